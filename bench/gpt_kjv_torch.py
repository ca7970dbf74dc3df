#!/usr/bin/env python3
"""bench/gpt_kjv_torch.py: duet's gpt_kjv (models/gpt_kjv.model) in PyTorch:
a byte-level GPT, n_layer 4, n_head 4, n_embd 256, block 128, vocab 256,
learned positions, pre-layernorm blocks with biases, GELU (tanh) MLP 4x, tied
input/output embedding, no dropout; nanoGPT initialisation (N(0, 0.02), the
residual projections N(0, 0.02 / sqrt(2 n_layer)), zero biases, unit norms);
mean cross-entropy; AdamW lr 3e-4 betas (0.9, 0.999) eps 1e-8 weight decay
0.01 on the 2-D parameters only (duet's decay = "matrices"); batch 16 random
windows of 129 bytes from the first 90% of data/kjv.txt, as duet draws them.
Attention is nanoGPT's slow path (matmul, masked_fill, softmax, matmul; the
fused scaled_dot_product_attention does not exist in PyTorch 1.13), so it
computes the full T x T scores and masks the upper triangle.
Times --steps optimizer steps after --warmup steps and prints

    torch: trained N steps in T s (X tokens/s)

Run it with OMP_WAIT_POLICY=PASSIVE in the environment and without (bench/
run_gpt.sh does both): which is faster depends on the machine.
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # q, k, v fused (same FLOPs as three)
        self.attn_proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)).view(1, 1, block, block))

    def attention(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)  # [B, H, T, D]
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.attn_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp_proj(self.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, n_embd=256, block=128, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head, block) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        # nanoGPT's initialisation
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
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output embedding
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/kjv.txt")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    block = 128
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with open(args.data, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    n_train = len(data) * 9 // 10  # the first 90% trains, as in duet
    if n_train < block + 2:
        print("gpt_kjv_torch.py: %s is too short" % args.data, file=sys.stderr)
        return 1
    train = torch.from_numpy(data[:n_train].astype(np.int64))
    span = torch.arange(block + 1)
    gen = torch.Generator().manual_seed(args.seed)

    model = GPT(block=block)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.999), eps=1e-8)
    n_params = sum(p.numel() for p in model.parameters())

    def batch():
        off = torch.randint(0, n_train - block, (args.batch,), generator=gen)  # windows of block + 1 bytes
        w = train[off[:, None] + span]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def step():
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss.item()  # as duet, which reads the loss back every step

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    dt = time.perf_counter() - t0
    print("torch %s: %d parameters, %d threads, OMP_WAIT_POLICY=%s, final loss %.4f" %
          (torch.__version__, n_params, torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY", "(unset)"), loss))
    print("torch: trained %d steps in %.2f s (%.0f tokens/s)" % (args.steps, dt, args.steps * args.batch * block / dt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
