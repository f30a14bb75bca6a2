#!/usr/bin/env python3
"""Tests of tools/gpu_checks, the scripts a session lent a GPU runs there: a GPU session is rare
and short (minutes of device time), so what can go wrong before it is checked here, on the CPU.
Every script parses (bash -n); every target a script's --targets names is a target of this build
(the pack builds exactly those: a misspelt one fails the pack, a missing one leaves its step
with no program on the GPU machine); the Python helpers compile; median_step.py reads step
lines, and refuses output with none."""
import os
import pathlib
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

    def test_python_helpers_compile(self):
        for path in (CHECKS / "median_step.py", ROOT / "tools" / "trace_reads"):
            compile(path.read_text(), str(path), "exec")  # raises SyntaxError

    def test_median_step_reads_step_lines(self):
        lines = "".join(f"step={i} loss=5.0 lr=1.00e-04 dt={10 * (i + 1)}ms tps=1.2M tps/rank=1.2M "
                        f"mfu=30.0% mem=6.2GiB\n" for i in range(6))
        helper = [sys.executable, str(CHECKS / "median_step.py"), "--label", "x"]
        ok = subprocess.run(helper, input="noise\n" + lines, capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        # steps 2..5: 30, 40, 50, 60 ms
        self.assertIn("median step    45.0 ms over 4 steps", ok.stdout)
        self.assertIn("peak 6.2GiB", ok.stdout)
        none = subprocess.run(helper, input="error: cuda: out of memory\n", capture_output=True,
                              text=True)
        self.assertNotEqual(none.returncode, 0)
        self.assertIn("no step line", none.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
