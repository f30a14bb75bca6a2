#pragma once
/// @file communicator.hpp
/// The communication layer every lab talks through: a Communicator over a group of ranks, with
/// the collectives of the lecture, point-to-point send/recv, non-blocking variants returning a
/// Work handle, and split() into sub-groups (the DP/TP/PP groups of later labs).
///
///   auto world = comm::Communicator::world("auto");         // every rank, once
///   world.all_reduce(grad, comm::ReduceOp::avg);             // in place, every rank gets the avg
///   comm::Work w = world.all_reduce_async(bucket);           // returns at once ...
///   ...                                                      // ... compute meanwhile
///   w.wait();                                                // bucket now holds the sum
///   auto dp = world.split(/*color=*/rank % 2, /*key=*/rank, "dp");
///
/// Backends (common/comm/backend_*.cpp):
///   mpi   host memory. Every MPI call of one communicator runs on that communicator's worker
///         thread, in submission order, so a non-blocking collective makes progress while the
///         caller computes, and every rank issues the same MPI calls in the same order. CUDA
///         tensors are staged through host memory.
///   nccl  CUDA tensors over NCCL, on a communication stream separate from compute; the
///         ncclUniqueId goes from rank 0 to the others over MPI. A lone send/recv is launched
///         when it is waited for; a batch of them (send_recv_async) when it is posted. Host
///         tensors (a loss, a twin check, a table's numbers) go over the group's MPI
///         communicator, which every group has (PyTorch's "cuda:nccl,cpu:gloo"); a message to
///         oneself is a copy. Ranks that share a GPU where NCCL refuses it (before 2.30, or
///         without NCCL_MULTI_RANK_GPU_ENABLE=1): a usage error at world(), naming them.
///   self  a world of one, no launcher needed (each rank is alone).
///   auto  as nccl when NCCL was compiled in and accepts the ranks; mpi otherwise (CUDA tensors
///         staged through host memory, said once when it is because ranks share a GPU).
/// common/comm/route.hpp holds the table; the traffic ledger, the execution log, the trace and
/// the watchdog name each operation's transport (mpi, nccl or self).
///
/// Every operation is registered with the watchdog (common/watchdog.hpp: a hang ends the job with
/// exit 3 and a report), appears in the Chrome trace (common/trace.hpp) with its bytes, and is
/// counted per group and kind (common/comm/stats.hpp: comm_stats(), format_comm_stats()). Tensors
/// must be contiguous, of any shape, f32, f64, bf16 or i32 (no avg for i32). bf16 is moved as
/// 16-bit words (send/recv and gathers: bf16 activations and weights in mixed precision) and
/// reduced in float, rounded once per combine (NCCL's ncclBfloat16; on mpi our own MPI_Ops).
/// Shapes do not matter, only element counts: a (4, 8) tensor all-gathers into any tensor of
/// 4*8*size elements.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/stats.hpp"
#include "common/tensor.hpp"

namespace scalelab::comm {

/// How a reduction combines the ranks' elements: avg is the sum divided by the group's size
/// (what data parallelism does to gradients; not for i32).
enum class ReduceOp { sum, max, min, avg };
/// "sum", "max", "min" or "avg" (for traces and error messages).
const char* reduce_op_name(ReduceOp op);

namespace detail {
struct Op;
struct CommState;
}  // namespace detail

/// A non-blocking operation in flight. Copies share the same operation. [[nodiscard]]: an
/// operation must be waited for before its tensor is used again (a dropped send's buffer may
/// still be read after the function that posted it returned).
class [[nodiscard("wait for the operation (Work::wait) before its tensor is used again")]] Work {
 public:
  Work() = default;
  /// Blocks until the operation is done; rethrows its error (on every rank alike for the
  /// matching-size check). Waiting twice is fine.
  void wait();
  /// True when done (then wait() returns at once). Never blocks. Like wait(), it launches the
  /// send/recvs that the nccl backend holds back (see send_recv_async), this one among them: a
  /// send tested before the receive that follows it goes alone, not in one group with that
  /// receive (lab 08's run_schedule tests its sends only before it computes, for that reason).
  bool test();
  /// False for a default-constructed Work (no operation to wait for).
  bool valid() const { return op_ != nullptr; }

