#!/usr/bin/python3
"""PyTorch's training step on the CPU at bench_train_step's 6-layer shapes, the figure our
mixture-of-experts rows are read beside (never a dependency of omnitron; Debian's
python3-torch runs it).

  OMP_NUM_THREADS=2 /usr/bin/python3 bench/pytorch_moe_cpu.py [--steps N] [--openblas-auto]
                                                                [--bf16]

A GPT of 6 layers, 6 heads, hidden 384, vocabulary 50257, sequence 256, micro batch 4, in
float32 without dropout (run bench_train_step with --hidden-dropout 0 --attention-dropout 0
beside it), AdamW; its MLP either dense (GELU, 1536 wide) or a mixture of experts of the same
active FLOPs, written as PyTorch users write one without a grouped GEMM: a loop over the
experts, each taking its tokens by index (as Megatron's SequentialMLP and Mixtral's
Hugging Face block do):
  - 8 experts, top 2, each 768 wide (Mixtral-shaped);
  - 16 experts, top 4, each 192 wide, plus a shared expert 768 wide, with multi-latent
    attention (DeepSeek-shaped: q through a 192-wide latent, k and v through a 128-wide one,
    heads of 64 + 32 with rope on the 32, no position embedding table; no linear biases).
The router is Megatron's default: softmax over the top-k logits, with the aux loss (0.01).
Prints tokens/s and GFLOP/s by Megatron's formula (active parameters), the median step of
the steps after the first. --bf16 runs the forward pass and the loss under
torch.autocast("cpu", dtype=torch.bfloat16), as a PyTorch user writes mixed precision (fp32
weights and optimizer; oneDNN's bf16 GEMMs), beside bench_train_step --bf16.
"""
import argparse
import math
import os
import sys
import time

# The OpenBLAS kernels omnitron's launcher picks on AVX-512 machines (its auto-detection
# takes slower ones): the same sgemm for both. Read when torch loads OpenBLAS.
# --openblas-auto leaves OpenBLAS its own choice, as PyTorch runs for a user who has not
# set OPENBLAS_CORETYPE.
with open("/proc/cpuinfo") as cpuinfo:
    if " avx512f" in cpuinfo.read() and "--openblas-auto" not in sys.argv:
        os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F

V, L, H, C, S, B = 50257, 6, 6, 384, 256, 4


class Experts(nn.Module):
    def __init__(self, experts, topk, width, shared=0):
        super().__init__()
        self.topk = topk
        self.router = nn.Linear(C, experts, bias=False)
        self.fc1 = nn.ModuleList(nn.Linear(C, width, bias=shared == 0) for _ in range(experts))
        self.fc2 = nn.ModuleList(nn.Linear(width, C, bias=shared == 0) for _ in range(experts))
        self.shared = None
        if shared:
            self.shared = nn.Sequential(nn.Linear(C, shared, bias=False), nn.GELU(),
                                        nn.Linear(shared, C, bias=False))
        self.aux = torch.zeros(())

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, C)
        logits = self.router(x)
        top, idx = torch.topk(logits, self.topk, dim=-1)
        probs = torch.softmax(top, dim=-1)
        E = logits.shape[1]
        counts = torch.zeros(E).index_add_(0, idx.flatten(), torch.ones(idx.numel()))
        scores = torch.softmax(logits, dim=-1)
        self.aux = 0.01 * E / (self.topk * x.shape[0] ** 2) * (scores.sum(0) * counts).sum()
        y = torch.zeros_like(x)
        for e in range(E):
            token, slot = torch.nonzero(idx == e, as_tuple=True)
            if token.numel() == 0:
                continue
            h = self.fc2[e](F.gelu(self.fc1[e](x[token])))
            y.index_add_(0, token, (h * probs[token, slot].unsqueeze(1)).to(y.dtype))
        if self.shared is not None:
            y = y + self.shared(x)
        return y.reshape(shape)


MASK = torch.full((S, S), float("-inf")).triu(1)


def attend(q, k, v):
    """Causal attention of [B, H, S, d] heads: the [B, S, H * dv] outputs."""
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + MASK, dim=-1) @ v
    return a.transpose(1, 2).reshape(B, S, -1)


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, S, 3, H, C // H).permute(2, 0, 3, 1, 4)
        return self.proj(attend(q, k, v))


