#!/usr/bin/env python3
"""tools/bench_gpt_vs_torch end to end on the CPU with the tiny model (no GPU, no torch.compile):
both programs run, the table parses, and bad options are one error line with exit 2.

Needs a python with PyTorch (any version: on Debian 12's 1.13 the PyTorch side runs its written
attention, eagerly): SCALELAB_TORCH_PYTHON (CMake option or environment). Without one the test
exits 77 (ctest reports it skipped). Args: LAB02_PROGRAM TEXT_FILE.
"""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(ROOT, "tools", "bench_gpt_vs_torch")
sys.path.insert(0, os.path.join(ROOT, "tools"))
LAB02, DATA = sys.argv[1], sys.argv[2]
PYTHON = os.environ.get("SCALELAB_TORCH_PYTHON", "")


def torch_python():
    if not PYTHON:
        return False
    try:
        code = "import torch"
        return subprocess.run([PYTHON, "-c", code], capture_output=True).returncode == 0
    except OSError:
        return False


class BenchGptVsTorch(unittest.TestCase):
    def run_harness(self, *extra):
        cmd = [sys.executable, HARNESS, "--device", "cpu", "--model", "tiny", "--batch", "2",
               "--steps", "3", "--warmup", "1", "--no-compile", "--data", DATA, "--lab02", LAB02,
               "--python", PYTHON, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def test_table_on_cpu(self):
        p = self.run_harness()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        loader = importlib.machinery.SourceFileLoader("bench_gpt_vs_torch", HARNESS)
        harness = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(harness)
        rows = harness.parse_table(p.stdout)
        self.assertIn("scalelab lab 02 (flash attention)", rows, p.stdout)
        torch_rows = [k for k in rows if k.startswith("PyTorch ")]
        self.assertEqual(len(torch_rows), 1, p.stdout)
        self.assertIn("scalelab / PyTorch", rows, p.stdout)
        for name in ("scalelab lab 02 (flash attention)", torch_rows[0]):
            tps, mfu, mem = rows[name]
            self.assertGreater(float(tps.rstrip("kMG")), 0, name)
            self.assertGreater(float(mfu.rstrip("%")), 0, name)
        self.assertRegex(rows["scalelab lab 02 (flash attention)"][2], r"^[\d.]+(B|KiB|MiB|GiB)$")
        self.assertRegex(rows["scalelab / PyTorch"][0], r"^[\d.]+x$")
        self.assertIn("batch 2 x context 16, bf16, on cpu", p.stdout)

    def test_bad_option_is_a_usage_error(self):
        for bad in (["--batch", "0"], ["--context", "17"], ["--device", "tpu"]):
            p = self.run_harness(*bad)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn("error:", p.stderr, bad)


if __name__ == "__main__":
    if not torch_python():
        print(f"skipped: no python with PyTorch (SCALELAB_TORCH_PYTHON='{PYTHON}')")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1])
