// MPI-aware GoogleTest main, shared by every test binary.
//
// - Every rank runs the same tests; only rank 0 prints GoogleTest's progress.
// - After each test the ranks compare verdicts: a failure on any rank is printed by rank 0 with
//   that rank's first failure message, and the test counts as failed for everyone. The verdict
//   names the first rank that gives its own cause (not the echo "failed on another rank" of a
//   collective check: labtest::on_every_rank gives every rank the failing ranks' causes).
// - Exceptions are not swallowed by GoogleTest: one escaping a test (NotImplemented from a
//   starter, or a bug) ends the job on every rank instead of leaving the others in a collective;
//   its verdict is led by an earlier test's failure, when there is one (the first to fix).
// - The last line on rank 0 is the verdict the grader reads:
//     [scalelab] verdict: passed
//     [scalelab] verdict: failed: Step3_AllReduce.SumOfRanks on rank 2: <message>
//     [scalelab] verdict: not implemented: lab 00 step 3: ... (README.md#step-3)
//     [scalelab] verdict: error: exception in Suite.Test on rank 1: <what>
//   That line is a diagnostic for people. The grader's evidence is GoogleTest's own XML report:
//   with --gtest_output=xml:DIR/NAME.xml every rank writes DIR/NAME.rank<r>.xml (the grader
//   picks DIR per run), once all of its tests have run, and the grader requires every expected
//   test passed in every rank's report (docs/grading.md).
// - Where SCALELAB_RUN_DIR is set (the grader gives each run its own), every rank keeps the name
//   of the test it is in, in DIR/running.rank<r> (empty between tests): a rank killed by a
//   signal leaves the name behind, where rank 0's "[ RUN ]" line may never reach the launcher's
//   output (Open MPI drops a rank's unforwarded output when another rank dies). The rank that
//   states the verdict (rank 0, or the rank an exception ends) also keeps its line whole in
//   DIR/verdict.rank<r>: the launcher forwards each rank's output in pieces as it reads them, so
//   another rank's line can land inside the printed one (seen in CI: "verdict: failed:
//   Step3_Finish.GradientsEqualSingleD[scalelab] rank 1 failed a check ...eviceForEvery...").
//   For the same reason each rank keeps its latest "failed a check" line in DIR/failed.rank<r>.
// - This file is linked into every test binary as an object (tests/support/CMakeLists.txt), not
//   from a static library, so a second strong `main` (e.g. in a lab's code) is a link error, and
//   this strong `main` always wins over a weak one.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/comm/communicator.hpp"
#include "common/errors.hpp"
#include "common/runtime.hpp"
#include "common/watchdog.hpp"
#include "tests/support/rank_threads.hpp"
#include "tests/support/raw_mpi.hpp"

