#!/usr/bin/python3
"""tests/ref/gpt_ref.py: PyTorch reference for duet's tiny GPT parity test.

Writes tests/ref/gpt_tiny.safetensors: initial weights, a batch of text,
the logits, the loss, every parameter's gradient and the losses of 10 AdamW
steps, all in duet's layout (Linear weights [in, out], y = x @ w + b).
Also prints the float32 noise of logits, grads and losses, measured
against the same computation in float64.

Run with Debian's python3 and torch (1.13), from the repository root:
    /usr/bin/python3 tests/ref/gpt_ref.py [--out PATH]
Needs Debian's bible-kjv package (`apt-get install bible-kjv`) for the text.
The safetensors format is written with json + struct (no safetensors
package); tests/test_safetensors.c reads the file back with duet's reader.
"""
import argparse
import copy
import json
import math
import os
import re
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------- configuration

CONFIG = dict(
    vocab=256, block=16, batch=4, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True,
    ln_eps=1e-5, gelu="tanh", tied_lm_head=True, seed=1337, threads=2,
    init="nanoGPT: Linear weights, wte, wpe ~ N(0, 0.02); linear4, linear6 weights ~ "
         "N(0, 0.02/sqrt(2*n_layer)); biases 0; layernorm w 1, b 0; drawn in the order "
         "wte, wpe, then per layer linear1..linear6",
    optimizer=dict(name="AdamW", lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.1,
                   decay="params of rank >= 2 only (wte, wpe, Linear weights)", steps=10,
                   losses="loss before each step, same batch every step"),
    data=dict(source='bible -f "gen1:1-rev22:21" (Debian bible-kjv), verse reference '
                     '(leading "Ge1:1 ") stripped from each line, lines joined by "\\n", as bytes',
              offsets=[0, 1000, 2000, 3000], window=17, idx="w[:16]", targets="w[1:]"),
)
V, T, B = CONFIG["vocab"], CONFIG["block"], CONFIG["batch"]
N_LAYER, N_HEAD, C = CONFIG["n_layer"], CONFIG["n_head"], CONFIG["n_embd"]


# ------------------------------------------------------------------- model

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(C, eps=CONFIG["ln_eps"])
        self.linear1 = nn.Linear(C, C)  # query
        self.linear2 = nn.Linear(C, C)  # key
        self.linear3 = nn.Linear(C, C)  # value
        self.linear4 = nn.Linear(C, C)  # attention output projection
        self.ln2 = nn.LayerNorm(C, eps=CONFIG["ln_eps"])
        self.linear5 = nn.Linear(C, 4 * C)  # MLP up
        self.linear6 = nn.Linear(4 * C, C)  # MLP down

    def attn(self, h):
        b, t, c = h.shape
        d = c // N_HEAD
        q = self.linear1(h).view(b, t, N_HEAD, d).transpose(1, 2)  # (B, H, T, D)
        k = self.linear2(h).view(b, t, N_HEAD, d).transpose(1, 2)
        v = self.linear3(h).view(b, t, N_HEAD, d).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, H, T, T)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)  # heads back in channel order
        return self.linear4(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.linear6(F.gelu(self.linear5(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(V, C))
        self.wpe = nn.Parameter(torch.empty(T, C))
        self.layers = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln1 = nn.LayerNorm(C, eps=CONFIG["ln_eps"])  # final layernorm
        std, std_res = 0.02, 0.02 / math.sqrt(2 * N_LAYER)
        with torch.no_grad():
            nn.init.normal_(self.wte, 0.0, std)
            nn.init.normal_(self.wpe, 0.0, std)
            for blk in self.layers:
                for i in range(1, 7):
                    lin = getattr(blk, f"linear{i}")
                    nn.init.normal_(lin.weight, 0.0, std_res if i in (4, 6) else std)
                    nn.init.zeros_(lin.bias)

    def forward(self, idx, targets):
        x = self.wte[idx.long()] + self.wpe  # (B, T, C); wpe broadcasts over the batch
        for blk in self.layers:
            x = blk(x)
        x = self.ln1(x)
        logits = x @ self.wte.t()  # tied output: (B, T, V)
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1).long())
        return logits, loss


def duet_params(model):
    """[(duet name, torch parameter, transpose?)] in a fixed order."""
    out = [("wte", model.wte, False), ("wpe", model.wpe, False)]
    for li, blk in enumerate(model.layers, 1):
        out += [(f"layer{li}.ln1.w", blk.ln1.weight, False), (f"layer{li}.ln1.b", blk.ln1.bias, False)]
        for i in range(1, 5):
            lin = getattr(blk, f"linear{i}")
            out += [(f"layer{li}.linear{i}.w", lin.weight, True), (f"layer{li}.linear{i}.b", lin.bias, False)]
        out += [(f"layer{li}.ln2.w", blk.ln2.weight, False), (f"layer{li}.ln2.b", blk.ln2.bias, False)]
        for i in (5, 6):
            lin = getattr(blk, f"linear{i}")
            out += [(f"layer{li}.linear{i}.w", lin.weight, True), (f"layer{li}.linear{i}.b", lin.bias, False)]
    out += [("ln1.w", model.ln1.weight, False), ("ln1.b", model.ln1.bias, False)]
    assert len(out) == len(list(model.parameters()))
    return out


def to_duet(t, transpose):
    """A copy in duet's layout (a copy: training later changes params in place)."""
    t = t.detach()
    return (t.t() if transpose else t).contiguous().clone()


# -------------------------------------------------------------------- data

def load_batch():
    try:
        text = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True, capture_output=True).stdout
    except FileNotFoundError:
        sys.exit("gpt_ref.py: `bible` not found: apt-get install -y bible-kjv")
    lines = text.decode("ascii").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    verse_ref = re.compile(r"^\S+:\d+ ")
    stripped = []
    for line in lines:
        m = verse_ref.match(line)
        if not m:
            sys.exit(f"gpt_ref.py: line without a verse reference: {line[:40]!r}")
        stripped.append(line[m.end():])
    data = "\n".join(stripped).encode("ascii")
    w = CONFIG["data"]["window"]
    wins = [data[o:o + w] for o in CONFIG["data"]["offsets"]]
    assert all(len(x) == w for x in wins)
    idx = torch.tensor([list(x[:-1]) for x in wins], dtype=torch.int32)
    targets = torch.tensor([list(x[1:]) for x in wins], dtype=torch.int32)
    return idx, targets, wins


