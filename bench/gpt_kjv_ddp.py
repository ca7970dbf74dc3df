#!/usr/bin/env python3
"""bench/gpt_kjv_ddp.py: bench/gpt_kjv_torch.py's GPT trained by --procs
processes with PyTorch DistributedDataParallel over the gloo backend (Debian's
python3-torch has no MPI backend), each process one thread, the global batch
(16 windows) split among them as duet's ranks split it (process r takes
windows r*16/N .. (r+1)*16/N - 1 of every global batch, drawn by the same
generator on every process).  DDP's defaults: buckets of 25 MiB
(bucket_cap_mb), the first of 1 MiB, all-reduced as the backward pass makes
them.  --procs 1 trains without DDP (the one-process reference).  Times
--steps steps after --warmup and prints, from process 0,

    torch: trained N steps in T s (X tokens/s)

and, with --procs > 1, the seconds of one gloo all_reduce of all the
gradients (median of 5, after the run) as the communication cost.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_kjv_torch  # noqa: E402  (the model)
import numpy as np  # noqa: E402


def run(rank, args, port):
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    N = args.procs
    if N > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=N)
    block = 128
    with open(args.data, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    n_train = len(data) * 9 // 10
    train = torch.from_numpy(data[:n_train].astype(np.int64))
    span = torch.arange(block + 1)
    gen = torch.Generator().manual_seed(args.seed)
    model = gpt_kjv_torch.GPT(block=block)  # the same initial weights on every process (same seed)
    if N > 1:  # the causal masks are constant bool buffers, which gloo cannot broadcast
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [n for n, _ in model.named_buffers()])
    net = torch.nn.parallel.DistributedDataParallel(model) if N > 1 else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.999), eps=1e-8)
    per = args.batch // N

    def step():
        off = torch.randint(0, n_train - block, (args.batch,), generator=gen)  # the global batch
        w = train[off[rank * per:(rank + 1) * per, None] + span]  # this process's slice
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    if N > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if N > 1:
        dist.barrier()
    dt = time.perf_counter() - t0
    comm = None
    if N > 1:  # one all_reduce of every gradient, flattened: the communication a step needs
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        times = []
        for _ in range(5):
            dist.barrier()
            c0 = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - c0)
        comm = sorted(times)[2]
    if rank == 0:
        print("torch %s: %d processes x 1 thread (%s), final loss %.4f" %
              (torch.__version__, N, "DDP, gloo" if N > 1 else "no DDP", loss))
        if comm is not None:
            print("torch: all_reduce of %.2f MiB of gradients (gloo): %.2f ms" %
                  (sum(p.numel() for p in model.parameters()) * 4 / 1048576.0, 1e3 * comm))
        print("torch: trained %d steps in %.2f s (%.0f tokens/s)" % (args.steps, dt, args.steps * args.batch * block / dt))
        sys.stdout.flush()
    if N > 1:  # no destroy_process_group: with torch 1.13's gloo it can hang at the end of a run
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/kjv.txt")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    if args.batch % args.procs:
        print("gpt_kjv_ddp.py: --batch %d is not a multiple of --procs %d" % (args.batch, args.procs), file=sys.stderr)
        return 2
    if args.procs == 1:
        run(0, args, args.port)
    else:
        mp.spawn(run, args=(args, args.port), nprocs=args.procs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
