#!/usr/bin/python3
"""Writes tests/data/gpt_golden.txt: a small GPT's weights, a batch, its loss and every parameter
gradient, computed by PyTorch in float64. tests/common/test_gpt_golden.cpp loads the same weights
into scalelab's GPT and compares.

Run with Debian's PyTorch (apt-get install python3-torch; torch 1.13, no fused attention, so
attention is written out here as scalelab does it):

    /usr/bin/python3 tools/torch_golden.py            # rewrites tests/data/gpt_golden.txt

PyTorch is not part of set-up or CI: the golden file is committed.
"""
import math
import pathlib

import torch
import torch.nn.functional as F

# A config small enough that the file stays well under 1 MB, with every dimension distinct so a
# transposed or mis-split tensor cannot pass by accident.
V, T, L, H, C = 37, 8, 2, 2, 16   # vocab, context, layers, heads, width
B = 3                             # batch rows
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "gpt_golden.txt"

torch.manual_seed(1234)
dt = torch.float64


def rand(*shape, scale=0.3):
    # random values for everything (LayerNorm weights and biases too), so no zero or unit
    # parameter can hide a missing term
    return (torch.rand(*shape, dtype=dt) * 2 - 1) * scale


# names and shapes exactly as scalelab's GPT (common/nn/gpt.hpp), in its order
params = {"wte.weight": rand(V, C), "wpe.weight": rand(T, C)}
for i in range(L):
    p = f"blocks.{i}."
    params[p + "ln1.weight"] = 1 + rand(C)
    params[p + "ln1.bias"] = rand(C)
    params[p + "attn.qkv.weight"] = rand(3 * C, C)
    params[p + "attn.qkv.bias"] = rand(3 * C)
    params[p + "attn.proj.weight"] = rand(C, C)
    params[p + "attn.proj.bias"] = rand(C)
    params[p + "ln2.weight"] = 1 + rand(C)
    params[p + "ln2.bias"] = rand(C)
    params[p + "mlp.fc.weight"] = rand(4 * C, C)
    params[p + "mlp.fc.bias"] = rand(4 * C)
    params[p + "mlp.proj.weight"] = rand(C, 4 * C)
    params[p + "mlp.proj.bias"] = rand(C)
params["ln_f.weight"] = 1 + rand(C)
params["ln_f.bias"] = rand(C)
for t in params.values():
    t.requires_grad_(True)

tokens = torch.randint(0, V, (B, T))
targets = torch.randint(0, V, (B, T))


def layernorm(x, name):
    return F.layer_norm(x, (C,), params[name + ".weight"], params[name + ".bias"], eps=1e-5)


def linear(x, name):
    return x @ params[name + ".weight"].T + params[name + ".bias"]


x = params["wte.weight"][tokens] + params["wpe.weight"][:T]
hs = C // H
mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
for i in range(L):
    p = f"blocks.{i}."
    qkv = linear(layernorm(x, p + "ln1"), p + "attn.qkv")
    q, k, v = qkv.split(C, dim=2)
    q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))   # (B, H, T, hs)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + linear(y, p + "attn.proj")
    h = F.gelu(linear(layernorm(x, p + "ln2"), p + "mlp.fc"), approximate="tanh")
    x = x + linear(h, p + "mlp.proj")
logits = layernorm(x, "ln_f") @ params["wte.weight"].T   # tied head
loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
loss.backward()


def numbers(t):
    return " ".join(repr(float(v)) for v in t.detach().reshape(-1).tolist())


lines = [f"# written by tools/torch_golden.py with torch {torch.__version__} (float64)",
         f"config {V} {T} {L} {H} {C}",
         f"tokens {B} {T} " + " ".join(str(int(v)) for v in tokens.reshape(-1)),
         f"targets {B} {T} " + " ".join(str(int(v)) for v in targets.reshape(-1)),
         f"loss {float(loss)!r}"]
for name, t in params.items():
    lines.append(f"param {name} {t.numel()} {numbers(t)}")
    lines.append(f"grad {name} {t.numel()} {numbers(t.grad)}")
OUT.parent.mkdir(parents=True, exist_ok=True)
OUT.write_text("\n".join(lines) + "\n")
print(f"{OUT}: loss {float(loss):.6f}, {sum(t.numel() for t in params.values())} parameters, "
      f"{OUT.stat().st_size} bytes")
