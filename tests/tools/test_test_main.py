#!/usr/bin/env python3
"""Tests of the MPI-aware GoogleTest main (tests/support/test_main.cpp) with planted failures.
argv[1]: the test_main_selftest binary; mpiexec from $MPIEXEC_EXECUTABLE (set by CMake)."""
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

from mpi_env import mpi_env
import xml.etree.ElementTree as ET

EXE = None
MPIEXEC = os.environ.get("MPIEXEC_EXECUTABLE", "mpiexec")


ENV = mpi_env()
# The watchdog's run directories go here (removed at the end): the planted aborts leave none in /tmp.
RUN_DIR = tempfile.mkdtemp(prefix="scalelab-test-main-")
ENV["SCALELAB_RUN_DIR"] = RUN_DIR


def kept(what):
    """The lines the ranks kept whole in RUN_DIR/<what>.rank<r>, by rank."""
    prefix = f"{what}.rank"
    names = sorted(f for f in os.listdir(RUN_DIR) if f.startswith(prefix) and f[len(prefix):].isdigit())
    return {int(f[len(prefix):]): open(os.path.join(RUN_DIR, f)).read() for f in names}


def kept_verdicts():
    """The verdict lines the ranks kept whole in RUN_DIR/verdict.rank<r>, by rank."""
    return kept("verdict")


def forget_kept_lines():
    for f in os.listdir(RUN_DIR):
        if f.startswith(("verdict.rank", "failed.rank")):
            os.remove(os.path.join(RUN_DIR, f))


def run(suite, ranks=2, *extra):
    """(the process, its output followed by the verdict lines the ranks kept, seconds). The kept
    lines come last and whole: the launcher may cut the printed verdict with another rank's line."""
    forget_kept_lines()
    start = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), EXE, f"--gtest_filter={suite}.*", *extra],
                          capture_output=True, text=True, timeout=60, env=ENV)
    seconds = time.monotonic() - start
    kept = "".join(f"\nkept by rank {r}: {line}" for r, line in kept_verdicts().items())
    return proc, proc.stdout + proc.stderr + kept, seconds


