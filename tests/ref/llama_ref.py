#!/usr/bin/python3
"""tests/ref/llama_ref.py: PyTorch reference for duet's tiny LLaMA parity test.

Writes tests/ref/llama_tiny.safetensors for tests/models/llama_tiny.model:
initial weights, a batch of text, the logits, the loss, every parameter's
gradient and the losses of 10 AdamW steps, all in duet's layout (weights
[in, out], y = x @ w, no biases).  Also prints the float32 noise of logits,
grads and losses, measured against the same computation in float64.

The network, written here from the papers and Meta's LLaMA reference
description: pre-RMSNorm blocks (Zhang & Sennrich 2019), rotary position
embeddings on queries and keys with the pairs (2i, 2i+1) of each head
turned by t * 10000^(-2i/D) (Su et al. 2021), grouped-query attention (4
query heads, 2 key/value heads; query head h reads key/value head h // 2,
Ainslie et al. 2023), a SwiGLU MLP silu(h W5) * (h W6) W7 (Shazeer 2020), an
untied output head.

Run with Debian's python3 and torch (1.13), from the repository root:
    /usr/bin/python3 tests/ref/llama_ref.py [--out PATH]
Needs Debian's bible-kjv package for the text.  The file format, the batch
and the checks are those of tests/ref/gpt_ref.py, whose helpers it imports.
"""
import argparse
import copy
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_ref  # noqa: E402  (st_save, st_load, load_batch)

CONFIG = dict(
    vocab=256, block=16, batch=4, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, hidden=64,
    norm_eps=1e-5, rope_base=10000.0, seed=1337, threads=2,
    init="Linear weights, wte ~ N(0, 0.02); linear4, linear7 ~ N(0, 0.02/sqrt(2*n_layer)); "
         "norm gains 1; drawn in the order wte, per layer linear1..linear7, then the head",
    optimizer=dict(name="AdamW", lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.1,
                   decay="params of rank >= 2 only (wte, Linear weights)", steps=10,
                   losses="loss before each step, same batch every step"),
    data=gpt_ref.CONFIG["data"],
)
V, T, B = CONFIG["vocab"], CONFIG["block"], CONFIG["batch"]
N_LAYER, H, KV, C, HID = CONFIG["n_layer"], CONFIG["n_head"], CONFIG["n_kv_head"], CONFIG["n_embd"], CONFIG["hidden"]
D = C // H


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + CONFIG["norm_eps"]) * self.weight


