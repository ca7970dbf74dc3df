#!/usr/bin/python3
"""tools/duet_to_torch.py: load `duet export` weights into the equivalent
torch.nn model and check its outputs against `duet predict`.

    duet export M.model --checkpoint CK -o W.safetensors
    duet predict M.model --checkpoint CK --logits -o P.jsonl   (gpt_tiny: without --logits)
    /usr/bin/python3 tools/duet_to_torch.py W.safetensors P.jsonl [--data PATH] [--numpy]

The safetensors file is parsed here (8-byte little-endian header length N,
N bytes of JSON: each tensor's dtype, shape and data_offsets into the data
that follows, plus "__metadata__"), so neither the `safetensors` package
nor torch is needed to read it.  Models, by the metadata's "model":

  fmnist_mlp  torch.nn.Sequential(Linear(784,1024), ReLU, Linear(1024,1024),
              ReLU, Linear(1024,10)), the sizes taken from the weights (an
              export with --shrink has fewer hidden units: Linear(784, 512),
              ...); duet's `linearK.w` is [in, out] (x @ w),
              torch's Linear.weight is [out, in]: transposed; `linearK.b` the bias.
              Inputs: the Fashion-MNIST test images (--data DIR, default
              /usr/share/datasets/fashion-mnist), pixels / 255 in float32, the
              first as many as P.jsonl has lines.  Checked: every logit within
              --tol (default 1e-4, absolute) of duet's, the same class wherever
              the top two logits differ by more than 2 * tol, the probability
              within tol.
  gpt_tiny    the GPT of tests/ref/gpt_ref.py (2 layers, 2 heads, n_embd 32,
              block 16, tied output), names layerL.linearK.w (transposed) /
              .b, layerL.ln1.w / .b, ..., wte, wpe, ln1.w / .b.  Inputs: the
              windows P.jsonl names (offset into --data FILE, default
              data/kjv.txt).  Checked: each token's loss within --tol of duet's.

--numpy computes the forward pass with numpy alone (fmnist_mlp only): the
check `ctest -R export` runs where torch is absent.  Without --numpy the
script exits 77 (a skipped test) when torch cannot be imported.
Prints the largest differences; exit 0 when within tolerance, 1 otherwise.
"""
import argparse
import gzip
import json
import math
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "F16": np.float16, "U8": np.uint8}


