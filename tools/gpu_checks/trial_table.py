#!/usr/bin/env python3
"""The trial kernels' end-to-end table from a GPU session's full.log: issue33.sh times lab 02's
step once with each trial kernel alone (steps lab02_trial_<name>, tools/bench_gpt_vs_torch
--scalelab-only), once with none and once with all; this prints each one's tokens/s, its ratio
to none and its peak memory as a markdown table, the input of "which trial kernels to flip".

  python3 tools/gpu_checks/trial_table.py $OUT/full.log

A step that failed or printed no row says so in its line. Exit 0 with a table, 1 when the log
holds no lab02_trial_ step, 2 when the log cannot be read."""
import importlib.machinery
import importlib.util
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}  # bench_gpt_vs_torch's human_count, read back
STEP = re.compile(r"^=== lab02_trial_(\w+) \(cap [^)]*\): .*?$(.*?)^--- lab02_trial_\1 rc=(-?\d+)",
                  re.M | re.S)


def bench_tool():
    """tools/bench_gpt_vs_torch as a module: its parse_table reads the rows it printed."""
    path = os.path.join(ROOT, "tools", "bench_gpt_vs_torch")
    loader = importlib.machinery.SourceFileLoader("bench_gpt_vs_torch", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def trials(log):
    """[(name, tokens/s or None, peak memory text, rc)] in the order the steps ran."""
    parse_table = bench_tool().parse_table
    out = []
    for name, body, rc in STEP.findall(log):
        row = next((r for program, r in parse_table(body).items()
                    if program.startswith("scalelab lab 02")), None)
        m = re.fullmatch(r"([\d.]+)([kMG]?)", row[0]) if row else None
        tps = float(m.group(1)) * UNITS[m.group(2)] if m else None
        out.append((name, tps, row[2] if row else "", int(rc)))
    return out


def table(rows):
    base = next((tps for name, tps, _, rc in rows if name == "none" and rc == 0), None)
    lines = ["| trial kernels on | tokens/s | vs none | peak memory |", "|---|---:|---:|---:|"]
    for name, tps, mem, rc in rows:
        if rc != 0 or tps is None:
            lines.append(f"| {name} | (step failed: rc {rc}) | | |" if rc != 0
                         else f"| {name} | (no row) | | |")
            continue
        ratio = f"{tps / base:.3f}x" if base else "n/a"
        lines.append(f"| {name} | {tps / 1e3:.1f}k | {ratio} | {mem} |")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 1:
        print("usage: trial_table.py FULL_LOG", file=sys.stderr)
        return 2
    try:
        log = open(argv[0], errors="replace").read()
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = trials(log)
    if not rows:
        print(f"error: no lab02_trial_ step in {argv[0]}", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