# ------------------------------------------------------------------- steps

def run(model, idx, targets):
    """Forward + backward on a fresh grad; returns logits, loss, {name: grad}."""
    model.zero_grad(set_to_none=True)
    logits, loss = model(idx, targets)
    loss.backward()
    grads = {n: to_duet(p.grad, tr) for n, p, tr in duet_params(model)}
    return logits.detach(), loss.detach(), grads


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


# ------------------------------------------------------------- safetensors

ST_DTYPES = {torch.float32: ("F32", "<f4"), torch.float64: ("F64", "<f8"), torch.int32: ("I32", "<i4")}


def st_save(path, tensors, metadata):
    """Writes [(name, tensor)] as safetensors: u64 LE header length, compact JSON
    (__metadata__ first, tensors in the given order) padded with spaces to a
    multiple of 8, then the data, contiguous and little-endian."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in tensors:
        dt, np_dt = ST_DTYPES[t.dtype]
        b = t.detach().contiguous().numpy().astype(np_dt).tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def st_load(path):
    """Reads a safetensors file back: ({name: tensor}, metadata)."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    by_name = {v[0]: (k, v[1]) for k, v in ST_DTYPES.items()}
    out = {}
    for name, e in header.items():
        dt, np_dt = by_name[e["dtype"]]
        b, en = e["data_offsets"]
        arr = np.frombuffer(buf[8 + n + b:8 + n + en], dtype=np_dt).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy()).to(dt)
    return out, meta


