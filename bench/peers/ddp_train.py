#!/usr/bin/python3
"""PyTorch DDP peer for `lockstep train` (run by bench/peers/compare_train.sh, by hand, never in CI).

The same job as lockstep's default: Fashion-MNIST from the Debian package, pixels / 255, the MLP
784-512-512-10, SGD (lr 0.1, momentum 0.9, cosine schedule), N processes x micro-batch B, each
step's global batch cut into N contiguous shards of one permutation per epoch. DDP as its
documentation recommends for speed: Gloo (the CPU backend), default buckets (25 MB, first 1 MB),
gradient_as_bucket_view, zero_grad(set_to_none=True). BLAS threads per process as lockstep's (one
each when there are at least as many processes as cores, else cores / processes) unless --threads
says otherwise; torch's own intra-op threads stay at one, since OpenMP threads around a
multithreaded OpenBLAS run one process at a third of the speed on this machine.

Timing favours DDP: the clock starts after --warmup untimed steps (lockstep's own number counts
every step). Rank 0 prints one JSON line: peer, replicas, micro_batch, steps, samples_per_s, loss.

    /usr/bin/python3 bench/peers/ddp_train.py --nproc 8 --micro-batch 32 --steps 600

Across machines (bench/peers/compare_hosts_train.sh runs it so in test hosts): each machine runs
its --nproc ranks, numbered from --first-rank, of a --world-size job that meets at --master
ADDR:PORT (torch's TCP store on the machine of rank 0). GLOO_SOCKET_IFNAME names the interface.
"""

import argparse
import gzip
import json
import math
import os
import struct
import sys
import tempfile
import time


def read_idx(path):
    """An IDX file, plain or gzip, as (dims, bytes)."""
    for name in (path, path + ".gz"):
        if os.path.exists(name):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(name, "rb") as f:
                data = f.read()
            ndim = data[3]
            dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
            return dims, data[4 + 4 * ndim:]
    sys.exit(f"ddp_train.py: no IDX file {path} (or .gz); install dataset-fashion-mnist or pass --data.")


def run(local_rank, args, init, threads):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # intra-op (OpenMP); the matrix products get OpenBLAS's `threads`
    rank, world = args.first_rank + local_rank, args.world_size or args.nproc
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    dims, pixels = read_idx(os.path.join(args.data, "train-images-idx3-ubyte"))
    _, labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte"))
    features = dims[1] * dims[2]
    x = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(dims[0], features).float() / 255
    y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    widths = [features] + [int(h) for h in args.hidden.split(",")] + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    model = DDP(nn.Sequential(*layers), gradient_as_bucket_view=True)
    if args.compress == "fp16":  # torch's own hook: each bucket all-reduced as float16, no error feedback
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    total = args.warmup + args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / total)))
    loss_fn = nn.CrossEntropyLoss()

    global_batch = world * args.micro_batch
    steps_per_epoch = dims[0] // global_batch  # full global batches only
    order = None
    loss_sum, loss_n = 0.0, 0
    t0 = time.perf_counter()
    for step in range(total):
        if step == args.warmup:
            dist.barrier()
            t0 = time.perf_counter()
            loss_sum, loss_n = 0.0, 0
        epoch, in_epoch = divmod(step, steps_per_epoch)
        if in_epoch == 0:
            order = torch.randperm(dims[0], generator=torch.Generator().manual_seed(args.seed * 1000003 + epoch))
        lo = in_epoch * global_batch + rank * args.micro_batch
        idx = order[lo:lo + args.micro_batch]
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()  # DDP all-reduces the gradient buckets as backward produces them
        opt.step()
        sched.step()
        loss_sum += loss.item()
        loss_n += 1
    dist.barrier()
    seconds = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"peer": "pytorch-ddp", "torch": torch.__version__, "replicas": world, "threads": threads,
                          "compress": args.compress,
                          "micro_batch": args.micro_batch, "steps": args.steps,
                          "samples_per_s": global_batch * args.steps / seconds,
                          "loss": loss_sum / loss_n}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=600, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument("--hidden", default="512,512")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--threads", type=int, default=0,
                   help="OpenBLAS threads per process (0: as lockstep, 1 or cores / processes)")
    p.add_argument("--compress", choices=["none", "fp16"], default="none",
                   help="fp16: DDP's fp16_compress_hook, half the bytes as lockstep's --compress bf16 (torch's "
                        "bf16_compress_hook needs CUDA)")
    p.add_argument("--master", default="", help="ADDR:PORT of rank 0's TCP store (several machines)")
    p.add_argument("--world-size", type=int, default=0, help="ranks on all machines (default --nproc)")
    p.add_argument("--first-rank", type=int, default=0, help="the rank of this machine's first process")
    args = p.parse_args()
    if bool(args.master) != bool(args.world_size) or args.first_rank + args.nproc > (args.world_size or args.nproc):
        p.error("--master and --world-size go together, and --first-rank + --nproc must not exceed --world-size")
    cores = os.cpu_count() or 1
    threads = args.threads or (1 if args.nproc >= cores else cores // args.nproc)
    # Before torch loads OpenBLAS in the children, which read it once.
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.multiprocessing as mp
    if args.master:
        mp.spawn(run, args=(args, "tcp://" + args.master, threads), nprocs=args.nproc, join=True)
        return
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(run, args=(args, "file://" + os.path.join(d, "init"), threads), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
