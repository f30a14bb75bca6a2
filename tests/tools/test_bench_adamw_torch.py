#!/usr/bin/env python3
"""tools/bench_adamw_torch.py runs on the PyTorch it finds (issue 22: it passed fused= to every
variant, which PyTorch 1.13 does not take, and called torch.backends.cpu, which 1.13 lacks) and
names the default implementation from what PyTorch runs, not from an assumption.

Needs a python with torch: SCALELAB_TORCH_PYTHON (CMake option or environment; e.g. Debian's
/usr/bin/python3 with python3-torch). Without one the test exits 77 (ctest reports it skipped).
"""
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tools", "bench_adamw_torch.py")
PYTHON = os.environ.get("SCALELAB_TORCH_PYTHON", "")


def torch_python():
    if not PYTHON:
        return False
    try:
        return subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode == 0
    except OSError:
        return False


class BenchAdamwTorch(unittest.TestCase):
    def test_table_marks_the_default_this_pytorch_runs(self):
        p = subprocess.run([PYTHON, BENCH, "--model", "tiny", "--repeats", "2", "--warmup", "1"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        default = re.search(r"the default AdamW here runs the (\S+) implementation", p.stdout)
        self.assertIsNotNone(default, p.stdout)
        rows = [line for line in p.stdout.splitlines() if line.startswith("| torch")]
        self.assertGreaterEqual(len(rows), 2, p.stdout)  # at least the for-loop and foreach
        marked = [r for r in rows if ", the default" in r]
        self.assertEqual(len(marked), 1, p.stdout)
        self.assertTrue(marked[0].startswith(f"| torch {default.group(1)} "), p.stdout)

    def test_the_options_select_the_implementations_they_name(self):
        # the spy that finds the default must see what foreach=True and foreach=False select
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import bench_adamw_torch as b; "
                "print(b.implementation(foreach=True), b.implementation(foreach=False))")
        p = subprocess.run([PYTHON, "-c", code, os.path.join(ROOT, "tools")], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["foreach", "for-loop"])


if __name__ == "__main__":
    if not torch_python():
        print("skipped: set SCALELAB_TORCH_PYTHON to a python with torch", file=sys.stderr)
        sys.exit(77)
    unittest.main(verbosity=2)