class TestMainTest(unittest.TestCase):
    def test_failure_on_one_rank_is_reported_by_rank_0(self):
        proc, out, _ = run("SelfTest_FailOnRank1")
        self.assertEqual(proc.returncode, 1, out)
        self.assertIn("[scalelab] verdict: failed: SelfTest_FailOnRank1.Fails on rank 1:", out)
        self.assertIn("planted failure", out)
        # rank 0 prints the progress: the test is FAILED there too, not "OK" and "PASSED 1 test"
        self.assertIn("the test failed on rank 1 (the line above)", out)
        self.assertRegex(out, r"\[  FAILED  \] (\x1b\[m)?SelfTest_FailOnRank1\.Fails \(\d+ ms\)")
        self.assertNotRegex(out, r"\[       OK \] (\x1b\[m)?SelfTest_FailOnRank1")
        self.assertNotRegex(out, r"\[  PASSED  \] (\x1b\[m)?1 test")

    def test_a_failed_check_is_said_at_once_before_a_hang(self):
        env = dict(ENV, SCALELAB_TIMEOUT="3")
        forget_kept_lines()
        proc = subprocess.run([MPIEXEC, "-n", "2", EXE, "--gtest_filter=SelfTest_FailThenHang.*"],
                              capture_output=True, text=True, timeout=60, env=env)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 3, out)  # the watchdog ended it
        line = "[scalelab] rank 0 failed a check in SelfTest_FailThenHang.Hangs: "
        self.assertIn(line, out)
        self.assertIn("planted failure before a collective", out.split(line, 1)[1].splitlines()[0])
        # and kept whole by the rank that said it (the launcher may cut the printed one)
        failed = kept("failed")
        self.assertEqual(list(failed), [0], out)
        self.assertRegex(failed[0], "^" + re.escape(line) + r".*planted failure before a collective.*\)$")

    def test_the_verdict_names_the_rank_with_the_cause_not_an_echo(self):
        proc, out, _ = run("SelfTest_EchoOnRank0", ranks=3)
        self.assertEqual(proc.returncode, 1, out)
        self.assertIn("[scalelab] verdict: failed: SelfTest_EchoOnRank0.Fails on rank 1:", out)
        self.assertIn("planted cause on rank 1", out.split("[scalelab] verdict:")[-1])

    def test_exception_on_one_rank_ends_the_job(self):
        proc, out, seconds = run("SelfTest_ThrowOnRank1")
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertIn("exception in SelfTest_ThrowOnRank1.Throws on rank 1: planted exception", out)
        self.assertLess(seconds, 45, "the other rank must not be left waiting")

    def test_an_earlier_failure_leads_the_verdict_of_an_exception(self):
        proc, out, seconds = run("SelfTest_FailThenThrow")
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertRegex(out, r"\[scalelab\] verdict: failed: SelfTest_FailThenThrow\.AFailsOnRank0 on rank 0: "
                              r".*planted failure first.* \(then error: exception in "
                              r"SelfTest_FailThenThrow\.BThrowsOnRank1 on rank 1: planted exception after\)")
        self.assertLess(seconds, 45, "the other rank must not be left waiting")

    def test_not_implemented_verdict(self):
        proc, out, _ = run("SelfTest_NotImplemented", ranks=2)
        self.assertEqual(proc.returncode, 1, out)
        self.assertIn("[scalelab] verdict: not implemented: lab 99 step 1: planted (README.md#step-1)", out)
        printed = proc.stdout + proc.stderr
        self.assertEqual(printed.count("[scalelab] verdict:"), 1, "only rank 0 prints the verdict")
        self.assertEqual(list(kept_verdicts()), [0, 1], "each rank that stopped in the stub keeps it")

    def test_not_implemented_in_a_destructor_is_the_same_verdict(self):
        proc, out, _ = run("SelfTest_NotImplementedInDestructor", ranks=2)
        self.assertEqual(proc.returncode, 1, out)
        verdict = "[scalelab] verdict: not implemented: lab 99 step 2: planted in a destructor (README.md#step-2)"
        self.assertIn(verdict, out)
        self.assertEqual(set(kept_verdicts().values()), {verdict}, "kept as a thrown one is")

    def test_a_failure_reads_what_is_wrong_not_the_tests_source(self):
        proc, out, _ = run("SelfTest_ExplainedCheck", ranks=1)
        self.assertEqual(proc.returncode, 1, out)
        verdict = out.split("[scalelab] verdict: ")[-1].splitlines()[0]
        self.assertRegex(verdict, r"^failed: SelfTest_ExplainedCheck\.Fails on rank 0: max \|diff\| 0\.5 at "
                                  r"element 3; planted message \(tests/support/test_main_selftest\.cpp:\d+\)$")
        self.assertNotIn("Value of", verdict)
        proc, out, _ = run("SelfTest_UnnamedCheck", ranks=1)
        verdict = out.split("[scalelab] verdict: ")[-1].splitlines()[0]
        self.assertRegex(verdict, r"^failed: SelfTest_UnnamedCheck\.Fails on rank 0: within_planted_tolerance\(\): "
                                  r"max \|diff\| 0\.5 at element 3 \(tests/support/test_main_selftest\.cpp:\d+\)$")

    def test_drawn_shapes_name_the_seed_that_draws_them_again(self):
        proc, out, _ = run("SelfTest_Drawn", ranks=2)
        self.assertEqual(proc.returncode, 0, out)
        draws = re.findall(r"^draw (\d+) (\d+): drawn from grading seed (\d+) \(draw (\d) of this run; "
                           r"rerun: SCALELAB_GRADE_SEED=(\d+) \./scalelab grade NN\)$", out, re.M)
        self.assertEqual(len(draws), 2, out)
        self.assertEqual([d[3] for d in draws], ["0", "1"])
        self.assertEqual(draws[0][2], draws[0][4])
        self.assertNotEqual(draws[0][:2], draws[1][:2], "each draw of a run has its own numbers")
        try:
            ENV["SCALELAB_GRADE_SEED"] = draws[0][2]
            _, again, _ = run("SelfTest_Drawn", ranks=2)
        finally:
            del ENV["SCALELAB_GRADE_SEED"]
        self.assertEqual(re.findall(r"^draw .*$", again, re.M), re.findall(r"^draw .*$", out, re.M))

    def test_pass(self):
        proc, out, _ = run("SelfTest_Passes", ranks=3)
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("[scalelab] verdict: passed", out)
        self.assertEqual(kept_verdicts(), {0: "[scalelab] verdict: passed"})

    def test_the_verdict_is_kept_whole_by_the_rank_that_states_it(self):
        # rank 0 states a failure (any rank's); an exception's, the rank it ends
        proc, _, _ = run("SelfTest_FailOnRank1")
        kept = kept_verdicts()
        self.assertEqual(list(kept), [0], proc.stdout)
        self.assertRegex(kept[0], r"^\[scalelab\] verdict: failed: SelfTest_FailOnRank1\.Fails on rank 1: "
                                  r".*planted failure.*\)$")
        run("SelfTest_ThrowOnRank1")
        self.assertRegex(kept_verdicts().get(1, ""), r"^\[scalelab\] verdict: error: exception in "
                                                     r"SelfTest_ThrowOnRank1\.Throws on rank 1: planted exception")

    def test_a_rank_killed_in_a_test_leaves_its_name(self):
        # SCALELAB_RUN_DIR/running.rank<r>: the test a rank is in, empty between tests (the
        # grader names the test a crash interrupted from it, tools/grade running_tests)
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(ENV, SCALELAB_RUN_DIR=tmp)
            proc = subprocess.run([MPIEXEC, "-n", "2", EXE, "--gtest_filter=SelfTest_SignalOnRank1.*"],
                                  capture_output=True, text=True, timeout=60, env=env)
            self.assertNotEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            with open(f"{tmp}/running.rank1") as f:
                self.assertEqual(f.read(), "SelfTest_SignalOnRank1.Dies")
            proc = subprocess.run([MPIEXEC, "-n", "2", EXE, "--gtest_filter=SelfTest_Passes.*"],
                                  capture_output=True, text=True, timeout=60, env=env)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            for r in range(2):
                with open(f"{tmp}/running.rank{r}") as f:
                    self.assertEqual(f.read(), "", f"rank {r} left a test it ended")

    def test_every_rank_writes_its_own_report(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc, out, _ = run("SelfTest_Passes.*:SelfTest_Skips", 3, f"--gtest_output=xml:{tmp}/report.xml")
            self.assertEqual(proc.returncode, 0, out)
            self.assertEqual(sorted(os.listdir(tmp)), [f"report.rank{r}.xml" for r in range(3)])
            for r in range(3):
                cases = {c.get("name"): c for c in ET.parse(f"{tmp}/report.rank{r}.xml").getroot().iter("testcase")}
                self.assertEqual(cases["Passes"].get("status"), "run")
                self.assertIsNone(cases["Passes"].find("failure"))
                # a skip says where it was written (the grader accepts skips in tests/ only)
                self.assertEqual(cases["Skips"].get("result"), "skipped")
                self.assertIn("test_main_selftest.cpp", cases["Skips"].find("skipped").get("message"))

    def test_failure_on_one_rank_is_in_that_ranks_report(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc, out, _ = run("SelfTest_FailOnRank1", 2, f"--gtest_output=xml:{tmp}/report.xml")
            self.assertEqual(proc.returncode, 1, out)
            failures = {r: ET.parse(f"{tmp}/report.rank{r}.xml").getroot().find(".//failure")
                        for r in range(2)}
            self.assertIn("planted failure", failures[1].get("message"))
            # rank 0's copy is failed too, naming the rank (tools/grade takes rank 1's cause first)
            self.assertIn("the test failed on rank 1", failures[0].get("message"))


if __name__ == "__main__":
    EXE = sys.argv.pop(1)
    try:
        unittest.main(verbosity=2)
    finally:
        import shutil
        shutil.rmtree(RUN_DIR, ignore_errors=True)
