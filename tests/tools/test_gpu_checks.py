#!/usr/bin/env python3
"""Tests of tools/gpu_checks, the scripts a session lent a GPU runs there: a GPU session is rare
and short (minutes of device time), so what can go wrong before it is checked here, on the CPU.
Every script parses (bash -n); every target a script's --targets names is a target of this build
(the pack builds exactly those: a misspelt one fails the pack, a missing one leaves its step
with no program on the GPU machine); trace_reads compiles; bench_gpt_vs_torch --scalelab-only
(each trial kernel's timing) prints lab 02's row alone; that timing names every trial kernel."""
import os
import pathlib
import re
import subprocess
import sys
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKS = ROOT / "tools" / "gpu_checks"
BUILD = pathlib.Path(os.environ.get("SCALELAB_BUILD_DIR", ROOT / "build"))


class GpuChecksTest(unittest.TestCase):
    def test_every_script_parses(self):
        scripts = sorted(CHECKS.glob("*.sh"))
        self.assertTrue(scripts)
        for s in scripts:
            proc = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, f"{s.name}: {proc.stderr}")

    def build_targets(self):
        proc = subprocess.run(["cmake", "--build", str(BUILD), "--target", "help"],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        known = set()
        for line in proc.stdout.splitlines():  # Makefiles: "... name"; Ninja: "name: phony"
            line = line.strip()
            known.add(line[4:].split()[0] if line.startswith("... ") else line.split(":")[0])
        return known

    def test_a_misspelt_target_is_not_a_target(self):
        # planted: what the check below would catch in a script's --targets
        known = self.build_targets()
        self.assertIn("scalelab_bench_attention", known)
        self.assertNotIn("scalelab_bench_atention", known)

    def test_the_targets_exist_in_this_build(self):
        known = self.build_targets()
        for script in ("all.sh", "issue31.sh", "issue33.sh"):
            out = subprocess.run(["bash", str(CHECKS / script), "--targets"], capture_output=True,
                                 text=True, cwd=ROOT)
            self.assertEqual(out.returncode, 0, out.stderr)
            targets = out.stdout.split()
            self.assertTrue(targets, script)
            missing = [t for t in targets if t not in known]
            self.assertEqual(missing, [], f"{script} --targets names targets this build lacks")

    def test_the_build_machine_is_refused(self):
        # sourcing the pack's env.sh unpacks over build/gpu: on the build machine, where build/gpu
        # is the CMake build the pack comes from, that would wipe it; each script stops first
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            cache = pathlib.Path(tmp, "build", "gpu", "CMakeCache.txt")
            cache.parent.mkdir(parents=True)
            cache.write_text("# a CMake build\n")
            for script in ("issue31.sh", "issue32.sh", "issue33.sh"):
                proc = subprocess.run(["bash", str(CHECKS / script)], capture_output=True,
                                      text=True, cwd=tmp, env=dict(os.environ, OUT=tmp))
                self.assertEqual(proc.returncode, 2, script + proc.stdout + proc.stderr)
                self.assertIn("this is the build machine", proc.stderr, script)
                self.assertTrue(cache.is_file(), script)

    def test_python_helpers_compile(self):
        path = ROOT / "tools" / "trace_reads"
        compile(path.read_text(), str(path), "exec")  # raises SyntaxError

    def test_lab02_row_alone(self):
        # issue33.sh times lab 02 with each trial kernel through bench_gpt_vs_torch --scalelab-only
        lab02 = BUILD / "labs" / "lab02_single_device_solution"
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "bench_gpt_vs_torch"), "--scalelab-only",
             "--device", "cpu", "--model", "tiny", "--batch", "2", "--steps", "2", "--warmup", "1",
             "--data", str(ROOT / "tests" / "data" / "gpt_golden.txt"), "--lab02", str(lab02),
             "--also-kernels", "none,flash_dq_from_kept_ds"],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertRegex(proc.stdout, r"\| scalelab lab 02 \(flash attention\) \| [\d.]+[kMG]? \|")
        # and a second row, lab 02 run with SCALELAB_TRY_GPU_KERNELS set (the candidate default)
        self.assertRegex(proc.stdout, r"\| scalelab lab 02 \(flash attention, kernels "
                                      r"none,flash_dq_from_kept_ds\) \| [\d.]+[kMG]? \|")
        self.assertIn("SCALELAB_TRY_GPU_KERNELS=none,flash_dq_from_kept_ds ", proc.stdout)
        self.assertNotIn("PyTorch", proc.stdout)

    def test_side_by_side_has_a_ratio_for_each_scalelab_row(self):
        # issue33.sh's side_by_side measures the default and the candidate default
        # (--also-kernels) against one PyTorch run: each scalelab row gets its ratio row
        import importlib.machinery
        import importlib.util
        path = str(ROOT / "tools" / "bench_gpt_vs_torch")
        loader = importlib.machinery.SourceFileLoader("bench_gpt_vs_torch", path)
        harness = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name,
                                                                                  loader))
        loader.exec_module(harness)
        args = harness.argparse.Namespace(model="tiny", batch=2, precision="bf16",
                                          peak_tflops=989.4)
        rows = [{"name": "scalelab lab 02 (flash attention)", "kernels": None,
                 "tokens_per_s": 400e3, "peak_memory": 6 * 2**30},
                {"name": "scalelab lab 02 (flash attention, kernels k1)", "kernels": "k1",
                 "tokens_per_s": 600e3, "peak_memory": 7 * 2**30},
                {"name": "PyTorch 2.11 (compiled)", "tokens_per_s": 500e3,
                 "peak_memory": 6.5 * 2**30}]
        text = harness.table(args, 16, rows, "cuda")
        self.assertIn("| scalelab / PyTorch | 0.80x | 0.80x | 0.92x |", text)
        self.assertIn("| scalelab (kernels k1) / PyTorch | 1.20x | 1.20x | 1.08x |", text)
        self.assertEqual(text.count(" / PyTorch |"), 2, text)
        # a candidate whose run failed (a trial kernel that traps): its row says so, no ratio
        rows[1].update(tokens_per_s=None, failed=1)
        text = harness.table(args, 16, rows, "cuda")
        self.assertIn("| scalelab lab 02 (flash attention, kernels k1) | (failed: exit 1) | | |",
                      text)
        self.assertEqual(text.count(" / PyTorch |"), 1, text)

    @staticmethod
    def timed_trials(script):
        """The trial kernels issue33.sh's per-trial loop times alone (none, the default and
        all aside)."""
        loop = re.search(r"for k in ((?:[\w ]|\\\n)+); do", script)
        return (set(loop.group(1).replace("\\\n", " ").split()) - {"none", "default", "all"}
                if loop else set())

    def test_each_trial_kernel_is_timed_alone(self):
        # issue33.sh's per-trial loop names every kernel of trial_kernels.hpp (kTrialKernels and
        # kCheckedKernels) and no other: a misspelt name would stop that step on the GPU with a
        # usage error, a missing one would leave a kernel unmeasured
        header = (ROOT / "common" / "ops" / "trial_kernels.hpp").read_text()
        trials = set()
        for name in ("kTrialKernels", "kCheckedKernels"):
            listed = re.search(name + r"\[\]\s*=\s*\{([^}]*)\}", header)
            self.assertIsNotNone(listed, name)
            trials |= set(re.findall(r'"(\w+)"', listed.group(1)))
        self.assertGreaterEqual(len(trials), 5)
        script = (CHECKS / "issue33.sh").read_text()
        self.assertEqual(self.timed_trials(script), trials)
        # planted: one name misspelt in the loop is caught
        some = sorted(trials)[0]
        self.assertNotEqual(self.timed_trials(script.replace(f" {some} ", f" {some}x ", 1)), trials)
    def test_trial_table_reads_the_log(self):
        # the per-trial steps as env.sh's `step` logs them: none, one faster, one failed
        log = "\n".join([
            "=== lab02_trial_none (cap 60s): env SCALELAB_TRY_GPU_KERNELS= python3 ...",
            "| scalelab lab 02 (flash attention) | 400.0k | 25.2% | 6.2 GiB |",
            "--- lab02_trial_none rc=0 20.1 s",
            "=== lab02_trial_dgelu_epilogue (cap 60s): env ...",
            "| scalelab lab 02 (flash attention) | 440.0k | 27.7% | 6.1 GiB |",
            "--- lab02_trial_dgelu_epilogue rc=0 19.5 s",
            "=== lab02_trial_all (cap 60s): env ...",
            "error: lab 02 failed (exit 1)",
            "--- lab02_trial_all rc=1 3.0 s", ""])
        path = BUILD / "trial_table_test.log"
        path.write_text(log)
        try:
            proc = subprocess.run([sys.executable, str(CHECKS / "trial_table.py"), str(path)],
                                  capture_output=True, text=True)
        finally:
            path.unlink()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("| none | 400.0k | 1.000x | 6.2 GiB |", proc.stdout)
        self.assertIn("| dgelu_epilogue | 440.0k | 1.100x | 6.1 GiB |", proc.stdout)
        self.assertIn("| all | (step failed: rc 1) |", proc.stdout)
        empty = subprocess.run([sys.executable, str(CHECKS / "trial_table.py"), "/dev/null"],
                               capture_output=True, text=True)
        self.assertEqual(empty.returncode, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
