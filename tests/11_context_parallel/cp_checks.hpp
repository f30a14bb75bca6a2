#pragma once
// What lab 11's graders share: random attention inputs of the whole sequence (the same on every
// rank), the single-device flash attention on them, the grader's OWN zig-zag rows (so steps 2-4
// are graded without the attendee's step 1), the byte, work and overlap checks, and the
// single-device GPT twin. The wrong techniques the checks must stop (an all-gather instead of the
// ring, no causal skip, each block waited for before computing, dK/dV that do not travel, the
// contiguous split, Ulysses in arrival order) are planted into a copy of the reference at build time
// (solutions/11_context_parallel/planted/cheats.plant, labs/11_context_parallel/lab.cmake), not
// written again here.
#include <string>
#include <vector>

#include "common/allocator.hpp"
#include "common/comm/communicator.hpp"
#include "common/comm/stats.hpp"
#include "common/exec_log.hpp"
#include "common/ops/flash_attention.hpp"
#include "common/ops/ops.hpp"
#include "common/ops/work.hpp"
#include "context_parallel.hpp"
#include "tests/support/expect.hpp"
#include "tests/support/lab_fixture.hpp"
#include "tests/support/memory_use.hpp"
#include "tests/support/on_sim.hpp"
#include "tests/support/own_work.hpp"
#include "tests/support/traffic_budget.hpp"

namespace cptest {

using namespace scalelab;

/// The grader's zig-zag rows of x (B, T, ...) for rank of cp: chunks rank and 2cp-1-rank.
inline Tensor zigzag_rows(const Tensor& x, int cp, int rank) {
  const int64_t B = x.size(0), T = x.size(1), c = T / (2 * cp), w = c * (x.numel() / (B * T));
  std::vector<int64_t> shape = x.shape();
  shape[1] = T / cp;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const Tensor in = x.view({B * 2 * cp, w});
  Tensor o = out.view({B * 2, w});
  for (int64_t b = 0; b < B; ++b) {
    o.rows(2 * b, 2 * b + 1).copy_from(in.rows(b * 2 * cp + rank, b * 2 * cp + rank + 1));
    const int64_t late = b * 2 * cp + 2 * cp - 1 - rank;
    o.rows(2 * b + 1, 2 * b + 2).copy_from(in.rows(late, late + 1));
  }
  return out;
}

/// The grader's zig-zag positions.
inline std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  const int64_t c = T / (2 * cp);
  std::vector<int64_t> p;
  for (int64_t k : {static_cast<int64_t>(rank), 2 * cp - 1 - static_cast<int64_t>(rank)})
    for (int64_t i = 0; i < c; ++i) p.push_back(k * c + i);
  return p;
}

/// Attention over the whole sequence: inputs (BH, T, hs) and the single device's flash results.
struct Full {
  Tensor q, k, v, dy;   // (BH, T, hs)
  Tensor y, lse;        // forward
  Tensor dq, dk, dv;    // backward
  double scale = 0;
};

inline Full full_attention(int64_t BH, int64_t T, int64_t hs, DType dtype, uint64_t seed) {
  Full f;
  f.q = Tensor::uniform({BH, T, hs}, seed, dtype);
  f.k = Tensor::uniform({BH, T, hs}, seed + 1, dtype);
  f.v = Tensor::uniform({BH, T, hs}, seed + 2, dtype);
  f.dy = Tensor::uniform({BH, T, hs}, seed + 3, dtype);
  f.scale = 1.0 / std::sqrt(static_cast<double>(hs));
  f.y = Tensor::empty({BH, T, hs}, dtype);
  f.lse = Tensor::empty({BH, T}, ops::flash_attention_lse_dtype(dtype));
  ops::flash_attention_forward(f.y, f.lse, f.q, f.k, f.v, f.scale);
  f.dq = Tensor::empty({BH, T, hs}, dtype);
  f.dk = f.dq.clone();
  f.dv = f.dq.clone();
  ops::flash_attention_backward(f.dq, f.dk, f.dv, f.dy, f.q, f.k, f.v, f.y, f.lse, f.scale);
  return f;
}