namespace {

constexpr int kMessageBytes = 1024;

std::string g_current_test;   // for reports of exceptions that escape a test
std::string g_first_failure;  // "Suite.Test on rank r: message", empty while all passed

// Writes `line` to stdout in one write, after what is buffered before it: a line that left in two
// pieces (the buffer filled mid-line) could get another rank's line between them. One write is
// not enough under Open MPI 4 (a rank's stdout is a terminal the launcher reads in pieces of its
// own size), hence keep_verdict below.
void say_whole(const std::string& line) {
  std::fflush(stdout);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

// "failed on another rank", "another rank failed" and the like: a collective check's echo on a
// rank that passed it. A rank's own cause rarely says so; when every failing rank's message does,
// the first is shown anyway.
bool only_an_echo(const std::string& message) {
  return message.find("another rank") != std::string::npos;
}

// A failure as the attendee reads it: what is wrong first, where the check is last. GoogleTest's
// summary of EXPECT_TRUE(check) on an AssertionResult is "Value of: <the test's source>\n
// Actual: false (<the check's explanation>)\nExpected: true\n<streamed message>". Kept: the
// explanation, and the message where the test streams one (it names what was compared); else
// the check's source, when short, since it is then the only name of what was compared
// ("close_on_every_rank(g.dkv, g.want.dkv, ...)"); dropped: GoogleTest's frame and a long source
// expression. Other summaries (EXPECT_EQ's "Expected equality of these values", a FAIL()
// message) are kept whole. The file is named from tests/ on, not by the build's path.
std::string attendee_message(const char* file, int line, const std::string& summary) {
  std::string where = file ? file : "?";
  if (const auto at = where.rfind("tests/"); at != std::string::npos) where = where.substr(at);
  where = fmt::format("{}:{}", where, line);
  std::string what = summary;
  const std::string actual = "\n  Actual: false", expected = "\nExpected: true";
  const auto a = summary.find(actual), e = summary.find(expected);
  if (summary.rfind("Value of: ", 0) == 0 && a != std::string::npos && e != std::string::npos &&
      a < e) {
    std::string why = summary.substr(a + actual.size(), e - a - actual.size());
    std::string streamed = summary.substr(e + expected.size());
    while (!streamed.empty() && (streamed.front() == '\n' || streamed.front() == ' '))
      streamed.erase(0, 1);
    std::string source = summary.substr(10, a - 10);
    if (source.size() > 100 || source.find('\n') != std::string::npos) source = "the check";
    if (why.size() >= 3 && why.rfind(" (", 0) == 0 && why.back() == ')') {
      why = why.substr(2, why.size() - 3);  // the check's own explanation
      what = !streamed.empty() ? fmt::format("{}; {}", why, streamed)
             : source != "the check" ? fmt::format("{}: {}", source, why)
                                     : why;
    } else {  // a plain bool: its source is all there is to say
      what = fmt::format("{} is false{}", source, streamed.empty() ? "" : "; " + streamed);
    }
  }
  return fmt::format("{} ({})", what, where);
}

// SCALELAB_RUN_DIR/<what>.rank<r> holds `text`: written under a temporary name and renamed, so a
// reader sees the whole text or the one before. Best effort: a run without the file only loses
// what it would have said.
void keep_in_run_dir(const char* what, const std::string& text) {
  const char* dir = std::getenv("SCALELAB_RUN_DIR");
  if (dir == nullptr || *dir == 0) return;
  const std::string path = fmt::format("{}/{}.rank{}", dir, what, scalelab::world_rank());
  const std::string tmp = path + ".tmp";
  if (std::FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(text.c_str(), f);
    if (std::fclose(f) == 0) std::rename(tmp.c_str(), path.c_str());
  }
}

// DIR/running.rank<r>: the test this rank is in ("" between tests).
void note_running_test(const std::string& name) { keep_in_run_dir("running", name); }

// DIR/verdict.rank<r>: the verdict line this rank states (without its newline).
void keep_verdict(const std::string& line) { keep_in_run_dir("verdict", line); }

// Ends the job with `line` as its verdict: kept (keep_verdict), then said (exit_all).
[[noreturn]] void end_with_verdict(const std::string& line) {
  keep_verdict(line);
  scalelab::exit_all(scalelab::kExitFailed, line);
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

class RankVerdictListener : public testing::EmptyTestEventListener {
 public:
  void OnTestStart(const testing::TestInfo& info) override {
    g_current_test = std::string(info.test_suite_name()) + "." + info.name();
    first_message_.clear();
    note_running_test(g_current_test);
  }

  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed() || !first_message_.empty() || echoing_) return;
    first_message_ = attendee_message(result.file_name(), result.line_number(), result.summary());
    // Said at once, every rank: a rank whose check failed may leave the others waiting in a
    // collective (a failed ASSERT returns), and the gather at the test's end then never comes;
    // tools/grade puts this line before the watchdog's report.
    // Kept whole too (DIR/failed.rank<r>): this line is what the attendee fixes when a hang
    // follows, and the launcher can cut it as it can the verdict.
    const std::string line = fmt::format("[scalelab] rank {} failed a check in {}: {}",
                                         scalelab::world_rank(), g_current_test,
                                         one_line(first_message_));
    keep_in_run_dir("failed", line);
    say_whole(line + "\n");
  }

  // Every rank reaches here once per test, in the same order: gather the verdicts to rank 0.
  void OnTestEnd(const testing::TestInfo& info) override {
    note_running_test("");  // this rank is out of the test (the gather below is the harness's)
    const int rank = scalelab::world_rank(), size = scalelab::world_size();
    char mine[kMessageBytes] = {0};
    if (info.result()->Failed()) {
      std::string m = first_message_.empty() ? "failed" : first_message_;
      std::strncpy(mine, m.c_str(), kMessageBytes - 1);
    }
    std::vector<char> all(rank == 0 ? size * kMessageBytes : 0);
    const scalelab::labtest::LibraryMpi harness;  // not the code under test (raw_mpi.hpp)
    MPI_Gather(mine, kMessageBytes, MPI_CHAR, all.data(), kMessageBytes, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    if (rank != 0) {
      share_first_failure();
      return;
    }
    // The verdict names the rank where it happened: a rank whose message only says that another
    // rank failed (a collective check's echo) yields to one that gives its own cause.
    std::string echo;
    std::vector<int> others;  // ranks other than 0 where the test failed
    for (int r = 0; r < size; ++r) {
      const char* m = all.data() + r * kMessageBytes;
      if (m[0] == 0) continue;
      std::string line = fmt::format("{} on rank {}: {}", g_current_test, r, m);
      if (r != 0) fmt::print("[  FAILED  ] {}\n", line);
      if (r != 0) others.push_back(r);
      if (!g_first_failure.empty()) continue;
      if (only_an_echo(m)) {
        if (echo.empty()) echo = line;
      } else {
        g_first_failure = line;
      }
    }
    if (g_first_failure.empty()) g_first_failure = echo;
    // Rank 0 prints the job's progress: a test that passed here but failed on another rank is
    // failed here too, so its line and the closing summary do not read "OK" / "PASSED" (this
    // listener's OnTestEnd runs before the printer's; the test is still the current one, so the
    // failure is its).
    if (!others.empty() && !info.result()->Failed()) {
      echoing_ = true;  // not this rank's own check: no "failed a check" line for it
      GTEST_MESSAGE_AT_(info.file(), info.line(),
                        fmt::format("the test failed on rank{} {} (the line above)",
                                    others.size() > 1 ? "s" : "", fmt::join(others, ", "))
                            .c_str(),
                        testing::TestPartResult::kNonFatalFailure);
      echoing_ = false;
    }
    share_first_failure();
  }

 private:
  // Every rank learns the job's first failure (rank 0 found it above): a rank whose exception
  // ends the job in a later test leads its verdict with it (after_earlier_failure).
  static void share_first_failure() {
    char line[2 * kMessageBytes] = {0};
    if (scalelab::world_rank() == 0) std::strncpy(line, g_first_failure.c_str(), sizeof line - 1);
    const scalelab::labtest::LibraryMpi harness;  // not the code under test (raw_mpi.hpp)
    MPI_Bcast(line, sizeof line, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (scalelab::world_rank() != 0) g_first_failure = line;
  }

  std::string first_message_;
  bool echoing_ = false;
};

// --gtest_output=xml:PATH.xml becomes xml:PATH.rank<r>.xml, so ranks never write one file.
// Must run before InitGoogleTest (which reads the flag). A directory (xml:DIR/) is left alone.
void per_rank_report_path(int argc, char** argv, std::vector<std::string>& storage) {
  const std::string flag = "--gtest_output=xml:";
  storage.reserve(argc);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind(flag, 0) != 0 || arg.back() == '/') continue;
    std::string path = arg.substr(flag.size());
    const auto slash = path.rfind('/');
    const auto dot = path.rfind('.');
    const std::string stem = (dot != std::string::npos && (slash == std::string::npos || dot > slash))
                                 ? path.substr(0, dot)
                                 : path;
    storage.push_back(fmt::format("{}{}.rank{}.xml", flag, stem, scalelab::world_rank()));
    argv[i] = storage.back().data();
  }
}

// The verdict of a job an exception ends: `verdict`, unless an earlier test already failed (on
// any rank: rank 0 gathered it and told every rank), which then leads: the first failure is the
// one to fix first, and what the run would have said had that test been last.
std::string after_earlier_failure(const std::string& verdict) {
  if (g_first_failure.empty()) return verdict;
  const std::string prefix = "[scalelab] verdict: ";
  return fmt::format("{}failed: {} (then {})", prefix, one_line(g_first_failure),
                     verdict.substr(prefix.size()));
}

}  // namespace