def rope(x, heads):
    """x [B, T, heads*D]: the pairs (2i, 2i+1) of each head turned by t * base^(-2i/D)."""
    b, t, c = x.shape
    d = c // heads
    i = torch.arange(0, d, 2, dtype=torch.float64)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * CONFIG["rope_base"] ** (-i / d)  # [T, D/2]
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    xp = x.view(b, t, heads, d // 2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).view(b, t, c)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = RMSNorm()
        self.linear1 = nn.Linear(C, C, bias=False)        # query
        self.linear2 = nn.Linear(C, KV * D, bias=False)   # key
        self.linear3 = nn.Linear(C, KV * D, bias=False)   # value
        self.linear4 = nn.Linear(C, C, bias=False)        # attention output projection
        self.norm2 = RMSNorm()
        self.linear5 = nn.Linear(C, HID, bias=False)      # SwiGLU gate
        self.linear6 = nn.Linear(C, HID, bias=False)      # SwiGLU up
        self.linear7 = nn.Linear(HID, C, bias=False)      # down

    def attn(self, h):
        b, t, _ = h.shape
        q = rope(self.linear1(h), H).view(b, t, H, D).transpose(1, 2)    # (B, H, T, D)
        k = rope(self.linear2(h), KV).view(b, t, KV, D).transpose(1, 2)  # (B, KV, T, D)
        v = self.linear3(h).view(b, t, KV, D).transpose(1, 2)
        k = k.repeat_interleave(H // KV, dim=1)  # query head h reads key/value head h // (H / KV)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, C)
        return self.linear4(y)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.linear7(F.silu(self.linear5(h)) * self.linear6(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(V, C))
        self.layers = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.norm1 = RMSNorm()
        self.linear1 = nn.Linear(C, V, bias=False)  # untied head
        std, std_res = 0.02, 0.02 / math.sqrt(2 * N_LAYER)
        with torch.no_grad():
            nn.init.normal_(self.wte, 0.0, std)
            for blk in self.layers:
                for i in range(1, 8):
                    nn.init.normal_(getattr(blk, f"linear{i}").weight, 0.0, std_res if i in (4, 7) else std)
            nn.init.normal_(self.linear1.weight, 0.0, std)

    def forward(self, idx, targets):
        x = self.wte[idx.long()]
        for blk in self.layers:
            x = blk(x)
        logits = self.linear1(self.norm1(x))
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1).long())
        return logits, loss


def duet_params(model):
    """[(duet name, torch parameter, transpose?)] in a fixed order."""
    out = [("wte", model.wte, False)]
    for li, blk in enumerate(model.layers, 1):
        out.append((f"layer{li}.norm1.w", blk.norm1.weight, False))
        out += [(f"layer{li}.linear{i}.w", getattr(blk, f"linear{i}").weight, True) for i in range(1, 5)]
        out.append((f"layer{li}.norm2.w", blk.norm2.weight, False))
        out += [(f"layer{li}.linear{i}.w", getattr(blk, f"linear{i}").weight, True) for i in range(5, 8)]
    out += [("norm1.w", model.norm1.weight, False), ("linear1.w", model.linear1.weight, True)]
    assert len(out) == len(list(model.parameters()))
    return out


def to_duet(t, transpose):
    t = t.detach()
    return (t.t() if transpose else t).contiguous().clone()


def run(model, idx, targets):
    model.zero_grad(set_to_none=True)
    logits, loss = model(idx, targets)
    loss.backward()
    return logits.detach(), loss.detach(), {n: to_duet(p.grad, tr) for n, p, tr in duet_params(model)}


def train_losses(model, idx, targets):
    o = CONFIG["optimizer"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])
    losses = []
    for _ in range(o["steps"]):
        opt.zero_grad(set_to_none=True)
        _, loss = model(idx, targets)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return losses


