// Planted failures for the MPI-aware test main. These suites never run in the normal suite
// (tests/tools/test_test_main.py runs them one at a time with --gtest_filter and checks what
// rank 0 reports and how the job ends).
#include <csignal>
#include <stdexcept>

#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "common/runtime.hpp"
#include "common/tensor.hpp"
#include "tests/support/drawn.hpp"
#include "common/comm/communicator.hpp"

using scalelab::world_rank;

// An assertion fails on rank 1 only: rank 0 must report it, naming rank 1, and all ranks exit 1.
TEST(SelfTest_FailOnRank1, Fails) { EXPECT_NE(world_rank(), 1) << "planted failure"; }

// Rank 1 throws while the others wait in a barrier: the job must end (not hang) with exit 1.
TEST(SelfTest_ThrowOnRank1, Throws) {
  if (world_rank() == 1) throw std::runtime_error("planted exception");
  MPI_Barrier(MPI_COMM_WORLD);
}

// A check fails on rank 0, then rank 1 throws in the next test: the verdict leads with the
// earlier failure (the first to fix), then names the exception.
TEST(SelfTest_FailThenThrow, AFailsOnRank0) { EXPECT_NE(world_rank(), 0) << "planted failure first"; }
TEST(SelfTest_FailThenThrow, BThrowsOnRank1) {
  if (world_rank() == 1) throw std::runtime_error("planted exception after");
  MPI_Barrier(MPI_COMM_WORLD);
}

// Every rank throws NotImplemented (a starter): the verdict names the step.
TEST(SelfTest_NotImplemented, Throws) {
  throw scalelab::NotImplemented("lab 99 step 1: planted (README.md#step-1)");
}

// A starter's step inside a destructor (lab 05's NoSync: a destructor cannot throw) ends the job
// with the same verdict as a thrown NotImplemented, kept in the run directory as that one is.
struct UnwrittenDestructor {
  ~UnwrittenDestructor() {
    scalelab::not_implemented_in_destructor("lab 99 step 2: planted in a destructor (README.md#step-2)");
  }
};
TEST(SelfTest_NotImplementedInDestructor, Ends) { UnwrittenDestructor scope; }

// A collective check fails because of rank 1: rank 0 only echoes it ("failed on another rank",
// as a check that agrees over every rank says on the ranks that passed), rank 1 gives the cause.
// The verdict must name rank 1 and its cause, not rank 0's echo.
TEST(SelfTest_EchoOnRank0, Fails) {
  if (world_rank() == 0) ADD_FAILURE() << "failed on another rank";
  if (world_rank() == 1) ADD_FAILURE() << "planted cause on rank 1";
}

// Rank 1 is killed by a signal while rank 0 waits: the ranks' running files (SCALELAB_RUN_DIR)
// must name the test, whatever of rank 0's output the launcher forwards before it ends the job.
TEST(SelfTest_SignalOnRank1, Dies) {
  if (world_rank() == 1) std::raise(SIGSEGV);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0's check fails and its test returns (ASSERT) while rank 1 waits in an all-reduce for it:
// the watchdog ends the job, and rank 0's failure must have been said before (the gather at the
// test's end never comes), so the grader can put the cause before the hang.
TEST(SelfTest_FailThenHang, Hangs) {
  auto world = scalelab::comm::Communicator::world("mpi");  // collective: before the check
  ASSERT_NE(world_rank(), 0) << "planted failure before a collective";
  scalelab::Tensor t = scalelab::Tensor::zeros({1});
  world.all_reduce(t);
}

TEST(SelfTest_Passes, Passes) { EXPECT_EQ(1 + 1, 2); }

// A check that explains itself (an AssertionResult), with a message streamed after it: the verdict
// gives the explanation and the message, then where the check is; never the test's source.
testing::AssertionResult within_planted_tolerance() {
  return testing::AssertionFailure() << "max |diff| 0.5 at element 3";
}
TEST(SelfTest_ExplainedCheck, Fails) {
  EXPECT_TRUE(within_planted_tolerance()) << "planted message";
}
// Without a message, the check's short source names what was compared.
TEST(SelfTest_UnnamedCheck, Fails) { EXPECT_TRUE(within_planted_tolerance()); }

// A skip written in a test: the per-rank XML report says where (the grader accepts only skips
// written in the pristine tests).
TEST(SelfTest_Skips, Skips) { GTEST_SKIP() << "planted skip"; }

// Shapes drawn at grading time: two draws of one run, printed with the trace a failure shows. A
// second run given the printed seed (SCALELAB_GRADE_SEED) prints the same numbers.
TEST(SelfTest_Drawn, PrintsItsDraws) {
  for (int i = 0; i < 2; ++i) {
    scalelab::labtest::Drawn draw;
    const int a = draw.in(1, 1000000), b = draw.in(1, 1000000);
    if (world_rank() == 0) fmt::print("draw {} {}: {}\n", a, b, draw.trace());
  }
}