 private:
  friend class Communicator;
  explicit Work(std::shared_ptr<detail::Op> op) : op_(std::move(op)) {}
  std::shared_ptr<detail::Op> op_;
};

/// Waits for every work in `works` (in order).
void wait_all(std::vector<Work>& works);

/// One send or receive of a batch posted together (Communicator::send_recv_async; PyTorch's
/// P2POp): `P2POp::recv(next, left)`, `P2POp::send(cur, right)`.
struct P2POp {
  /// Which of the two.
  enum class Kind {
    send,  ///< Communicator::send_async
    recv   ///< Communicator::recv_async
  };
  Kind kind = Kind::send;  ///< send or receive
  Tensor tensor;  ///< send: the message (read, kept alive until done); recv: where it lands
  int peer = 0;   ///< send: the destination; recv: the source (ranks of the communicator)
  int tag = 0;    ///< matches a send with its recv between the same two ranks
  /// Send `t` to `dst` (send_async's arguments).
  static P2POp send(const Tensor& t, int dst, int tag = 0) { return {Kind::send, t, dst, tag}; }
  /// Receive into `t` from `src` (recv_async's arguments).
  static P2POp recv(const Tensor& t, int src, int tag = 0) { return {Kind::recv, t, src, tag}; }
};

/// Seconds this process has spent blocked in Work::wait (and in the blocking calls, which wait
/// on their own Work), over every thread and group, since the start: the communication a caller
/// did not hide. A lab reads the difference over a region (lab 11's overlap table).
double wait_seconds();

/// The no-overlap baseline. Off (`overlap` false): every operation submitted is waited for
/// before the next compute kernel of the library that labs overlap with communication
/// (exec_log::record_compute: flash attention, the attention merge), so a transfer posted
/// before a block's compute is finished before that compute starts: the same program, its
/// transfers never in flight while it computes. On (the default): nothing is waited for early.
/// Not thread-safe against running compute: switch between steps.
void set_overlap(bool overlap);
/// Whether set_overlap is on (the default).
bool overlap();

/// When on, every collective first checks that all ranks called the same collective with the
/// same element count, dtype and root, and fails with a clear error on every rank otherwise
/// (instead of a hang or silent garbage). Costs one small all-gather per collective: on in tests
/// (tests/support/test_main.cpp), off by default, on with SCALELAB_COMM_CHECK=1.
void set_check_matching(bool on);
/// Whether set_check_matching is on.
bool check_matching();

/// True when this build has the NCCL backend.
bool nccl_compiled();

/// NCCL's version code (ncclGetVersion: 22803 for 2.28.3), 0 without NCCL. Two ranks may share
/// one GPU only from 2.30 on, with NCCL_MULTI_RANK_GPU_ENABLE=1.
int nccl_version();

/// A group of ranks that talk: the world, or a sub-group made by split() (a tp, dp or pp group
/// of the later labs). A handle: copies share the group. Every rank of the group calls its
/// collectives in the same order with matching sizes (set_check_matching checks it); each call
/// is counted by kind and bytes under the group's name (common/comm/stats.hpp), which is how the
/// graders see what a technique sends.
class Communicator {
 public:
  Communicator() = default;  ///< not usable; see world()

  /// The communicator of all ranks (collective over MPI_COMM_WORLD for mpi/nccl/auto; for
  /// "self" each rank gets its own world of one). `backend`: auto, mpi, nccl or self (the
  /// --backend option). Starts the watchdog with its current timeout.
  static Communicator world(const std::string& backend = "auto");

  /// This rank's index in the group, 0 .. size() - 1 (not its world rank unless the group is
  /// the world: world_ranks() maps them).
  int rank() const;
  /// The number of ranks in the group.
  int size() const;
  /// "world", or the name given to split().
  const std::string& name() const;
  /// "auto", "mpi", "nccl" or "self".
  const std::string& backend() const;
  /// This group's members as ranks of MPI_COMM_WORLD, in this group's rank order.
  const std::vector<int>& world_ranks() const;
  /// False for a default-constructed Communicator.
  bool valid() const { return s_ != nullptr; }

