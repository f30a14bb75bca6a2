#!/usr/bin/env python3
"""One training step's GPU kernel time, scalelab beside PyTorch, by what the kernels do.

scalelab's side comes from Nsight Compute (ncu's gpu__time_duration of every kernel) on two runs
of lab 02 that differ only in --steps: the difference, divided by the step difference, is what
one step launches (start-up, cuBLAS's first-call work, the final evaluation and the checkpoint
cancel out). PyTorch's side is tools/bench_gpt_torch.py --kernel-table (torch.profiler over steps
after the timed ones). Kernels are grouped by name into GEMM, attention, LayerNorm, GELU,
optimizer, embedding, softmax / cross-entropy, copies and the rest.

  ncu --metrics gpu__time_duration.sum --clock-control none --csv --print-units base \\
      --print-kernel-base function \\
      build/labs/lab02_single_device_solution ... --steps 1 > a.csv      # and --steps 2 > b.csv
  python3 tools/bench_gpt_torch.py ... --kernel-table torch.csv
  tools/kernel_table.py --ncu a.csv b.csv --step-diff 1 --torch torch.csv
"""
import argparse
import csv
import io
import re
import sys

CATEGORIES = [  # (category, regex on the lower-cased kernel name): the first match wins
    ("bias and LayerNorm weight gradients", r"bias_backward|bgrad|column_partial|column_total"),
    ("attention", r"flash|attention|fmha|sdpa|attn"),
    ("LayerNorm", r"layer_?norm|layernorm|\blnf?_"),
    ("GELU", r"gelu"),
    ("optimizer", r"adam|multi_tensor|foreach|clip|norm_sq|grad_norm"),
    ("embedding", r"embedding|index_add|gather_rows|embed|grouped_rows|radixsort|keys_kernel"
                  r"|starts_kernel"),
    ("softmax / cross-entropy", r"softmax|cross_entropy|nll|logsumexp|exp_rows|row_max"
                                r"|divide_rows|logarithm"),
    ("GEMM", r"gemm|cutlass|xmma|nvjet|cublas|matmul|sm\d+_"),
    ("copies / casts / fills", r"memcpy|memset|copy|cast|convert|fill|to_bf16|to_f32|transpose"),
    ("fused by the compiler (other)", r"triton"),
]


def category(name):
    low = name.lower()
    for cat, rx in CATEGORIES:
        if re.search(rx, low):
            return cat
    return "other"


def read_ncu(path):
    """{kernel name: (launches, ns)} from ncu --csv output (lines before the header skipped)."""
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"error: {path}: no ncu CSV header (\"ID\",...) found")
    out = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        ns = value * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        n, t = out.get(row["Kernel Name"], (0, 0.0))
        out[row["Kernel Name"]] = (n + 1, t + ns)
    return out


def per_step_from_ncu(a_path, b_path, step_diff):
    """{name: (launches, us)} of one step: (b - a) / step_diff."""
    a, b = read_ncu(a_path), read_ncu(b_path)
    out = {}
    for name in set(a) | set(b):
        na, ta = a.get(name, (0, 0.0))
        nb, tb = b.get(name, (0, 0.0))
        if nb - na > 0:
            out[name] = ((nb - na) / step_diff, (tb - ta) / step_diff / 1e3)
    return out


def read_torch(path):
    out = {}
    for row in csv.DictReader(open(path)):
        out[row["name"]] = (float(row["launches"]), float(row["us"]))
    return out


def by_category(kernels):
    cats = {}
    for name, (n, us) in kernels.items():
        c = cats.setdefault(category(name), [0.0, 0.0])
        c[0] += n
        c[1] += us
    return cats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ncu", nargs=2, metavar=("FEWER", "MORE"), required=True,
                    help="ncu CSVs of lab 02 with fewer and more --steps")
    ap.add_argument("--step-diff", type=int, required=True, help="MORE's --steps minus FEWER's")
    ap.add_argument("--torch", help="tools/bench_gpt_torch.py --kernel-table CSV")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per side")
    a = ap.parse_args(argv)
    if a.step_diff <= 0:
        ap.error("--step-diff must be positive")
    sides = [("scalelab", per_step_from_ncu(a.ncu[0], a.ncu[1], a.step_diff))]
    if a.torch:
        sides.append(("PyTorch", read_torch(a.torch)))
    cats = [by_category(k) for _, k in sides]
    names = sorted({c for cs in cats for c in cs}, key=lambda c: -cats[0].get(c, [0, 0])[1])
    head = " | ".join(f"{s} ms (launches)" for s, _ in sides)
    print(f"| kernels | {head} |")
    print("|---|" + "---:|" * len(sides))
    for c in names:
        cells = " | ".join(f"{cs.get(c, [0, 0])[1] / 1e3:.2f} ({cs.get(c, [0, 0])[0]:.0f})" for cs in cats)
        print(f"| {c} | {cells} |")
    totals = " | ".join(f"**{sum(v[1] for v in cs.values()) / 1e3:.2f}** ({sum(v[0] for v in cs.values()):.0f})"
                        for cs in cats)
    print(f"| **one step** | {totals} |")
    for side, kernels in sides:
        print(f"\n{side}: the {a.top} longest kernels per step")
        for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:a.top]:
            print(f"  {us / 1e3:8.3f} ms  {n:6.0f}x  [{category(name)}]  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
