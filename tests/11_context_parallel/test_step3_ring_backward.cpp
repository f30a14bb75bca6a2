// Lab 11 step 3: ring attention, backward, on cp = every rank (1 to 4; the model tests skip 3).
//  - The attention alone, from the single device's y and lse (this rank's rows of them: so this
//    step is graded without step 2): dq and dK/dV of this rank's rows against the single device's flash backward (fp32
//    1e-5 relative / 1e-6 absolute; bf16 3e-2: every block's gradient rounds before it is summed).
//  - Bytes (the ledger, raw MPI counted), fp32 and bf16: K/V blocks cp-1 times, their dK/dV cp
//    times (round the ring and home); nothing at cp = 1. Peers: to r+1, from r-1, as step 2.
//  - Work (work_stats().matmul_flops: every matmul, batched or fused): the zig-zag formula for the
//    backward (cptest::zigzag_attention_flops), so the fully masked blocks were skipped.
//  - Memory (the allocator and the heap): at most min(2, cp-1) remote K/V blocks, two dK/dV
//    blocks and one block of scratch; nothing held outside the allocator but bookkeeping.
//  - Overlap (the execution log, as step 2): the cp-1 K/V blocks' receives posted before a
//    block's compute started and first waited for after it started (the dK/dV that follow a
//    block need its compute first, so only the K/V blocks are asked to overlap; told apart from
//    the dK/dV receives, the same size, by tag (the K/V blocks' is the first send's) or, on one
//    tag, by order); each dK/dV receive posted only after a block computed here (earlier, the
//    ring deadlocks on NCCL and under the no-overlap baseline, which Step3_PlantedFault runs).
//  - Sends, as step 2: every send waited for in time, each receive batched with a send.
//  - The whole model: the context-parallel GPT (the given mappings with the grader's own ring
//    forward, so this step is graded without step 2 too; the grader's positions and rows)
//    against the single-device GPT with the same seed and global batch, loss and every gradient
//    after the all-reduce: fp32 1e-5 relative (the loss) and kAllReduceRtol / kAllReduceAtol
//    (gradients); bf16 2e-3 of the loss and 3e-2 of the largest gradient (as labs 07 and 10).
// Planted into a copy of the reference (solutions/11_context_parallel/planted/cheats.plant;
// labs/11_context_parallel/lab.cmake):
// dK/dV that do not travel (each rank keeps what its queries gave the blocks it saw) fail the
// gradient check; the masked blocks' scores computed through ops::batched_matmul fail the work;
// a backward that gathers every K/V block first and parks them in a std::vector fails the memory
// check; a backward that waits for every K/V block before computing but posts the dK/dV receive
// early fails the overlap check; two dK/dV buffers allocated once must pass (a control). Here: the
// backward under the library's no-overlap baseline (comm::set_overlap(false):
// each transfer waited for before the next block computes; right gradients) must fail the
// overlap check.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/data/sampler.hpp"
#include "tests/11_context_parallel/cp_checks.hpp"

using namespace scalelab;

namespace {

constexpr int64_t kBH = 3, kC = 8, kHs = 16;

struct Grads {
  Tensor dq, dkv;
  cptest::Mine want;
  comm::Traffic did;    // the ledger over the call, raw MPI counted
  ops::WorkCount work;  // the work counters over the call
  std::vector<exec_log::Event> log;
};

Grads run(DType dt, comm::Communicator& cp) {
  const int n = cp.size();
  const cptest::Full full = cptest::full_attention(kBH, 2 * n * kC, kHs, dt, 2000 + n);
  Grads g;
  g.want = cptest::mine(full, n, cp.rank());
  g.dq = Tensor::empty(g.want.q.shape(), dt);
  g.dkv = Tensor::empty(g.want.kv.shape(), dt);
  cp.barrier();
  const ops::WorkCount work = ops::work_stats();
  {
    exec_log::Recording recording;
    const cptest::RingWatch watch(recording, cp, "ring backward");
    g.did = labtest::traffic_of([&] {
      lab11::ring_attention_backward(g.dq, g.dkv, g.want.dy, g.want.q, g.want.kv, g.want.y,
                                     g.want.lse, full.scale, cp);
    });
    g.log = recording.events();
  }
  g.work = ops::work_stats() - work;
  return g;
}

void gradients_match(DType dt) {
  comm::Communicator cp = labtest::new_world();
  const Grads g = run(dt, cp);
  EXPECT_TRUE(cptest::close_chunks(g.dq, g.want.dq, cptest::rtol(dt), cptest::atol(dt), "dq"));
  EXPECT_TRUE(cptest::close_chunks(g.dkv, g.want.dkv, cptest::rtol(dt), cptest::atol(dt), "dkv"));
}

}  // namespace

