#!/usr/bin/env python3
"""Each memory-bounded step's memory check runs first in the step's run.

A step is graded as one process per rank count (`--gtest_filter=StepK*`). A buffer the attendee's
code keeps in a function-local static is allocated the first time the code runs: if an earlier
test of the same process ran it, the memory check's window opens on a buffer already there and a
cache refilled in place never grows. So the test that bounds a step's memory comes first in the
step's run (first in its file, its file linked before the step's other files), and this test
checks that order in the reference test binaries, in GoogleTest's own listing (the order the
tests run in).
argv: the test_labNN_solution binaries of labs 07, 08, 09, 10, 11 and 12; mpiexec from
$MPIEXEC_EXECUTABLE."""
import os
import subprocess
import sys
import unittest

from mpi_env import mpi_env

MPIEXEC = os.environ.get("MPIEXEC_EXECUTABLE", "mpiexec")
BINARIES = {}

# (lab, step): the test that bounds the step's memory (the rank's heap beside the allocator)
FIRST = {
    ("07", 4): "Step4_Memory.TheFullLogitsNeverExistOnOneRank",
    ("07", 5): "Step5_Block.EqualsTheSingleDeviceBlockOnOurRows",
    ("08", 5): "Step5_Memory.AfabHoldsEveryMicroBatchOneFOneBAtMostPMinusStage",
    ("09", 3): "Step3_Zero2.OneTrainerGivesTheGradientTheMemoryAndTheTraffic",
    ("09", 4): "Step4_Zero3.OneTrainerGivesTheNumbersTheMemoryAndTheTraffic",
    ("10", 3): "Step3_Step.CheckpointedEqualsSingleDeviceAndKeepsLess",
    ("11", 2): "Step2_Ring.HoldsAtMostTwoRemoteBlocks",
    ("11", 3): "Step3_Ring.HoldsAtMostTwoRemoteBlocksAndTwoGradientBlocks",
    ("12", 3): "Step3_Memory.NoRankHoldsEveryExpert",
}


def listed(exe, gtest_filter):
    """The tests `exe` runs for `gtest_filter`, in the order it runs them."""
    proc = subprocess.run([MPIEXEC, "-n", "1", exe, "--gtest_list_tests",
                           f"--gtest_filter={gtest_filter}"], capture_output=True, text=True,
                          timeout=60, env=mpi_env("scalelab-memory-first-"))
    if proc.returncode != 0:
        raise AssertionError(f"{exe} --gtest_list_tests: exit {proc.returncode}\n{proc.stderr}")
    tests, suite = [], None
    for line in proc.stdout.splitlines():
        if not line.strip() or line.startswith(("[", "Note:")):
            continue
        if not line.startswith(" "):
            suite = line.split()[0]  # "Step2_Ring."
        else:
            tests.append(suite + line.split()[0])
    return tests


class MemoryChecksRunFirst(unittest.TestCase):
    def test_each_steps_memory_check_is_first_in_its_run(self):
        for (lab, step), first in sorted(FIRST.items()):
            with self.subTest(lab=lab, step=step):
                order = listed(BINARIES[lab], f"Step{step}*")
                self.assertIn(first, order, f"lab {lab}: {first} is not in step {step}'s run")
                self.assertEqual(order[0], first,
                                 f"lab {lab} step {step} runs {order[:order.index(first)]} before "
                                 f"its memory check {first}: move it first in its file (and its "
                                 f"file first among the step's files)")


if __name__ == "__main__":
    for lab, exe in zip(["07", "08", "09", "10", "11", "12"], sys.argv[1:7]):
        BINARIES[lab] = exe
    unittest.main(argv=sys.argv[:1], verbosity=2)