int main(int argc, char** argv) {
  scalelab::init(&argc, &argv);
  std::vector<std::string> rewritten_args;
  per_rank_report_path(argc, argv, rewritten_args);
  testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(catch_exceptions, false);
  // Communication layer (issue 4): a collective that hangs ends the test with exit 3 and the
  // watchdog's report after SCALELAB_TIMEOUT seconds (default 45: below the labs' ctest
  // timeouts, 60 s and up, so a hang is reported rather than killed), and every collective
  // checks that all ranks passed matching sizes.
  scalelab::watchdog::start(scalelab::watchdog::timeout_from_env(45));
  scalelab::comm::set_check_matching(true);
  // MPI's threads and the watchdog are up: a thread the tests (the attendee's code) start from
  // here on is the rank's, and its heap counts (tests/support/rank_threads.hpp).
  scalelab::labtest::count_threads_started_from_now();

  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  // Rank 0 alone prints gtest's progress. The verdict listener comes after the printer: gtest
  // calls OnTestEnd in reverse order, so it may fail rank 0's copy of a test another rank
  // failed before the printer says OK.
  if (scalelab::world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankVerdictListener);

  // A step not written in a destructor (it cannot throw) ends the job as a thrown one below.
  scalelab::set_not_implemented_ending([](const std::string& what) {
    end_with_verdict("[scalelab] verdict: not implemented: " + one_line(what));
  });
  int local_failed = 0;
  try {
    local_failed = RUN_ALL_TESTS() != 0;
  } catch (const scalelab::NotImplemented& e) {
    end_with_verdict("[scalelab] verdict: not implemented: " + one_line(e.what()));
  } catch (const scalelab::UsageError& e) {
    end_with_verdict(after_earlier_failure(
        fmt::format("[scalelab] verdict: failed: {} on rank {}: usage error: {}", g_current_test,
                    scalelab::world_rank(), one_line(e.what()))));
  } catch (const std::exception& e) {
    end_with_verdict(after_earlier_failure(
        fmt::format("[scalelab] verdict: error: exception in {} on rank {}: {}", g_current_test,
                    scalelab::world_rank(), one_line(e.what()))));
  }

  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (scalelab::world_rank() == 0) {
    const std::string verdict =
        any_failed ? fmt::format("[scalelab] verdict: failed: {}",
                                 one_line(g_first_failure.empty() ? "see above" : g_first_failure))
                   : std::string("[scalelab] verdict: passed");
    keep_verdict(verdict);
    say_whole(verdict + "\n");
  }
  scalelab::exit_all(any_failed ? scalelab::kExitFailed : scalelab::kExitOk);
}
