// Lab 11 step 2: ring attention, forward, on cp = every rank (1 to 4; the model test skips 3,
// whose chunks its context does not cut into). Against the single
// device's flash attention over the whole sequence (cp_checks.hpp: fp32 1e-5 relative / 1e-6
// absolute, bf16 3e-2). The technique, from the library's counters, never the attendee's report:
//  - bytes (the ledger, raw MPI counted): cp-1 sends of one K/V block each, nothing else, fp32
//    and bf16 (a block on the wire in its own dtype);
//  - peers (the execution log): every send to rank r+1, every receive from r-1; watched while
//    the ring runs too (cptest::RingWatch), so a ring that would hang on wrong peers is named;
//  - memory (the allocator's peak over the call): at most min(2, cp-1) remote K/V blocks at once
//    (the one in use and the one arriving), plus the merge's scratch (one query chunk's output
//    and log-sum-exps: under half a block); and the rank's whole heap (tests/support/heap.hpp)
//    no more than those tensors and bookkeeping, so a block kept in a std::vector counts too;
//  - work (work_stats().matmul_flops: every matmul, batched or fused in flash attention): exactly
//    the zig-zag formula (cptest::zigzag_attention_flops), the same on every rank, so the fully
//    masked blocks were skipped, through whatever op, and the balance holds;
//  - overlap (the execution log, exec_log.hpp: submissions, waits and flash attention calls in
//    program order): each of the cp-1 K/V receives posted before a block's compute started and
//    first waited for after all of its flash calls, i.e. in flight while the block computed.
//    Order, never durations: the check cannot flake with the machine's load;
//  - sends (the same log): every send waited for before the next send to that rank and before
//    return; each K/V receive posted in one batch with a send (send_recv_async: Event::batch).
// Planted into a copy of the reference (solutions/11_context_parallel/planted/cheats.plant;
// labs/11_context_parallel/lab.cmake
// runs these graders on it and expects each to fail where named): an all-gather of every block
// (right numbers; the bytes fail, and at 4 ranks the memory), every block parked in a std::vector
// as it passes (the heap fails), a ring that computes the masked blocks too, by flash attention
// or through ops::batched_matmul (the work count fails), a ring that waits for each step's
// transfers before computing (right numbers, the same bytes: the overlap check fails), a ring that
// waits only for its receives (the send check), lone recv_async/send_async (the batch). Here: the
// library's
// no-overlap baseline (comm::set_overlap(false), what the program's overlap table compares with)
// on the ring under test must fail the overlap check.
#include <gtest/gtest.h>

#include "tests/11_context_parallel/cp_checks.hpp"

using namespace scalelab;

