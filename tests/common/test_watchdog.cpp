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

// ---- who stopped: the report's lead, from status files written by hand (issue 22) ----------
// A stopped process cannot answer; its peers infer it from its heartbeat (a `beat` line older
// than watchdog::stale_after) or from being in no operation while others wait for it. These
// tests write the status files of a 4-rank job themselves, so each case is exact.

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One rank's status file. `beat_age`: seconds since its heartbeat; `waits`: "kind\tseq\tbytes\t
// group\tdetail\tpeer" lines begun 10 s ago; `groups`: "name\tmembers\tlast_seq\tlast_kind".
struct FakeRank {
  double beat_age = 0.1;
  double progress_age = 10;
  std::vector<std::string> waits, groups;
};

std::string write_job(const std::vector<FakeRank>& ranks, const std::string& name) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("{}_{}", name, ::getpid())).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const double now = now_s();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::ofstream f(fmt::format("{}/rank-{}.txt", dir, r));
    f << fmt::format("rank\t{}\nbeat\t{:.6f}\nprogress\t{:.6f}\n", r, now - ranks[r].beat_age,
                     now - ranks[r].progress_age);
    for (const auto& w : ranks[r].waits) {
      // kind seq bytes group detail peer -> the file's order: kind seq bytes group start detail peer
      std::vector<std::string> v;
      std::stringstream ss(w);
      std::string item;
      while (std::getline(ss, item, '\t')) v.push_back(item);
      f << fmt::format("wait\t{}\t{}\t{}\t{}\t{:.6f}\t{}\t{}\n", v[0], v[1], v[2], v[3], now - 10,
                       v[4], v[5]);
    }
    for (const auto& g : ranks[r].groups) f << "group\t" << g << "\n";
  }
  return dir;
}

std::string first_line(const std::string& report) { return report.substr(0, report.find('\n')); }

}  // namespace

// Rank 2 of 4 stopped (SIGSTOP) while the others wait in all_reduce #7 of the world: its file
// still says it was in #6, or even in #7; its heartbeat is 30 s old. It leads the report.
TEST(WatchdogReport, AStoppedRankInTheMiddleLeads) {
  if (world_rank() != 0) GTEST_SKIP() << "files only, rank 0 does it";
  const std::string world = "world\t0,1,2,3\t6\tall_reduce";
  std::vector<FakeRank> job(4);
  for (int r : {0, 1, 3}) job[r] = {0.1, 10, {"all_reduce\t7\t64\tworld\t\t-1"}, {world}};
  job[2] = {30, 30, {"all_reduce\t7\t64\tworld\t\t-1"}, {world}};  // in #7 when it stopped
  const std::string dir = write_job(job, "wd_stopped_middle");
  const std::string report = watchdog::build_report(dir, 1, 4);
  EXPECT_EQ(first_line(report).rfind("[scalelab] watchdog: rank 2 does not run: no heartbeat from "
                                     "it for 30.", 0), 0u) << report;
  EXPECT_NE(report.find("while ranks 0,1,3 wait for it; its last status: in all_reduce #7 (64 B, "
                        "group world)"), std::string::npos) << report;
  EXPECT_NE(report.find("ranks 0,1,3 wait for rank 2 in all_reduce #7 (64 B, group world) for 10."),
            std::string::npos) << report;
  std::filesystem::remove_all(dir);
}

// Rank 0 stopped outside any operation. Rank 1 waits in a send to it; rank 3 waits in an
// all-reduce of group {1, 3} for rank 1, which is in that send: the chain runs 3 -> 1 -> 0, and
// rank 2, in a collective with rank 0, waits for it directly.
TEST(WatchdogReport, RankZeroStoppedAndTheChainOfWaits) {
  if (world_rank() != 0) GTEST_SKIP() << "files only, rank 0 does it";
  std::vector<FakeRank> job(4);
  job[0] = {20, 20, {}, {"pp0\t0,1\t0\t-", "pair0\t0,2\t4\tall_reduce"}};
  job[1] = {0.1, 10, {"send\t5\t4096\tpp0\tto rank 0\t0"}, {"pp0\t0,1\t0\t-", "dp1\t1,3\t4\tall_reduce"}};
  job[2] = {0.1, 10, {"all_reduce\t5\t64\tpair0\t\t-1"}, {"pair0\t0,2\t4\tall_reduce"}};
  job[3] = {0.1, 10, {"all_reduce\t5\t64\tdp1\t\t-1"}, {"dp1\t1,3\t4\tall_reduce"}};
  const std::string dir = write_job(job, "wd_stopped_zero");
  const std::string report = watchdog::build_report(dir, 3, 4);
  EXPECT_EQ(first_line(report).rfind("[scalelab] watchdog: rank 0 does not run", 0), 0u) << report;
  EXPECT_NE(first_line(report).find("while ranks 1,2 wait for it; its last status: in no "
                                    "collective"), std::string::npos) << report;
  // nearest first: the ranks that wait for rank 0, then rank 3, which waits for rank 1
  const std::size_t direct = report.find("rank 1 waits for rank 0 in send #5 (4 KiB, group pp0");
  const std::size_t chained = report.find("rank 3 waits for rank 1 in all_reduce #5 (64 B, group dp1)");
  EXPECT_NE(direct, std::string::npos) << report;
  EXPECT_NE(chained, std::string::npos) << report;
  EXPECT_LT(direct, chained) << report;
  std::filesystem::remove_all(dir);
}

