#!/usr/bin/env python3
"""Tests of the ./scalelab launcher: usage errors (one clear line, exit code 2), the notice of a
killed rank, Ctrl-C (exit 130, saying what was stopped), what `plan` starts, `hint`, and the
corpus `run` prepares."""
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
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


# A launcher whose job runs until it is signalled (it records its arguments for the test first).
# Started in the background by a script, it ignores SIGINT (as any background command of a
# non-interactive shell does) and ends on SIGTERM, as mpirun ends its ranks on it.
FAKE_LONG_MPIRUN = r"""#!/bin/sh
printf '%s\n' "$@" > "$FAKE_MPIRUN_ARGS"
echo "fake job running" >&2
exec sleep 60
"""


# A lab 10 program whose lab 08 is not written yet: the runtime's line on rank 0's stderr.
FAKE_NOT_IMPLEMENTED_MPIRUN = r"""#!/bin/sh
echo "not implemented: lab 08 step 1: stage_layers (README.md#step-1)" >&2
exit 1
"""


def fake_mpirun(tmp, script):
    fake = pathlib.Path(tmp) / "mpirun"
    fake.write_text(script)
    fake.chmod(0o755)
    return {"PATH": f"{tmp}:{os.environ['PATH']}", "FAKE_MPIRUN_ARGS": str(pathlib.Path(tmp) / "args")}


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

    def test_reference_names_labs_the_lab_is_built_from(self):
        # lab 10 runs the attendee's labs 07-09; --reference swaps in the named references only
        self.assert_usage_error(launch("run", "10", "--reference", "05"), "built from labs 07, 08, 09")
        self.assert_usage_error(launch("run", "07", "--reference", "05"), "applies to lab 10")
        self.assert_usage_error(launch("run", "10", "--solution", "--reference", "07"),
                                "not with --solution")

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

    def interrupt(self, sig, whole_group):
        """Starts `./scalelab run 00` on a fake mpirun that runs until signalled, sends `sig` to
        the launcher alone or to its whole process group (what Ctrl-C in a terminal does), and
        returns (exit code, stderr, seconds from the signal to the exit)."""
        launch("build", "lab00_hello_dist_solution")
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, **fake_mpirun(tmp, FAKE_LONG_MPIRUN))
            env.pop("MPIEXEC", None)
            env.pop("SLURM_JOB_ID", None)
            env.pop("PBS_JOBID", None)
            proc = subprocess.Popen([str(ROOT / "scalelab"), "run", "00", "--solution", "-n", "2"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    start_new_session=True)
            try:
                for _ in range(300):  # the fake mpirun is running once it has written its arguments
                    if (pathlib.Path(tmp) / "args").exists():
                        break
                    time.sleep(0.1)
                start = time.monotonic()
                if whole_group:
                    os.killpg(proc.pid, sig)
                else:
                    os.kill(proc.pid, sig)
                _, err = proc.communicate(timeout=30)
                return proc.returncode, err, time.monotonic() - start
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def test_not_implemented_in_another_lab_names_its_readme_and_reference(self):
        # lab 10's program runs labs 07-09 and 11 too: a "not implemented" of lab 08 gets one
        # more line naming labs/08_*/README.md and --reference 08; lab 10's own gets none
        launch("build", "lab10_3d_parallel")
        with tempfile.TemporaryDirectory() as tmp:
            # (--plan: no corpus to prepare; the fake job ignores its arguments)
            proc = launch("run", "10", "-n", "2", "--", "--plan",
                          env=fake_mpirun(tmp, FAKE_NOT_IMPLEMENTED_MPIRUN))
            self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
            lines = proc.stderr.splitlines()
            self.assertIn("not implemented: lab 08 step 1: stage_layers (README.md#step-1)", lines)
            pointer = [l for l in lines if l.startswith("scalelab: that is lab 08's step 1")]
            self.assertEqual(len(pointer), 1, proc.stderr)
            self.assertIn("labs/08_pipeline_parallel/README.md", pointer[0])
            self.assertIn("--reference 08", pointer[0])
            own = FAKE_NOT_IMPLEMENTED_MPIRUN.replace("lab 08", "lab 10")
            proc = launch("run", "10", "-n", "2", "--", "--plan", env=fake_mpirun(tmp, own))
            self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
            self.assertNotIn("scalelab: that is lab", proc.stderr)

    def test_ctrl_c_ends_the_job_with_130_and_says_what_was_stopped(self):
        # Ctrl-C: SIGINT to the whole foreground process group (the launcher sees it too)
        code, err, seconds = self.interrupt(signal.SIGINT, whole_group=True)
        self.assertEqual(code, 130, err)
        self.assertIn("scalelab: interrupted by SIGINT: stopped lab 00 (lab00_hello_dist_solution) "
                      "on 2 ranks; exit code 130", err)
        self.assertLess(seconds, 20, err)

    def test_sigterm_to_the_launcher_alone_is_passed_on(self):
        # `timeout`, a CI runner cancelling: the signal reaches scalelab only; it must still end
        # the job (the fake mpirun only ends on the SIGTERM scalelab passes on) and exit 128 + 15
        code, err, seconds = self.interrupt(signal.SIGTERM, whole_group=False)
        self.assertEqual(code, 143, err)
        self.assertIn("interrupted by SIGTERM: stopped lab 00", err)
        self.assertLess(seconds, 20, err)

    def test_plan_for_many_ranks_starts_one_process_per_core_at_most(self):
        # the planner plans for --ranks N without starting them: mpirun gets -n min(N, cores)
        # and the program --ranks N
        launch("build", "lab10_3d_parallel_solution")
        with tempfile.TemporaryDirectory() as tmp:
            env = fake_mpirun(tmp, "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$FAKE_MPIRUN_ARGS\"\n")
            env.update(MPIEXEC="", SLURM_JOB_ID="", PBS_JOBID="")
            cores = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
            for ranks, started in ((1024, min(1024, cores)), (1, 1)):
                proc = launch("plan", "--ranks", str(ranks), "--model", "tiny", env=env)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                args = (pathlib.Path(tmp) / "args").read_text().splitlines()
                self.assertEqual(args[:2], ["-n", str(started)], args)
                self.assertIn("--plan", args)
                self.assertEqual(args[args.index("--ranks") + 1], str(ranks), args)
        self.assert_usage_error(launch("plan", "--ranks", "many"), "positive number of ranks")

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

    def test_hint_prints_a_steps_hints_one_at_a_time_from_the_readme(self):
        # on a copy of the launcher and a README with two hints in step 1 and none in step 2
        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp)
            shutil.copy2(ROOT / "scalelab", root / "scalelab")
            (root / "labs" / "42_demo").mkdir(parents=True)
            (root / "labs" / "42_demo" / "README.md").write_text(
                "# Lab 42\n\n## Step 1: one (core)\n\n**Goal.** g.\n\n"
                "<details><summary>Stuck? the <code>split</code></summary>\n\nfirst body\n</details>\n"
                "<details><summary>Stuck? the exchange</summary>\n\nsecond body\n</details>\n\n"
                "## Step 2: two\n\nno hints here\n\n"
                "<details><summary>The measured tables</summary>\n\nnot a hint\n</details>\n")

            def hint(*args):
                return subprocess.run([str(root / "scalelab"), "hint", *args], capture_output=True,
                                      text=True, timeout=60)
            first = hint("42", "1")
            self.assertEqual(first.returncode, 0, first.stderr)
            self.assertIn("lab 42 step 1, hint 1 of 2: the split", first.stdout)
            self.assertIn("first body", first.stdout)
            self.assertNotIn("second body", first.stdout)  # one level at a time
            self.assertIn("./scalelab hint 42 1 2", first.stdout)
            second = hint("42", "1", "2")
            self.assertEqual(second.returncode, 0, second.stderr)
            self.assertIn("hint 2 of 2: the exchange", second.stdout)
            self.assertIn("second body", second.stdout)
            self.assertNotIn("first body", second.stdout)
            none = hint("42", "2")  # a <details> that is not a "Stuck?" hint is not one
            self.assertEqual(none.returncode, 0, none.stderr)
            self.assertIn("has no hints", none.stdout)
            self.assertNotIn("not a hint", none.stdout)
            self.assert_usage_error(hint("42", "1", "3"), "has 2 hint(s), not 3")
            self.assert_usage_error(hint("42", "7"), "no step 7 (steps: 1 2)")
            self.assert_usage_error(hint("42", "x"), "STEP must be a step number")
        # every real README's hints are found: lab 08 step 1 has two
        proc = launch("hint", "08", "1", "2")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("lab 08 step 1, hint 2 of 2", proc.stdout)

    def test_run_prepares_the_default_corpus_when_missing(self):
        # a fresh clone has no ./data: `run` makes it (saying so) before a lab that trains on it,
        # not when the program is given --data, and only once
        launch("build", "lab08_pipeline_parallel_solution")
        with tempfile.TemporaryDirectory() as tmp:
            env = fake_mpirun(tmp, "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$FAKE_MPIRUN_ARGS\"\n")
            corpus = pathlib.Path(tmp) / "corpus"
            env.update(MPIEXEC="", SLURM_JOB_ID="", PBS_JOBID="", SCALELAB_DATA_DIR=str(corpus))
            given = launch("run", "08", "--solution", "-n", "2", "--", "--data", str(tmp), env=env)
            self.assertEqual(given.returncode, 0, given.stderr)
            self.assertFalse(corpus.exists(), given.stderr)
            first = launch("run", "08", "--solution", "-n", "2", env=env)
            self.assertEqual(first.returncode, 0, first.stderr)
            self.assertIn(f"no usable corpus in {corpus}: preparing the default one", first.stderr)
            self.assertTrue((corpus / "train.bin").is_file(), first.stderr)
            again = launch("run", "08", "--solution", "-n", "2", env=env)
            self.assertEqual(again.returncode, 0, again.stderr)
            self.assertNotIn("preparing", again.stderr)

    def test_help(self):
        for args in (["--help"], ["run", "--help"], ["grade", "--help"], ["setup", "--help"]):
            proc = launch(*args)
            self.assertEqual(proc.returncode, 0, args)
            self.assertIn("usage", proc.stdout.lower())


if __name__ == "__main__":
    unittest.main(verbosity=2)