namespace {

constexpr int64_t kBH = 3, kC = 8, kHs = 16;  // heads x batch rows, chunk length, head size

// One forward on every rank; what it gave and what the counters saw.
struct RingRun {
  Tensor y, lse;
  cptest::Mine want;
  comm::Traffic did;  // the ledger over the call, raw MPI counted
  std::size_t peak_extra = 0, kv_bytes = 0;
  ops::WorkCount work;         // the work counters over the call
  labtest::MemoryUse memory;   // the tensors and the rank's whole heap (a std::vector too)
  std::vector<exec_log::Event> log;
  int64_t heap_allowed = 0;  // bookkeeping and the kernels' own scratch (cptest::heap_allowance)
};

RingRun run(DType dt, comm::Communicator& cp, int64_t chunk = kC) {
  const int n = cp.size();
  const int64_t T = 2 * n * chunk;
  const cptest::Full full = cptest::full_attention(kBH, T, kHs, dt, 1000 + n);
  RingRun r;
  r.want = cptest::mine(full, n, cp.rank());
  r.kv_bytes = r.want.kv.nbytes();
  r.y = Tensor::empty(r.want.q.shape(), dt);
  r.heap_allowed = cptest::heap_allowance(kBH, chunk, kHs, /*backward=*/false);
  cp.barrier();  // the communicator lets go of its last operation's tensors
  const ops::WorkCount work = ops::work_stats();
  {
    exec_log::Recording recording;
    const cptest::RingWatch watch(recording, cp, "ring forward");
    r.did = labtest::traffic_of([&] {
      r.memory = labtest::memory_use_of(
          [&] { r.lse = lab11::ring_attention_forward(r.y, r.want.q, r.want.kv, full.scale, cp); });
    });
    r.log = recording.events();
  }
  r.peak_extra = static_cast<std::size_t>(r.memory.tensor_peak);
  r.work = ops::work_stats() - work;
  return r;
}

testing::AssertionResult bytes_ok(const RingRun& r, int n) {
  const std::string p = cptest::sends_problem(r.did, n - 1, r.kv_bytes);
  if (p.empty()) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "ring forward: " << p;
}

testing::AssertionResult memory_ok(const RingRun& r, int n) {
  const std::size_t remote = static_cast<std::size_t>(std::min(2, n - 1)) * r.kv_bytes;
  const std::size_t bound = remote + r.kv_bytes / 2;
  if (r.peak_extra > bound)
    return testing::AssertionFailure()
           << "ring forward held up to " << r.peak_extra << " bytes beyond its inputs: more than "
           << std::min(2, n - 1) << " remote K/V blocks of " << r.kv_bytes
           << " bytes and the merge's scratch (" << bound << " in all)";
  // The heap holds the tensors' host memory too: beyond them, only bookkeeping (the execution
  // log's records, the communicator's), never a K/V block parked in a std::vector or a static.
  return labtest::nothing_beside_tensors(r.memory, r.heap_allowed, "ring forward");
}

testing::AssertionResult work_ok(const RingRun& r, const comm::Communicator& cp) {
  const std::string p = cptest::work_problem(r.work, kBH, kC, kHs, cp, /*backward=*/false);
  if (p.empty()) return testing::AssertionSuccess();
  return testing::AssertionFailure() << p;
}

testing::AssertionResult overlap_ok(const RingRun& r, const comm::Communicator& cp) {
  const std::string p = cptest::overlap_problem(r.log, cp, r.kv_bytes, cp.size() - 1);
  if (p.empty()) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "ring forward: " << p;
}

void output_matches(DType dt) {
  comm::Communicator cp = labtest::new_world();
  const RingRun r = run(dt, cp);
  EXPECT_TRUE(cptest::close_chunks(r.y, r.want.y, cptest::rtol(dt), cptest::atol(dt), "y"));
  EXPECT_TRUE(cptest::close_chunks(r.lse, r.want.lse, cptest::rtol(dt), cptest::atol(dt), "lse"));
}

}  // namespace

// First in the file, so first in step 2's run (tools.memory_first checks it): a buffer the code
// keeps in a function-local static is allocated inside this window, not by an earlier test.
TEST(Step2_Ring, HoldsAtMostTwoRemoteBlocks) {
  comm::Communicator cp = labtest::new_world();
  const RingRun r = run(DType::f32, cp, cptest::kMemoryChunk);
  EXPECT_TRUE(memory_ok(r, cp.size()));
  EXPECT_TRUE(labtest::static_storage_at_most(labtest::kStaticStorageBytes, "ring forward"));
}

TEST(Step2_Ring, OutputEqualsFullAttentionF32) { output_matches(DType::f32); }
TEST(Step2_Ring, OutputEqualsFullAttentionBf16) { output_matches(DType::bf16); }

// The bytes in fp32 and in bf16 (a block sent at the compute dtype's 2 bytes, not widened), and
// every message between ring neighbours (the execution log's peers; a wrong peer seen while the
// ring runs stops it at once: cptest::RingWatch).
TEST(Step2_Ring, SendsCpMinusOneBlocks) {
  comm::Communicator cp = labtest::new_world();
  for (const DType dt : {DType::f32, DType::bf16}) {
    const RingRun r = run(dt, cp);
    EXPECT_TRUE(bytes_ok(r, cp.size())) << "(" << dtype_name(dt) << " K/V blocks)";
    EXPECT_EQ(cptest::direction_problem(r.log, cp, "ring forward"), "");
  }
}

