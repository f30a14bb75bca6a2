#!/usr/bin/env python3
"""Tests of the grader itself: planted submissions must get the right verdict, in bounded time,
and no cheat may pass.

Each submission is lab 00's reference solution (or its untouched starter) with one fault or one
cheat planted in it. The grader copies only labs/NN_name/name.cpp from the submission onto a
pristine tree, builds each lab on its own and runs the starter tests; a run passes only when
GoogleTest's XML report of every rank lists every expected test as passed. All submissions share
one pristine tree and build (only hello_dist.cpp changes between them), and only one of them also
grades a second lab, so the whole file stays within a few minutes on 2 cores.
Run by ctest (label reference;tools) or directly: python3 tests/tools/test_grade.py
"""
import contextlib
import importlib.machinery
import io
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB = "00_hello_dist"


def grader_env(**extra):
    """The environment of a graded run: this one, without SCALELAB_TIMEOUT (each test sets its own)
    and without SCALELAB_CUDA, so the pristine tree is built as a grader builds by default (CPU-only
    where no GPU is visible). CI sets SCALELAB_CUDA=ON to compile the CUDA code once, in its main
    build; compiling every kernel again for each grader test's tree tests nothing more (choose_cuda
    has its own tests below) and cost minutes of CI."""
    env = {k: v for k, v in os.environ.items() if k not in ("SCALELAB_TIMEOUT", "SCALELAB_CUDA")}
    env.update(extra)
    return env


def pristine(rel):
    """A file as this repository's HEAD has it (what the grader grades against), else as it is."""
    proc = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{rel}"], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else (ROOT / rel).read_text()


SOLUTION = pristine(f"solutions/{LAB}/hello_dist.cpp")
STARTER = pristine(f"labs/{LAB}/hello_dist.cpp")  # the untouched starter, even if labs/ is edited
TEST_TIMEOUT = 30  # seconds a test run may take before the grader kills it ("timed out")
WATCHDOG_TIMEOUT = 8  # the watchdog ends a hung collective first, with its report (exit 3)

loader = importlib.machinery.SourceFileLoader("grade", str(ROOT / "tools" / "grade"))
spec = importlib.util.spec_from_loader("grade", loader)
grade = importlib.util.module_from_spec(spec)
loader.exec_module(grade)


def plant(old, new, base=SOLUTION):
    assert old in base, f"planting site not found: {old!r}"
    return base.replace(old, new, 1)


VERDICT = 'std::printf("[scalelab] verdict: passed\\n"); std::fflush(stdout);'
ALL_REDUCE = "  comm.all_reduce(id, comm::ReduceOp::sum);"
STEP2_SITE = '  if (!want_gpu || gpu_count == 0) return "cpu";'
STEP1_SITE = "Placement placement_from_env(const EnvLookup& env) {\n"
STEP1_COMM_SITE = "Placement placement_from_comm(MPI_Comm comm, const NodeSplit& split_node) {\n"

SUBMISSIONS = {
    "correct": SOLUTION,
    # Rank 1 skips the all-reduce: every other rank waits in it forever.
    "hangs": plant(ALL_REDUCE, "  if (comm.rank() != 1) comm.all_reduce(id, comm::ReduceOp::sum);"),
    # One fault per step, each on rank 1 only (so every step passes at one rank):
    #   step 1: an exception while the other ranks wait in MPI_Comm_split_type;
    #   step 2: a null pointer dereference;
    #   step 3: a wrong sum.
    "faults": plant("  return static_cast<long long>(id.item(0));",
                    "  return static_cast<long long>(id.item(0)) + (comm.rank() == 1);",
                    plant(STEP2_SITE, '  if (!want_gpu || gpu_count == 0) {\n'
                          '    int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r);\n'
                          '    if (r == 1) { volatile int* p = nullptr; *p = 1; }\n'
                          '    return "cpu";\n  }',
                          plant(STEP1_COMM_SITE, STEP1_COMM_SITE + "  { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r);\n"
                                '    if (r == 1) throw std::runtime_error("planted exception on rank 1"); }\n'))),
    # Does not compile.
    "no_compile": plant("  Placement p;\n", "  Placement p = ;\n"),
    # Cheat (a) and (b, weak): the untouched starter, plus an atexit handler that prints a
    # passing verdict and exits 0 after the test main printed its own (not implemented), plus a
    # weak main that prints a passing verdict (the test main's strong main must win).
    "cheat_atexit_weak_main": STARTER + "\n#include <cstdio>\n#include <cstdlib>\nnamespace {\n"
                              "struct Cheat { Cheat() { std::atexit([] { " + VERDICT + " std::_Exit(0); }); } } cheat;\n}\n"
                              "__attribute__((weak)) int main() { " + VERDICT + " return 0; }\n",
    # Cheat (b, strong): its own main that prints a passing verdict: a link error.
    "cheat_main": STARTER + "\n#include <cstdio>\nint main() { " + VERDICT + " return 0; }\n",
    # Cheat (c): step 1 prints a passing verdict, finalizes MPI and exits 0 before any check.
    "cheat_exit_in_step": "#include <cstdio>\n" + plant(STEP1_SITE, STEP1_SITE + "  " + VERDICT +
                                                      " MPI_Finalize(); std::_Exit(0);\n"),
}