/// This rank's ring inputs and the reference's answers, in the chunk-major layout.
struct Mine {
  Tensor q, kv, dy;        // (2, BH, c, hs), (2, 2, BH, c, hs), (2, BH, c, hs)
  Tensor y, lse, dq, dkv;  // what the ring must give
};

inline Mine mine(const Full& f, int cp, int rank) {
  Mine m;
  const Tensor lse3 = f.lse.view({f.lse.size(0), f.lse.size(1), 1});
  m.q = lab11::to_chunks(zigzag_rows(f.q, cp, rank));
  m.kv = lab11::pack_kv(zigzag_rows(f.k, cp, rank), zigzag_rows(f.v, cp, rank));
  m.dy = lab11::to_chunks(zigzag_rows(f.dy, cp, rank));
  m.y = lab11::to_chunks(zigzag_rows(f.y, cp, rank));
  const Tensor lse_c = lab11::to_chunks(zigzag_rows(lse3, cp, rank));  // (2, BH, c, 1)
  m.lse = lse_c.view({2, lse_c.size(1), lse_c.size(2)});
  m.dq = lab11::to_chunks(zigzag_rows(f.dq, cp, rank));
  m.dkv = lab11::pack_kv(zigzag_rows(f.dk, cp, rank), zigzag_rows(f.dv, cp, rank));
  return m;
}

/// fp32: the blocks' sums and merges run in another order than one flash call: 1e-5 relative,
/// 1e-6 absolute. bf16: each block's output rounds to 8 bits before it is merged and the
/// gradients are summed in bf16 over the blocks: 3e-2 relative and absolute (values of order 1).
/// The memory tests' chunk length: a K/V block of 3 x 2 chunks x 16 x 2 fp32 is 48 KiB, far above
/// the ring's bookkeeping, so one block more, in a tensor or beside them, stands out.
inline constexpr int64_t kMemoryChunk = 64;
/// What the heap may hold beyond a ring's tensors during a call, besides the library kernels'
/// own scratch (heap_allowance): tensor views' shapes, the communicator's and the execution log's
/// records (measured at kMemoryChunk with the kernels' scratch included: forward 9.0 to 12.8
/// KiB, backward 4.0 to 4.6 KiB, on 2 and 4 ranks): half a memory test's K/V block.
inline constexpr int64_t kHeapBookkeeping = 24576;

/// kHeapBookkeeping plus what the library's own kernels hold on the heap beside their tensors
/// when a ring calls them on one (BH, c, hs) chunk: the CPU flash attention's host scratch (the
/// transposed keys and values, its accumulators) and the merge's, measured here by one call of
/// each (the backward's flash backward, the forward's flash forward and merge), never guessed. A
/// ring that keeps its peak of tensors alive while a kernel runs (buffers allocated once, as
/// README step 3 says) holds that scratch on top of them: it is the library's, not the ring's.
int64_t heap_allowance(int64_t bh, int64_t c, int64_t hs, bool backward);

inline double rtol(DType dt) { return dt == DType::bf16 ? 3e-2 : 1e-5; }
inline double atol(DType dt) { return dt == DType::bf16 ? 3e-2 : 1e-6; }

/// The matmul FLOPs of one rank's ring attention (backward: its backward) over the zig-zag split
/// with every fully masked block skipped: bh heads, c rows per chunk, head size hs, cp ranks.
/// Written out chunk by chunk, for any rank: query chunk a (this rank's rank and 2cp-1-rank) sees
/// key chunk b < a whole (c*c pairs), b = a causally (c(c+1)/2), b > a not at all; each pair costs
/// flash attention's 2 GEMMs forward, 5 backward, of 2 hs FLOPs each (common/ops/work.hpp).
inline int64_t zigzag_attention_flops(int64_t bh, int64_t c, int64_t hs, int cp, int rank,
                                      bool backward) {
  int64_t pairs = 0;
  for (const int64_t a : {static_cast<int64_t>(rank), 2 * cp - 1 - static_cast<int64_t>(rank)})
    for (int64_t b = 0; b < 2 * cp; ++b) pairs += b < a ? c * c : b == a ? c * (c + 1) / 2 : 0;
  return bh * pairs * (backward ? 5 : 2) * 2 * hs;
}

