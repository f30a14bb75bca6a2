// Lab 08 step 5 graders: the bubble formula, the bubble measured from a run's own timings, and
// the activation memory each schedule holds, from the allocator's counters (exact, repeatable:
// no timing is asserted against a formula, since CI's ranks share 2 cores).
// The peak is the grader's own measurement around the real run (the allocator's counters), and
// what ran is the library's execution log; the attendee's measure_peak_activation_bytes must
// report that same peak (within half a micro-batch), also when it is called after earlier work
// left the allocator's peak higher (a tensor allocated and freed before the call: planted,
// lab08.planted.no_peak_reset).
// Memory: A = one micro-batch's activations on this stage (GPTActivations::nbytes after one
// forward), P1 = the peak of one micro-batch's forward + backward (A plus backward's
// temporaries). A schedule that holds k micro-batches peaks near P1 + (k - 1) A; the check
// allows half an A over that (messages in flight), and the planted 1F1B with a warm-up one too
// long holds one more, a whole A more. The rank's whole heap over the same run (heap.hpp) may
// exceed the tensors by bookkeeping only (MemoryBounds::bookkeeping): copies of the activations
// kept in a std::vector or a static beside the tensors fail as tensors would (planted:
// lab08.planted.activations_in_vector).
#include <gtest/gtest.h>

#include <cmath>

#include "common/allocator.hpp"
#include "common/exec_log.hpp"
#include "pipeline_parallel.hpp"
#include "pp_test.hpp"
#include "tests/support/memory_use.hpp"
#include "tests/support/own_work.hpp"

using namespace scalelab;
using namespace scalelab::lab08;
using pptest::kLab;

namespace {

// The run held k micro-batches by the grader's measurement (`measured`), and the attendee's
// function reported that peak (within half a micro-batch: the two windows open a few
// allocations apart).
testing::AssertionResult peak_check(std::size_t reported, std::size_t measured,
                                    const pptest::MemoryBounds& b, int k, const std::string& what) {
  if (auto ok = b.holds(measured, k, what + " (measured by the grader around the run)"); !ok)
    return ok;
  const double off = std::abs(static_cast<double>(reported) - static_cast<double>(measured));
  if (off > b.a / 2)
    return testing::AssertionFailure()
           << what << ": measure_peak_activation_bytes reported " << reported
           << " bytes, the allocator's peak around the same run was " << measured;
  return testing::AssertionSuccess();
}

// The function called again once a tensor of `stale` bytes, more than the run's peak, has been
// allocated and freed: the allocator's peak then stands above anything the run reaches, and the
// function must still report the run's own peak (`measured`, the grader's, within half an A).
testing::AssertionResult stale_peak_check(std::size_t reported, std::size_t measured,
                                          int64_t stale, const pptest::MemoryBounds& b,
                                          const std::string& what) {
  const double off = std::abs(static_cast<double>(reported) - static_cast<double>(measured));
  if (off > b.a / 2)
    return testing::AssertionFailure()
           << what << ": measure_peak_activation_bytes reported " << reported << " bytes when "
           << "called after a tensor of " << stale << " bytes had been allocated and freed (the "
           << "allocator's peak stood above this run's), " << measured << " for the same run "
           << "before: it must report the peak of its own run, whatever came before the call";
  return testing::AssertionSuccess();
}

}  // namespace

