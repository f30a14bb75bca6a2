#pragma once
// The execution log: what this process asked the library to do, in order, while a grader watches.
// The model's stage pieces (nn::GPT::embed, forward_blocks, head_forward, head_backward,
// backward_blocks, embed_backward) and every Communicator operation (at submission, on the calling
// thread) append one event each. A grader reads what a run REALLY executed from here, not from
// what the code under test says it did (lab 08: the order of a schedule's forwards, backwards and
// messages, the micro-batches in flight).
//
//   exec_log::Recording rec;             // starts recording (one at a time per process)
//   run_schedule(...);
//   for (const exec_log::Event& e : rec.events()) ...
//
// Off (nothing recorded, one relaxed atomic load per call) unless a Recording is alive.
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::exec_log {

struct Event {
  std::string what;              // a piece ("forward_blocks", ...) or an op kind ("send", ...)
  const void* object = nullptr;  // model pieces: the nn::GPT called
  std::string group;             // operations: the communicator's name
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

/// Called by nn::GPT's pieces and Communicator::submit (not by labs).
void record_piece(const char* what, const void* object);
void record_comm(const char* what, const std::string& group, int peer, int tag,
                 std::int64_t bytes);

}  // namespace scalelab::exec_log