// Memory (the allocator and the rank's whole heap, over the call): at most min(2, cp-1) remote
// K/V blocks (the one in use, the one arriving), two dK/dV blocks (the one this rank adds to, the
// one arriving) and one block of scratch (one query chunk's dq, dk and dv: 3/4 of a block).
// First in the file, so first in step 3's run (tools.memory_first checks it): a buffer the code
// keeps in a function-local static is allocated inside this window, not by an earlier test.
TEST(Step3_Ring, HoldsAtMostTwoRemoteBlocksAndTwoGradientBlocks) {
  comm::Communicator cp = labtest::new_world();
  const int n = cp.size();
  const cptest::Full full =
      cptest::full_attention(kBH, 2 * n * cptest::kMemoryChunk, kHs, DType::f32, 2000 + n);
  const cptest::Mine want = cptest::mine(full, n, cp.rank());
  Tensor dq = Tensor::empty(want.q.shape()), dkv = Tensor::empty(want.kv.shape());
  cp.barrier();  // the communicator lets go of its last operation's tensors
  // watched as the other tests' calls (cptest::RingWatch): this test runs first, so a ring whose
  // peers are wrong stops here, named, instead of hanging
  exec_log::Recording recording;
  const cptest::RingWatch watch(recording, cp, "ring backward");
  const labtest::MemoryUse m = labtest::memory_use_of([&] {
    lab11::ring_attention_backward(dq, dkv, want.dy, want.q, want.kv, want.y, want.lse,
                                   full.scale, cp);
  });
  const auto block = static_cast<int64_t>(want.kv.nbytes());
  const int64_t bound = (std::min(2, n - 1) + 2 + 1) * block;
  EXPECT_LE(m.tensor_peak, bound)
      << "ring backward held up to " << m.tensor_peak << " bytes of tensors beyond its inputs: "
      << "more than " << std::min(2, n - 1) << " remote K/V blocks and 2 dK/dV blocks of "
      << block << " bytes and one block of scratch";
  // beside the tensors: bookkeeping and the flash backward's own scratch, measured at this shape
  const int64_t allowed = cptest::heap_allowance(kBH, cptest::kMemoryChunk, kHs, true);
  EXPECT_TRUE(labtest::nothing_beside_tensors(m, allowed, "ring backward"));
  EXPECT_TRUE(labtest::static_storage_at_most(labtest::kStaticStorageBytes, "ring backward"));
}

TEST(Step3_Ring, GradientsEqualFullAttentionF32) { gradients_match(DType::f32); }
TEST(Step3_Ring, GradientsEqualFullAttentionBf16) { gradients_match(DType::bf16); }

// fp32 and bf16 (the blocks and their dK/dV at the compute dtype's 2 bytes); every message
// between ring neighbours, the last hop home too (the execution log's peers).
TEST(Step3_Ring, SendsEachBlockAndItsGradient) {
  comm::Communicator cp = labtest::new_world();
  const int n = cp.size();
  for (const DType dt : {DType::f32, DType::bf16}) {
    const Grads g = run(dt, cp);
    // at cp = 1 nothing travels: the only block is this rank's, and its dK/dV are home already
    const int64_t blocks = n == 1 ? 0 : 2 * n - 1;
    const std::string p = cptest::sends_problem(g.did, blocks, g.want.kv.nbytes());
    EXPECT_EQ(p, "") << "ring backward (" << dtype_name(dt) << "): "
                     << (n == 1 ? "a ring of one rank sends nothing"
                                : fmt::format("K/V blocks {} times and dK/dV {} times", n - 1, n));
    EXPECT_EQ(cptest::direction_problem(g.log, cp, "ring backward"), "");
  }
}

TEST(Step3_Ring, SkipsMaskedBlocksAndIsBalanced) {
  comm::Communicator cp = labtest::new_world();
  const Grads g = run(DType::f32, cp);
  const std::string p = cptest::work_problem(g.work, kBH, kC, kHs, cp, /*backward=*/true);
  if (!p.empty()) ADD_FAILURE() << p;
}

