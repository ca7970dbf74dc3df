#!/usr/bin/python3
"""Writes the .npy files the npy tests and examples read (numpy.save, format
version 1.0; run with /usr/bin/python3, which has numpy).

usage: gen_npy_fixtures.py fmnist OUTDIR [N_TRAIN N_TEST]
         the first N_TRAIN (default 512) training and N_TEST (default 256) test
         samples of Fashion-MNIST (Debian's IDX files), as duet's own
         fashion_mnist source reads them: images f32 pixel/255 (divided in
         float32, as runtime/data.c divides), labels i64 (numpy's default
         integer, converted to i32 by duet); written as x_train.npy,
         y_train.npy, x_test.npy, y_test.npy (images (N, 784)) and
         x_train_u8.npy (the raw bytes, (N, 28, 28), for the u8 path).
       gen_npy_fixtures.py random OUTDIR [N [SEED]]
         N (default 1000) random inputs x f32 (N, 1000), standard normal, and
         targets y = tanh(x @ W) f32 (N, 1000) for a fixed random W / 32, from
         numpy's default_rng(SEED) (SEED default 0): the data of
         models/examples/data_parallel.model (x.npy, y.npy).
"""
import gzip
import os
import struct
import sys

import numpy as np

FMNIST = "/usr/share/datasets/fashion-mnist"


def idx(path):
    with gzip.open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        ndim = magic & 0xFF
        dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def fmnist(out, n_train, n_test):
    for split, n, stem in (("train", n_train, "train"), ("t10k", n_test, "test")):
        images = idx(os.path.join(FMNIST, split + "-images-idx3-ubyte.gz"))[:n]
        labels = idx(os.path.join(FMNIST, split + "-labels-idx1-ubyte.gz"))[:n]
        x = images.reshape(n, 784).astype(np.float32) / np.float32(255)
        assert x.dtype == np.float32
        np.save(os.path.join(out, "x_%s.npy" % stem), x)
        np.save(os.path.join(out, "y_%s.npy" % stem), labels.astype(np.int64))
        if stem == "train":
            np.save(os.path.join(out, "x_train_u8.npy"), np.ascontiguousarray(images))


def random_data(out, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1000), dtype=np.float32)
    w = rng.standard_normal((1000, 1000), dtype=np.float32) / np.float32(32)
    y = np.tanh(x @ w).astype(np.float32)
    np.save(os.path.join(out, "x.npy"), x)
    np.save(os.path.join(out, "y.npy"), y)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("fmnist", "random"):
        sys.exit(__doc__)
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if sys.argv[1] == "fmnist":
        n_train = int(sys.argv[3]) if len(sys.argv) > 3 else 512
        n_test = int(sys.argv[4]) if len(sys.argv) > 4 else 256
        fmnist(out, n_train, n_test)
    else:
        n = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
        seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        random_data(out, n, seed)


if __name__ == "__main__":
    main()
