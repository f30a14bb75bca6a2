#!/usr/bin/env python3
"""The memory checks give the reference the same verdict every time, under a competing CPU load.

The counting heap counts the rank's own threads only (tests/support/heap.hpp, rank_threads.hpp):
what MPI's progress threads, a communicator's worker or the watchdog allocate meanwhile no longer
moves a bound (lab 07 step 4 once failed correct code on 4 ranks that way). Runs the memory-
bounded steps' graders on the reference, as the grader runs a step (its --gtest_filter), ROUNDS
times each while two busy processes compete for the cores, and requires a pass every time.
argv: the test_lab07_solution, test_lab08_solution and test_lab11_solution binaries; mpiexec from
$MPIEXEC_EXECUTABLE; SCALELAB_STABILITY_ROUNDS (default 2) rounds."""
import os
import subprocess
import sys
import unittest

from mpi_env import mpi_env

MPIEXEC = os.environ.get("MPIEXEC_EXECUTABLE", "mpiexec")
ROUNDS = int(os.environ.get("SCALELAB_STABILITY_ROUNDS", "2"))
LAB07 = LAB08 = LAB11 = None


class MemoryChecksAreStableUnderLoad(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Two processes that never sleep: the ranks, MPI's threads and the communicators'
        # workers are descheduled at any point, as on a busy CI machine.
        busy = "while True: pass"
        cls.load = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(2)]

    @classmethod
    def tearDownClass(cls):
        for p in cls.load:
            p.kill()
            p.wait()

    def grade(self, exe, ranks, gtest_filter):
        env = mpi_env("scalelab-memory-stability-")
        for k in range(ROUNDS):
            command = [MPIEXEC, "-n", str(ranks), exe, f"--gtest_filter={gtest_filter}"]
            proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
            out = proc.stdout + proc.stderr
            self.assertEqual(proc.returncode, 0, f"round {k + 1} of {ROUNDS}: {gtest_filter} on "
                             f"{ranks} ranks failed the reference:\n{out[-3000:]}")
            self.assertIn("[scalelab] verdict: passed", out)

    def test_lab07_step4_on_4_ranks(self):
        self.grade(LAB07, 4, "Step4*")

    def test_lab08_step5_memory_on_2_ranks(self):
        self.grade(LAB08, 2, "Step5_Memory*")

    def test_lab11_ring_memory_on_4_ranks(self):
        self.grade(LAB11, 4, "Step2_Ring.Holds*:Step3_Ring.Holds*")


if __name__ == "__main__":
    LAB07, LAB08, LAB11 = sys.argv[1:4]
    unittest.main(argv=sys.argv[:1], verbosity=2)