/// "" when `did` (the work counters over one ring call) shows exactly zigzag_attention_flops of
/// matrix multiplies, else what it shows and how to look: every matmul counts, separate, batched
/// or fused in flash attention, so a masked block computed through any op is seen.
std::string work_problem(const ops::WorkCount& did, int64_t bh, int64_t c, int64_t hs,
                         const comm::Communicator& cp, bool backward);

/// labtest::close_on_every_rank for the ring's chunk-major tensors (collective), the worst element
/// named where it is: y, dq (2, BH, c, hs) as (query chunk, head, row, column) and the token of
/// the sequence that row is; lse (2, BH, c) likewise; dK/dV (2, 2, BH, c, hs) as (dK or dV, key
/// chunk, head, row, column). `what` names the tensor in the message.
testing::AssertionResult close_chunks(const Tensor& got, const Tensor& want, double rtol,
                                      double atol, const std::string& what);

/// "" when rank's sends of one call were exactly `blocks` K/V blocks of kv_bytes and nothing but
/// sends and receives moved, else what did. `did` is the ledger of the call with raw MPI counted
/// (labtest::traffic_of): a block moved by MPI_Send or gathered by MPI_Allgather past the
/// Communicator is an operation like any other.
std::string sends_problem(const comm::Traffic& did, int64_t blocks, std::size_t kv_bytes);

/// "" when at least `blocks` receives of a K/V block (kv_bytes, on cp's group) were in flight
/// while this rank computed a block: posted before a block's flash attention started, and first
/// waited for after all of that block's flash attention calls (none between the wait and the
/// next K/V receive's post; after the last receive's wait, no more calls than before it: the
/// last block's), whatever the number of calls a block takes. From the library's execution log
/// (exec_log.hpp: submissions, waits and compute kernels of this process, in program order),
/// never from timings: a receive that happens to finish early still counts (its wait came after
/// the compute), and a
/// ring that waits before it computes never does, however fast its messages. Else what was seen.
/// `backward`: the dK/dV receives (the same size) are not K/V blocks and are not counted; they are
/// told apart by tag (the K/V blocks' tag is the one of the call's first send: a ring sends its
/// own block first) or, on one tag, by order (each step's first receive is its K/V block, the
/// last one is the dK/dV home).
std::string overlap_problem(const std::vector<exec_log::Event>& log, const comm::Communicator& cp,
                            std::size_t kv_bytes, int64_t blocks, bool backward = false);

/// "" when every send this rank posted on cp's group in `log` went to the next rank of the ring,
/// (rank + 1) mod cp, and every receive came from the previous one, (rank - 1) mod cp (forward:
/// the K/V blocks; backward: the K/V blocks, their dK/dV and the last hop home), else which did
/// not. A "ring" that sends its own block straight to the rank that needs it (rank + s + 1 at
/// step s) moves the same bytes; one whose peers are right only when cp is a power of two
/// deadlocks at cp = 3. `what` names the call ("ring forward").
std::string direction_problem(const std::vector<exec_log::Event>& log,
                              const comm::Communicator& cp, const std::string& what);

/// While alive (and only when comm::overlap() is on: comm::set_overlap(false) owns the same
/// hook), checks direction_problem on the execution log at every compute kernel the code under
/// test starts (exec_log's compute hook) and, when it fails, ends the job at once with the test
/// main's verdict line naming the wrong peer ("failed: <test> on rank R: ..."): a send or
/// receive to the wrong rank may never be matched, and the ranks would wait for each other until
/// the watchdog. `rec` is the test's Recording.
class RingWatch {
 public:
  RingWatch(const exec_log::Recording& rec, const comm::Communicator& cp, std::string what);
  ~RingWatch();
  RingWatch(const RingWatch&) = delete;
  RingWatch& operator=(const RingWatch&) = delete;

