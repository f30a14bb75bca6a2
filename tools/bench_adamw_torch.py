#!/usr/bin/env python3
"""AdamW at a GPT's shape on one CPU thread: PyTorch's torch.optim.AdamW against scalelab's.

Times optimizer.step() of torch.optim.AdamW over the parameters of a scalelab model config (the
same shapes as scalelab_bench_adamw: 148 tensors for gpt-85m, 2-d weights with weight decay 0.1,
the rest without; betas (0.9, 0.95), eps 1e-8, lr 6e-4, nanoGPT's) with torch.set_num_threads(1),
for each implementation the installed PyTorch has on the CPU: the for-loop over the tensors
(foreach=False), foreach=True (one kernel per operation over all tensors) and fused=True, each
where this PyTorch's AdamW takes the option and the CPU runs it (PyTorch 1.13 has no `fused`;
fused on the CPU needs 2.4 or later). Which one is the default is not assumed: the script watches
which implementation an AdamW built without options runs and marks that row (on the CPU it is the
for-loop: PyTorch picks foreach by default only for GPU tensors). With --scalelab BINARY it also
runs scalelab_bench_adamw with the same config and repeats and prints one table.

  OPENBLAS_NUM_THREADS=1 python3 tools/bench_adamw_torch.py \\
      --scalelab build/common/scalelab_bench_adamw

Needs torch (pip install torch, or Debian's python3-torch). tests/tools/test_bench_adamw_torch.py
runs it when SCALELAB_TORCH_PYTHON names a python with torch.
"""
import argparse
import inspect
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


# PyTorch's AdamW calls one private function per implementation, named by kind in every version
# so far: _single_tensor_adamw (the for-loop), _multi_tensor_adamw (foreach), _fused_adamw (fused),
# in torch.optim.adamw, or the _adam ones in torch.optim.adam where AdamW is Adam with decoupled
# weight decay (2.6 and later). Watching which one a step calls tells the implementation.
KINDS = (("_single_tensor_", "for-loop"), ("_multi_tensor_", "foreach"), ("_fused_", "fused"))


def implementation(**kwargs):
    """The implementation torch.optim.AdamW(**kwargs) runs one step with on CPU tensors:
    'for-loop', 'foreach', 'fused', or 'unknown' (a PyTorch whose functions are named otherwise)."""
    import importlib
    import torch
    seen = []
    patched = []
    for module_name in ("torch.optim.adamw", "torch.optim.adam"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in dir(module):
            for prefix, kind in KINDS:
                if attr.startswith(prefix) and callable(getattr(module, attr)):
                    original = getattr(module, attr)

                    def spy(*a, _original=original, _kind=kind, **k):
                        seen.append(_kind)
                        return _original(*a, **k)
                    setattr(module, attr, spy)
                    patched.append((module, attr, original))
    try:
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.ones(4)
        torch.optim.AdamW([p], **kwargs).step()
    finally:
        for module, attr, original in patched:
            setattr(module, attr, original)
    return seen[0] if seen else "unknown"


def variants():
    """(implementation, AdamW keyword arguments) for each implementation this PyTorch's AdamW
    lets one choose; an implementation the CPU cannot run is reported when it is timed."""
    import torch
    takes = set(inspect.signature(torch.optim.AdamW.__init__).parameters)
    out = []
    if "foreach" in takes:
        loop = dict(foreach=False, fused=False) if "fused" in takes else dict(foreach=False)
        out += [("for-loop", loop), ("foreach", dict(foreach=True))]
    if "fused" in takes:
        out.append(("fused", dict(fused=True)))
    return out


def cpu_capability():
    """The vector instructions PyTorch's CPU kernels use ("AVX2"): torch.backends.cpu (2.0+), or
    the build configuration's 'CPU capability usage' line (older releases)."""
    import torch
    backend = getattr(torch.backends, "cpu", None)
    if backend is not None and hasattr(backend, "get_cpu_capability"):
        return backend.get_cpu_capability()
    m = re.search(r"CPU capability usage: (\S+)", torch.__config__.show())
    return m.group(1) if m else "CPU capability unknown"


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

    try:
        import torch
    except ImportError:
        print(f"error: {sys.argv[0]} needs PyTorch, and {sys.executable} has none (pip install "
              "torch, or Debian's python3-torch for /usr/bin/python3)", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(1)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    rows = []
    if args.scalelab:
        rows.append(("scalelab AdamW (one pass, AVX/SSE2)",)
                    + time_scalelab(args.scalelab, args.model, args.repeats, args.warmup))
    default = implementation()
    for kind, kwargs in variants():
        options = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        try:
            ran = implementation(**kwargs)  # what the options really select here
            if ran == "unknown":
                ran = kind
            label = f"torch {ran} ({options})" + (", the default" if ran == default else "")
            rows.append((label,) + time_torch(args.model, args.repeats, args.warmup, **kwargs))
        except (RuntimeError, TypeError, ValueError) as e:  # e.g. fused=True on a CPU before 2.4
            print(f"# torch {kind} ({options}): not available here ({e})", file=sys.stderr)
    if not any(label.endswith(", the default") for label, *_ in rows):
        # an implementation no option selects here (or an unknown one): time the default as it is
        rows.append((f"torch default ({default})",)
                    + time_torch(args.model, args.repeats, args.warmup))
    print(f"AdamW step, {args.model}, one CPU thread, best / median of {args.repeats} steps "
          f"after {args.warmup} (torch {torch.__version__}, {cpu_capability()}); the default "
          f"AdamW here runs the {default} implementation")
    print(f"| {'implementation':50} | {'params':>10} | {'best ms':>8} | {'median ms':>9} |")
    print(f"|{'-' * 52}|{'-' * 11}:|{'-' * 9}:|{'-' * 10}:|")
    for label, n, best, median in rows:
        print(f"| {label:50} | {n:>10} | {best:>8.1f} | {median:>9.1f} |")
    counts = {n for _, n, _, _ in rows}
    if len(counts) != 1:
        sys.exit(f"error: the implementations timed different parameter counts: {counts}")


if __name__ == "__main__":
    main()