def numpy_forward(w, idx, targets):
    """The forward pass as duet computes it, from the file's tensors (duet
    layout, x @ w + b), in float64 numpy: checks the layout, not torch."""
    w = {k: v.numpy().astype(np.float64) for k, v in w.items()}
    d = C // N_HEAD

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + CONFIG["ln_eps"]) * w[p + ".w"] + w[p + ".b"]

    def lin(x, p):
        return x @ w[p + ".w"] + w[p + ".b"]

    x = w["wte"][idx.numpy()] + w["wpe"]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for li in range(1, N_LAYER + 1):
        pre = f"layer{li}."
        h = ln(x, pre + "ln1")
        q, k, v = (lin(h, pre + f"linear{i}") for i in (1, 2, 3))
        y = np.empty_like(q)
        for hd in range(N_HEAD):
            sl = slice(hd * d, (hd + 1) * d)
            att = q[:, :, sl] @ k[:, :, sl].transpose(0, 2, 1) / math.sqrt(d)
            att = np.where(causal, att, -np.inf)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            y[:, :, sl] = att @ v[:, :, sl]
        x = x + lin(y, pre + "linear4")
        u = lin(ln(x, pre + "ln2"), pre + "linear5")
        g = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
        x = x + lin(g, pre + "linear6")
    logits = ln(x, "ln1") @ w["wte"].T
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    t = targets.numpy().astype(np.int64)
    loss = -np.take_along_axis(logp, t[..., None], -1).mean()
    return logits, loss


# -------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "gpt_tiny.safetensors"))
    args = ap.parse_args()

    torch.manual_seed(CONFIG["seed"])
    torch.set_num_threads(CONFIG["threads"])
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    idx, targets, wins = load_batch()
    model = GPT()
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
        "layout": "duet: Linear weights [in, out], y = x @ w + b (torch's weight transposed); "
                  "grad.NAME is the gradient of NAME in the same layout",
        "generator": "tests/ref/gpt_ref.py",
        "text": json.dumps([w.decode("ascii") for w in wins]),
    }
    st_save(args.out, tensors, meta)

    # read it back: every tensor bit-identical
    back, meta_back = st_load(args.out)
    assert meta_back == meta and list(back) == [n for n, _ in tensors]
    for n, t in tensors:
        assert back[n].dtype == t.dtype and back[n].shape == t.shape and torch.equal(back[n], t), n

    # an independent numpy forward from the file's duet-layout weights
    np_logits, np_loss = numpy_forward(back, back["idx"], back["targets"])
    np_dl = np.abs(np_logits - back["logits"].numpy()).max()
    np_dloss = abs(np_loss - back["loss"].item())
    assert np_dl < 1e-5 and np_dloss < 1e-5, (np_dl, np_dloss)

    # a fresh model given the stored initial weights (transposed back)
    # reproduces the stored logits, grads and losses exactly
    fresh = GPT()
    with torch.no_grad():
        for n, p, tr in duet_params(fresh):
            p.copy_(back[n].t() if tr else back[n])
    l2, loss2, g2 = run(fresh, back["idx"], back["targets"])
    assert torch.equal(l2, back["logits"]) and torch.equal(loss2, back["loss"])
    assert all(torch.equal(g2[n], back[f"grad.{n}"]) for n, _ in init)
    assert torch.equal(torch.tensor(train_losses(fresh, back["idx"], back["targets"]), dtype=torch.float32),
                       back["losses"])

    # float32 noise: the same computation in float64
    def maxabs(a, b):
        return (a.double() - b.double()).abs().max().item()

    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(tensors)} tensors, torch {torch.__version__}")
    print("batch windows:", [w.decode("ascii") for w in wins])
    print(f"loss (f32) {loss.item():.9f}   loss (f64) {loss64.item():.12f}   |diff| {abs(loss.item() - loss64.item()):.3e}")
    print(f"logits: max |f32 - f64| {maxabs(logits, logits64):.3e}   max |logit| {logits64.abs().max().item():.3e}")
    worst = max(grads, key=lambda n: maxabs(grads[n], grads64[n]))
    print(f"grads:  max |f32 - f64| {maxabs(grads[worst], grads64[worst]):.3e} (in grad.{worst})   "
          f"max |grad| {max(g.abs().max().item() for g in grads64.values()):.3e}")
    print("per-tensor grad noise (max |f32 - f64| / max |grad|):")
    for n, _ in init:
        d, m = maxabs(grads[n], grads64[n]), grads64[n].abs().max().item()
        print(f"  grad.{n:<20} {d:.3e} / {m:.3e}")
    print(f"numpy f64 forward from the file (duet layout): max |logits diff| {np_dl:.3e}, |loss diff| {np_dloss:.3e}")
    print("losses (f32):", " ".join(f"{x:.6f}" for x in losses))
    print(f"losses: max |f32 - f64| over 10 AdamW steps {max(abs(a - b) for a, b in zip(losses, losses64)):.3e}")


if __name__ == "__main__":
    main()
