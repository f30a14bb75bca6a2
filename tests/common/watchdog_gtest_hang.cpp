// A GoogleTest binary whose test hangs on purpose (rank 1 skips an all-reduce and goes on to the
// test main's end-of-test bookkeeping, which the matching check cannot see), run only through
// expect_exit.cmake: checks that the test main's watchdog (SCALELAB_TIMEOUT) turns a hang inside a
// test into exit code 3 with the report, which is what the grader shows as "timed out".
#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"

using namespace scalelab;

TEST(WatchdogInTests, SkippedAllReduceIsReported) {
  auto world = comm::Communicator::world("mpi");
  Tensor t = Tensor::zeros({16});
  if (world.rank() != 1) world.all_reduce(t);
}