// First in the file, so first in step 5's run (tools.memory_first checks it): a buffer the code
// keeps in a function-local static is allocated inside this window, not by an earlier test.
TEST(Step5_Memory, AfabHoldsEveryMicroBatchOneFOneBAtMostPMinusStage) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  constexpr int kM = 8;
  auto pieces = pptest::pieces_of(p, 1, s);
  const std::vector<data::Batch> micro = pptest::split(kLab.batch(0), kM);
  // The communicator's worker thread frees a finished message's buffer a little after the
  // message completes: under load, an earlier test's tied-gradient send (a view that keeps
  // that stage's whole gradient buffer, 136 KiB, alive) was freed in the middle of the
  // measurements below. A barrier runs on that same thread after it, so nothing allocated
  // before the measurements is freed during them.
  pp.barrier();
  const pptest::MemoryBounds b = pptest::bounds(*pieces[0], micro);
  testing::AssertionResult ok = testing::AssertionSuccess();
  for (const bool afab : {true, false}) {
    const Schedule schedule = pptest::test_schedule(afab, p, kM, s);
    const std::string what = fmt::format("{} stage {} of {}", afab ? "AFAB" : "1F1B", s, p);
    // The grader's own measurement around the real run (the allocator's peak, and what ran from
    // the library's log), beside the number the attendee's function reports.
    pp.barrier();
    exec_log::Recording recording;
    std::size_t reported = 0;
    const labtest::MemoryUse m = labtest::memory_use_of([&] {
      reported = measure_peak_activation_bytes(pptest::raw(pieces), schedule, micro, pp);
    });
    const auto measured = static_cast<std::size_t>(m.tensor_peak);
    const pptest::Executed e = pptest::executed(recording.events(), pptest::raw(pieces), pp,
                                                kLab.global_batch / kM * kLab.config().block_size *
                                                    kLab.config().n_embd * 4);
    if (ok) ok = pptest::ran(e, schedule, /*with_messages=*/true);
    // the rank's whole heap: the tensors and bookkeeping, never copies kept beside them
    const int k = afab ? kM : std::min(p - s, kM);  // micro-batches held
    if (ok) ok = peak_check(reported, measured, b, k, what);
    if (ok) ok = labtest::nothing_beside_tensors(m, b.bookkeeping(k), what);
    // Once more, with a peak left behind by earlier work: a tensor above the run's peak
    // allocated and freed just before the call.
    const auto stale = static_cast<int64_t>(2 * measured + 4 * b.a);
    { const Tensor above = Tensor::empty({stale / 4}); }  // freed here: the peak stays
    pp.barrier();
    const std::size_t again =
        measure_peak_activation_bytes(pptest::raw(pieces), schedule, micro, pp);
    if (ok) ok = stale_peak_check(again, measured, stale, b, what);
  }
  EXPECT_TRUE(pptest::on_every_rank(ok));
  EXPECT_TRUE(labtest::static_storage_at_most(labtest::kStaticStorageBytes, "lab 08 step 5"));
}