TEST(Step2_Ring, SkipsMaskedBlocksAndIsBalanced) {
  comm::Communicator cp = labtest::new_world();
  const RingRun r = run(DType::f32, cp);
  EXPECT_TRUE(work_ok(r, cp));
}

TEST(Step2_Ring, NextBlockInFlightWhileABlockComputes) {
  comm::Communicator cp = labtest::new_world();
  const RingRun r = run(DType::f32, cp);
  EXPECT_TRUE(overlap_ok(r, cp));
}

// Each step's K/V receive posted in one batch with its send (send_recv_async; the execution
// log's batch numbers): the CPU's MPI overlaps lone ops too, NCCL does not.
TEST(Step2_Ring, PostsEachStepAsOneBatch) {
  comm::Communicator cp = labtest::new_world();
  const RingRun r = run(DType::f32, cp);
  const std::string p = cptest::batch_problem(r.log, cp, r.kv_bytes);
  if (!p.empty()) ADD_FAILURE() << "ring forward: " << p;
}

// Every send waited for before its buffer is used again and before the call returns (the
// execution log's submissions and waits): a ring that waits only for its receives leaves the
// transport reading a buffer the ring (or its caller) may change: a data race whose numbers
// come out wrong only now and then.
TEST(Step2_Ring, WaitsForEverySend) {
  comm::Communicator cp = labtest::new_world();
  const RingRun r = run(DType::f32, cp);
  const std::string p = cptest::sends_waited_problem(r.log, cp);
  if (!p.empty()) ADD_FAILURE() << "ring forward: " << p;
}

// The program's no-overlap baseline (comm::set_overlap(false): every transfer waited for before
// the next compute kernel) turns the ring into one that fails the check (right numbers).
TEST(Step2_PlantedFault, TheLibrarysNoOverlapBaselineFailsTheOverlap) {
  if (labtest::world().size() == 1) GTEST_SKIP() << "a ring of one rank has nothing to overlap";
  comm::Communicator cp = labtest::new_world();
  RingRun r;
  {
    const cptest::NoOverlap baseline;
    r = run(DType::f32, cp);
  }
  EXPECT_TRUE(labtest::close_on_every_rank(r.y, r.want.y, 1e-5, 1e-6));
  EXPECT_FALSE(overlap_ok(r, cp));
}

// The whole model with this ring in its attention: the loss of one global batch and this rank's
// rows of the last block's output beside the single device's (a failure names the first tensor
// that left the twin).
// Not at 3 ranks: the test model's context (4 x its block size, 64) does not cut into 2 x 3
// chunks; the ring alone (Step2_Ring) is graded there.
TEST(Step2_Model, LossEqualsSingleDeviceF32) {
  if (labtest::world().size() == 3)
    GTEST_SKIP() << "the model's context does not cut into 6 chunks";
  cptest::model_loss_matches_single_device(DType::f32);
}

// The ring forward (step 2) in the whole model on the simulated GPU, fp32 and bf16: the host's numbers bit for bit
// (cptest::model_runs_on_sim_as_on_host). Not at 3 ranks, as the model tests above.
TEST(Step2_Model, RunsOnTheSimulatedGpuAsOnTheHost) {
  if (labtest::world().size() == 3)
    GTEST_SKIP() << "the model's context does not cut into 6 chunks";
  const std::string problems = cptest::model_runs_on_sim_as_on_host(lab11::Attention::ring, /*backward=*/false);
  if (!problems.empty()) LABTEST_FAIL() << problems;
  EXPECT_TRUE(labtest::opens_no_sim_kernel_scope());
}