def rope(x):
    """Rotary embedding (base 10000) of the last dimension of [B, H, S, d]: halves rotated."""
    d = x.shape[-1]
    angle = torch.arange(S).unsqueeze(1) * 10000.0 ** (-torch.arange(0, d, 2) / d)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class MLA(nn.Module):
    """DeepSeek-V2/V3's multi-latent attention, as Megatron-Core's MLASelfAttention computes
    it: q and the joint k/v each through a normed low-rank latent, a decoupled rope part of
    the key shared by the heads."""
    QL, KVL, QK, PE, DV = 192, 128, 64, 32, 64

    def __init__(self):
        super().__init__()
        self.q_down, self.q_norm = nn.Linear(C, self.QL, bias=False), nn.LayerNorm(self.QL)
        self.q_up = nn.Linear(self.QL, H * (self.QK + self.PE), bias=False)
        self.kv_down = nn.Linear(C, self.KVL + self.PE, bias=False)
        self.kv_norm = nn.LayerNorm(self.KVL)
        self.kv_up = nn.Linear(self.KVL, H * (self.QK + self.DV), bias=False)
        self.proj = nn.Linear(H * self.DV, C, bias=False)

    def forward(self, x):
        # (.float(): under bf16 autocast the norms take fp32 input, as the blocks' norms do)
        q = self.q_up(self.q_norm(self.q_down(x).float())).view(B, S, H, -1).transpose(1, 2)
        q = torch.cat((q[..., : self.QK], rope(q[..., self.QK:])), dim=-1)
        latent, k_pe = self.kv_down(x).split((self.KVL, self.PE), dim=-1)
        kv = self.kv_up(self.kv_norm(latent.float())).view(B, S, H, -1).transpose(1, 2)
        k_pe = rope(k_pe.unsqueeze(1)).expand(B, H, S, self.PE)
        k = torch.cat((kv[..., : self.QK], k_pe), dim=-1)
        return self.proj(attend(q, k, kv[..., self.QK:]))


class Block(nn.Module):
    def __init__(self, mlp, attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attention, self.mlp = attention, mlp

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, make_mlp, mla):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = None if mla else nn.Embedding(S, C)  # MLA's rope gives the positions
        self.blocks = nn.ModuleList(Block(make_mlp(), MLA() if mla else MHA()) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, tokens, labels):
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(S))
        for b in self.blocks:
            x = b(x)
        loss = F.cross_entropy((self.lnf(x) @ self.wte.weight.T).view(-1, V), labels.view(-1))
        return loss + sum(b.mlp.aux for b in self.blocks if isinstance(b.mlp, Experts))


def megatron_flops(ffn_active, mla):
    """Megatron's per-iteration formula (as src/train/flops.h: causal attention halved) with
    the MLP's active width, multi-head or multi-latent attention, no gated MLP, the vocabulary
    padded to 50304 as omnitron pads it."""
    projections, core = 4 * C * C, C
    if mla:
        m = MLA
        projections = (m.QL * (C + H * (m.QK + m.PE) + 1) + m.KVL * (C + H * (m.QK + m.DV) + 1)
                       + C * m.PE + H * m.DV * C)
        core = H * (m.QK + m.PE) / 2 + H * m.DV / 2
    per_token = L * (projections + 2 * C * ffn_active) + C * 50304
    return 6.0 * B * S * (per_token + S * L * core)


def run(name, make_mlp, ffn_active, steps, bf16, mla=False):
    torch.manual_seed(0)
    model = GPT(make_mlp, mla)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    tokens = torch.randint(0, V, (B, S))
    labels = torch.randint(0, V, (B, S))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(tokens, labels)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    sec = sorted(times[1:])[len(times[1:]) // 2]
    print(f"{name:<40} {B * S / sec:10.0f} {sec * 1e3:12.1f} "
          f"{megatron_flops(ffn_active, mla) / sec / 1e9:10.1f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    # 8: over 4 its median still held slower early steps (MoE 8 at 446-501 tokens/s over 4
    # steps, 551-595 over 8, in one sitting on the 2-core machine, while omnitron's rows held).
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--openblas-auto", action="store_true",
                   help="leave OPENBLAS_CORETYPE unset (OpenBLAS detects the CPU itself)")
    p.add_argument("--bf16", action="store_true",
                   help="forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    args = p.parse_args()
    steps, bf16 = args.steps, args.bf16
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(auto)')}, "
          f"{'bf16 autocast' if bf16 else 'float32'}")
    print(f"{'6 layers, 384, seq 256, micro batch 4':<40} {'tokens/s':>10} {'ms/step':>12} "
          f"{'GFLOP/s':>10}")
    run("dense, ffn 1536", lambda: nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(),
                                                 nn.Linear(4 * C, C)), 4 * C, steps, bf16)
    run("  MoE 8 experts, top 2, ffn 768", lambda: Experts(8, 2, 768), 1536, steps, bf16)
    run("  MoE 16 top 4, shared 768, MLA", lambda: Experts(16, 4, 192, 768), 1536, steps, bf16,
        mla=True)


if __name__ == "__main__":
    main()