def processes_mentioning(text):
    """Pids of live processes whose command line contains text (not this one)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append((int(entry), cmdline.strip()))
    return found


def assert_well_formed_xml(testcase, path):
    ET.parse(path)  # raises on malformed XML
    if shutil.which("xmllint"):
        proc = subprocess.run(["xmllint", "--noout", str(path)], capture_output=True, text=True)
        testcase.assertEqual(proc.returncode, 0, proc.stderr)


class GraderTest(unittest.TestCase):
    work = None
    other_lab = None

    @classmethod
    def setUpClass(cls):
        cls.work = pathlib.Path(tempfile.mkdtemp(prefix="scalelab-grade-test-"))
        labs = sorted(p.name for p in (ROOT / "labs").glob("[0-9][0-9]_*") if (p / "lab.cmake").exists())
        others = [l for l in labs if l != LAB]
        cls.other_lab = others[0] if others else None

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def write_submission(self, kind):
        sub = self.work / f"sub-{kind}"
        (sub / "labs" / LAB).mkdir(parents=True, exist_ok=True)
        (sub / "labs" / LAB / "hello_dist.cpp").write_text(SUBMISSIONS[kind])
        return sub

    def grade_cmd(self, kind, labs=("00",), test_timeout=TEST_TIMEOUT, keep_files=False):
        sub = self.work / f"sub-{kind}" if keep_files else self.write_submission(kind)
        return [str(ROOT / "scalelab"), "grade", *labs, "--submission", str(sub),
                "--work-dir", str(self.work / "tree-work"), "--json", str(self.work / f"{kind}.json"),
                "--junit", str(self.work / f"{kind}.xml"), "--test-timeout", str(test_timeout)]

    def grade(self, kind, with_other_lab=False, keep_files=False, test_timeout=TEST_TIMEOUT,
              watchdog_timeout=WATCHDOG_TIMEOUT):
        labs = ["00"] + ([self.other_lab[:2]] if with_other_lab and self.other_lab else [])
        report = self.work / f"{kind}.json"
        start = time.monotonic()
        env = grader_env(**({"SCALELAB_TIMEOUT": str(watchdog_timeout)} if watchdog_timeout else {}))
        proc = subprocess.run(self.grade_cmd(kind, labs, test_timeout=test_timeout, keep_files=keep_files),
                              capture_output=True, text=True, timeout=1500, env=env)
        elapsed = time.monotonic() - start
        self.assertTrue(report.exists(), proc.stdout + proc.stderr)
        data = json.loads(report.read_text())
        labs = {l["lab"]: l for l in data["labs"]}
        steps = {s["step"]: s for s in labs["00"]["steps"]}
        if with_other_lab and self.other_lab:
            other = labs[self.other_lab[:2]]
            self.assertEqual(other["build"], "ok", f"lab {self.other_lab} must still be built and graded")
            self.assertTrue(all(s["verdict"] != "build failed" for s in other["steps"]))
        for s in steps.values():
            if s["verdict"] != "passed":  # every step that did not pass says where its output is
                self.assertTrue(pathlib.Path(s["log"]).is_file(), s)
                self.assertIn(f"full output: {s['log']}", proc.stdout)
                # named for the step and ranks: "lab00.step3.np2.log", not the ctest entry's
                # ".starter" (the attendee's own code read as the starter's)
                self.assertRegex(pathlib.Path(s["log"]).name, r"^lab00\.(step\d+\.np\d+|build)\.log$")
        # nothing of the runs is left: no report or watchdog directory
        reports = self.work / "tree-work" / "tree" / "build" / "grade" / "reports"
        self.assertEqual(list(reports.iterdir()) if reports.exists() else [], [])
        return proc, steps, elapsed

    # ---- faults: the verdict, the rank, the detail -----------------------------------------------

    def test_correct_submission_passes_and_only_the_attendee_file_is_taken(self):
        sub = self.write_submission("correct")
        # a submission's main.cpp and other files are never compiled
        (sub / "labs" / LAB / "main.cpp").write_text("#error a submission's main.cpp must not be compiled\n")
        (sub / "labs" / LAB / "extra.cpp").write_text("#error nor an extra file\n")
        proc, steps, _ = self.grade("correct", keep_files=True)
        self.assertEqual({s["verdict"] for s in steps.values()}, {"passed"}, proc.stdout + proc.stderr)
        self.assertEqual(sorted(steps), [1, 2, 3])
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        report = json.loads((self.work / "correct.json").read_text())
        self.assertEqual(report["schema"], "scalelab-grade/2")
        self.assertEqual([s["optional"] for s in steps.values()], [False] * 3, "lab 00 is all core")
        self.assertEqual((report["points"], report["max_points"], report["passed"]), (30, 30, True))
        self.assertEqual((report["optional_points"], report["optional_max_points"]), (0, 0))
        self.assertIn(f"ignored (not an attendee file; the pristine copy is used): labs/{LAB}/extra.cpp, "
                      f"labs/{LAB}/main.cpp", proc.stderr)
        # the pristine tree is never edited: its library is a unity build (half the build time)
        unity = self.work / "tree-work" / "tree" / "build" / "common" / "CMakeFiles" / "scalelab_common.dir" / "Unity"
        self.assertTrue(list(unity.glob("unity_*")), f"no unity sources in {unity}")

    def test_hang_is_timed_out_with_every_ranks_line_once_per_step(self):
        # No SCALELAB_TIMEOUT (the test main's default is 45 s) and a 15 s limit: the grader must
        # lower the watchdog below the limit, or the report is lost to the kill.
        proc, steps, elapsed = self.grade("hangs", test_timeout=15, watchdog_timeout=None)
        self.assertEqual(steps[3]["verdict"], "timed out", proc.stdout)
        self.assertEqual(steps[3]["ranks"], [2], "one rank passes, two ranks hang")
        # the watchdog, not the grader's kill, ended it: its whole report, every rank's line
        detail = steps[3]["detail"]
        self.assertIn("all_reduce", detail)
        self.assertIn("sequence numbers", detail)
        for rank in range(2):
            self.assertIn(f"rank {rank}", detail)
        # a hang costs one time limit: the 4-rank run, which would hang too, is not started
        run4 = next(r for r in steps[3]["runs"] if r["ranks"] == 4)
        self.assertEqual((run4["verdict"], run4["detail"], run4["log"], run4["seconds"]),
                         ("skipped", "skipped: step already timed out on 2 rank(s)", None, 0.0))
        self.assertEqual(steps[1]["verdict"], "passed")
        self.assertNotEqual(proc.returncode, 0)
        # one hanging run, bounded by the test timeout plus the kill grace period
        self.assertLess(elapsed, (15 + 10) + 240)
        assert_well_formed_xml(self, self.work / "hangs.xml")
        skipped = ET.parse(self.work / "hangs.xml").getroot().findall(".//testcase[@name='np4']/skipped")
        self.assertEqual(len(skipped), 1, "the skipped run is a JUnit <skipped/>")

    def test_faults_name_their_rank_and_cause(self):
        proc, steps, _ = self.grade("faults")
        # step 1: an exception on rank 1 alone is "failed" with the rank and the message, not
        # "crashed" with Open MPI's help text
        self.assertEqual(steps[1]["verdict"], "failed", proc.stdout)
        self.assertEqual(steps[1]["ranks"], [2, 4])
        self.assertIn("on rank 1: planted exception on rank 1", steps[1]["detail"])
        self.assertNotIn("ORTE", steps[1]["detail"])
        # step 2: a segfault on rank 1 is "crashed", naming the rank, the signal and the test
        self.assertEqual(steps[2]["verdict"], "crashed", proc.stdout)
        self.assertEqual(steps[2]["ranks"], [2, 4])
        for run in steps[2]["runs"][1:]:
            # ... and the function it died in, from Open MPI's backtrace (-rdynamic names it; GCC
            # moves the null store into choose_device's .cold clone, a local symbol: addr2line)
            self.assertRegex(run["detail"], r"^rank 1 killed by SIGSEGV \(signal 11\) in Step2_\w+\.\w+, "
                             r"at scalelab::lab00::choose_device$")
        # step 3: a wrong value on rank 1 is "failed", naming the rank
        self.assertEqual(steps[3]["verdict"], "failed", proc.stdout)
        self.assertIn("on rank 1", steps[3]["detail"])
        self.assertEqual(steps[3]["ranks"], [2, 4])
        self.assertEqual(proc.returncode, 1)
        assert_well_formed_xml(self, self.work / "faults.xml")  # failing and crashing runs

    def test_compile_error_is_build_failed_and_other_labs_still_graded(self):
        proc, steps, _ = self.grade("no_compile", with_other_lab=True)
        self.assertEqual({s["verdict"] for s in steps.values()}, {"build failed"}, proc.stdout)
        self.assertIn("error", steps[1]["detail"])
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("build failed", proc.stdout)

    # ---- cheats: never passed --------------------------------------------------------------------

    def assert_no_step_passes(self, proc, steps):
        self.assertNotIn("passed", {s["verdict"] for s in steps.values()}, proc.stdout)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)

    def test_cheat_atexit_and_weak_main_are_not_passed(self):
        proc, steps, _ = self.grade("cheat_atexit_weak_main")
        self.assert_no_step_passes(proc, steps)
        # the test main ran (not the weak main) and its verdict stands
        self.assertEqual({s["verdict"] for s in steps.values()}, {"not implemented"}, proc.stdout)
        # a step stopped in its stub at the fewest ranks is not started again at more (it cannot
        # pass): one run a step, the others skipped, saying why
        for s in steps.values():
            self.assertEqual([(r["ranks"], r["verdict"]) for r in s["runs"]],
                             [(1, "not implemented"), (2, "skipped"), (4, "skipped")], s)
            self.assertEqual(s["runs"][1]["detail"], "skipped: step not implemented on 1 rank(s)")
            self.assertEqual(s["ranks"], [1])

    def test_cheat_own_main_is_build_failed(self):
        proc, steps, _ = self.grade("cheat_main")
        self.assert_no_step_passes(proc, steps)
        self.assertEqual({s["verdict"] for s in steps.values()}, {"build failed"}, proc.stdout)
        self.assertIn("multiple definition of `main'", steps[1]["detail"])

    def test_cheat_exit_0_in_a_step_is_not_passed(self):
        proc, steps, _ = self.grade("cheat_exit_in_step")
        self.assertNotEqual(steps[1]["verdict"], "passed", proc.stdout)
        self.assertIn("no GoogleTest report", steps[1]["detail"])
        self.assertEqual(steps[2]["verdict"], "passed", "the other steps are graded as they are")
        self.assertNotEqual(proc.returncode, 0)

    # ---- stopping the grader ---------------------------------------------------------------------

    def test_sigterm_leaves_no_process_behind(self):
        tree = str(self.work / "tree-work" / "tree")
        proc = subprocess.Popen(self.grade_cmd("hangs", test_timeout=120), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env=grader_env(SCALELAB_TIMEOUT="100"))
        try:
            deadline = time.monotonic() + 900
            # wait until a hanging run (step 3 at 2 ranks: two rank processes) is under way
            while time.monotonic() < deadline and proc.poll() is None:
                ranks = [p for p, cmd in processes_mentioning("test_lab00") if "gtest_filter=Step3" in cmd
                         and tree in cmd]
                if len(ranks) >= 2:
                    break
                time.sleep(0.5)
            self.assertIsNone(proc.poll(), "the grader ended before the hanging run started")
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)  # the launcher execs the grader: this pid is it
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, out)
        time.sleep(0.5)
        self.assertEqual(processes_mentioning(tree), [], "mpiexec or ranks were left running")


class ClassifyTest(unittest.TestCase):
    """The verdict logic on outputs that are slow or hard to plant for real (labs 01 and 03)."""
    NO_REPORT = (False, ["no GoogleTest report from ranks 0,1,2,3 (the run ended before its tests finished)"], [])

    def test_exception_on_one_rank_with_open_mpi_help_text(self):
        out = ("[rank 2] [scalelab] verdict: error: exception in Step2_Ring.AllReduce on rank 2: "
               "recv from rank 1: MPI_ERR_TRUNCATE: message truncated\n"
               "--------------------------------------------------------------------------\n"
               "MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD\nwith errorcode 1.\n"
               "[vm:01234] 3 more processes have sent help message help-mpi-api.txt / mpi-abort\n"
               "[vm:01234] ORTE_ERROR_LOG: ... exited on signal 15 (Terminated).\n")
        verdict, detail = grade.classify(1, out, 60, self.NO_REPORT)
        self.assertEqual(verdict, "failed")
        self.assertIn("on rank 2", detail)
        self.assertIn("MPI_ERR_TRUNCATE", detail)

    def test_a_kept_verdict_reads_whole_where_the_printed_one_was_cut(self):
        # seen in CI: rank 1's line landed inside rank 0's verdict as the launcher forwarded them
        cut = ("[scalelab] verdict: failed: Step3_Finish.GradientsEqualSingleD[scalelab] rank 1 failed "
               "a check in Step3_Finish.GradientsEqualSingleDeviceForEveryBucketSize: boom (t.cpp:3)\n"
               "eviceForEveryBucketSize on rank 0: boom (t.cpp:3)\n")
        whole = "[scalelab] verdict: failed: Step3_Finish.GradientsEqualSingleDeviceForEveryBucketSize on rank 0: boom (t.cpp:3)"
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = pathlib.Path(tmp)
            (run_dir / "verdict.rank1").write_text("[scalelab] verdict: error: exception in A.B on rank 1: x")
            (run_dir / "verdict.rank0").write_text(whole)
            (run_dir / "verdict.rank2").write_text("not a verdict line")  # ignored
            (run_dir / "verdict.rank0.tmp").write_text("[scalelab] verdict: passed")  # never renamed
            kept = grade.kept_lines(run_dir)
        self.assertEqual(kept.splitlines(), [whole, "[scalelab] verdict: error: exception in A.B on rank 1: x"])
        self.assertEqual(grade.classify(1, cut, 60, self.NO_REPORT, kept=kept),
                         ("failed", whole.split("verdict: failed: ")[1]))
        self.assertEqual(grade.classify(1, cut, 60, self.NO_REPORT)[1],
                         "Step3_Finish.GradientsEqualSingleD[scalelab] rank 1 failed a check in "
                         "Step3_Finish.GradientsEqualSingleDeviceForEveryBucketSize: boom (t.cpp:3)")

    def test_crash_names_the_rank(self):
        out = "mpiexec noticed that process rank 3 with PID 0 on node vm exited on signal 11 (Segmentation fault).\n"
        self.assertEqual(grade.classify(139, out, 60, self.NO_REPORT),
                         ("crashed", "rank 3 killed by SIGSEGV (signal 11)"))

    def test_a_failed_check_before_a_hang_leads_the_detail(self):
        # rank 0's ASSERT failed and returned; rank 1 waits for it: the cause before the report
        out = ("[ RUN      ] Step3_Ring.Broadcast\n"
               "[scalelab] rank 0 failed a check in Step3_Ring.Broadcast: x = {0}, want {-1} (t.cpp:117)\n"
               "[scalelab] watchdog: rank 0 is in no collective and has made no progress for 45.3 s\n")
        verdict, detail = grade.classify(3, out, 60, self.NO_REPORT)
        self.assertEqual(verdict, "timed out")
        self.assertTrue(detail.startswith("rank 0 failed a check first, in Step3_Ring.Broadcast: x = {0}, "
                                          "want {-1} (t.cpp:117); then in Step3_Ring.Broadcast: "
                                          "[scalelab] watchdog: rank 0"), detail)
        # a check that failed in an earlier test is not this hang's cause
        earlier = out.replace("failed a check in Step3_Ring.Broadcast", "failed a check in Step2_A.B")
        self.assertNotIn("failed a check first", grade.classify(3, earlier, 60, self.NO_REPORT)[1])

    def test_a_kept_failed_check_reads_whole_where_the_printed_one_was_cut(self):
        # rank 1's check failed, then rank 0's; rank 0's piece of output landed inside rank 1's line
        out = ("[ RUN      ] Step3_Ring.Broadcast\n"
               "[scalelab] rank 1 failed a check in Step3_Ring.Broadcast: x = {0}, w[scalelab] rank 0 "
               "failed a check in Step3_Ring.Broadcast: y = {1}, want {2} (t.cpp:120)\n"
               "ant {-1} (t.cpp:117)\n"
               "[scalelab] watchdog: rank 2 is in no collective and has made no progress for 45.3 s\n")
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = pathlib.Path(tmp)
            (run_dir / "failed.rank1").write_text(
                "[scalelab] rank 1 failed a check in Step3_Ring.Broadcast: x = {0}, want {-1} (t.cpp:117)")
            (run_dir / "failed.rank0").write_text(
                "[scalelab] rank 0 failed a check in Step3_Ring.Broadcast: y = {1}, want {2} (t.cpp:120)")
            (run_dir / "failed.rank3").write_text("[scalelab] rank 3 failed a che")  # not a line: ignored
            kept = grade.kept_lines(run_dir)
        self.assertEqual(len(kept.splitlines()), 2)
        want = ("rank 1 failed a check first, in Step3_Ring.Broadcast: x = {0}, want {-1} (t.cpp:117); "
                "then in Step3_Ring.Broadcast: [scalelab] watchdog: rank 2")
        self.assertTrue(grade.classify(3, out, 60, self.NO_REPORT, kept=kept)[1].startswith(want))
        # without the kept lines, the garbled words
        self.assertIn("x = {0}, w[scalelab]", grade.classify(3, out, 60, self.NO_REPORT)[1])
        # a line whose start was cut in the output: the kept one stands in (rank 0's here)
        lost = out.replace("[scalelab] rank 1 failed", "[scalela").replace("[scalelab] rank 0 failed", "[scal")
        self.assertTrue(grade.classify(3, lost, 60, self.NO_REPORT, kept=kept)[1].startswith(
            "rank 0 failed a check first, in Step3_Ring.Broadcast: y = {1}, want {2} (t.cpp:120)"))

    def test_crash_names_the_function_from_the_backtrace(self):
        # Open MPI's backtrace: system frames skipped; an op of common/ named with the lab's
        # function that called it; c++filt (binutils) demangles where installed
        trace = ("[vm:4036] *** Process received signal ***\n"
                 "[vm:4036] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7fe36685a050]\n"
                 "[vm:4036] [ 1] ./labs/test_lab05(_ZN8scalelab3ops6matmulERNS_6TensorE+0x29)[0x5646]\n"
                 "[vm:4036] [ 2] ./labs/test_lab05(_ZN8scalelab5lab0513choose_deviceB5cxx11Eiib+0x10)[0x5647]\n"
                 "[vm:4036] [ 3] ./labs/test_lab05(main+0x130)[0x5648]\n"
                 "mpiexec noticed that process rank 1 with PID 0 on node vm exited on signal 11 "
                 "(Segmentation fault).\n")
        verdict, detail = grade.classify(139, trace, 60, self.NO_REPORT)
        self.assertEqual(verdict, "crashed")
        if shutil.which("c++filt"):
            self.assertEqual(detail, "rank 1 killed by SIGSEGV (signal 11), at scalelab::ops::matmul, "
                                     "called from scalelab::lab05::choose_device")  # no [abi:cxx11]
        else:
            self.assertIn(", at _ZN8scalelab3ops6matmulERNS_6TensorE", detail)
        self.assertEqual(grade.crash_site("no backtrace\n"), "")

    def test_a_frame_without_a_name_is_looked_up_in_the_program(self):
        # a function of an anonymous namespace (or a .cold clone) is a local symbol: the backtrace
        # prints only "(+0x...)"; addr2line names it from the program's symbol table
        build = pathlib.Path(os.environ.get("SCALELAB_BUILD_DIR", ROOT / "build"))
        exe = build / "tests" / "support" / "test_main_selftest"
        if not (exe.is_file() and shutil.which("nm") and shutil.which("addr2line")):
            self.skipTest("needs the built test_main_selftest, nm and addr2line")
        table = subprocess.run(["nm", "-C", str(exe)], capture_output=True, text=True).stdout
        m = re.search(r"^([0-9a-f]+) t \(anonymous namespace\)::one_line\(", table, re.M)
        self.assertIsNotNone(m, "test_main.cpp's one_line, a local function")
        trace = (f"[vm:1] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f]\n"
                 f"[vm:1] [ 1] {exe}(+0x{int(m.group(1), 16) + 4:x})[0x55]\n")
        self.assertEqual(grade.crash_site(trace), ", at (anonymous namespace)::one_line")
        # a program that is not there (or a relative path): nothing is made up
        self.assertEqual(grade.crash_site(trace.replace(str(exe), "/no/such/program")), "")

    def test_printed_verdict_and_exit_0_without_report_is_not_passed(self):
        verdict, detail = grade.classify(0, "[scalelab] verdict: passed\n", 60, self.NO_REPORT)
        self.assertEqual(verdict, "crashed")
        self.assertIn("not evidence", detail)

    def test_report_with_exit_0_passes_and_report_failure_fails(self):
        self.assertEqual(grade.classify(0, "", 60, (True, [], [])), ("passed", ""))
        verdict, detail = grade.classify(1, "", 60, (False, [], [(1, "Step1_A.B", "x.cpp:3: boom")]))
        self.assertEqual((verdict, detail), ("failed", "Step1_A.B on rank 1: x.cpp:3: boom"))

    def test_hang_shows_every_line_of_the_watchdog_report(self):
        out = ("[scalelab] watchdog: rank 2 waits in send #61 to rank 3 for 8.0 s;\n"
               "  rank 0 is in send #61 to rank 1;\n  rank 1 is in send #61 to rank 2;\n"
               "  rank 3 is in send #61 to rank 0\nother output\n")
        verdict, detail = grade.classify(3, out, 60, self.NO_REPORT)
        self.assertEqual(verdict, "timed out")
        for rank in range(4):
            self.assertIn(f"rank {rank} ", detail)
        self.assertNotIn("other output", detail)

    def test_watchdog_fires_before_the_test_timeout(self):
        old = os.environ.pop("SCALELAB_TIMEOUT", None)
        try:
            self.assertEqual(grade.watchdog_timeout(120), 45)  # the test main's default
            self.assertEqual(grade.watchdog_timeout(20), 15)   # 5 s before a shorter limit
            self.assertEqual(grade.watchdog_timeout(6), 3)
            os.environ["SCALELAB_TIMEOUT"] = "8"
            self.assertEqual(grade.watchdog_timeout(30), 8)    # a shorter watchdog is kept
        finally:
            os.environ.pop("SCALELAB_TIMEOUT", None)
            if old is not None:
                os.environ["SCALELAB_TIMEOUT"] = old

    def test_reports_must_list_every_expected_test_on_every_rank(self):
        case = ('<testcase name="{n}" status="run" result="{r}" classname="Step1_A">{body}</testcase>')
        skip = '<skipped message="{f}:3&#x0A;why"/>'

        def report(*cases):
            return '<?xml version="1.0"?><testsuites><testsuite name="Step1_A">' + "".join(cases) + "</testsuite></testsuites>"

        expected = ["Step1_A.B", "Step1_A.C"]
        tests_dir = pathlib.Path("/x/tests/00_hello_dist")
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(tmp)
            good = report(case.format(n="B", r="completed", body=""),
                          case.format(n="C", r="skipped", body=skip.format(f="/x/tests/00_hello_dist/t.cpp")))
            (d / "report.rank0.xml").write_text(good)
            (d / "report.rank1.xml").write_text(good)
            self.assertEqual(grade.read_reports(d, 2, expected, tests_dir), (True, [], []))
            ok, problems, _ = grade.read_reports(d, 3, expected, tests_dir)
            self.assertFalse(ok)
            self.assertIn("no GoogleTest report from rank 2", problems[0])
            # a test missing from one rank's report, a skip written outside the tests
            (d / "report.rank1.xml").write_text(report(
                case.format(n="C", r="skipped", body=skip.format(f="/x/labs/00_hello_dist/hello_dist.cpp"))))
            ok, problems, _ = grade.read_reports(d, 2, expected, tests_dir)
            self.assertFalse(ok)
            self.assertEqual(problems, ["rank 1's report lacks Step1_A.B",
                                        "Step1_A.C was skipped on rank 1 outside the tests"])

    def test_junit_is_well_formed_with_escapes_and_control_characters(self):
        run = {"ranks": 2, "test": "lab00.step3.np2.starter", "verdict": "failed", "seconds": 1.0,
               "detail": "\x1b[0;31m[  FAILED  ]\x1b[m A.B on rank 1: \x01\x08 bad <&>",
               "log": "/x/lab00.step3.np2.log", "output": "\x1b[0;32m[ RUN ]\x1b[m\x00\x0c\ufffe end"}
        report = {"labs": [{"lab": "00", "name": "hello_dist", "steps": [{"step": 3, "runs": [run]}]}]}
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "g.xml"
            grade.write_junit(report, path)
            assert_well_formed_xml(self, path)
            failure = ET.parse(path).getroot().find(".//failure")
            self.assertEqual(failure.get("message"), "failed: [  FAILED  ] A.B on rank 1:  bad <&>")


class ReportTest(unittest.TestCase):
    """Optional steps, skipped runs, the running test's name, the CUDA choice and a foreign build
    directory, on made-up inputs (no build)."""

    @staticmethod
    def step(n, verdict, optional=False):
        return {"step": n, "optional": optional, "verdict": verdict, "detail": "", "ranks": [1],
                "points": 10 if verdict == "passed" else 0, "max_points": 10, "log": None,
                "runs": [{"ranks": 1, "test": f"lab08.step{n}.np1.starter", "verdict": verdict,
                          "detail": "", "seconds": 1.0, "log": None, "output": ""}]}

    def test_optional_steps_are_totalled_apart_and_do_not_block_the_core(self):
        lab = {"lab": "08", "name": "pipeline_parallel", "build": "ok",
               "steps": [self.step(1, "passed"), self.step(2, "passed"),
                         self.step(5, "not implemented", True), self.step(6, "timed out", True)]}
        grade.add_points(lab, lab["steps"])
        self.assertEqual((lab["points"], lab["max_points"], lab["passed"]), (20, 20, True))
        self.assertEqual((lab["optional_points"], lab["optional_max_points"], lab["optional_passed"]),
                         (0, 20, False))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            grade.print_table(lab)
        self.assertIn("  5 opt not implemented", out.getvalue())
        self.assertRegex(out.getvalue(), r"core \(steps 1, 2\) +20/20")
        self.assertRegex(out.getvalue(), r"optional \(steps 5, 6\) +0/20 +graded apart")
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "g.xml"
            grade.write_junit({"labs": [lab]}, path)
            assert_well_formed_xml(self, path)
            error = ET.parse(path).getroot().find(".//testcase[@classname='lab08.step6']/error")
            self.assertTrue(error.get("message").startswith("(optional step) timed out"))

    def test_a_step_that_runs_a_failing_step_says_fix_that_one_first(self):
        # lab.cmake's STEP_USES "4:2,3" (ctest labNN.step_uses measures it): step 4's graders run
        # steps 2 and 3's code. Step 3 fails, so step 4's failure is no news about step 4.
        lab = {"lab": "03", "name": "ddp", "build": "ok",
               "steps": [self.step(1, "failed"), self.step(2, "passed"), self.step(3, "failed"),
                         self.step(4, "failed")]}
        uses = {4: {2, 3}}
        grade.add_fix_first("03", lab["steps"], uses)
        self.assertEqual([s["fix_first"] for s in lab["steps"]], [[], [], [], [3]],
                         "step 1 fails too, but step 4 does not run it")
        grade.add_points(lab, lab["steps"])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            grade.print_table(lab)
        self.assertIn("fix step 3 first: step 4's tests run its code, and it does not pass", out.getvalue())
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "g.xml"
            grade.write_junit({"labs": [lab]}, path)
            failure = ET.parse(path).getroot().find(".//testcase[@classname='lab03.step4']/failure")
            self.assertIn("(fix step 3 first:", failure.get("message"))
        # two failing steps, named together
        lab["steps"][1] = self.step(2, "crashed")
        grade.add_fix_first("03", lab["steps"], uses)
        self.assertEqual(grade.fix_first_text(lab["steps"][3]),
                         "fix steps 2 and 3 first: step 4's tests run their code, and they do not pass")
        # nothing to add: step 4 passes; the build failed
        for verdict in ("passed", "build failed"):
            steps = [self.step(3, "not implemented"), self.step(4, verdict)]
            grade.add_fix_first("03", steps, {4: {3}})
            self.assertEqual(steps[1]["fix_first"], [], verdict)
        # listed even where the verdict already names it (a list without it read as "not needed")
        steps = [self.step(3, "not implemented"), self.step(4, "not implemented")]
        steps[1]["detail"] = "lab 03 step 3: all-reduce (README.md#step-3)"
        grade.add_fix_first("03", steps, {4: {3}})
        self.assertEqual(steps[1]["fix_first"], [3])
        # step 4's own NotImplemented while step 3 fails: fix step 3 first still
        steps = [self.step(3, "failed"), self.step(4, "not implemented")]
        steps[1]["detail"] = "lab 03 step 4: zero grads (README.md#step-4)"
        grade.add_fix_first("03", steps, {4: {3}})
        self.assertEqual(steps[1]["fix_first"], [3])

    def test_skipped_runs_are_junit_skipped(self):
        lab = {"lab": "08", "name": "pipeline_parallel", "steps": [self.step(2, "timed out")]}
        lab["steps"][0]["runs"].append({"ranks": 4, "test": "lab08.step2.np4.starter", "verdict": "skipped",
                                        "detail": "skipped: step already timed out on 2 rank(s)",
                                        "seconds": 0.0, "log": None, "output": ""})
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "g.xml"
            grade.write_junit({"labs": [lab]}, path)
            suite = ET.parse(path).getroot().find("testsuite")
            self.assertEqual((suite.get("errors"), suite.get("skipped")), ("1", "1"))
            skipped = suite.find(".//testcase[@name='np4']/skipped")
            self.assertIn("step already timed out", skipped.get("message"))
        self.assertLess(grade.SEVERITY.index("timed out"), grade.SEVERITY.index("skipped"),
                        "the step's verdict is the timed-out run's")

    def test_a_crash_or_a_kill_names_the_running_test(self):
        progress = ("[ RUN      ] Step4_Execute.AfabEqualsSingleDevice\n"
                    "[       OK ] Step4_Execute.AfabEqualsSingleDevice (812 ms)\n"
                    "[ RUN      ] Step4_Execute.OneFOneBEqualsSingleDevice\n")
        died = "mpiexec noticed that process rank 0 with PID 7 on node vm exited on signal 11 (Segmentation fault).\n"
        self.assertEqual(grade.classify(139, progress + died, 60, ClassifyTest.NO_REPORT),
                         ("crashed", "rank 0 killed by SIGSEGV (signal 11) in Step4_Execute.OneFOneBEqualsSingleDevice"))
        verdict, detail = grade.classify(None, progress, 60, ClassifyTest.NO_REPORT)
        self.assertEqual(verdict, "timed out")
        self.assertIn("in Step4_Execute.OneFOneBEqualsSingleDevice", detail)
        watchdog = "[scalelab] watchdog: rank 1 waits in send #1 (4 KiB, group world, to rank 0) for 45.3 s\n"
        self.assertEqual(grade.classify(3, progress + watchdog, 60, ClassifyTest.NO_REPORT),
                         ("timed out", "in Step4_Execute.OneFOneBEqualsSingleDevice: [scalelab] watchdog: "
                                       "rank 1 waits in send #1 (4 KiB, group world, to rank 0) for 45.3 s"))
        # the ranks' running files name it where the output lost rank 0's "[ RUN ]" line (Open
        # MPI ends the job before forwarding it), the killed rank's first
        running = {0: "Step4_Execute.AfabEqualsSingleDevice", 1: "Step4_Execute.OneFOneBEqualsSingleDevice"}
        self.assertEqual(grade.classify(139, died, 60, ClassifyTest.NO_REPORT, running),
                         ("crashed", "rank 0 killed by SIGSEGV (signal 11) in Step4_Execute.AfabEqualsSingleDevice"))
        self.assertEqual(grade.running_test("", {2: "A.b", 1: "C.d"}), "C.d")
        with tempfile.TemporaryDirectory() as tmp:
            for r, name in [(0, ""), (1, "Step2_X.Y/3"), (2, "not a test name\n")]:
                pathlib.Path(tmp, f"running.rank{r}").write_text(name)
            self.assertEqual(grade.running_tests(pathlib.Path(tmp)), {1: "Step2_X.Y/3"})
        # a test that ended (OK or FAILED, rank 0's or another rank's line) is not the one running
        ended = progress + "[  FAILED  ] Step4_Execute.OneFOneBEqualsSingleDevice on rank 1: x\n"
        self.assertEqual(grade.running_test(ended), "")
        self.assertEqual(grade.running_test("no progress at all"), "")

    def test_cuda_only_where_a_gpu_is_visible_unless_asked(self):
        real = grade.gpu_visible
        try:
            grade.gpu_visible = lambda: False
            cuda, why = grade.choose_cuda(None, "", False)
            self.assertEqual(cuda, "OFF")
            self.assertIn("no GPU visible", why)
            self.assertIn("--cuda on", why)
            grade.gpu_visible = lambda: True
            self.assertEqual(grade.choose_cuda(None, "", False)[0], "AUTO")
            self.assertEqual(grade.choose_cuda(None, "", True)[0], "OFF", "a submission: CPU unless asked")
            self.assertEqual(grade.choose_cuda("ON", "OFF", True), ("ON", "--cuda"))
            self.assertEqual(grade.choose_cuda(None, "on", False), ("ON", "SCALELAB_CUDA"))
        finally:
            grade.gpu_visible = real
        old = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
            self.assertFalse(grade.gpu_visible(), "every device hidden")
        finally:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
            if old is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = old

    def test_build_directory_of_another_clone_is_refused_with_what_to_do(self):
        with tempfile.TemporaryDirectory() as tmp:
            build = pathlib.Path(tmp) / "build"
            build.mkdir()
            (build / "CMakeCache.txt").write_text("# comment\nCMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere/scalelab\n"
                                                  "SCALELAB_CUDA:STRING=AUTO\n")
            self.assertEqual(grade.foreign_build_dir(ROOT, build), "/elsewhere/scalelab")
            with self.assertRaises(grade.Usage) as e:
                grade.configure(ROOT, build, "OFF", "test", explicit=False)
            self.assertIn("another source tree (/elsewhere/scalelab", str(e.exception))
            self.assertIn(f"rm -rf {build}", str(e.exception))
            (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={ROOT}\n")
            self.assertIsNone(grade.foreign_build_dir(ROOT, build))

    def test_the_labs_optional_steps_are_labelled(self):
        # lab.cmake's OPTIONAL_STEPS reach the grader as the ctest label `optional`.
        build = pathlib.Path(os.environ.get("SCALELAB_BUILD_DIR", ROOT / "build"))
        if not (build / "CTestTestfile.cmake").is_file():
            self.skipTest(f"no configured build in {build}")
        optional = {(t["name"].split(".")[0], t["name"].split(".")[1])
                    for t in grade.list_tests(build) if "starter" in t["labels"] and "optional" in t["labels"]}
        for lab, steps in (("lab07", {5, 6}), ("lab08", {5, 6}), ("lab09", {4, 5}), ("lab10", {4})):
            self.assertEqual({int(s[4:]) for l, s in optional if l == lab}, steps, lab)

    def test_the_steps_each_step_runs_are_labelled(self):
        # lab.cmake's STEP_USES reach the grader as the labels uses-stepJ of step K's entries.
        build = pathlib.Path(os.environ.get("SCALELAB_BUILD_DIR", ROOT / "build"))
        if not (build / "CTestTestfile.cmake").is_file():
            self.skipTest(f"no configured build in {build}")
        labels = {t["name"]: set(t["labels"]) for t in grade.list_tests(build) if "starter" in t["labels"]}
        self.assertLessEqual({"uses-step2", "uses-step3"}, labels["lab03.step4.np2.starter"])
        self.assertFalse(any(l.startswith("uses-") for l in labels["lab03.step3.np2.starter"]))
        self.assertIn("lab03.step_uses", {t["name"] for t in grade.list_tests(build)})


class UsageTest(unittest.TestCase):
    """Bad options: one error line, exit 2, before anything is built or written."""

    def run_grade(self, *args, env=None):
        return subprocess.run([str(ROOT / "scalelab"), "grade", *args], capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, **(env or {})))

    def assert_usage_error(self, proc, words):
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, f"want one error line, got: {proc.stderr!r}")
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        self.assertIn(words, lines[0])

    def test_bad_timeouts(self):
        for value in ("-1", "0", "nan", "soon"):
            self.assert_usage_error(self.run_grade("00", "--test-timeout", value), value)
        self.assert_usage_error(self.run_grade("00", "--build-timeout", "0"), "0")
        self.assert_usage_error(self.run_grade("00", env={"SCALELAB_TIMEOUT": "-3"}), "SCALELAB_TIMEOUT")

    def test_unwritable_report_paths(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assert_usage_error(self.run_grade("00", "--json", f"{tmp}/no/such/dir/g.json"), "does not exist")
            self.assert_usage_error(self.run_grade("00", "--junit", tmp), "is a directory")

    def test_unknown_lab_with_submission_creates_nothing(self):
        with tempfile.TemporaryDirectory() as tmp:
            sub = pathlib.Path(tmp) / "sub"
            (sub / "labs").mkdir(parents=True)
            work = pathlib.Path(tmp) / "work"
            self.assert_usage_error(self.run_grade("99", "--submission", str(sub), "--work-dir", str(work)),
                                    "no lab 99")
            self.assertFalse(work.exists(), "nothing may be created before the usage check")
            self.assert_usage_error(self.run_grade("00", "--submission", str(pathlib.Path(tmp) / "none"),
                                                   "--work-dir", str(work)), "no labs/ directory")
            self.assertFalse(work.exists())


if __name__ == "__main__":
    unittest.main(verbosity=2)
