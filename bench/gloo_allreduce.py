#!/usr/bin/python3
"""The torch.distributed peer of `cortado bench pushpull`: Gloo all_reduce
(sum, float32) over the same sizes and iteration counts, with W processes on
loopback, printing the same JSON fields from rank 0."""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iters_for(nbytes, requested):
    if requested > 0:
        return requested
    return max(5, min(200, (1 << 30) // max(nbytes, 1)))


def run(rank, args, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.workers)
    size = args.min_bytes
    while size <= args.max_bytes:
        n = max(1, size // 4)
        x = (torch.arange(n) % 13 + 1).float() * (rank + 1)
        buf = x.clone()
        for _ in range(args.warmup):
            buf.copy_(x)
            dist.all_reduce(buf)
        iters = iters_for(size, args.iters)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            buf.copy_(x)  # all_reduce is in place: restore the input (Cortado's is out of place)
            dist.all_reduce(buf)
        secs = (time.perf_counter() - t0) / iters
        expect = (torch.arange(n) % 13 + 1).float() * (args.workers * (args.workers + 1) // 2)
        ok = torch.tensor([int(torch.equal(buf, expect))])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if rank == 0:
            algbw = n * 4 / secs / 1e9
            print(json.dumps({"size_bytes": n * 4, "seconds": secs, "algbw_gbps": algbw,
                              "busbw_gbps": algbw * 2 * (args.workers - 1) / args.workers,
                              "ok": bool(ok.item()), "iters": iters}), flush=True)
        size *= 2
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-w", "--workers", type=int, default=4)
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.workers, join=True)


if __name__ == "__main__":
    main()
