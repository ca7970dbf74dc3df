#!/usr/bin/env python3
"""bench/fmnist_mlp_torch.py: duet's fmnist_mlp (784-1024-1024-10 ReLU MLP,
softmax cross-entropy, AdamW lr 1e-3 weight decay 0.01, batch 256) in PyTorch,
on the real Fashion-MNIST training set with random-permutation batches.
Times --steps optimizer steps after --warmup steps and prints

    torch: trained N steps in T s (X samples/s)

Run it with OMP_WAIT_POLICY=PASSIVE in the environment (bench/run.sh does):
otherwise PyTorch's OpenMP workers spin while OpenBLAS runs and on 2 cores it
is several times slower.
"""
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
from torch import nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    x_all = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    y_all = torch.from_numpy(labels.astype(np.int64))
    n = x_all.shape[0]
    per_epoch = n // args.batch

    model = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10))
    for m in model:  # kaiming-uniform weights, zero biases, as duet
        if isinstance(m, nn.Linear):
            nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()

    state = {"perm": None, "b": per_epoch}

    def batch():
        if state["b"] >= per_epoch:
            state["perm"] = torch.randperm(n)
            state["b"] = 0
        idx = state["perm"][state["b"] * args.batch:(state["b"] + 1) * args.batch]
        state["b"] += 1
        return x_all[idx], y_all[idx]

    def step():
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # as duet, which reads the loss back every step

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    dt = time.perf_counter() - t0
    print("torch %s: %d threads, OMP_WAIT_POLICY=%s, final loss %.4f" %
          (torch.__version__, torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY", "(unset)"), loss))
    print("torch: trained %d steps in %.2f s (%.0f samples/s)" % (args.steps, dt, args.steps * args.batch / dt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
