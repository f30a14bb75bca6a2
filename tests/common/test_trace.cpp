// The Chrome trace: every rank's events, collectives with their bytes, merged by rank 0 into one
// JSON file with pid = rank.
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/comm/bandwidth.hpp"
#include "common/comm/communicator.hpp"
#include "common/runtime.hpp"
#include "common/trace.hpp"

using namespace scalelab;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(Trace, RankZeroMergesEveryRanksEvents) {
  // One path for all ranks, unique per job: rank 0's pid.
  long pid = static_cast<long>(::getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::string path = fmt::format("/tmp/scalelab-test-trace-{}.json", pid);
  trace::enable(path);
  auto world = comm::Communicator::world("mpi");
  {
    trace::Scope s("forward");
    Tensor t = Tensor::zeros({100});  // 400 bytes
    world.all_reduce(t);
  }
  std::size_t n = trace::finish();
  EXPECT_FALSE(trace::enabled());
  if (world_rank() == 0) {
    std::string json = slurp(path);
    EXPECT_EQ(n, 3u * world_size());  // forward, the all_reduce, and the wait for it
    EXPECT_EQ(json.rfind("{\"displayTimeUnit\"", 0), 0u) << json.substr(0, 80);
    EXPECT_EQ(count(json, "\"name\":\"forward\""), world_size()) << json;
    EXPECT_EQ(count(json, "\"name\":\"all_reduce\",\"cat\":\"comm\""), world_size()) << json;
    EXPECT_EQ(count(json, "\"bytes\":400,\"group\":\"world\""), world_size()) << json;
    EXPECT_EQ(count(json, "\"transport\":\"mpi\""), world_size()) << json;
    // The caller blocked in the all_reduce: a span on its compute track (tid 0).
    EXPECT_EQ(count(json, "\"name\":\"wait all_reduce\",\"cat\":\"comm wait\",\"ph\":\"X\""),
              world_size()) << json;
    for (int r = 0; r < world_size(); ++r)
      EXPECT_NE(json.find(fmt::format("\"ph\":\"X\",\"pid\":{},\"tid\":1", r)), std::string::npos)
          << "no comm event of rank " << r;
    // Valid JSON arrays do not end with a comma.
    EXPECT_EQ(json.find(",\n]"), std::string::npos);
    std::remove(path.c_str());
  } else {
    EXPECT_EQ(n, 0u);
  }
}

TEST(Trace, OffCostsNothingAndWritesNothing) {
  trace::reset();
  { trace::Scope s("ignored"); }
  EXPECT_EQ(trace::finish(), 0u);
}

// nccl-tests' factors (doc/PERFORMANCE.md): busbw = algbw * factor.
TEST(Bandwidth, FactorsAsNcclTestsDefineThem) {
  EXPECT_DOUBLE_EQ(comm::busbw_factor("all_reduce", 4), 2.0 * 3 / 4);
  EXPECT_DOUBLE_EQ(comm::busbw_factor("all_reduce", 1), 0.0);
  EXPECT_DOUBLE_EQ(comm::busbw_factor("all_gather", 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(comm::busbw_factor("reduce_scatter", 3), 2.0 / 3);
  EXPECT_DOUBLE_EQ(comm::busbw_factor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(comm::busbw_factor("reduce", 8), 1.0);
  EXPECT_DOUBLE_EQ(comm::algbw(1e9, 0.5), 2e9);
  EXPECT_DOUBLE_EQ(comm::busbw("all_reduce", 2, 1e9, 1.0), 1e9);
  EXPECT_THROW(comm::busbw_factor("all_to_some", 2), UsageError);
  EXPECT_THROW(comm::busbw_factor("all_reduce", 0), UsageError);
}
