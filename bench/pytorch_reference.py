#!/usr/bin/env python3
"""The reference figures our GPU benchmarks are read beside, measured with PyTorch 2 on the
same GPU (never a dependency of omnitron: only the GPU machine's PyTorch runs it).

  python3 bench/pytorch_reference.py [--attention] [--train] [--compile]

--attention: scaled_dot_product_attention with the cuDNN and the flash backends, causal,
  forward and backward, at bench_gpu_ops's shapes, TFLOP/s with FlashAttention's convention
  (forward 4*B*H*S^2*D halved for causality, backward 2.5x the forward).
--train: GPT-2 124M (seq 1024) and a Llama 3.2 1B-shaped model (seq 2048) training steps in
  bf16 autocast with fused AdamW: step time, tokens/s and MFU by Megatron's formula (the same
  as bench_gpu_train_step), against 989 TFLOP/s.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK = 989e12


def timed(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def attention(batch, heads, groups, seq, hd):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(batch, heads, seq, hd, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(batch, groups, seq, hd, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(batch, groups, seq, hd, device=dev, dtype=dt, requires_grad=True)
    if groups != heads:  # the fused backends want equal heads: expand as GQA does
        k2 = k.repeat_interleave(heads // groups, dim=1).detach().requires_grad_()
        v2 = v.repeat_interleave(heads // groups, dim=1).detach().requires_grad_()
    else:
        k2, v2 = k, v
    fwd_flops = 4.0 * batch * heads * seq * seq * hd / 2
    for name, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k2, v2, is_causal=True)
                grad = torch.randn_like(out)
                f = timed(lambda: F.scaled_dot_product_attention(q, k2, v2, is_causal=True))
                b = timed(lambda: torch.autograd.grad(
                    F.scaled_dot_product_attention(q, k2, v2, is_causal=True), (q, k2, v2), grad)) - f
        except Exception as e:  # a backend this PyTorch or GPU lacks
            print(f"torch sdpa {name:5s} B{batch} H{heads} S{seq} D{hd}: unavailable ({e})")
            continue
        print(f"torch sdpa {name:5s} B{batch} H{heads} G{groups} S{seq} D{hd} causal: "
              f"fwd {f:.3f} ms {fwd_flops / f / 1e9:.1f} TFLOP/s, bwd {b:.3f} ms "
              f"{2.5 * fwd_flops / b / 1e9:.1f} TFLOP/s, fwd+bwd {3.5 * fwd_flops / (f + b) / 1e9:.1f} TFLOP/s")


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        norm = nn.LayerNorm if c["norm"] == "layer" else nn.RMSNorm
        h, hd = c["hidden"], c["hidden"] // c["heads"]
        self.ln1, self.ln2 = norm(h), norm(h)
        self.qkv = nn.Linear(h, (c["heads"] + 2 * c["groups"]) * hd, bias=c["bias"])
        self.proj = nn.Linear(c["heads"] * hd, h, bias=c["bias"])
        ff = c["ffn"]
        self.fc1 = nn.Linear(h, 2 * ff if c["swiglu"] else ff, bias=c["bias"])
        self.fc2 = nn.Linear(ff, h, bias=c["bias"])

    def forward(self, x, cos, sin):
        c = self.c
        B, S, _ = x.shape
        hd = c["hidden"] // c["heads"]
        q, k, v = self.qkv(self.ln1(x)).split([c["heads"] * hd, c["groups"] * hd, c["groups"] * hd], -1)
        q = q.view(B, S, c["heads"], hd).transpose(1, 2)
        k = k.view(B, S, c["groups"], hd).transpose(1, 2)
        v = v.view(B, S, c["groups"], hd).transpose(1, 2)
        if cos is not None:
            def rot(t):
                t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
                return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1)
            q, k = rot(q), rot(k)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c["groups"] != c["heads"])
        x = x + self.proj(a.transpose(1, 2).reshape(B, S, -1))
        y = self.fc1(self.ln2(x))
        if c["swiglu"]:
            g, u = y.chunk(2, -1)
            y = F.silu(g) * u
        else:
            y = F.gelu(y, approximate="tanh")
        return x + self.fc2(y)


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab"], c["hidden"])
        self.wpe = nn.Embedding(c["seq"], c["hidden"]) if not c["rope"] else None
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.ln_f = (nn.LayerNorm if c["norm"] == "layer" else nn.RMSNorm)(c["hidden"])
        hd = c["hidden"] // c["heads"]
        if c["rope"]:
            inv = 1.0 / (c["rope_base"] ** (torch.arange(0, hd // 2).float() * 2 / hd))
            ang = torch.outer(torch.arange(c["seq"]).float(), inv)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
        else:
            self.cos = self.sin = None

    def forward(self, idx, targets):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        cos = self.cos.to(x.dtype) if self.cos is not None else None
        sin = self.sin.to(x.dtype) if self.sin is not None else None
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied, as both shapes are
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def megatron_flops(c, batch):
    h, s, L = c["hidden"], c["seq"], c["layers"]
    q_ratio = 1.0
    gated = 1.5 if c["swiglu"] else 1.0
    vocab = math.ceil(c["vocab"] / 128) * 128
    return 12.0 * batch * s * L * h * h * ((1 + c["groups"] / c["heads"] + s / h) * q_ratio
                                           + c["ffn"] / h * gated + vocab / (2.0 * L * h))


def train(compile_model):
    gpt2 = dict(name="gpt2", layers=12, hidden=768, heads=12, groups=12, ffn=3072, seq=1024,
                vocab=50257, norm="layer", rope=False, swiglu=False, bias=True, batch=32)
    llama = dict(name="llama1b", layers=16, hidden=2048, heads=32, groups=8, ffn=8192, seq=2048,
                 vocab=128256, norm="rms", rope=True, rope_base=500000.0, swiglu=True, bias=False,
                 batch=4)
    for c in (gpt2, llama):
        torch.manual_seed(0)
        model = GPT(c).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                fused=True)
        step_model = torch.compile(model) if compile_model else model
        idx = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device="cuda")
        tgt = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_model(idx, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        ms = timed(step, reps=10, warmup=3 if not compile_model else 5)
        tflops = megatron_flops(c, c["batch"]) / (ms * 1e-3) / 1e12
        print(f"torch {'compiled ' if compile_model else ''}{c['name']:8s} bf16 autocast, fused AdamW: "
              f"step {ms:.1f} ms, {c['batch'] * c['seq'] / ms * 1e3:.0f} tokens/s, "
              f"{tflops:.1f} TFLOP/s, MFU {100 * tflops * 1e12 / PEAK:.1f}%")
        del model, opt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--attention", action="store_true")
    p.add_argument("--train", action="store_true")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("pytorch_reference: no CUDA device; nothing measured")
        return
    print(f"pytorch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}")
    if a.attention or not a.train:
        attention(4, 16, 16, 4096, 128)
        attention(32, 12, 12, 1024, 64)
        attention(4, 32, 8, 2048, 64)
    if a.train or not a.attention:
        train(a.compile)


if __name__ == "__main__":
    main()
