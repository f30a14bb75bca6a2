#!/usr/bin/env python3
"""Tests of the ./scalelab launcher's usage errors: one clear line, exit code 2."""
import os
import pathlib
import subprocess
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def launch(*args):
    return subprocess.run([str(ROOT / "scalelab"), *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))


class LauncherTest(unittest.TestCase):
    def assert_usage_error(self, proc, words):
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, f"want one error line, got: {proc.stderr!r}")
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        self.assertIn(words, lines[0])

    def test_zero_ranks(self):
        self.assert_usage_error(launch("run", "00", "-n", "0"), "positive number of ranks")

    def test_unknown_lab(self):
        self.assert_usage_error(launch("run", "77"), "no lab 77")
        self.assert_usage_error(launch("grade", "77"), "no lab 77")
        self.assert_usage_error(launch("reset", "77"), "no lab 77")

    def test_unknown_option_and_command(self):
        self.assert_usage_error(launch("run", "00", "--bogus"), "unknown option '--bogus'")
        self.assert_usage_error(launch("frobnicate"), "unknown command")

    def test_program_rejects_unknown_option_on_every_rank(self):
        proc = launch("run", "00", "--solution", "-n", "2", "--", "--bogus")
        self.assert_usage_error(proc, "bogus")

    def test_solution_prints_the_table(self):
        proc = launch("run", "00", "--solution", "-n", "2")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("rank local node world", proc.stdout)
        self.assertIn("all-reduce of rank ids: 1 (expected 1) on every rank: OK", proc.stdout)

    def test_help(self):
        for args in (["--help"], ["run", "--help"], ["grade", "--help"], ["setup", "--help"]):
            proc = launch(*args)
            self.assertEqual(proc.returncode, 0, args)
            self.assertIn("usage", proc.stdout.lower())


if __name__ == "__main__":
    unittest.main(verbosity=2)
