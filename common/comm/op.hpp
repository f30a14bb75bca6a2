#pragma once
/// @file op.hpp
/// Internal to common/comm (namespace detail: not for labs): one operation as the backends see
/// it, and the backend interface. Communicator (communicator.hpp) turns each call into an Op,
/// counts it (stats.hpp), records it (exec_log.hpp, trace.hpp), registers it with the watchdog and
/// submits it to its Backend (MPI on a worker thread, NCCL on a stream, or a copy for one rank);
/// Work::wait waits on the Op.
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

/// Every operation a Communicator submits: the collectives, point-to-point send/recv, and split
/// (making a sub-communicator is itself collective over the parent).
enum class OpKind {
  all_reduce, reduce, broadcast, all_gather, reduce_scatter, scatter, gather, barrier,
  send, recv, split, all_to_all
};
/// The kind's name as the byte counters, traces and watchdog reports print it ("all_reduce").
const char* op_kind_name(OpKind kind);
/// True for send and recv: the operations between one pair of ranks, not the whole group.
inline bool is_point_to_point(OpKind k) { return k == OpKind::send || k == OpKind::recv; }

/// Which tensor an operation reads and writes (see Communicator's comments):
///   all_reduce, reduce, broadcast: `out` in place;   send: `in`;   recv: `out`;
///   all_gather, reduce_scatter, scatter, gather, all_to_all: `in` -> `out` (all_to_all with
///   send_counts / recv_counts: variable chunks, back to back in rank order).
struct Op {
  OpKind kind;                      ///< what to do
  Tensor in;                        ///< the tensor read (table above); alive until complete()
  Tensor out;                       ///< the tensor written; alive until complete()
  ReduceOp reduce = ReduceOp::sum;  ///< all_reduce, reduce, reduce_scatter: how values combine
  int root = 0;       ///< collectives with a root: its rank in this communicator
  int peer = -1;      ///< send: destination; recv: source (ranks in this communicator)
  int tag = 0;        ///< send/recv: matches a send with its recv between the same two ranks
  int color = 0;      ///< split: ranks with the same color form one new communicator
  int key = 0;        ///< split: orders the ranks inside the new communicator
  std::int64_t seq = 0;    ///< the group's sequence number (collectives) or p2p count
  std::string group;       ///< the communicator's name, for messages
  std::size_t bytes = 0;   ///< the payload (stats.hpp): what the counters, trace and watchdog show
  /// What moves the bytes (route.hpp's transport_name: "mpi", "nccl", "self"), set by
  /// Communicator::submit: the ledger, the execution log, the trace and the watchdog show it.
  const char* transport = "";
  /// all_to_all with per-peer counts (elements to / from each rank of the group, in rank
  /// order); both empty for the equal-chunk all_to_all.
  std::vector<int64_t> send_counts, recv_counts;

  /// Result of a split on the mpi backend (owned by the new communicator's backend).
  MPI_Comm split_comm = MPI_COMM_NULL;

  /// Bookkeeping set by the Communicator before submission: the watchdog's handle of this op.
  std::uint64_t watchdog_token = 0;
  /// When the op was submitted (trace clock, us); -1 when tracing is off.
  double trace_begin_us = -1;
  int trace_lane = -1;      // which comm track of the trace it occupies while in flight
  int world_peer = -1;      // the peer or root as a world rank (execution log)
  /// Called by Work::wait/test before looking at `done`, and by Communicator::send_recv_async
  /// once its batch is posted (the nccl backend launches its collected point-to-point operations
  /// as one group then).
  std::function<void()> flush;

  /// Marks the operation finished (error or not): releases `in` and `out`, leaves the watchdog,
  /// records the trace event, wakes waiters. Called exactly once, by the backend, when it no
  /// longer needs the tensors (and after its own staging copies are gone).
  void complete(std::exception_ptr error = nullptr);
  /// Blocks until complete(); rethrows the error.
  void wait();
  /// True once complete() ran, with or without an error (wait() rethrows it); never blocks.
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
  /// Queues `op`; the backend completes ops in submission order, which every rank of the group
  /// shares (a collective's ranks submit in the same order, or the watchdog names the one that
  /// did not).
  virtual void submit(std::shared_ptr<Op> op) = 0;
  /// Launches what the backend holds back (the nccl backend's lone send/recvs), as a wait on one
  /// of them would. Communicator::submit calls it before a collective of the same group goes to
  /// another transport (a host value over MPI), so that no rank sits in that collective while a
  /// peer waits for a message it holds. Nothing to do for the others.
  virtual void flush() {}
};

/// Adds one call of `kind` with `bytes` of payload to this process's counters and ledger
/// (stats.cpp): on `group` (its name, its members as world ranks), with reduction `reduce` ("" for
/// none), `peer` (world rank of the destination, source or root; -1 for none) and `transport`
/// (route.hpp's transport_name). Called by Communicator::submit only, on the submitting thread:
/// the one place ops are counted.
void count_op(const std::string& group, const std::vector<int>& members, OpKind kind,
              const char* reduce, int peer, std::size_t bytes, const char* transport);

// Backend factories (backend_mpi.cpp, backend_self.cpp, backend_nccl*.cpp).
/// Takes ownership of `comm` (a duplicate made for this communicator).
std::unique_ptr<Backend> make_mpi_backend(MPI_Comm comm);
/// The one-rank backend (a world of 1, or a split of one rank): every collective is a copy.
std::unique_ptr<Backend> make_self_backend();
/// An NCCL communicator for (rank, size); `broadcast_id` sends the unique id's `bytes` bytes
/// from rank 0 to every rank (over MPI). Throws "built without NCCL" in a build without it.
std::unique_ptr<Backend> make_nccl_backend(int rank, int size,
                                           const std::function<void(void*, std::size_t)>& broadcast_id);

}  // namespace scalelab::comm::detail