TEST(Step3_Ring, NextBlockInFlightWhileABlockComputes) {
  comm::Communicator cp = labtest::new_world();
  const Grads g = run(DType::f32, cp);
  const std::string p = cptest::overlap_problem(g.log, cp, g.want.kv.nbytes(), cp.size() - 1, true);
  EXPECT_EQ(p, "") << "ring backward";
}

// As step 2: each K/V receive (and each dK/dV receive: the same size) in one batch with a send;
// and each dK/dV receive posted only after this rank computed on the block (its sender sends
// after computing: posted earlier, the ring deadlocks on NCCL and under the no-overlap baseline).
TEST(Step3_Ring, PostsEachStepAsOneBatch) {
  comm::Communicator cp = labtest::new_world();
  const Grads g = run(DType::f32, cp);
  const std::string p = cptest::batch_problem(g.log, cp, g.want.kv.nbytes());
  if (!p.empty()) ADD_FAILURE() << "ring backward: " << p;
  const std::string early = cptest::dkdv_posted_problem(g.log, cp, g.want.kv.nbytes());
  if (!early.empty()) ADD_FAILURE() << "ring backward: " << early;
}

// As step 2: every send (K/V blocks and their dK/dV) waited for before its buffer is used again
// and before the call returns.
TEST(Step3_Ring, WaitsForEverySend) {
  comm::Communicator cp = labtest::new_world();
  const Grads g = run(DType::f32, cp);
  const std::string p = cptest::sends_waited_problem(g.log, cp);
  if (!p.empty()) ADD_FAILURE() << "ring backward: " << p;
}

// Not at 3 ranks: the test model's context (4 x its block size, 64) does not cut into 2 x 3
// chunks; the ring alone (Step3_Ring) is graded there.
TEST(Step3_Model, LossAndGradientsEqualSingleDeviceF32) {
  if (labtest::world().size() == 3)
    GTEST_SKIP() << "the model's context does not cut into 6 chunks";
  cptest::model_matches_single_device(DType::f32, lab11::Attention::ring, 0,
                                     /*grader_forward=*/true);
}
TEST(Step3_Model, LossAndGradientsEqualSingleDeviceBf16) {
  if (labtest::world().size() == 3)
    GTEST_SKIP() << "the model's context does not cut into 6 chunks";
  cptest::model_matches_single_device(DType::bf16, lab11::Attention::ring, 0,
                                     /*grader_forward=*/true);
}

TEST(Step3_PlantedFault, WaitingForEachBlockBeforeComputingFailsTheOverlap) {
  if (labtest::world().size() == 1) GTEST_SKIP() << "a ring of one rank has nothing to overlap";
  comm::Communicator cp = labtest::new_world();
  {  // a dK/dV receive posted before the compute deadlocks under the baseline: said, not run
    const Grads plain = run(DType::f32, cp);
    const std::string early = cptest::dkdv_posted_problem(plain.log, cp, plain.want.kv.nbytes());
    testing::AssertionResult ok = testing::AssertionSuccess();
    if (!early.empty()) ok = testing::AssertionFailure() << "ring backward: " << early;
    ok = labtest::on_every_rank(ok);
    if (!ok) {
      ADD_FAILURE() << ok.message() << " (the no-overlap baseline is not run on it: it would hang)";
      return;
    }
  }
  Grads g;
  {
    const cptest::NoOverlap baseline;
    g = run(DType::f32, cp);
  }
  EXPECT_TRUE(labtest::close_on_every_rank(g.dkv, g.want.dkv, 1e-5, 1e-6));  // right numbers
  EXPECT_NE(cptest::overlap_problem(g.log, cp, g.want.kv.nbytes(), cp.size() - 1, true), "");
}

// The ring backward (step 3, after the grader's own forward) in the whole model on the simulated GPU, fp32 and bf16: the host's numbers bit for bit
// (cptest::model_runs_on_sim_as_on_host). Not at 3 ranks, as the model tests above.
TEST(Step3_Model, RunsOnTheSimulatedGpuAsOnTheHost) {
  if (labtest::world().size() == 3)
    GTEST_SKIP() << "the model's context does not cut into 6 chunks";
  const std::string problems = cptest::model_runs_on_sim_as_on_host(lab11::Attention::ring, /*backward=*/true, /*grader_forward=*/true);
  if (!problems.empty()) LABTEST_FAIL() << problems;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
