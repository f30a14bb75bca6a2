#!/usr/bin/env python3
"""AdamW at a GPT's shape on one CPU thread: PyTorch's torch.optim.AdamW against scalelab's.

Times optimizer.step() of torch.optim.AdamW over the parameters of a scalelab model config (the
same shapes as scalelab_bench_adamw: 148 tensors for gpt-85m, 2-d weights with weight decay 0.1,
the rest without; betas (0.9, 0.95), eps 1e-8, lr 6e-4, nanoGPT's) with torch.set_num_threads(1),
for the implementations PyTorch has on the CPU: foreach (the default), the for-loop
(foreach=False, fused=False) and fused=True where this PyTorch has it. With --scalelab BINARY it
also runs scalelab_bench_adamw with the same config and repeats and prints one table.

  OPENBLAS_NUM_THREADS=1 python3 tools/bench_adamw_torch.py \\
      --scalelab build/common/scalelab_bench_adamw

Needs torch (pip install torch). Not part of the test suite.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

CONFIGS = {  # name: (vocab, block_size, n_layer, n_embd), as common/model_config.cpp
    "tiny": (256, 16, 2, 32),
    "small": (256, 64, 4, 128),
    "gpt-85m": (256, 1024, 12, 768),
}


def gpt_shapes(name):
    """(shape, weight decay) of each parameter in model order; the tied LM head counted once."""
    vocab, block, n_layer, c = CONFIGS[name]
    shapes = [((vocab, c), True), ((block, c), True)]
    for _ in range(n_layer):
        for s in [(c,), (c,), (3 * c, c), (3 * c,), (c, c), (c,), (c,), (c,), (4 * c, c),
                  (4 * c,), (c, 4 * c), (c,)]:
            shapes.append((s, len(s) == 2))
    shapes += [((c,), False), ((c,), False)]
    return shapes


def time_torch(name, repeats, warmup, **kwargs):
    import torch
    torch.manual_seed(1337)
    params = []
    decay, no_decay = [], []
    for shape, wd in gpt_shapes(name):
        p = torch.nn.Parameter(torch.randn(shape) * 0.02)
        p.grad = torch.randn(shape) * 0.02
        (decay if wd else no_decay).append(p)
        params.append(p)
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **kwargs)
    times = []
    with torch.no_grad():
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            opt.step()
            dt = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times.append(dt)
    n = sum(p.numel() for p in params)
    return n, min(times), statistics.median(times)


def time_scalelab(binary, name, repeats, warmup):
    out = subprocess.run([binary, "--model", name, "--repeats", str(repeats), "--warmup",
                          str(warmup)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"params=(\d+).*best ([\d.]+) ms, median ([\d.]+) ms", out)
    if not m:
        sys.exit(f"error: unexpected output from {binary}: {out!r}")
    return int(m.group(1)), float(m.group(2)), float(m.group(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-85m", choices=sorted(CONFIGS))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--scalelab", metavar="BINARY", help="scalelab_bench_adamw to run as well")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(1)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    rows = []
    if args.scalelab:
        rows.append(("scalelab AdamW (one pass, AVX/SSE2)",)
                    + time_scalelab(args.scalelab, args.model, args.repeats, args.warmup))
    variants = [("torch foreach=True (default)", dict(foreach=True, fused=False)),
                ("torch foreach=False, fused=False", dict(foreach=False, fused=False)),
                ("torch fused=True", dict(fused=True))]
    for label, kwargs in variants:
        try:
            rows.append((label,) + time_torch(args.model, args.repeats, args.warmup, **kwargs))
        except (RuntimeError, TypeError, ValueError) as e:  # fused=True is not on every CPU build
            print(f"# {label}: not available ({e})", file=sys.stderr)
    print(f"AdamW step, {args.model}, one CPU thread, best / median of {args.repeats} steps "
          f"after {args.warmup} (torch {torch.__version__}, "
          f"{torch.backends.cpu.get_cpu_capability()})")
    print(f"| {'implementation':36} | {'params':>10} | {'best ms':>8} | {'median ms':>9} |")
    print(f"|{'-' * 38}|{'-' * 11}:|{'-' * 9}:|{'-' * 10}:|")
    for label, n, best, median in rows:
        print(f"| {label:36} | {n:>10} | {best:>8.1f} | {median:>9.1f} |")
    counts = {n for _, n, _, _ in rows}
    if len(counts) != 1:
        sys.exit(f"error: the implementations timed different parameter counts: {counts}")


if __name__ == "__main__":
    main()