// Every heartbeat is fresh: rank 1 runs, but is in no operation while rank 0 waits for it in a
// collective rank 1 has not reached (it skipped it, or computes forever): rank 1 leads.
TEST(WatchdogReport, ARankInNoCollectiveThatOthersWaitForLeads) {
  if (world_rank() != 0) GTEST_SKIP() << "files only, rank 0 does it";
  std::vector<FakeRank> job(2);
  job[0] = {0.1, 10, {"all_reduce\t2\t64\tworld\t\t-1"}, {"world\t0,1\t1\tall_reduce"}};
  job[1] = {0.1, 12.5, {}, {"world\t0,1\t1\tall_reduce"}};
  const std::string dir = write_job(job, "wd_idle");
  const std::string report = watchdog::build_report(dir, 0, 2);
  EXPECT_EQ(first_line(report).rfind("[scalelab] watchdog: rank 1 is in no collective and has "
                                     "made no progress for 12.", 0), 0u) << report;
  EXPECT_NE(report.find("rank 0 waits for rank 1 in all_reduce #2 (64 B, group world)"),
            std::string::npos) << report;
  std::filesystem::remove_all(dir);
}

// When every rank waits and none waits for a rank that is stopped or idle (ranks that called
// different collectives), nobody stopped: the reporting rank leads, as before, with the mismatch.
// A rank without a heartbeat line (an older build's file) never counts as stopped.
TEST(WatchdogReport, WithoutARootTheReporterLeads) {
  if (world_rank() != 0) GTEST_SKIP() << "files only, rank 0 does it";
  std::vector<FakeRank> job(2);
  job[0] = {0.1, 10, {"all_reduce\t1\t64\tworld\t\t-1"}, {"world\t0,1\t0\t-"}};
  job[1] = {0.1, 10, {"barrier\t1\t0\tworld\t\t-1"}, {"world\t0,1\t0\t-"}};
  const std::string dir = write_job(job, "wd_mismatch");
  {  // rank 1's file as an older build wrote it: no beat, no progress
    std::ofstream f(dir + "/rank-1.txt");
    f << fmt::format("rank\t1\nwait\tbarrier\t1\t0\tworld\t{:.6f}\t\ngroup\tworld\t0,1\t0\t-\n",
                     now_s() - 10);
  }
  const std::string report = watchdog::build_report(dir, 0, 2);
  EXPECT_EQ(first_line(report).rfind("[scalelab] watchdog: rank 0 waits in all_reduce #1 (64 B, "
                                     "group world) for 10.", 0), 0u) << report;
  EXPECT_NE(report.find("rank 1 entered barrier #1 where rank 0 entered all_reduce #1"),
            std::string::npos) << report;
  std::filesystem::remove_all(dir);
}

// A rank whose status file is gone (it exited) while another waits for it in a send leads too.
TEST(WatchdogReport, AnExitedRankThatOthersWaitForLeads) {
  if (world_rank() != 0) GTEST_SKIP() << "files only, rank 0 does it";
  std::vector<FakeRank> job(3);
  job[0] = {0.1, 10, {"send\t1\t4096\tworld\tto rank 2\t2"}, {"world\t0,1,2\t0\t-"}};
  job[1] = {0.1, 10, {"recv\t1\t4096\tworld\tfrom rank 0\t0"}, {"world\t0,1,2\t0\t-"}};
  const std::string dir = write_job(job, "wd_exited");
  std::filesystem::remove(dir + "/rank-2.txt");
  const std::string report = watchdog::build_report(dir, 0, 3);
  EXPECT_EQ(first_line(report).rfind("[scalelab] watchdog: rank 2 has no status file: it has "
                                     "exited", 0), 0u) << report;
  EXPECT_NE(report.find("rank 1 waits for rank 0 in recv #1"), std::string::npos)
      << "rank 1 waits for rank 0, which sends to rank 2, not to it\n" << report;
  std::filesystem::remove_all(dir);
}

TEST(WatchdogReport, StaleAfterFollowsTheTimeoutWithinBounds) {
  EXPECT_DOUBLE_EQ(watchdog::stale_after(3), 1.5);
  EXPECT_DOUBLE_EQ(watchdog::stale_after(0.5), 1.0) << "a live watchdog thread writes every 0.1 s";
  EXPECT_DOUBLE_EQ(watchdog::stale_after(600), 5.0);
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