  // ---- collectives: every rank of the group calls them in the same order -----------------
  /// In place: every rank ends with the reduction of all ranks' `t`.
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum);
  /// In place: `root` ends with the reduction; the others' `t` is unspecified afterwards.
  void reduce(const Tensor& t, int root, ReduceOp op = ReduceOp::sum);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work reduce_async(const Tensor& t, int root, ReduceOp op = ReduceOp::sum);
  /// In place: every rank ends with root's `t`.
  void broadcast(const Tensor& t, int root);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work broadcast_async(const Tensor& t, int root);
  /// `out` (size * in.numel elements) = rank 0's `in`, then rank 1's, ...
  void all_gather(const Tensor& in, const Tensor& out);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work all_gather_async(const Tensor& in, const Tensor& out);
  /// `in` and `out` (one size, size() equal chunks): chunk r of my `in` goes to rank r, and
  /// chunk s of my `out` comes from rank s (a transpose of the ranks' chunks; lab 11's Ulysses).
  void all_to_all(const Tensor& in, const Tensor& out);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work all_to_all_async(const Tensor& in, const Tensor& out);
  /// With per-peer counts (MPI_Alltoallv; expert parallelism's exchange of tokens): my `in`
  /// holds send_counts[r] elements for each rank r, back to back in rank order (in.numel() is
  /// their sum); my `out` gets recv_counts[s] elements from each rank s, back to back in rank
  /// order (out.numel() is their sum). Rank s's send_counts[r] must be rank r's
  /// recv_counts[s]: exchange the counts first (an equal-chunk all_to_all of them), as a real
  /// dispatcher does; set_check_matching also checks them. Counts may be 0. Payload counted
  /// (stats.hpp): the bytes this rank sends, sum(send_counts) x the element size.
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                  const std::vector<int64_t>& recv_counts);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work all_to_all_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                        const Tensor& out, const std::vector<int64_t>& recv_counts);
  /// `in` has size * out.numel elements; rank r gets the reduction of every rank's r-th chunk.
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  /// Root's `in` (size * out.numel elements, ignored elsewhere) in chunks: rank r gets chunk r.
  void scatter(const Tensor& in, const Tensor& out, int root);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work scatter_async(const Tensor& in, const Tensor& out, int root);
  /// Root's `out` (size * in.numel elements, ignored elsewhere) = every rank's `in`, in order.
  void gather(const Tensor& in, const Tensor& out, int root);
  /// The same, non-blocking: returns at once; the tensors may be read or changed only
  /// after the Work is done.
  Work gather_async(const Tensor& in, const Tensor& out, int root);
  /// Returns once every rank of the group has called it.
  void barrier();
  /// The barrier, non-blocking: the Work is done once every rank has called it.
  Work barrier_async();

  // ---- point to point ------------------------------------------------------------------
  /// Sends `t` to `dst`. Messages between two ranks with the same tag arrive in order. A
  /// blocking send may wait until the receiver posts its recv: in a ring, post recv_async
  /// first, then send, then wait the recv. On nccl tags are not matched (NCCL has none): the
  /// messages between two ranks pair up in the order they were posted, so post them in the
  /// same order on both sides (a schedule that is correct over mpi's tags may not be).
  void send(const Tensor& t, int dst, int tag = 0);
  /// The send, non-blocking: returns at once; keep `t` unchanged and alive until the Work is
  /// done (the message is read from it).
  Work send_async(const Tensor& t, int dst, int tag = 0);
  /// Receives into `t` from `src`; the message must have exactly t.numel() elements.
  void recv(const Tensor& t, int src, int tag = 0);
  /// The receive, non-blocking: returns at once; `t` holds the message once the Work is done.
  Work recv_async(const Tensor& t, int src, int tag = 0);
  /// One step's sends and receives, posted together, non-blocking (PyTorch's
  /// batch_isend_irecv, NCCL's group): the Works of `ops`, in their order. Each is the
  /// send_async or recv_async it names (counted, logged, traced and waited for the same way);
  /// the batch says that nothing else belongs with them, so every backend has them in flight
  /// when the call returns. On nccl, which needs a send and the matching recv of a step in one
  /// ncclGroupStart/End, lone send_async/recv_async calls are held back until one of them is
  /// waited for (or a collective follows), and a batch launches the group at once: a ring's
  /// next block travels while this one computes. On mpi and self each op is posted as it would
  /// be alone. A ring step: `auto w = cp.send_recv_async({P2POp::recv(next, left),
  /// P2POp::send(cur, right)}); compute(cur); wait_all(w);`. Every op is checked (tensor, peer)
  /// before any is posted; the batch also launches send/recvs posted unbatched before it.
  std::vector<Work> send_recv_async(const std::vector<P2POp>& ops);

  /// Sub-communicators: ranks with the same `color` form one group, ordered by `key` (then by
  /// rank). Collective over this communicator. `name` labels the group in watchdog reports and
  /// traces (default "<parent>/<color>").
  Communicator split(int color, int key, const std::string& name = "") const;

 private:
  explicit Communicator(std::shared_ptr<detail::CommState> s) : s_(std::move(s)) {}
  Work submit(std::shared_ptr<detail::Op> op) const;
  std::shared_ptr<detail::CommState> s_;
};

}  // namespace scalelab::comm