TEST(Step5_Formula, BubbleFractions) {
  EXPECT_DOUBLE_EQ(bubble_formula(Kind::afab, 4, 1), 0.75);
  EXPECT_DOUBLE_EQ(bubble_formula(Kind::one_f_one_b, 4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(bubble_formula(Kind::one_f_one_b, 4, 16), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(bubble_formula(Kind::afab, 1, 8), 0.0);
  EXPECT_DOUBLE_EQ(bubble_formula(Kind::interleaved, 4, 4, 2), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_formula(Kind::interleaved, 2, 8, 4), 1.0 / 33.0);
}

TEST(Step5_Measure, ComputeAndWaitFromTheTimeline) {
  ExecStats st;
  // The sends take time too (starting one is not free): they are neither compute nor waiting for
  // a neighbour, so wait_s is the receives' time alone (planted: sends_counted_as_wait).
  st.actions = {{{Op::recv_activation, 0}, 0.0, 0.5}, {{Op::forward, 0}, 0.5, 1.5},
                {{Op::send_activation, 0}, 1.5, 1.75}, {{Op::recv_gradient, 0}, 1.75, 3.25},
                {{Op::backward, 0}, 3.25, 5.25},      {{Op::send_gradient, 0}, 5.25, 5.5}};
  st.step_s = 6.0;
  const StageTime t = measure_stage_time(st);
  EXPECT_DOUBLE_EQ(t.compute_s, 3.0);
  EXPECT_DOUBLE_EQ(t.wait_s, 2.0) << "the time waiting for a neighbour: the receives' (0.5 s and "
                                     "1.5 s), not the sends' (0.25 s each)";
  EXPECT_DOUBLE_EQ(t.step_s, 6.0);
  EXPECT_DOUBLE_EQ(t.bubble, 0.5);
}

TEST(Step5_Measure, FromARealRun) {
  comm::Communicator& pp = labtest::world();
  const int p = pp.size(), s = pp.rank();
  auto pieces = pptest::pieces_of(p, 1, s);
  ExecStats st;
  pipeline_step(pptest::raw(pieces), pptest::test_schedule(false, p, 4, s), kLab.batch(0), 4, pp, &st);
  const StageTime t = measure_stage_time(st);
  EXPECT_GT(t.compute_s, 0.0);
  EXPECT_LE(t.compute_s + t.wait_s, t.step_s * (1 + 1e-9)) << "compute and waiting do not overlap";
  EXPECT_GE(t.bubble, 0.0);
  EXPECT_LT(t.bubble, 1.0);
  if (p == 1) EXPECT_EQ(t.wait_s, 0.0) << "one stage never waits";
}

TEST(Step5_PlantedFault, WarmupOneTooLongHoldsOneMore) {
  // The same memory check on a stage run alone (pp_test.cpp) under 1F1B and under 1F1B with a
  // warm-up of p - stage forwards: the second holds one micro-batch more and fails it.
  constexpr int kP = 4, kM = 8;
  const std::vector<data::Batch> micro = pptest::split(kLab.batch(0), kM);
  labtest::world().barrier();  // see Step5_Memory: nothing from earlier tests freed meanwhile
  for (int s = 0; s < kP; ++s) {
    const auto [first, last] = pptest::blocks_of(4, kP, s);
    nn::GPT stage(kLab.config(), {.seed = kLab.seed, .first_block = first, .last_block = last});
    const pptest::MemoryBounds b = pptest::bounds(stage, micro);
    const Schedule planted = pptest::test_schedule(false, kP, kM, s, /*extra_warmup=*/1);
    const std::size_t peak = pptest::local_stage_peak(stage, planted, micro);
    EXPECT_FALSE(b.holds(peak, std::min(kP - s, kM), "planted"))
        << "stage " << s << ": the memory check must fail when the warm-up is one too long";
  }
}

// A measurement that reports what the schedule promises (the 1F1B figure) while the run holds
// every micro-batch (an executor running AFAB): the grader's own measurement of the real run
// fails the check whatever the report says.
TEST(Step5_PlantedFault, AReportedPeakThatIsNotTheRunsIsCaught) {
  constexpr int kP = 4, kM = 8, kStage = 0;
  const std::vector<data::Batch> micro = pptest::split(kLab.batch(0), kM);
  labtest::world().barrier();  // see Step5_Memory
  const auto [first, last] = pptest::blocks_of(4, kP, kStage);
  nn::GPT stage(kLab.config(), {.seed = kLab.seed, .first_block = first, .last_block = last});
  const pptest::MemoryBounds b = pptest::bounds(stage, micro);
  const int k = std::min(kP - kStage, kM);
  const auto promised = static_cast<std::size_t>(b.p1 + (k - 1) * b.a);
  const std::size_t ran_1f1b = pptest::local_stage_peak(stage, pptest::test_schedule(false, kP, kM, kStage), micro);
  const std::size_t ran_afab = pptest::local_stage_peak(stage, pptest::test_schedule(true, kP, kM, kStage), micro);
  EXPECT_TRUE(peak_check(ran_1f1b, ran_1f1b, b, k, "the base")) << "1F1B run and reported passes";
  EXPECT_FALSE(peak_check(promised, ran_afab, b, k, "planted"))
      << "the memory check must fail when the run holds every micro-batch";
}
