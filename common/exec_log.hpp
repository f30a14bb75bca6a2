#pragma once
/// @file exec_log.hpp
/// The execution log: what this process asked the library to do, in order, while a grader watches.
/// The model's stage pieces (nn::GPT::embed, forward_blocks, head_forward, head_backward,
/// backward_blocks, embed_backward), the compute kernels that labs overlap with communication
/// (ops::flash_attention_forward / _backward, ops::attention_merge), every Communicator operation
/// (at submission, on the calling thread) and every wait on one (Work::wait, when the caller asks
/// for the result) append one event each. A grader reads what a run REALLY executed from here, not from
/// what the code under test says it did (lab 08: the order of a schedule's forwards, backwards and
/// messages, the micro-batches in flight; lab 11: a ring's next block posted before the current
/// block's compute and waited for only after it, i.e. in flight while the block computes).
///
///   exec_log::Recording rec;             // starts recording (one at a time per process)
///   run_schedule(...);
///   for (const exec_log::Event& e : rec.events()) ...
///
/// Off (nothing recorded, one relaxed atomic load per call) unless a Recording is alive.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace scalelab::exec_log {

/// One thing this process did: a model piece called, or a communication operation submitted.
struct Event {
  /// A piece ("forward_blocks", ...), a compute kernel ("flash_attention_forward", ...), an op
  /// kind ("send", ...) at submission, or "wait" (a caller waiting on an operation).
  std::string what;
  /// Model pieces: the nn::GPT called (which stage's model); compute kernels: nullptr.
  const void* object = nullptr;
  std::string op;                ///< "wait": the kind of the operation waited for ("recv", ...)
  /// Operations and waits: the operation's sequence number in its group (a wait and the
  /// submission it waits for share it).
  std::int64_t seq = 0;
  std::string group;             ///< operations and waits: the communicator's name ("tp0", ...)
  /// send/recv: the other rank; rooted collectives: the root (world ranks); -1 otherwise.
  int peer = -1;
  /// send/recv: the message's tag (lab 08 tells activations from gradients and micro-batches by
  /// it); 0 otherwise.
  int tag = 0;
  std::int64_t bytes = 0;        ///< operations: the payload (common/comm/stats.hpp)
  /// send/recv: the batch it was posted in (Communicator::send_recv_async), numbered from 1 in
  /// this process; 0 when posted alone (send_async / recv_async). Lab 11 asks a ring step's
  /// receive and send in one batch (on NCCL a lone send/recv starts only when waited for).
  std::int64_t batch = 0;
  /// Operations and waits: what moved the bytes, "mpi", "nccl" or "self" (on an nccl group CUDA
  /// tensors go over NCCL and host values over MPI: common/comm/route.hpp); "" otherwise.
  std::string transport;
};

/// Records every event while alive; another Recording while one is alive is an error.
class Recording {
 public:
  /// Starts recording with an empty log; throws if another Recording is alive in this process.
  Recording();
  /// Stops recording; the events are gone with it.
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  /// The events so far, in order.
  std::vector<Event> events() const;
};

/// True while a Recording is alive.
bool recording();

/// Appends a model piece `what` called on the nn::GPT `object`, when recording. Called by
/// nn::GPT's pieces (not by labs).
void record_piece(const char* what, const void* object);
/// Appends a communication operation `what` (its kind's name) on the communicator `group` with
/// its `peer` (world rank, -1 for none), `tag`, payload `bytes`, sequence number `seq` and
/// `transport`, when recording. Called by Communicator::submit on the submitting thread (not by
/// labs).
void record_comm(const char* what, const std::string& group, int peer, int tag,
                 std::int64_t bytes, std::int64_t seq, const char* transport);
/// While alive, the operations this thread submits are one batch: their events carry its number
/// (Event::batch). Communicator::send_recv_async holds one around its submissions (not labs).
/// Numbered whether or not a Recording is alive; not nestable.
class BatchScope {
 public:
  BatchScope();
  ~BatchScope();
  BatchScope(const BatchScope&) = delete;
  BatchScope& operator=(const BatchScope&) = delete;
};

/// Appends a wait on operation `seq` (of kind `op`, moved by `transport`) of `group`, when
/// recording. Called by Work::wait (not by labs).
void record_wait(const char* op, const std::string& group, int peer, int tag, std::int64_t seq,
                 const char* transport);

/// Called by the compute kernels a lab overlaps with communication (flash attention, the
/// attention merge), before they run: records a piece `what` (object nullptr) and runs the
/// compute hook, if any.
void record_compute(const char* what);
/// The function record_compute runs first (empty: none). comm::set_overlap(false) installs one
/// that waits for every operation in flight: the no-overlap baseline (communicator.hpp).
void set_compute_hook(std::function<void()> hook);

}  // namespace scalelab::exec_log
