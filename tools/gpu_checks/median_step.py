#!/usr/bin/env python3
"""Reads a lab program's step lines (metrics::step_line) on stdin and prints the median step time
and tokens/s over the steps from --from on (the first steps warm the allocator and cuBLAS).
usage: PROGRAM ... --log-every 1 | python3 tools/gpu_checks/median_step.py [--from 2] [--label X]"""
import argparse
import re
import statistics
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--from", dest="first", type=int, default=2)
ap.add_argument("--label", default="")
args = ap.parse_args()
ms, tps, mem = [], [], ""
for line in sys.stdin:
    m = re.match(r"^step=(\d+) .*?dt=([0-9.]+)ms tps=(\S+) .*?mem=(\S+)", line)
    if m and int(m.group(1)) >= args.first:
        ms.append(float(m.group(2)))
        tps.append(m.group(3))
        mem = m.group(4)
if not ms:
    sys.exit(f"{args.label}: no step line from step {args.first} on")
print(f"{args.label:<24} median step {statistics.median(ms):7.1f} ms over {len(ms)} steps "
      f"(tokens/s of the last {tps[-1]}), peak {mem}")
