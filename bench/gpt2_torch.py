#!/usr/bin/env python3
"""bench/gpt2_torch.py: models/gpt2_124m.model in PyTorch on the GPU, the
peer of bench/gpu_gpt2.sh: GPT-2 small shapes (12 layers, 12 heads, n_embd
768, block 1024, vocab 50304), learned positions, pre-layernorm blocks with
biases, GELU (tanh) MLP 4x, tied output embedding, no dropout, nanoGPT's
initialisation; AdamW lr 6e-4 betas (0.9, 0.999) eps 1e-8, weight decay 0.1
on the 2-D parameters; byte-level windows of data/kjv.txt (as duet).

Arithmetic as duet's: float32 everywhere, TF32 disabled (duet's cuBLAS
SGEMMs use no tensor cores), no autocast.  Attention is PyTorch's fused
scaled_dot_product_attention (causal), what a PyTorch user would write.
Times --steps optimizer steps after --warmup steps (CUDA synchronised) and
prints

    torch: trained N steps in T s (X tokens/s)
"""
import argparse
import math
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.attn_proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(self.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, n_layer=12, n_head=12, n_embd=768, block=1024, vocab=50304):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
        for b in self.blocks:
            for proj in (b.attn_proj, b.mlp_proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/kjv.txt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpt2_torch.py: no CUDA device for PyTorch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    block = 1024
    torch.manual_seed(args.seed)
    with open(args.data, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    n_train = len(data) * 9 // 10
    train = torch.from_numpy(data[:n_train].astype(np.int64))
    span = torch.arange(block + 1)
    gen = torch.Generator().manual_seed(args.seed)
    model = GPT().to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.999), eps=1e-8)

    def step():
        off = torch.randint(0, n_train - block - 1, (args.batch,), generator=gen)
        w = train[off[:, None] + span]
        x, y = w[:, :-1].to(dev, non_blocking=True), w[:, 1:].to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss.item()  # as duet, which reads the loss back every step

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print("torch %s on %s: %d parameters, batch %d x %d, final loss %.4f" %
          (torch.__version__, torch.cuda.get_device_name(0), sum(p.numel() for p in model.parameters()),
           args.batch, block, loss))
    print("torch: trained %d steps in %.2f s (%.0f tokens/s)" % (args.steps, dt, args.steps * args.batch * block / dt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
