"""tests/calibrate_check.py: recomputes, independently of duet's kernels,
the activation scales that `duet run --quantize int8 --calibrate N` prints.

usage: /usr/bin/python3 tests/calibrate_check.py CK.st DATA_DIR N BATCH OUT

CK.st is fmnist_mlp's f32 checkpoint (safetensors, read here with json and
numpy), DATA_DIR the Fashion-MNIST directory (its TRAINING split, gzip
IDX), OUT duet's output.  The weights are quantized as duet_quantize_i8
defines (per output channel: scale = max|w| / 127 in f32, q = w / scale
rounded half to even, numpy's rule, clamped to [-127, 127]); the first
N x BATCH training images (pixels / 255 in f32) run through the three
layers with the dequantized weights in f32 (numpy's summation order, not
duet's), and each layer's input max|x| must match the printed one within a
relative 1e-5 (f32 sums of up to 1024 terms in another order), and each
printed scale must equal float32(max|x|) / 127 in f32 exactly.  Exit 1 on
a mismatch."""
import gzip
import json
import re
import struct
import sys

import numpy as np


def load_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"])
    return out


def quant(w):  # [in, out]: one scale per output channel (axis 1)
    m = np.abs(w).max(axis=0, keepdims=True).astype(np.float32)
    s = np.where(m == 0, np.float32(1), m / np.float32(127)).astype(np.float32)
    q = np.clip(np.round(w / s), -127, 127)
    return (q.astype(np.float32) * s).astype(np.float32)


def main():
    ck, data, n, batch, outp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    p = load_st(ck)
    with gzip.open(data + "/train-images-idx3-ubyte.gz") as f:
        raw = f.read()
    count = n * batch
    x = np.frombuffer(raw[16:16 + count * 784], dtype=np.uint8).reshape(count, 784).astype(np.float32) / np.float32(255)
    maxima = {}
    h = x
    for i, name in enumerate(["linear1", "linear2", "linear3"]):
        maxima[name + ".w.act_scale"] = float(np.abs(h).max())
        h = h @ quant(p[name + ".w"]) + p[name + ".b"]
        if i < 2:
            h = np.maximum(h, np.float32(0))
    text = open(outp).read()
    line = [l for l in text.splitlines() if l.startswith("duet: activation scales")]
    if len(line) != 1:
        print("FAIL no activation scale line in duet's output")
        return 1
    got = re.findall(r" (\S+\.act_scale) (\S+) \(max\|x\| (\S+)\)", line[0])
    bad = 0
    if sorted(g[0] for g in got) != sorted(maxima):
        print("FAIL the printed scales are", [g[0] for g in got], "not", sorted(maxima))
        return 1
    for name, scale, mx in got:
        want = maxima[name]
        rel = abs(float(mx) - want) / want
        exact = np.float32(np.float32(float(mx)) / np.float32(127)) == np.float32(float(scale))
        ok = rel <= 1e-5 and exact
        bad += not ok
        print("%s %s: max|x| %s, recomputed %.9g (relative %.2g, tolerance 1e-5); scale %s %s max|x| / 127"
              % ("ok" if ok else "FAIL", name, mx, want, rel, scale, "==" if exact else "!="))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
