#!/usr/bin/env python3
"""The PyTorch side of the side-by-side benchmark (issue 14): a nanoGPT-style GPT of exactly the
shape of a scalelab model config, trained on random tokens, timed the way lab 02 times itself.

The model is scalelab's (common/nn, read from common/model_config.cpp so the shapes cannot drift):
token + position embeddings, n_layer pre-LayerNorm blocks (LayerNorm with bias, causal
self-attention with a fused qkv Linear, GELU-tanh MLP of width 4C, Linears with bias), a final
LayerNorm and an LM head tied to the token embedding. Init as scalelab/GPT-2: normal(0, 0.02),
residual projections 0.02 / sqrt(2 n_layer), biases 0, LayerNorm 1 and 0.

What PyTorch gets (the fast path an attendee would write): bf16 autocast (--precision bf16; fp32
master weights and gradients, like scalelab's mixed precision), F.scaled_dot_product_attention
(is_causal=True: flash attention on a GPU; PyTorch 1.13 has no such op, and there the model
uses the written masked softmax nanoGPT used before it), torch.compile (2.0 and later;
--no-compile turns it off), fused AdamW on CUDA (betas 0.9/0.95, weight decay 0.1 on 2-d
weights), gradient clipping at 1.0 (lab 02's default).

Measured: tokens/s over --steps steps after --warmup steps (the device synchronised before each
clock read), peak memory (torch.cuda.max_memory_allocated: live tensor bytes, the same notion as
scalelab's allocator peak; not measured on a CPU) and MFU = tokens/s x FLOPs per token / peak,
with FLOPs per token = 6 N + 12 L H Q T (PaLM / nanoGPT; N without the position embedding, the
tied head counted once) -- common/metrics.hpp's formula -- and the peak the dense bf16
tensor-core figure, 989.4 TFLOP/s for an H100 SXM (--peak-tflops to change it).

Output: one "metric NAME VALUE" line per metric (tools/bench_gpt_vs_torch parses them).
  python3 tools/bench_gpt_torch.py --device cuda --model gpt-85m --batch 16 --steps 50
--kernel-table FILE (CUDA): after the timed steps, 2 more under torch.profiler; FILE gets each GPU
kernel's name, launches and microseconds per step as CSV (tools/kernel_table.py reads it).
"""
import argparse
import math
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100_BF16_DENSE_TFLOPS = 989.4  # H100 SXM data sheet, bf16 tensor core, no sparsity


def model_configs(root=ROOT):
    """{name: (vocab, block_size, n_layer, n_head, n_embd)} from common/model_config.cpp."""
    with open(os.path.join(root, "common", "model_config.cpp")) as f:
        text = f.read()
    found = re.findall(r'\{"([\w.-]+)",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\}', text)
    if not found:
        raise SystemExit("error: no model configs found in common/model_config.cpp")
    return {name: tuple(int(x) for x in rest) for name, *rest in found}


def flops_per_token(config, T):
    """6 N + 12 L H Q T: common/metrics.cpp's flops_per_token."""
    vocab, block, L, H, C = config
    per_block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C
    n = vocab * C + L * per_block + 2 * C  # without wpe; the tied head counted once
    return 6 * n + 12 * L * H * (C // H) * T


def causal_attention(torch):
    """F.scaled_dot_product_attention(is_causal=True) where PyTorch has it (2.0 and later: a fused
    kernel); on older PyTorch (Debian 12's 1.13) the written form nanoGPT used before it, the
    masked softmax of QK^T / sqrt(hs) times V."""
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def written(q, k, v):  # (B, H, T, hs) each
        T = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        return att @ v

    return written


def build_model(config, torch):
    nn, F = torch.nn, torch.nn.functional
    vocab, block, L, H, C = config
    attention = causal_attention(torch)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = attention(q, k, v)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(block, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.float().view(-1, vocab), targets.reshape(-1))

    return GPT()


def main(argv=None):
    configs = model_configs()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="gpt-85m", choices=sorted(configs))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=-1, help="T (default: the model's block size)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS,
                    help="dense peak for MFU (default: H100 SXM bf16, 989.4)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--kernel-table", help="CSV of each GPU kernel's time per step (CUDA only)")
    a = ap.parse_args(argv)
    config = configs[a.model]
    T = config[1] if a.context < 0 else a.context
    for what, v in (("--batch", a.batch), ("--context", T), ("--steps", a.steps), ("--peak-tflops", a.peak_tflops)):
        if v <= 0:
            ap.error(f"{what} must be positive")
    if a.warmup < 0 or T > config[1]:
        ap.error(f"--warmup must be >= 0 and --context <= {config[1]}")
    try:
        import torch
    except ImportError:
        print("error: torch is not importable by " + sys.executable, file=sys.stderr)
        return 2
    # torch.compile came with PyTorch 2.0 (Debian 12's python3-torch is 1.13): without it the
    # model runs eagerly, and the output says compile=False, so a table never claims otherwise.
    if not a.no_compile and not hasattr(torch, "compile"):
        print(f"note: torch {torch.__version__} has no torch.compile; running eagerly", file=sys.stderr)
        a.no_compile = True
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model = build_model(config, torch).to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = {"fused": True} if a.device == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **fused)
    step_model = model if a.no_compile else torch.compile(model)
    vocab = config[0]
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    batches = [torch.randint(0, vocab, (a.batch, T + 1), generator=gen).to(dev) for _ in range(4)]
    amp = torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def step(i):
        data = batches[i % len(batches)]
        with amp:
            loss = step_model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(a.warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(a.warmup + i)
    sync()
    elapsed = time.perf_counter() - t0
    tps = a.batch * T * a.steps / elapsed
    fpt = flops_per_token(config, T)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"metric device {torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'}")
    print(f"metric torch {torch.__version__}")
    print(f"metric model {a.model} params={n_params} batch={a.batch} context={T} "
          f"precision={a.precision} compile={not a.no_compile}")
    print(f"metric loss {loss.item():.4f}")
    print(f"metric tokens_per_s {tps:.1f}")
    print(f"metric flops_per_token {fpt}")
    print(f"metric peak_tflops {a.peak_tflops}")
    print(f"metric mfu {tps * fpt / (a.peak_tflops * 1e12):.6g}")
    peak = torch.cuda.max_memory_allocated() if a.device == "cuda" else None
    print(f"metric peak_memory_bytes {peak if peak is not None else 'n/a'}")
    if a.kernel_table and a.device == "cuda":
        write_kernel_table(torch, step, a.warmup + a.steps, a.kernel_table)
    return 0


def write_kernel_table(torch, step, first, path, steps=2):
    """Profiles `steps` more steps (CUDA activity only) and writes name,launches,us per step."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(first + i)
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += e.time_range.elapsed_us()
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("name,launches,us\n")
        for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            f.write('"{}",{:.2f},{:.3f}\n'.format(name.replace('"', "'"), n / steps, us / steps))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
