#!/usr/bin/env python3
"""Tests of the ./scalelab launcher's usage errors: one clear line, exit code 2."""
import os
import pathlib
import shutil
import subprocess
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def launch(*args, env=None):
    return subprocess.run([str(ROOT / "scalelab"), *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


# What Open MPI 4's mpirun prints when one rank is killed with `kill -9` (its exit code: 137).
FAKE_MPIRUN = r"""#!/bin/sh
echo "rank output" >&2
cat >&2 <<'EOF'
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).
--------------------------------------------------------------------------
EOF
exit 137
"""


class LauncherTest(unittest.TestCase):
    def assert_usage_error(self, proc, words):
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, f"want one error line, got: {proc.stderr!r}")
        self.assertTrue(lines[0].startswith("error: "), lines[0])
        self.assertIn(words, lines[0])

    def test_zero_ranks(self):
        self.assert_usage_error(launch("run", "00", "-n", "0"), "positive number of ranks")
        self.assert_usage_error(launch("plan", "--ranks", "0"), "positive number of ranks")

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

    def test_killed_rank_is_named(self):
        # `./scalelab run` keeps mpirun's notice of which rank died of which signal (not --quiet)
        # as one line, and drops Open MPI's help text; the exit code stays 128+9.
        launch("build", "lab00_hello_dist_solution")
        with tempfile.TemporaryDirectory() as tmp:
            fake = pathlib.Path(tmp) / "mpirun"
            fake.write_text(FAKE_MPIRUN)
            fake.chmod(0o755)
            proc = launch("run", "00", "--solution", "-n", "4", env={"PATH": f"{tmp}:{os.environ['PATH']}"})
        self.assertEqual(proc.returncode, 137, proc.stderr)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        self.assertEqual(lines, ["rank output",
                                 "error: rank 2 (on node vm) was killed by signal 9 (Killed); mpirun ended the others"])

    def test_reset_keeps_a_backup(self):
        # on a copy of the launcher, make-labs and lab 00 (reset rewrites files in the tree)
        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp)
            (root / "tools").mkdir()
            shutil.copy2(ROOT / "scalelab", root / "scalelab")
            shutil.copy2(ROOT / "tools" / "make-labs", root / "tools" / "make-labs")
            shutil.copytree(ROOT / "solutions" / "00_hello_dist", root / "solutions" / "00_hello_dist")
            shutil.copytree(ROOT / "labs" / "00_hello_dist", root / "labs" / "00_hello_dist")
            lab = root / "labs" / "00_hello_dist" / "hello_dist.cpp"
            lab.write_bytes(lab.read_bytes() + b"// my work\n")
            proc = subprocess.run([str(root / "scalelab"), "reset", "00"], capture_output=True, text=True,
                                  timeout=60, env=dict(os.environ, SCALELAB_BUILD_DIR=str(root / "build")))
            self.assertEqual(proc.returncode, 0, proc.stderr)
            backups = list((root / "build" / "backup").glob("00_hello_dist-*.cpp"))
            self.assertEqual(len(backups), 1, proc.stderr)
            self.assertTrue(backups[0].read_bytes().endswith(b"// my work\n"))
            self.assertIn(str(backups[0]), proc.stderr)
            self.assertNotIn(b"// my work", lab.read_bytes())

    def test_build_directory_of_another_clone_is_explained(self):
        # A build directory copied from another clone: CMake would fail every build with a cache
        # error; the launcher says what it is and what to do, before running anything.
        with tempfile.TemporaryDirectory() as tmp:
            build = pathlib.Path(tmp) / "build"
            build.mkdir()
            (build / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere/scalelab\n")
            for args in (["build"], ["run", "00", "--solution"]):
                proc = launch(*args, env={"SCALELAB_BUILD_DIR": str(build)})
                self.assert_usage_error(proc, "configured for another source tree (/elsewhere/scalelab)")
                self.assertIn(f"rm -rf {build}", proc.stderr)

    def test_help(self):
        for args in (["--help"], ["run", "--help"], ["grade", "--help"], ["setup", "--help"]):
            proc = launch(*args)
            self.assertEqual(proc.returncode, 0, args)
            self.assertIn("usage", proc.stdout.lower())


if __name__ == "__main__":
    unittest.main(verbosity=2)