 private:
  bool armed_ = false;
};

/// "" when each receive of a K/V block (kv_bytes, on cp's group) was posted in one batch with a
/// send (Communicator::send_recv_async: the execution log's Event::batch), else which were posted
/// alone. On NCCL a lone recv_async / send_async is held back until it is waited for, so a ring
/// written that way has nothing in flight while it computes there, though it overlaps on MPI.
std::string batch_problem(const std::vector<exec_log::Event>& log, const comm::Communicator& cp,
                          std::size_t kv_bytes);

/// "" when each dK/dV receive of a ring backward (a block-sized receive on cp's group that is not
/// a K/V block's, kv_receives' rule) was posted after a block's compute (a flash attention call
/// since the previous dK/dV receive was posted, or since the call began), else which were posted
/// before it. The dK/dV of a block leave its sender only after the sender computed on it: a
/// receive posted earlier is waited for, under comm::set_overlap(false), before this rank's
/// compute, and on NCCL it sits in a group launched before that compute, while the sender is
/// itself waiting for its own: the ring deadlocks.
std::string dkdv_posted_problem(const std::vector<exec_log::Event>& log,
                                const comm::Communicator& cp, std::size_t kv_bytes);

/// "" when every send this rank posted on cp's group during the call (the log of the call) was
/// waited for (Work::wait, comm::wait_all) before the call returned and before the next send to
/// the same rank with the same tag was posted (the next ring step's, when a double-buffered ring
/// reuses or drops the buffer); else which sends were not. Until its Work is waited for, a send
/// may still be reading its tensor: a ring that waits only for its receives races with the
/// transport when it overwrites that buffer or when its caller changes the input after return.
std::string sends_waited_problem(const std::vector<exec_log::Event>& log,
                                 const comm::Communicator& cp);

/// Step 2's whole model: the context-parallel GPT's forward with the attendee's ring (the given
/// mappings) against the single-device GPT on the same global batch: the loss (fp32 1e-5
/// relative, bf16 2e-3) and this rank's rows of the last block's output (fp32 1e-5, bf16 3e-2 of
/// the largest); no backward, so step 3 is not needed. A failure leads with the divergence report.
void model_loss_matches_single_device(DType dt);

/// The whole model: one step of the context-parallel GPT (lab 11's mappings with `attention`,
/// over every rank of the world, at 4x tiny's context, `n_head` heads: 0 for tiny's) against the
/// single-device GPT with the same seed and batch: the loss and every flat gradient, fp32 at the
/// all-reduce tolerances, bf16 at 2e-3 of the loss and 3e-2 of the largest gradient. With
/// `grader_forward` (ring only) the attention's forward is the grader's own (every K/V block
/// all-gathered, each chunk merged by the online softmax) and only its backward the attendee's:
/// step 3's model is graded without step 2.
void model_matches_single_device(DType dt, lab11::Attention attention, int64_t n_head = 0,
                                 bool grader_forward = false);

/// The whole model on the simulated GPU (tests/support/on_sim.hpp) against the same on the host,
/// fp32 and bf16, with `attention`: the forward's loss and last block's output, or with
/// `backward` one step's loss and gradients (`grader_forward`: the grader's own ring forward, as
/// model_matches_single_device), bit for bit. A tensor made without its device or a loop over a
/// block's elements stops with the op's or the tensor's own line: "" or the problems found.
std::string model_runs_on_sim_as_on_host(lab11::Attention attention, bool backward,
                                         bool grader_forward = false);

/// The library's no-overlap baseline while alive (comm::set_overlap(false)), restored on exit
/// even when the code under test throws.
struct NoOverlap {
  NoOverlap() { comm::set_overlap(false); }
  ~NoOverlap() { comm::set_overlap(true); }
  NoOverlap(const NoOverlap&) = delete;
  NoOverlap& operator=(const NoOverlap&) = delete;
};

}  // namespace cptest