def numpy_forward(w, idx, targets):
    """The forward pass from the file's duet-layout tensors in float64 numpy,
    written independently of the torch model (rope by explicit pair indices,
    grouped-query attention by head index arithmetic)."""
    w = {k: v.numpy().astype(np.float64) for k, v in w.items()}

    def norm(x, p):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + CONFIG["norm_eps"]) * w[p]

    def rot(x, heads):
        d = x.shape[-1] // heads
        y = np.empty_like(x)
        for hd in range(heads):
            for i in range(d // 2):
                a = np.arange(T) * CONFIG["rope_base"] ** (-2.0 * i / d)
                c0, c1 = hd * d + 2 * i, hd * d + 2 * i + 1
                y[:, :, c0] = x[:, :, c0] * np.cos(a) - x[:, :, c1] * np.sin(a)
                y[:, :, c1] = x[:, :, c0] * np.sin(a) + x[:, :, c1] * np.cos(a)
        return y

    x = w["wte"][idx.numpy()]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for li in range(1, N_LAYER + 1):
        p = f"layer{li}."
        h = norm(x, p + "norm1.w")
        q, k, v = rot(h @ w[p + "linear1.w"], H), rot(h @ w[p + "linear2.w"], KV), h @ w[p + "linear3.w"]
        y = np.empty_like(q)
        for hd in range(H):
            g = hd // (H // KV)
            qs, ks = slice(hd * D, (hd + 1) * D), slice(g * D, (g + 1) * D)
            att = np.where(causal, q[:, :, qs] @ k[:, :, ks].transpose(0, 2, 1) / math.sqrt(D), -np.inf)
            att = np.exp(att - att.max(-1, keepdims=True))
            y[:, :, qs] = att / att.sum(-1, keepdims=True) @ v[:, :, ks]
        x = x + y @ w[p + "linear4.w"]
        h = norm(x, p + "norm2.w")
        a = h @ w[p + "linear5.w"]
        x = x + (a / (1 + np.exp(-a)) * (h @ w[p + "linear6.w"])) @ w[p + "linear7.w"]
    logits = norm(x, "norm1.w") @ w["linear1.w"]
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, targets.numpy().astype(np.int64)[..., None], -1).mean()
    return logits, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "llama_tiny.safetensors"))
    args = ap.parse_args()

    torch.manual_seed(CONFIG["seed"])
    torch.set_num_threads(CONFIG["threads"])
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    idx, targets, wins = gpt_ref.load_batch()
    model = Llama()
    model64 = copy.deepcopy(model).double()
    init = [(n, to_duet(p, tr)) for n, p, tr in duet_params(model)]

    logits, loss, grads = run(model, idx, targets)
    logits64, loss64, grads64 = run(model64, idx, targets)
    losses = train_losses(model, idx, targets)
    losses64 = train_losses(model64, idx, targets)
    assert abs(losses[0] - loss.item()) == 0.0

    tensors = list(init)
    tensors += [("idx", idx), ("targets", targets), ("logits", logits), ("loss", loss.reshape(()))]
    tensors += [(f"grad.{n}", grads[n]) for n, _ in init]
    tensors += [("losses", torch.tensor(losses, dtype=torch.float32))]
    meta = {
        "torch_version": torch.__version__,
        "config": json.dumps(CONFIG, sort_keys=True),
        "layout": "duet: Linear weights [in, out], y = x @ w (torch's weight transposed); "
                  "grad.NAME is the gradient of NAME in the same layout",
        "generator": "tests/ref/llama_ref.py",
        "text": json.dumps([x.decode("ascii") for x in wins]),
    }
    gpt_ref.st_save(args.out, tensors, meta)

    back, meta_back = gpt_ref.st_load(args.out)
    assert meta_back == meta and list(back) == [n for n, _ in tensors]
    for n, t in tensors:
        assert back[n].dtype == t.dtype and back[n].shape == t.shape and torch.equal(back[n], t), n

    np_logits, np_loss = numpy_forward(back, back["idx"], back["targets"])
    np_dl = np.abs(np_logits - back["logits"].numpy()).max()
    np_dloss = abs(np_loss - back["loss"].item())
    assert np_dl < 1e-5 and np_dloss < 1e-5, (np_dl, np_dloss)

    fresh = Llama()
    with torch.no_grad():
        for n, p, tr in duet_params(fresh):
            p.copy_(back[n].t() if tr else back[n])
    l2, loss2, g2 = run(fresh, back["idx"], back["targets"])
    assert torch.equal(l2, back["logits"]) and torch.equal(loss2, back["loss"])
    assert all(torch.equal(g2[n], back[f"grad.{n}"]) for n, _ in init)
    assert torch.equal(torch.tensor(train_losses(fresh, back["idx"], back["targets"]), dtype=torch.float32),
                       back["losses"])

    def maxabs(a, b):
        return (a.double() - b.double()).abs().max().item()

    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(tensors)} tensors, torch {torch.__version__}")
    print(f"loss (f32) {loss.item():.9f}   loss (f64) {loss64.item():.12f}   |diff| {abs(loss.item() - loss64.item()):.3e}")
    print(f"logits: max |f32 - f64| {maxabs(logits, logits64):.3e}   max |logit| {logits64.abs().max().item():.3e}")
    print("per-tensor grad noise (max |f32 - f64| / max |grad|):")
    for n, _ in init:
        print(f"  grad.{n:<20} {maxabs(grads[n], grads64[n]):.3e} / {grads64[n].abs().max().item():.3e}")
    print(f"numpy f64 forward from the file (duet layout): max |logits diff| {np_dl:.3e}, |loss diff| {np_dloss:.3e}")
    print("losses (f32):", " ".join(f"{x:.6f}" for x in losses))
    print(f"losses: max |f32 - f64| over 10 AdamW steps {max(abs(a - b) for a, b in zip(losses, losses64)):.3e}")


if __name__ == "__main__":
    main()
