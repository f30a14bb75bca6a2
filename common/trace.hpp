#pragma once
/// @file trace.hpp
/// Chrome trace events ("ph":"X", complete events), one process per rank (pid = rank), merged by
/// rank 0 into one JSON file that Perfetto (ui.perfetto.dev) or chrome://tracing opens.
///
///   trace::enable("run.json");               // every rank, same path (from --trace)
///   { trace::Scope s("forward"); ... }       // one event from construction to destruction
///   trace::finish();                          // collective: rank 0 writes run.json
///
/// Every operation of common/comm appears on a comm track (tid 1, "comm", and tids 2, 3, ...
/// "comm 2", ... while several are in flight at once: a send and a recv of a ring step) from
/// its submission to its completion, with its bytes, group and sequence number; compute scopes
/// go on tid 0, and so does each wait on an operation ("wait recv": the time the caller was
/// blocked, the communication it did not hide). When tracing is off, Scope costs one
/// branch. Timestamps are CLOCK_MONOTONIC microseconds, shifted so the earliest event of the job
/// is 0 (ranks on one node share that clock; across nodes the offsets are only approximate).
#include <cstdint>
#include <string>
#include <string_view>

namespace scalelab::trace {

/// Track ids inside a rank's process: compute (the calling thread) and communication.
enum Track : int { kCompute = 0, kComm = 1 };

/// A comm track for an operation in flight: the lowest lane (0, 1, ...) no other operation
/// holds; its events go on track kComm + lane. Released when the operation completes.
/// (Communicator only.) Thread-safe.
int acquire_comm_lane();
/// Gives `lane` back once its operation has completed (Communicator only). Thread-safe.
void release_comm_lane(int lane);

/// Starts recording on this rank. `path` is where finish() writes the merged trace (rank 0).
void enable(const std::string& path);

/// True between enable() and finish().
bool enabled();

/// The file enable() named, while enabled ("" otherwise).
std::string path();

/// Microseconds on the trace clock.
double now_us();

/// Records one complete event [begin_us, end_us). `args_json` is the inside of the "args"
/// object (e.g. `"bytes":4096,"group":"dp"`), may be empty. Thread-safe.
void event(std::string_view name, std::string_view category, double begin_us, double end_us,
           int track = kCompute, std::string_view args_json = {});

/// RAII: one event named `name` from construction to destruction (on the compute track).
class Scope {
 public:
  /// Starts the event (nothing when tracing is off); `category` names its track.
  explicit Scope(std::string_view name, std::string_view category = "compute");
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string name_, category_;
  double begin_us_ = -1;  // < 0: tracing was off at construction
};

/// Collective over MPI_COMM_WORLD (every rank calls it, tracing on or off): gathers all ranks'
/// events to rank 0, which writes the file given to enable(). Returns the number of events
/// written (on rank 0; 0 elsewhere). Recording stops. Without enable() it does nothing and needs
/// no MPI.
std::size_t finish();

/// Drops the recorded events and turns tracing off, without writing (tests).
void reset();

}  // namespace scalelab::trace
