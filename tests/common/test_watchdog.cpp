// The watchdog's bookkeeping, in process: status files, the report built from them, and the
// byte format. (The end-to-end hang tests, which need a job that really hangs and exits 3, are
// the common.watchdog.* entries in tests/common/comm.cmake.)
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/runtime.hpp"
#include "common/watchdog.hpp"

using namespace scalelab;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
}  // namespace

TEST(Watchdog, FormatsBytes) {
  EXPECT_EQ(watchdog::format_bytes(0), "0 B");
  EXPECT_EQ(watchdog::format_bytes(12), "12 B");
  EXPECT_EQ(watchdog::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(watchdog::format_bytes(4 << 20), "4 MiB");
}

TEST(Watchdog, TimeoutFromEnvironment) {
  ::setenv("SCALELAB_TIMEOUT", "7.5", 1);
  EXPECT_DOUBLE_EQ(watchdog::timeout_from_env(60), 7.5);
  ::setenv("SCALELAB_TIMEOUT", "soon", 1);
  EXPECT_THROW(watchdog::timeout_from_env(60), UsageError);
  ::unsetenv("SCALELAB_TIMEOUT");
  EXPECT_DOUBLE_EQ(watchdog::timeout_from_env(60), 60);
}

// Every rank registers an operation it "waits" in; each status file shows it, and the report
// built from the files names every rank with its collective and sequence number.
TEST(Watchdog, StatusFilesAndReportNameEveryRank) {
  const int rank = world_rank(), size = world_size();
  const std::string dir = watchdog::run_dir();
  ASSERT_FALSE(dir.empty()) << "the test main starts the watchdog";
  int group = watchdog::register_group("wdtest", [&] {
    std::vector<int> all;
    for (int r = 0; r < size; ++r) all.push_back(r);
    return all;
  }());
  // Every rank finished #1; rank 0 waits in all_reduce #2, the others in barrier #2 (a mismatch,
  // as when ranks take different code paths).
  auto t1 = watchdog::enter(group, rank == 0 ? "all_reduce" : "barrier", 1, 64, true);
  watchdog::leave(t1);
  auto t2 = watchdog::enter(group, rank == 0 ? "all_reduce" : "barrier", 2,
                            rank == 0 ? (4u << 20) : 0, true);
  sleep_ms(350);  // the watchdog thread writes every 100 ms
  std::string mine = slurp(fmt::format("{}/rank-{}.txt", dir, rank));
  EXPECT_NE(mine.find(rank == 0 ? "wait\tall_reduce\t2\t4194304\twdtest" : "wait\tbarrier\t2\t0\twdtest"),
            std::string::npos)
      << mine;
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's file is written
  if (rank == 0) {
    std::string report = watchdog::build_report(dir, 0, size);
    EXPECT_NE(report.find("watchdog: rank 0 waits in all_reduce #2 (4 MiB, group wdtest)"),
              std::string::npos)
        << report;
    if (size > 1) {
      std::string others = size == 2 ? "rank 1 is in barrier #2" : "ranks 1";
      EXPECT_NE(report.find(others), std::string::npos) << report;
      EXPECT_NE(report.find("entered barrier #2 where rank 0 entered all_reduce #2"),
                std::string::npos)
          << report;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  watchdog::leave(t2);
  sleep_ms(250);
  std::string after = slurp(fmt::format("{}/rank-{}.txt", dir, rank));
  EXPECT_EQ(after.find("wait\t"), std::string::npos) << after;
  EXPECT_NE(after.find("group\twdtest"), std::string::npos) << after;
  MPI_Barrier(MPI_COMM_WORLD);
}

// A rank that has not reached the collective the others wait in is named as behind.
TEST(Watchdog, ReportNamesTheRankThatIsBehind) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int rank = world_rank(), size = world_size();
  std::vector<int> all;
  for (int r = 0; r < size; ++r) all.push_back(r);
  int group = watchdog::register_group("behind", all);
  std::uint64_t t = 0;
  if (rank != 1) t = watchdog::enter(group, "all_reduce", 1, 4, true);
  sleep_ms(350);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::string report = watchdog::build_report(watchdog::run_dir(), 0, size);
    EXPECT_NE(report.find("rank 1 did not reach all_reduce #1 of group behind"), std::string::npos)
        << report;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (t) watchdog::leave(t);
}
