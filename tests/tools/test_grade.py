#!/usr/bin/env python3
"""Tests of the grader itself: planted submissions must get the right verdict, in bounded time.

Each submission is lab 00's reference solution with one fault planted in it. The grader copies
only labs/NN_*/*.cpp from the submission onto a pristine tree, builds each lab on its own and
runs the starter tests, so a broken lab 00 must not stop another lab from being graded.
Run by ctest (label reference;tools) or directly: python3 tests/tools/test_grade.py
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB = "00_hello_dist"
SOLUTION = (ROOT / "solutions" / LAB / "hello_dist.cpp").read_text()
TEST_TIMEOUT = 30  # seconds a test run may take before the grader kills it ("timed out")
WATCHDOG_TIMEOUT = 8  # the watchdog ends a hung collective first, with its report (exit 3)


def plant(old, new):
    assert old in SOLUTION, f"planting site not found: {old!r}"
    return SOLUTION.replace(old, new, 1)


SUBMISSIONS = {
    "correct": SOLUTION,
    # Rank 1 skips the all-reduce: every other rank waits in it forever.
    "hangs": plant("  comm.all_reduce(id, comm::ReduceOp::sum);",
                   "  if (comm.rank() != 1) comm.all_reduce(id, comm::ReduceOp::sum);"),
    # Step 2 dereferences a null pointer.
    "segfaults": plant('  if (!want_gpu || gpu_count == 0) return "cpu";',
                       '  if (!want_gpu || gpu_count == 0) { volatile int* p = nullptr; *p = 1; }'),
    # Rank 1 reports a wrong sum.
    "wrong": plant("  return static_cast<long long>(id.item(0));",
                   "  return static_cast<long long>(id.item(0)) + (comm.rank() == 1);"),
    # Does not compile.
    "no_compile": plant("  Placement p;\n", "  Placement p = ;\n"),
}


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

    def grade(self, kind):
        sub = self.work / f"sub-{kind}"
        (sub / "labs" / LAB).mkdir(parents=True, exist_ok=True)
        (sub / "labs" / LAB / "hello_dist.cpp").write_text(SUBMISSIONS[kind])
        report = self.work / f"{kind}.json"
        labs = ["00"] + ([self.other_lab[:2]] if self.other_lab else [])
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "grade"), *labs, "--submission", str(sub),
                               "--work-dir", str(self.work / "tree-work"), "--json", str(report),
                               "--junit", str(self.work / f"{kind}.xml"), "--test-timeout", str(TEST_TIMEOUT)],
                              capture_output=True, text=True, timeout=1500,
                              env=dict(os.environ, SCALELAB_TIMEOUT=str(WATCHDOG_TIMEOUT)))
        elapsed = time.monotonic() - start
        self.assertTrue(report.exists(), proc.stdout + proc.stderr)
        data = json.loads(report.read_text())
        labs = {l["lab"]: l for l in data["labs"]}
        steps = {s["step"]: s for s in labs["00"]["steps"]}
        if self.other_lab:
            other = labs[self.other_lab[:2]]
            self.assertEqual(other["build"], "ok", f"lab {self.other_lab} must still be built and graded")
            self.assertTrue(all(s["verdict"] != "build failed" for s in other["steps"]))
        return proc, steps, elapsed

    def test_correct_submission_passes(self):
        proc, steps, _ = self.grade("correct")
        self.assertEqual({s["verdict"] for s in steps.values()}, {"passed"}, proc.stdout)
        self.assertEqual(sorted(steps), [1, 2, 3])
        if not self.other_lab:  # lab 00 is all there is: every step passed, so exit 0
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)

    def test_hang_is_timed_out(self):
        proc, steps, elapsed = self.grade("hangs")
        self.assertEqual(steps[3]["verdict"], "timed out", proc.stdout)
        self.assertEqual(steps[3]["ranks"], [2, 4], "one rank passes, more ranks hang")
        # the watchdog, not the grader's kill, ended it: its report names the collective
        self.assertIn("all_reduce", steps[3]["detail"])
        self.assertEqual(steps[1]["verdict"], "passed")
        self.assertNotEqual(proc.returncode, 0)
        # two hanging runs, each bounded by the test timeout plus the kill grace period
        self.assertLess(elapsed, 2 * (TEST_TIMEOUT + 10) + 240)

    def test_segfault_is_crashed(self):
        proc, steps, _ = self.grade("segfaults")
        self.assertEqual(steps[2]["verdict"], "crashed", proc.stdout)
        self.assertIn("SIGSEGV", steps[2]["detail"])
        self.assertEqual(steps[1]["verdict"], "passed")
        self.assertNotEqual(proc.returncode, 0)

    def test_wrong_result_is_failed_naming_the_rank(self):
        proc, steps, _ = self.grade("wrong")
        self.assertEqual(steps[3]["verdict"], "failed", proc.stdout)
        self.assertIn("on rank 1", steps[3]["detail"])
        self.assertEqual(steps[3]["ranks"], [2, 4])
        self.assertNotEqual(proc.returncode, 0)

    def test_compile_error_is_build_failed(self):
        proc, steps, _ = self.grade("no_compile")
        self.assertEqual({s["verdict"] for s in steps.values()}, {"build failed"}, proc.stdout)
        self.assertIn("error", steps[1]["detail"])
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("build failed", proc.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
