#!/usr/bin/env python3
"""Synthetic training benchmark, in the manner of BytePS's benchmark_byteps.py:
a torchvision model trained on random images, reporting images per second.

    # Cortado, 4 workers and 2 servers:
    cortado launch -w 4 -s 2 -- /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py
    # torch.distributed DistributedDataParallel with Gloo, 4 processes (spawned here):
    /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py --backend gloo --workers 4
    # Both, one after the other, with a comparison table (and --json for a record):
    /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py --compare --workers 4 --servers 2
    # The same with every gradient through the plan executor (its default plan):
    /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py --compare --executor
    # The same with the model on the GPU (--device cuda; CUDA gradients stage through the host):
    python3 bindings/python/examples/benchmark_synthetic.py --compare --device cuda --workers 2 --servers 1

Each timed iteration is --num-batches-per-iter training steps; the result is
the mean over --num-iters iterations, per worker and in total. On a CPU-only
machine the workers share the cores: each gets cores // workers threads.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F
from torchvision import models


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Synthetic benchmark (images/sec)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", choices=["cortado", "gloo"], default="cortado")
    p.add_argument("--model", default="resnet50", help="a torchvision.models name")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--compression", default="none",
                   help="cortado only: none, fp16, auto, or an engine codec (topk:ratio=0.01, "
                        "dgc, efsignsgd, ...)")
    p.add_argument("--fp16-pushpull", action="store_true", help="same as --compression fp16")
    p.add_argument("--executor", action="store_true",
                   help="cortado only: DistributedOptimizer(executor=True), every gradient "
                        "through the plan executor (CORTADO_PLAN or the default plan; float32 "
                        "CPU models, compression none)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: auto)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model trains (cuda: every worker on GPU local_rank %% GPUs; "
                        "Cortado stages gradients through pinned host buffers, DDP + Gloo "
                        "through its own host copies)")
    p.add_argument("--workers", type=int, default=4, help="gloo/--compare: process count")
    p.add_argument("--servers", type=int, default=2, help="--compare: Cortado servers")
    p.add_argument("--compare", action="store_true", help="run Cortado, then DDP with Gloo")
    p.add_argument("--cortado-bin", default=None, help="the cortado launcher (for --compare)")
    p.add_argument("--rounds", type=int, default=1,
                   help="--compare: runs of each backend, alternating; the median is reported")
    p.add_argument("--run-timeout", type=float, default=1800,
                   help="--compare: seconds one run may take before it counts as hung")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line at the end")
    return p.parse_args(argv)


def log(rank, *a):
    if rank == 0:
        print(*a, flush=True)


def benchmark(args, rank, size, local_size, wrap_model, wrap_optimizer, local_rank=0):
    """The timed loop, the same for both backends."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_size)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = getattr(models, args.model)(num_classes=args.num_classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    model = wrap_model(model)
    optimizer = wrap_optimizer(model, optimizer)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, args.num_classes, (args.batch_size,), device=device)

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's GPU work, inside the timing

    log(rank, f"Model: {args.model}, batch size {args.batch_size} per worker, image "
              f"{args.image_size}x{args.image_size}, {size} workers, backend {args.backend}"
              + (f", compression {args.compression}" if args.backend == "cortado" else "")
            + (", plan executor" if args.backend == "cortado" and args.executor else "")
              + f", {threads} threads per worker, on {args.device}")
    log(rank, "Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)
    log(rank, "Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        t = timeit.timeit(step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(rank, f"Iter #{i}: {img_sec:.1f} img/sec per worker")
        img_secs.append(img_sec)
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    log(rank, f"Img/sec per worker: {mean:.1f} +-{conf:.1f}")
    log(rank, f"Total img/sec on {size} worker(s): {size * mean:.1f} +-{size * conf:.1f}")
    return {"backend": args.backend, "model": args.model, "batch_size": args.batch_size,
            "image_size": args.image_size, "workers": size, "threads_per_worker": threads,
            "compression": args.compression if args.backend == "cortado" else "none",
            "executor": args.backend == "cortado" and args.executor,
            "device": args.device,
            "img_sec_per_worker": mean, "img_sec_total": size * mean, "conf95_total": size * conf}


def run_cortado(args):
    import cortado.torch as ct
    if args.fp16_pushpull:
        args.compression = "fp16"
    compression = ct.Compression.lookup(args.compression)
    ct.init()
    rank, size = ct.rank(), ct.size()

    def wrap_optimizer(model, optimizer):
        optimizer = ct.DistributedOptimizer(optimizer, model.named_parameters(),
                                            compression=compression, executor=args.executor)
        ct.broadcast_parameters(model.state_dict(), root_rank=0)
        ct.broadcast_optimizer_state(optimizer, root_rank=0)
        return optimizer

    result = benchmark(args, rank, size, ct.local_size(), lambda m: m, wrap_optimizer,
                       ct.local_rank())
    if args.json and rank == 0:
        print(json.dumps(result), flush=True)
    ct.shutdown()


def _gloo_worker(rank, args, port):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    result = benchmark(args, rank, args.workers, args.workers, DistributedDataParallel,
                       lambda model, optimizer: optimizer, rank)
    if args.json and rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


def run_gloo(args):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gloo_worker, args=(args, port), nprocs=args.workers, join=True)


def run_compare(args):
    """Cortado, then DDP with Gloo, --rounds times alternately (the machine is
    shared, so the two sides see the same drift); the table has the median
    round of each and the ratio of the medians."""
    here = pathlib.Path(__file__).resolve()
    launcher = args.cortado_bin or str(here.parents[3] / "build" / "launcher" / "cortado")
    common = ["--model", args.model, "--batch-size", str(args.batch_size),
              "--image-size", str(args.image_size), "--num-classes", str(args.num_classes),
              "--num-warmup-batches", str(args.num_warmup_batches),
              "--num-batches-per-iter", str(args.num_batches_per_iter),
              "--num-iters", str(args.num_iters), "--threads", str(args.threads),
              "--device", args.device, "--json"]
    runs = [
        ("cortado", [launcher, "launch", "-w", str(args.workers), "-s", str(args.servers), "--",
                     sys.executable, str(here), "--backend", "cortado",
                     "--compression", args.compression,
                     *(["--executor"] if args.executor else []), *common]),
        ("gloo", [sys.executable, str(here), "--backend", "gloo", "--workers",
                  str(args.workers), *common]),
    ]
    results = {"cortado": [], "gloo": []}
    for r in range(args.rounds):
        for name, cmd in runs:
            print(f"$ {' '.join(cmd)}   # round {r + 1}/{args.rounds}", flush=True)
            # On a loaded machine four processes importing torch can take
            # longer than the default 30 s that the servers wait for the
            # workers to register.
            env = dict(os.environ)
            env.setdefault("CORTADO_CONNECT_TIMEOUT_MS", "180000")
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True,
                                 timeout=args.run_timeout, env=env).stdout
            print(out, end="", flush=True)
            results[name].append(json.loads([l for l in out.splitlines()
                                             if l.startswith("{")][-1]))

    def median(rs):
        return sorted(rs, key=lambda x: x["img_sec_total"])[len(rs) // 2]

    c, g = median(results["cortado"]), median(results["gloo"])
    print()
    print(f"{args.model}, {args.image_size}x{args.image_size}, batch {args.batch_size} per "
          f"worker, on {args.device}, {c['threads_per_worker']} threads per worker, median of {args.rounds} "
          f"alternating round(s)")
    print("| backend | workers | img/sec total | img/sec per worker | all rounds (total) |")
    print("| --- | --- | --- | --- | --- |")
    label = "Cortado (" + ("plan executor, " if c.get("executor") else "") + c["compression"] + \
        f", {args.servers} servers)"
    for name, r, key in ((label, c, "cortado"), ("DDP + Gloo", g, "gloo")):
        every = ", ".join(f"{x['img_sec_total']:.1f}" for x in results[key])
        print(f"| {name} | {r['workers']} | {r['img_sec_total']:.1f} +-{r['conf95_total']:.1f} "
              f"| {r['img_sec_per_worker']:.1f} | {every} |")
    pairs = sorted(x["img_sec_total"] / y["img_sec_total"]
                   for x, y in zip(results["cortado"], results["gloo"]))
    print(f"\nCortado / Gloo: {c['img_sec_total'] / g['img_sec_total']:.2f} (medians); per "
          f"round: {', '.join(f'{p:.2f}' for p in pairs)} (median {pairs[len(pairs) // 2]:.2f})")
    if args.json:
        print(json.dumps({"cortado": results["cortado"], "gloo": results["gloo"],
                          "ratio": c["img_sec_total"] / g["img_sec_total"]}))


def main():
    args = parse_args()
    if args.compare:
        run_compare(args)
    elif args.backend == "gloo":
        run_gloo(args)
    else:
        run_cortado(args)


if __name__ == "__main__":
    main()
