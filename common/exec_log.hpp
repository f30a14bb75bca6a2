#pragma once
/// @file exec_log.hpp
/// The execution log: what this process asked the library to do, in order, while a grader watches.
/// The model's stage pieces (nn::GPT::embed, forward_blocks, head_forward, head_backward,
/// backward_blocks, embed_backward) and every Communicator operation (at submission, on the calling
/// thread) append one event each. A grader reads what a run REALLY executed from here, not from
/// what the code under test says it did (lab 08: the order of a schedule's forwards, backwards and
/// messages, the micro-batches in flight).
///
///     exec_log::Recording rec;             // starts recording (one at a time per process)
///     run_schedule(...);
///     for (const exec_log::Event& e : rec.events()) ...
///
/// Off (nothing recorded, one relaxed atomic load per call) unless a Recording is alive.
#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::exec_log {

/// One thing this process did: a model piece called, or a communication operation submitted.
struct Event {
  std::string what;              ///< a piece ("forward_blocks", ...) or an op kind ("send", ...)
  const void* object = nullptr;  ///< model pieces: the nn::GPT called (which stage's model)
  std::string group;             ///< operations: the communicator's name ("tp0", "world", ...)
  /// send/recv: the other rank; rooted collectives: the root (world ranks); -1 otherwise.
  int peer = -1;
  /// send/recv: the message's tag (lab 08 tells activations from gradients and micro-batches by
  /// it); 0 otherwise.
  int tag = 0;
  std::int64_t bytes = 0;        ///< operations: the payload (common/comm/stats.hpp)
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
/// its `peer` (world rank, -1 for none), `tag` and payload `bytes`, when recording. Called by
/// Communicator::submit on the submitting thread (not by labs).
void record_comm(const char* what, const std::string& group, int peer, int tag,
                 std::int64_t bytes);

}  // namespace scalelab::exec_log
