#!/usr/bin/env python3
"""PyTorch's fused attention at one shape, for scalelab_bench_attention's table.

Times torch.nn.functional.scaled_dot_product_attention, causal (--mask none: unmasked), on a
CUDA GPU, with each of the backends named by --backends (flash: FlashAttention-2; cudnn: cuDNN's
fused attention), forward and backward separately: the best and the median ms of --repeats calls
after --warmup, measured with CUDA events. q, k, v and the output gradient are (B, NH, T, hs),
as in the C++ bench.

Prints one line per (backend, pass), for the C++ bench to parse:
    row <backend> <forward|backward> <best ms> <median ms>
or, when this PyTorch or GPU cannot run a backend:
    skip <backend> <reason>

scalelab_bench_attention --torch-python PYTHON runs it; by hand:
    python3 tools/bench_attention_torch.py --batch 16 --heads 12 --context 1024 --head-size 64
"""
import argparse
import statistics
import sys


def timed(torch, fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ms.append(start.elapsed_time(end))
    return min(ms), statistics.median(ms)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backends", default="flash,cudnn")
    p.add_argument("--mask", choices=["causal", "none"], default="causal")
    a = p.parse_args()
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:  # torch missing, or older than 2.3 (no torch.nn.attention)
        for b in a.backends.split(","):
            print(f"skip {b} {e}")
        return 0
    if not torch.cuda.is_available():
        for b in a.backends.split(","):
            print(f"skip {b} no CUDA device visible to PyTorch")
        return 0
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    shape = (a.batch, a.heads, a.context, a.head_size)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand():
        return torch.rand(shape, generator=gen, device="cuda", dtype=dtype) * 0.02 - 0.01

    q, k, v, dout = rand(), rand(), rand(), rand()
    for q_ in (q, k, v):
        q_.requires_grad_(True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    causal = a.mask == "causal"
    for name in a.backends.split(","):
        if name not in backends:
            print(f"skip {name} unknown backend (flash or cudnn)")
            continue
        try:
            with sdpa_kernel([backends[name]]):
                fwd = timed(torch, lambda: sdpa(q, k, v, is_causal=causal), a.warmup, a.repeats)
                # backward alone: a fresh graph before each timed call, untimed
                ms = []
                for i in range(a.warmup + a.repeats):
                    out = sdpa(q, k, v, is_causal=causal)
                    torch.cuda.synchronize()
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    out.backward(dout)
                    end.record()
                    torch.cuda.synchronize()
                    if i >= a.warmup:
                        ms.append(start.elapsed_time(end))
                    q.grad = k.grad = v.grad = None
                bwd = (min(ms), statistics.median(ms))
        except RuntimeError as e:  # this GPU, dtype or shape is not supported by the backend
            print(f"skip {name} {str(e).splitlines()[0]}")
            continue
        print(f"row {name} forward {fwd[0]:.6f} {fwd[1]:.6f}")
        print(f"row {name} backward {bwd[0]:.6f} {bwd[1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