def read_safetensors(path):
    """{name: numpy array}, metadata dict."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        a = np.frombuffer(data[b:end], dtype=np.dtype(DTYPES[e["dtype"]]).newbyteorder("<"))
        out[name] = a.reshape(e["shape"]).astype(a.dtype.newbyteorder("="))
    return out, meta


def read_idx_images(path, n):
    with gzip.open(path, "rb") as f:
        magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
        assert magic == 0x803, "not an IDX image file"
        n = min(n, count)
        px = np.frombuffer(f.read(n * rows * cols), dtype=np.uint8)
    return px.reshape(n, rows * cols).astype(np.float32) / np.float32(255.0)


def load_predictions(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ------------------------------------------------------------- fmnist_mlp

def mlp_numpy(w, x):
    h = np.maximum(x @ w["linear1.w"] + w["linear1.b"], 0)
    h = np.maximum(h @ w["linear2.w"] + w["linear2.b"], 0)
    return h @ w["linear3.w"] + w["linear3.b"]


def mlp_torch(w, x):
    import torch
    import torch.nn as nn
    # the sizes from the weights: an export of a program shrunk by --shrink (channels pruning's zero
    # channels removed) has fewer hidden units, e.g. Linear(784, 512)
    model = nn.Sequential(nn.Linear(*w["linear1.w"].shape), nn.ReLU(), nn.Linear(*w["linear2.w"].shape), nn.ReLU(),
                          nn.Linear(*w["linear3.w"].shape))
    state = {}
    for k, layer in ((1, 0), (2, 2), (3, 4)):
        state[f"{layer}.weight"] = torch.from_numpy(np.ascontiguousarray(w[f"linear{k}.w"].T))
        state[f"{layer}.bias"] = torch.from_numpy(w[f"linear{k}.b"].copy())
    model.load_state_dict(state)  # strict: every name and shape must match
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def check_mlp(w, preds, args):
    x = read_idx_images(f"{args.data or '/usr/share/datasets/fashion-mnist'}/t10k-images-idx3-ubyte.gz", len(preds))
    logits = (mlp_numpy if args.numpy else mlp_torch)(w, x).astype(np.float64)
    m = logits.max(axis=1, keepdims=True)
    prob = 1.0 / np.exp(logits - m).sum(axis=1)
    ok = True
    worst_logit = worst_prob = 0.0
    for i, p in enumerate(preds):
        if p.get("index") != i:
            sys.exit(f"duet_to_torch.py: {args.predictions} line {i + 1} is not a classifier's prediction {i} "
                     "(duet predict of the same fmnist_mlp checkpoint, with --logits)")
        if "logits" not in p:
            sys.exit(f"duet_to_torch.py: {args.predictions} has no logits: run duet predict with --logits")
        d = np.abs(np.array(p["logits"]) - logits[i]).max()
        worst_logit = max(worst_logit, d)
        worst_prob = max(worst_prob, abs(p["prob"] - prob[i]))
        top2 = np.sort(logits[i])[-2:]
        if int(np.argmax(logits[i])) != p["class"] and top2[1] - top2[0] > 2 * args.tol:
            print(f"sample {i}: class {p['class']} in duet, {int(np.argmax(logits[i]))} here")
            ok = False
    print(f"{'numpy' if args.numpy else 'torch'}: {len(preds)} samples, largest logit difference {worst_logit:.3g}, "
          f"largest probability difference {worst_prob:.3g} (tolerance {args.tol:g})")
    return ok and worst_logit <= args.tol and worst_prob <= args.tol


# --------------------------------------------------------------- gpt_tiny

def check_gpt(w, preds, args):
    import torch
    import torch.nn.functional as F
    t = {k: torch.from_numpy(v.copy()) for k, v in w.items()}
    V, C = t["wte"].shape
    T = t["wpe"].shape[0]
    H = args.heads
    n_layer = len({k.split(".")[0] for k in t if k.startswith("layer")})

    def lin(x, name):
        return x @ t[name + ".w"] + t[name + ".b"]  # duet layout [in, out]: as torch's x @ weight.T

    def ln(x, name):
        return F.layer_norm(x, (C,), t[name + ".w"], t[name + ".b"], 1e-5)

    def forward(idx):
        x = t["wte"][idx] + t["wpe"]
        for li in range(1, n_layer + 1):
            p = f"layer{li}."
            h = ln(x, p + "ln1")
            b, tt, c = h.shape
            q, k, v = (lin(h, p + f"linear{i}").view(b, tt, H, c // H).transpose(1, 2) for i in (1, 2, 3))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // H))
            att = att.masked_fill(~torch.tril(torch.ones(tt, tt, dtype=torch.bool)), float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, tt, c)
            x = x + lin(y, p + "linear4")
            x = x + lin(F.gelu(lin(ln(x, p + "ln2"), p + "linear5"), approximate="tanh"), p + "linear6")
        return ln(x, "ln1") @ t["wte"].t()

    text = np.fromfile(args.data or "data/kjv.txt", dtype=np.uint8)
    offs = [p["offset"] for p in preds]
    idx = torch.from_numpy(np.stack([text[o:o + T] for o in offs]).astype(np.int64))
    tgt = torch.from_numpy(np.stack([text[o + 1:o + T + 1] for o in offs]).astype(np.int64))
    with torch.no_grad():
        logits = forward(idx)
        loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="none").view(len(offs), T)
    d = np.abs(np.array([p["loss"] for p in preds]) - loss.numpy().astype(np.float64)).max()
    print(f"torch: {len(preds)} windows of {T} tokens, largest per-token loss difference {d:.3g} "
          f"(tolerance {args.tol:g})")
    return d <= args.tol


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("weights")
    ap.add_argument("predictions")
    ap.add_argument("--data")
    ap.add_argument("--numpy", action="store_true", help="numpy forward pass (fmnist_mlp), no torch")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--heads", type=int, default=2, help="gpt: attention heads (not in the weights)")
    args = ap.parse_args()
    if not args.numpy:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("duet_to_torch.py: torch is not installed: skipped")
            sys.exit(77)
    try:
        w, meta = read_safetensors(args.weights)
        preds = load_predictions(args.predictions)
    except OSError as e:
        sys.exit(f"duet_to_torch.py: cannot read {e.filename}: {e.strerror}")
    except (ValueError, KeyError) as e:
        sys.exit(f"duet_to_torch.py: {args.weights} or {args.predictions} is malformed: {e}")
    model = meta.get("model")
    if meta.get("format") != "duet-weights-1":
        sys.exit(f"duet_to_torch.py: {args.weights} is not a duet export (format {meta.get('format')!r})")
    if model == "fmnist_mlp":
        ok = check_mlp(w, preds, args)
    elif model and model.startswith("gpt") and not args.numpy:
        ok = check_gpt(w, preds, args)
    else:
        sys.exit(f"duet_to_torch.py: no torch.nn mapping for model {model!r} (fmnist_mlp; gpt_tiny with torch)")
    print("ok" if ok else "FAIL: outside the tolerance")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
