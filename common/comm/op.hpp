#pragma once
// Internal to common/comm: one operation as the backends see it, and the backend interface.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <mpi.h>

#include "common/comm/communicator.hpp"
#include "common/tensor.hpp"

namespace scalelab::comm::detail {

enum class OpKind {
  all_reduce, reduce, broadcast, all_gather, reduce_scatter, scatter, gather, barrier,
  send, recv, split, all_to_all
};
const char* op_kind_name(OpKind kind);
inline bool is_point_to_point(OpKind k) { return k == OpKind::send || k == OpKind::recv; }

/// Which tensor an operation reads and writes (see Communicator's comments):
///   all_reduce, reduce, broadcast: `out` in place;   send: `in`;   recv: `out`;
///   all_gather, reduce_scatter, scatter, gather, all_to_all: `in` -> `out`.
struct Op {
  OpKind kind;
  Tensor in, out;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;       // collectives with a root
  int peer = -1;      // send: destination; recv: source
  int tag = 0;
  int color = 0, key = 0;  // split
  std::int64_t seq = 0;    // the group's sequence number (collectives) or p2p count
  std::string group;       // the communicator's name, for messages
  std::size_t bytes = 0;   // the payload (stats.hpp): what the counters, trace and watchdog show

  // Result of a split on the mpi backend (owned by the new communicator's backend).
  MPI_Comm split_comm = MPI_COMM_NULL;

  // Bookkeeping set by the Communicator before submission.
  std::uint64_t watchdog_token = 0;
  double trace_begin_us = -1;
  int trace_lane = -1;      // which comm track of the trace it occupies while in flight
  int world_peer = -1;      // the peer or root as a world rank (execution log)
  /// Called by Work::wait/test before looking at `done` (the nccl backend launches grouped
  /// point-to-point operations then).
  std::function<void()> flush;

  /// Marks the operation finished (error or not): releases `in` and `out`, leaves the watchdog,
  /// records the trace event, wakes waiters. Called exactly once, by the backend, when it no
  /// longer needs the tensors (and after its own staging copies are gone).
  void complete(std::exception_ptr error = nullptr);
  /// Blocks until complete(); rethrows the error.
  void wait();
  bool test();

  /// "all_reduce #3 (group world)" for error messages.
  std::string label() const;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// Runs operations in submission order and calls Op::complete on each.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual void submit(std::shared_ptr<Op> op) = 0;
};

/// Adds one call of `kind` with `bytes` of payload to this process's counters and ledger
/// (stats.cpp): on `group` (its name, its members as world ranks), with reduction `reduce` ("" for
/// none) and `peer` (world rank of the destination, source or root; -1 for none). Called by
/// Communicator::submit only, on the submitting thread: the one place ops are counted.
void count_op(const std::string& group, const std::vector<int>& members, OpKind kind,
              const char* reduce, int peer, std::size_t bytes);

// Backend factories (backend_mpi.cpp, backend_self.cpp, backend_nccl*.cpp).
/// Takes ownership of `comm` (a duplicate made for this communicator).
std::unique_ptr<Backend> make_mpi_backend(MPI_Comm comm);
std::unique_ptr<Backend> make_self_backend();
/// An NCCL communicator for (rank, size); `broadcast_id` sends the unique id's `bytes` bytes
/// from rank 0 to every rank (over MPI). Throws "built without NCCL" in a build without it.
std::unique_ptr<Backend> make_nccl_backend(int rank, int size,
                                           const std::function<void(void*, std::size_t)>& broadcast_id);

}  // namespace scalelab::comm::detail
