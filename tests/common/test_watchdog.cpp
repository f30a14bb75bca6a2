// The watchdog's bookkeeping, in process: status files, the report built from them, and the
// byte format. (The end-to-end hang tests, which need a job that really hangs and exits 3, are
// the common.watchdog.* entries in tests/common/comm.cmake.)
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
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

// ---- run directories left by killed jobs (issue 9) ------------------------------------------------
// A job killed, aborted or crashed leaves its scalelab-watchdog-* directory; the next start of
// any job removes those whose owner processes are all gone, and never one with a live owner.

namespace {

namespace fs = std::filesystem;

std::string this_host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// Field 22 of /proc/PID/stat, as the watchdog records it.
std::string proc_start(long pid) {
  std::string stat = slurp(fmt::format("/proc/{}/stat", pid));
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i)
    if (i == 22) return field;
  return "";
}

constexpr long kDeadPid = 0x7ffffff0;  // above any pid_max: no such process

void make_run_dir(const fs::path& dir, const std::vector<std::string>& owners) {
  fs::create_directories(dir);
  std::ofstream(dir / "rank-0.txt") << "rank\t0\n";
  for (std::size_t r = 0; r < owners.size(); ++r)
    std::ofstream(dir / fmt::format("owner-{}.txt", r)) << owners[r] << "\n";
}

}  // namespace

TEST(WatchdogRunDirs, OwnerLinesTellLiveFromGone) {
  const long me = ::getpid();
  EXPECT_TRUE(watchdog::owner_alive(fmt::format("{}\t{}\t{}", this_host(), me, proc_start(me))));
  EXPECT_FALSE(watchdog::owner_alive(fmt::format("{}\t{}\t1", this_host(), kDeadPid)));
  EXPECT_FALSE(watchdog::owner_alive(fmt::format("{}\t{}\t{}1", this_host(), me, proc_start(me))))
      << "our pid with another start time: the owner was another process, now gone";
  EXPECT_TRUE(watchdog::owner_alive(fmt::format("elsewhere.example\t{}\t1", kDeadPid)))
      << "another host's process cannot be checked from here: keep its directory";
  EXPECT_TRUE(watchdog::owner_alive("")) << "a line being written: keep";
}

TEST(WatchdogRunDirs, RemovesOnlyDirectoriesWhoseOwnersAreAllGone) {
  if (world_rank() != 0) GTEST_SKIP() << "files only, rank 0 does it";
  const fs::path base = fs::temp_directory_path() / fmt::format("scalelab_wd_base_{}", ::getpid());
  fs::remove_all(base);
  const long me = ::getpid();
  const std::string live = fmt::format("{}\t{}\t{}", this_host(), me, proc_start(me));
  const std::string dead = fmt::format("{}\t{}\t1", this_host(), kDeadPid);
  const std::string reused = fmt::format("{}\t{}\t{}1", this_host(), me, proc_start(me));
  const std::string remote = fmt::format("elsewhere.example\t{}\t1", kDeadPid);
  make_run_dir(base / "scalelab-watchdog-killed", {dead, dead});            // every rank killed
  make_run_dir(base / "scalelab-watchdog-pidreused", {reused});             // pid reused since
  make_run_dir(base / "scalelab-watchdog-running", {dead, live});           // one rank still runs
  make_run_dir(base / "scalelab-watchdog-remote", {remote});                // a rank on another node
  make_run_dir(base / "scalelab-watchdog-ownerless-new", {});               // being created
  make_run_dir(base / "scalelab-watchdog-ownerless-old", {});               // an older build's
  fs::last_write_time(base / "scalelab-watchdog-ownerless-old",
                      fs::file_time_type::clock::now() - std::chrono::hours(1));
  make_run_dir(base / "scalelab-watchdog-mine", {dead});                    // this job's: kept
  make_run_dir(base / "not-a-watchdog-dir", {dead});                        // not ours at all

  EXPECT_EQ(watchdog::remove_stale_run_dirs(base.string(),
                                            (base / "scalelab-watchdog-mine").string(), 600), 3);
  EXPECT_FALSE(fs::exists(base / "scalelab-watchdog-killed"));
  EXPECT_FALSE(fs::exists(base / "scalelab-watchdog-pidreused"));
  EXPECT_FALSE(fs::exists(base / "scalelab-watchdog-ownerless-old"));
  EXPECT_TRUE(fs::exists(base / "scalelab-watchdog-running")) << "a live job's directory";
  EXPECT_TRUE(fs::exists(base / "scalelab-watchdog-remote"));
  EXPECT_TRUE(fs::exists(base / "scalelab-watchdog-ownerless-new"));
  EXPECT_TRUE(fs::exists(base / "scalelab-watchdog-mine"));
  EXPECT_TRUE(fs::exists(base / "not-a-watchdog-dir"));
  fs::remove_all(base);
}

TEST(WatchdogRunDirs, EveryRankRecordsItselfAsAnOwner) {
  // the test main started the watchdog: this rank's owner file names this process
  const std::string line =
      slurp(fmt::format("{}/owner-{}.txt", watchdog::run_dir(), world_rank()));
  EXPECT_NE(line.find(fmt::format("\t{}\t", ::getpid())), std::string::npos) << line;
  EXPECT_TRUE(watchdog::owner_alive(line));
}

TEST(WatchdogRunDirs, AKilledJobsDirectoryIsRemovedByTheNextStart) {
  // End to end: a singleton program (its own job) is SIGKILLed after it started its watchdog;
  // its directory stays. The next program's start removes it.
  if (world_rank() != 0) GTEST_SKIP() << "rank 0 runs the programs";
  const fs::path owner = fs::read_symlink("/proc/self/exe").parent_path() / "watchdog_owner";
  if (!fs::exists(owner)) GTEST_SKIP() << "build the target watchdog_owner (" << owner << ")";
  const fs::path base = fs::temp_directory_path() / fmt::format("scalelab_wd_e2e_{}", ::getpid());
  fs::remove_all(base);
  fs::create_directories(base);
  const auto run_dirs = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(base))
      n += e.path().filename().string().rfind("scalelab-watchdog-", 0) == 0;
    return n;
  };
  // its own job (no launcher variables), its run directory under `base`
  const std::string env = fmt::format("env -u PMIX_NAMESPACE -u SLURM_JOB_ID -u SCALELAB_JOB_ID "
                                      "SCALELAB_RUN_DIR={} ", base.string());
  ASSERT_EQ(std::system((env + "timeout -s KILL 2 " + owner.string() + " 30 >/dev/null").c_str()) != 0, true);
  ASSERT_EQ(run_dirs(), 1) << "the killed program left its directory (the case to clean up)";
  // the next start removes it; that program's own directory goes when it ends normally
  ASSERT_EQ(std::system((env + owner.string() + " 0 >/dev/null").c_str()), 0);
  EXPECT_EQ(run_dirs(), 0) << "a watchdog directory is left under " << base;
  fs::remove_all(base);
}
