#pragma once
// The execution log: what this process asked the library to do, in order, while a grader watches.
// The model's stage pieces (nn::GPT::embed, forward_blocks, head_forward, head_backward,
// backward_blocks, embed_backward), the compute kernels that labs overlap with communication
// (ops::flash_attention_forward / _backward, ops::attention_merge), every Communicator operation
// (at submission, on the calling thread) and every wait on one (Work::wait, when the caller asks
// for the result) append one event each. A grader reads what a run REALLY executed from here, not from
// what the code under test says it did (lab 08: the order of a schedule's forwards, backwards and
// messages, the micro-batches in flight; lab 11: a ring's next block posted before the current
// block's compute and waited for only after it, i.e. in flight while the block computes).
//
//   exec_log::Recording rec;             // starts recording (one at a time per process)
//   run_schedule(...);
//   for (const exec_log::Event& e : rec.events()) ...
//
// Off (nothing recorded, one relaxed atomic load per call) unless a Recording is alive.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace scalelab::exec_log {

struct Event {
  std::string what;              // a piece ("forward_blocks", ...), a compute kernel
                                 // ("flash_attention_forward", ...), an op kind ("send", ...) at
                                 // submission, or "wait" (a caller waiting on an operation)
  const void* object = nullptr;  // model pieces: the nn::GPT called (compute kernels: nullptr)
  std::string op;                // "wait": the kind of the operation waited for ("recv", ...)
  std::int64_t seq = 0;          // operations and waits: the operation's sequence number in its
                                 // group (a wait and the submission it waits for share it)
  std::string group;             // operations and waits: the communicator's name
  int peer = -1;                 // send/recv: the other rank, rooted collectives: the root
                                 // (world ranks); -1 otherwise
  int tag = 0;                   // send/recv
  std::int64_t bytes = 0;        // operations: the payload (common/comm/stats.hpp)
};

/// Records every event while alive; another Recording while one is alive is an error.
class Recording {
 public:
  Recording();
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  /// The events so far, in order.
  std::vector<Event> events() const;
};

/// True while a Recording is alive.
bool recording();

/// Called by nn::GPT's pieces, Communicator::submit and Work::wait (not by labs).
void record_piece(const char* what, const void* object);
void record_comm(const char* what, const std::string& group, int peer, int tag,
                 std::int64_t bytes, std::int64_t seq);
void record_wait(const char* op, const std::string& group, int peer, int tag, std::int64_t seq);

/// Called by the compute kernels a lab overlaps with communication (flash attention, the
/// attention merge), before they run: records a piece `what` (object nullptr) and runs the
/// compute hook, if any.
void record_compute(const char* what);
/// The function record_compute runs first (empty: none). comm::set_overlap(false) installs one
/// that waits for every operation in flight: the no-overlap baseline (communicator.hpp).
void set_compute_hook(std::function<void()> hook);

}  // namespace scalelab::exec_log
