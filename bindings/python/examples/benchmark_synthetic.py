#!/usr/bin/env python3
"""Synthetic training benchmark, in the manner of BytePS's benchmark_byteps.py:
a torchvision model trained on random images, reporting images per second.

    # Cortado, 4 workers and 2 servers:
    cortado launch -w 4 -s 2 -- /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py
    # torch.distributed DistributedDataParallel with Gloo, 4 processes (spawned here):
    /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py --backend gloo --workers 4
    # DDP with NCCL on CUDA models (ranks sharing a GPU get an NCCL_HOSTID each):
    python3 bindings/python/examples/benchmark_synthetic.py --backend nccl --device cuda --workers 2
    # Horovod with Gloo (bench/install_horovod.sh installs it), 4 processes:
    horovodrun --gloo -np 4 -H localhost:4 python bindings/python/examples/benchmark_synthetic.py --backend horovod
    # Both, one after the other, with a comparison table (and --json for a record):
    /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py --compare --workers 4 --servers 2
    # The same with every gradient through the plan executor (its default plan):
    /usr/bin/python3 bindings/python/examples/benchmark_synthetic.py --compare --executor
    # The same with the model on the GPU (--device cuda; CUDA gradients stage through the host),
    # against DDP with Gloo and DDP with NCCL:
    python3 bindings/python/examples/benchmark_synthetic.py --compare --device cuda --workers 2 --servers 1 --peers gloo,nccl

Each timed iteration is --num-batches-per-iter training steps; the result is
the mean over --num-iters iterations, per worker and in total. On a CPU-only
machine the workers share the cores: each gets cores // workers threads.

The model starts from --seed on every worker (and is broadcast from rank 0
besides); each worker trains on --data-batches fixed random batches of its
own (seeded from --seed and its rank), in turn. So runs with the same seed,
sizes and step count see the same data, and the loss after the last step
(rank 0's, and the mean over the workers) compares the backends' training,
as bench/train.sh does. With --backend gloo (or nccl) and WORLD_SIZE, RANK
and MASTER_ADDR set (as torchrun sets them), this process is one DDP worker
instead of spawning --workers of them.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
import timeit

import numpy as np
import torch
import torch.nn.functional as F
from torchvision import models


# DDP's backends that --backend and --peers take, with their names in tables.
DDP_BACKENDS = {"gloo": "DDP + Gloo", "nccl": "DDP + NCCL"}

# Plan options for --plan-option (as `cortado plan --json` writes them).
PLAN_OPTIONS = {
    "allreduce": {"scheme": "flat", "steps": [
        {"op": "allreduce", "scope": "flat", "compressed": False}]},
    "hierarchical": {"scheme": "hierarchical", "steps": [
        {"op": "reduce_scatter", "scope": "intra", "compressed": False},
        {"op": "allreduce", "scope": "inter", "compressed": False},
        {"op": "allgather", "scope": "intra", "compressed": False}]},
    "pushpull": {"scheme": "hierarchical", "steps": [
        {"op": "reduce_scatter", "scope": "intra", "compressed": False},
        {"op": "push", "scope": "inter", "compressed": False},
        {"op": "pull", "scope": "inter", "compressed": False},
        {"op": "allgather", "scope": "intra", "compressed": False}]},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Synthetic benchmark (images/sec)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", choices=["cortado", "gloo", "nccl", "horovod", "none"],
                   default="cortado",
                   help="cortado (under cortado launch), gloo (DDP with Gloo), nccl (DDP with "
                        "NCCL, --device cuda; ranks that share a GPU each get an NCCL_HOSTID "
                        "of their own, so NCCL runs them as machines of their own), horovod "
                        "(Horovod's DistributedOptimizer, under horovodrun or with its "
                        "HOROVOD_* rendezvous settings), none (no communication: this "
                        "process trains alone, RANK and WORLD_SIZE from the environment "
                        "only name it; the compute bound when WORLD_SIZE of them run at once)")
    p.add_argument("--start-barrier", default=None, metavar="DIR",
                   help="--backend none: write DIR/ready.RANK and wait (up to --run-timeout) "
                        "until WORLD_SIZE processes did before the warmup, so that they "
                        "run together")
    p.add_argument("--model", default="resnet50", help="a torchvision.models name")
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="per worker (models with BatchNorm need 2 or more)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--compression", default="none",
                   help="cortado: none, fp16, auto, or an engine codec (topk:ratio=0.01, "
                        "dgc, efsignsgd, ...); horovod: none or fp16 (hvd.Compression)")
    p.add_argument("--fp16-pushpull", action="store_true", help="same as --compression fp16")
    p.add_argument("--executor", action="store_true",
                   help="cortado only: DistributedOptimizer(executor=True), every gradient "
                        "through the plan executor (CORTADO_PLAN or the default plan; float32 "
                        "models: on the CPU, or on CUDA with CORTADO_DEVICE=cuda and "
                        "--plan-option, whose workers run under mpirun)")
    p.add_argument("--plan-option", choices=sorted(PLAN_OPTIONS), default=None,
                   help="with --executor: every gradient on this plan option instead of the "
                        "default plan: allreduce (a flat MPI allreduce), hierarchical (reduce-"
                        "scatter in the machine, allreduce between machines, allgather) or "
                        "pushpull (reduce-scatter, push/pull between machines, allgather); the "
                        "collectives need the workers under mpirun: --compare launches them "
                        "with --mpi")
    p.add_argument("--fusion-bytes", type=int, default=None,
                   help="cortado: DistributedOptimizer(fusion_bytes=...), the group size (0: "
                        "one gradient at a time; default: the binding's, 25 MiB with --executor, "
                        "4 MiB without)")
    p.add_argument("--cross-barrier", action="store_true",
                   help="cortado (default path): DistributedOptimizer(cross_barrier=model), each "
                        "group's update waits for its push_pull in the next forward pass")
    p.add_argument("--fusion-search", choices=["default", "on", "off"], default="default",
                   help="cortado --executor: DistributedOptimizer(fusion_search=...), MergeComp's "
                        "online search for the groups (default: the binding's, on with a codec)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed")
    p.add_argument("--data-batches", type=int, default=1,
                   help="distinct random batches per worker, trained on in turn")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate, times the workers")
    p.add_argument("--label", default="", help="a name for this run in its JSON line")
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: auto)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model trains (cuda: every worker on GPU local_rank %% GPUs; "
                        "Cortado stages gradients through pinned host buffers, DDP + Gloo "
                        "through its own host copies)")
    p.add_argument("--workers", type=int, default=4, help="gloo/--compare: process count")
    p.add_argument("--servers", type=int, default=2, help="--compare: Cortado servers")
    p.add_argument("--compare", action="store_true",
                   help="run Cortado, then each of --peers (DDP with Gloo by default)")
    p.add_argument("--peers", type=peer_list, default=["gloo"],
                   help="--compare: the DDP backends measured after Cortado in each round, "
                        "comma-separated: gloo, nccl (nccl needs --device cuda)")
    p.add_argument("--cortado-bin", default=None,
                   help="the cortado launcher (for --compare; default: the one that goes with "
                        "the cortado package, cortado.paths.command())")
    p.add_argument("--rounds", type=int, default=1,
                   help="--compare: runs of each backend, alternating; the median is reported")
    p.add_argument("--run-timeout", type=float, default=1800,
                   help="--compare: seconds one run may take before it counts as hung")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line at the end")
    return p.parse_args(argv)


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def peer_list(text):
    peers = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in peers if p not in DDP_BACKENDS]
    if not peers or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: --peers takes a comma-separated list of {', '.join(DDP_BACKENDS)}")
    return peers


def log(rank, *a):
    if rank == 0:
        print(*a, flush=True)


def benchmark(args, rank, size, local_size, wrap_model, wrap_optimizer, local_rank=0,
              average=None, ready=None):
    """The timed loop, the same for every backend. `average(tensor)` returns
    the mean of a CPU tensor over the workers (for the final loss); `ready()`
    runs just before the warmup."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_size)
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = getattr(models, args.model)(num_classes=args.num_classes).to(device)
    # BatchNorm refuses to train on one image (PyTorch raises in the first
    # forward pass, after the job started): refused here, before any
    # communication, on every worker alike.
    if args.batch_size < 2 and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                                   for m in model.modules()):
        raise SystemExit(f"benchmark_synthetic: {args.model} has BatchNorm layers, which need "
                         f"at least 2 images per worker to train: --batch-size "
                         f"{args.batch_size} is too small (give 2 or more)")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size)
    model = wrap_model(model)
    optimizer = wrap_optimizer(model, optimizer)
    # This worker's own batches, the same in every run with this seed and rank.
    gen = torch.Generator().manual_seed(args.seed * 100003 + rank + 1)
    batches = [(torch.randn(args.batch_size, 3, args.image_size, args.image_size,
                            generator=gen).to(device),
                torch.randint(0, args.num_classes, (args.batch_size,), generator=gen).to(device))
               for _ in range(max(1, args.data_batches))]
    losses = []
    # Wall seconds of each phase over the timed steps (rank 0's own): zero_grad
    # and the forward pass with the loss, backward, and optimizer.step().
    phases = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    timed = [False]

    def step():
        data, target = batches[len(losses) % len(batches)]
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        losses.append(loss.detach())
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's GPU work, inside the timing
        if timed[0]:
            t3 = time.perf_counter()
            phases["forward"] += t1 - t0
            phases["backward"] += t2 - t1
            phases["step"] += t3 - t2

    log(rank, f"Model: {args.model}, batch size {args.batch_size} per worker, image "
              f"{args.image_size}x{args.image_size}, {size} workers, backend {args.backend}"
              + (f", compression {args.compression}"
                 if args.backend not in ("gloo", "nccl", "none") else "")
              + (", plan executor" if args.backend == "cortado" and args.executor else "")
              + (f", every gradient {args.plan_option}" if args.plan_option else "")
              + (f", fusion_bytes {args.fusion_bytes}" if args.fusion_bytes is not None else "")
              + (f", fusion search {args.fusion_search}" if args.fusion_search != "default" else "")
              + (", cross-barrier" if args.backend == "cortado" and args.cross_barrier else "")
              + f", {threads} threads per worker, on {args.device}")
    if ready is not None:
        ready()
    log(rank, "Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)
    log(rank, "Running benchmark...")
    timed[0] = True
    img_secs = []
    for i in range(args.num_iters):
        t = timeit.timeit(step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(rank, f"Iter #{i}: {img_sec:.1f} img/sec per worker, loss {losses[-1].item():.4f}")
        img_secs.append(img_sec)
    # Cross-barrier: the last step's updates wait for the next forward pass.
    getattr(optimizer, "wait_updates", lambda: None)()
    n = max(1, args.num_iters * args.num_batches_per_iter)
    phase_ms = {k: 1000.0 * v / n for k, v in phases.items()}
    log(rank, "Per timed step (rank 0): " + ", ".join(f"{k} {v:.0f} ms" for k, v in phase_ms.items()))
    cross = getattr(optimizer, "_cross", None)
    if cross is not None:
        log(rank, f"Cross-barrier (rank 0): {cross.deferred_steps} of {len(losses)} steps left "
                  f"updates to the forward pass; the pre-hooks waited "
                  f"{1000.0 * cross.forward_wait_s / max(1, cross.deferred_steps):.0f} ms per step "
                  f"(with the update of what they waited for)")
        names = {id(p): n for n, p in model.named_parameters()}
        order = {id(p): i for i, p in enumerate(model.parameters())}
        waits = sorted(cross.waits.items(), key=lambda kv: order[id(kv[0])])
        log(rank, "Cross-barrier waits by group (first parameter, ms per step): " + ", ".join(
            f"{names[id(p)]} {1000.0 * s / max(1, cross.deferred_steps):.0f}" for p, s in waits))
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    last = losses[-1].detach().float().cpu().reshape(1).clone()
    last_mean = float(average(last.clone())[0]) if average is not None else float(last[0])
    log(rank, f"Img/sec per worker: {mean:.1f} +-{conf:.1f}")
    log(rank, f"Total img/sec on {size} worker(s): {size * mean:.1f} +-{size * conf:.1f}")
    log(rank, f"Loss after {len(losses)} steps: {float(last[0]):.4f} (rank 0), "
              f"{last_mean:.4f} (mean over workers); first step {losses[0].item():.4f}")
    executor = getattr(optimizer, "executor", None)
    search = str(executor.fusion_search) if executor is not None else None
    if search is not None:
        log(rank, f"Executor: {search}")
    return {"backend": args.backend, "label": args.label, "model": args.model,
            "batch_size": args.batch_size,
            "image_size": args.image_size, "workers": size, "threads_per_worker": threads,
            "compression": (args.compression if args.backend not in ("gloo", "nccl", "none")
                            else "none"),
            "executor": args.backend == "cortado" and args.executor,
            "plan_option": args.plan_option if args.backend == "cortado" else None,
            "fusion_bytes": args.fusion_bytes, "fusion_search": args.fusion_search,
            "cross_barrier": args.backend == "cortado" and args.cross_barrier,
            "phase_ms_rank0": phase_ms,
            "device": args.device, "seed": args.seed, "data_batches": args.data_batches,
            "steps": len(losses), "loss_first": float(losses[0]), "loss_last": float(last[0]),
            "loss_last_mean": last_mean, "executor_fusion_search": search,
            "img_sec_per_worker": mean, "img_sec_total": size * mean, "conf95_total": size * conf}


def run_cortado(args):
    import cortado.torch as ct
    if args.fp16_pushpull:
        args.compression = "fp16"
    compression = ct.Compression.lookup(args.compression)
    ct.init()
    rank, size = ct.rank(), ct.size()

    def wrap_optimizer(model, optimizer):
        extra = {}
        extra["fusion_bytes"] = args.fusion_bytes
        if args.executor:
            if args.fusion_search != "default":
                extra["fusion_search"] = args.fusion_search == "on"
        elif args.fusion_search != "default":
            raise SystemExit("--fusion-search needs --executor")
        if args.cross_barrier:
            extra["cross_barrier"] = model
        if args.plan_option:
            if not args.executor:
                raise SystemExit("--plan-option needs --executor")
            extra["plan"] = {"format": "cortado-plan", "version": 1,
                             "tensors": {f"grad.{n}": PLAN_OPTIONS[args.plan_option]
                                         for n, _ in model.named_parameters()}}
            extra.pop("fusion_bytes")  # the plan decides; the executor fuses by size
        optimizer = ct.DistributedOptimizer(optimizer, model.named_parameters(),
                                            compression=compression, executor=args.executor,
                                            **extra)
        ct.broadcast_parameters(model.state_dict(), root_rank=0)
        ct.broadcast_optimizer_state(optimizer, root_rank=0)
        return optimizer

    result = benchmark(args, rank, size, ct.local_size(), lambda m: m, wrap_optimizer,
                       ct.local_rank(), lambda t: ct.push_pull(t, name="bench.loss"))
    if result["fusion_bytes"] is None:  # the binding's default
        result["fusion_bytes"] = (ct.DEFAULT_FUSION_BYTES if args.executor
                                  else ct.DEFAULT_ENGINE_FUSION_BYTES)
    if args.json and rank == 0:
        print(json.dumps(result), flush=True)
    ct.shutdown()


def _ddp_worker(rank, args, port, size=None, local_size=None):
    """One DDP worker on args.backend (gloo or nccl)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    if port is not None:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
    size = size or args.workers
    if args.backend == "nccl" and torch.cuda.device_count() < (local_size or size):
        # NCCL refuses two ranks of one machine on one GPU; with a host id of
        # its own each rank is a machine of its own to NCCL (sockets between
        # them), as Cortado's NCCL tests emulate machines.
        os.environ.setdefault("NCCL_HOSTID", f"benchmark-synthetic-rank-{rank}")
    dist.init_process_group(args.backend, rank=rank, world_size=size)

    def average(t):
        on = t.cuda() if args.backend == "nccl" else t
        dist.all_reduce(on)
        return on.cpu() / size

    result = benchmark(args, rank, size, local_size or size, DistributedDataParallel,
                       lambda model, optimizer: optimizer, rank, average)
    if args.json and rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


def run_ddp(args):
    if args.backend == "nccl" and args.device != "cuda":
        raise SystemExit("--backend nccl trains on CUDA: add --device cuda")
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        # One worker of a job started elsewhere (torchrun, bench/train.sh).
        _ddp_worker(int(os.environ["RANK"]), args, None, int(os.environ["WORLD_SIZE"]),
                    int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        return
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_worker, args=(args, port), nprocs=args.workers, join=True)


def run_horovod(args):
    """One Horovod worker: Horovod's DistributedOptimizer (its gradient
    allreduce over Gloo on CPU), with hvd.Compression.fp16 for --compression
    fp16. Under horovodrun, or with the HOROVOD_* settings it would set."""
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise SystemExit(f"--backend horovod: cannot import horovod.torch ({e}); "
                         f"bench/install_horovod.sh installs Horovod 0.28.1") from None
    codecs = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
    if args.compression not in codecs:
        raise SystemExit(f"--backend horovod: --compression must be none or fp16 "
                         f"(got {args.compression!r})")
    hvd.init()

    def wrap_optimizer(model, optimizer):
        optimizer = hvd.DistributedOptimizer(optimizer, model.named_parameters(),
                                             compression=codecs[args.compression])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return optimizer

    result = benchmark(args, hvd.rank(), hvd.size(), hvd.local_size(), lambda m: m,
                       wrap_optimizer, hvd.local_rank(),
                       lambda t: hvd.allreduce(t, name="bench.loss", op=hvd.Average))
    if args.json and hvd.rank() == 0:
        print(json.dumps(result), flush=True)
    hvd.shutdown()


def run_alone(args):
    """--backend none: one process training its own copy with no
    communication at all. WORLD_SIZE of them started together (bench/train.sh
    `compute`) share the machine's cores as a data-parallel job's workers do
    and give the step time that no communication library can beat there."""
    rank = int(os.environ.get("RANK", "0"))
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    def ready():
        if args.start_barrier is None:
            return
        folder = pathlib.Path(args.start_barrier)
        (folder / f"ready.{rank}").touch()
        deadline = time.monotonic() + args.run_timeout
        while len(list(folder.glob("ready.*"))) < size:
            if time.monotonic() > deadline:
                raise SystemExit(f"--start-barrier {folder}: {len(list(folder.glob('ready.*')))} "
                                 f"of WORLD_SIZE={size} processes arrived within "
                                 f"{args.run_timeout} s")
            time.sleep(0.05)

    result = benchmark(args, rank, size, local_size, lambda m: m, lambda m, o: o, 0, None, ready)
    if args.json and rank == 0:
        print(json.dumps(result), flush=True)


def run_compare(args):
    """Cortado, then each DDP backend of --peers, --rounds times alternately
    (the machine is shared, so every side sees the same drift); the table has
    the median round of each and the ratios of the medians."""
    if "nccl" in args.peers and args.device != "cuda":
        raise SystemExit("--peers nccl trains on CUDA: add --device cuda")
    here = pathlib.Path(__file__).resolve()
    import cortado.paths
    # The command that goes with the imported package (CORTADO_BIN, the
    # installed copy, the build's), else the checkout's build.
    launcher = (args.cortado_bin or cortado.paths.command()
                or str(here.parents[3] / "build" / "launcher" / "cortado"))
    common = ["--model", args.model, "--batch-size", str(args.batch_size),
              "--image-size", str(args.image_size), "--num-classes", str(args.num_classes),
              "--num-warmup-batches", str(args.num_warmup_batches),
              "--num-batches-per-iter", str(args.num_batches_per_iter),
              "--num-iters", str(args.num_iters), "--threads", str(args.threads),
              "--device", args.device, "--seed", str(args.seed),
              "--data-batches", str(args.data_batches), "--lr", str(args.lr), "--json"]
    runs = [
        ("cortado", [launcher, "launch", "-w", str(args.workers), "-s", str(args.servers),
                     *(["--mpi"] if args.plan_option else []), "--",
                     sys.executable, str(here), "--backend", "cortado",
                     "--compression", args.compression,
                     *(["--executor"] if args.executor else []),
                     *(["--plan-option", args.plan_option] if args.plan_option else []),
                     *(["--fusion-bytes", str(args.fusion_bytes)] if args.fusion_bytes is not None
                       else []),
                     "--fusion-search", args.fusion_search, *common]),
    ] + [(peer, [sys.executable, str(here), "--backend", peer, "--workers", str(args.workers),
                 *common]) for peer in args.peers]
    results = {name: [] for name, _ in runs}
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

    c = median(results["cortado"])
    print()
    print(f"{args.model}, {args.image_size}x{args.image_size}, batch {args.batch_size} per "
          f"worker, on {args.device}, {c['threads_per_worker']} threads per worker, median of {args.rounds} "
          f"alternating round(s)")
    print("| backend | workers | img/sec total | img/sec per worker | all rounds (total) |")
    print("| --- | --- | --- | --- | --- |")
    label = "Cortado (" + ("plan executor, " if c.get("executor") else "") + \
        (f"every gradient {c['plan_option']}, " if c.get("plan_option") else "") + \
        c["compression"] + f", {args.servers} servers)"
    for name, _ in runs:
        r = median(results[name])
        every = ", ".join(f"{x['img_sec_total']:.1f}" for x in results[name])
        print(f"| {label if name == 'cortado' else DDP_BACKENDS[name]} | {r['workers']} "
              f"| {r['img_sec_total']:.1f} +-{r['conf95_total']:.1f} "
              f"| {r['img_sec_per_worker']:.1f} | {every} |")
    ratios = {}
    print()
    for peer in args.peers:
        g = median(results[peer])
        ratios[peer] = c["img_sec_total"] / g["img_sec_total"]
        pairs = sorted(x["img_sec_total"] / y["img_sec_total"]
                       for x, y in zip(results["cortado"], results[peer]))
        print(f"Cortado / {DDP_BACKENDS[peer].split(' + ')[1]}: {ratios[peer]:.2f} (medians); "
              f"per round: {', '.join(f'{p:.2f}' for p in pairs)} "
              f"(median {pairs[len(pairs) // 2]:.2f})")
    if args.json:
        # "ratio": against the first peer (Gloo by default).
        print(json.dumps({**results, "ratio": ratios[args.peers[0]], "ratios": ratios}))


def main():
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this torch sees no CUDA device (torch.cuda.is_available() "
                         "is False); run on a GPU machine with a CUDA build of PyTorch, or use "
                         "--device cpu")
    if args.compare:
        run_compare(args)
    elif args.backend in DDP_BACKENDS:
        run_ddp(args)
    elif args.backend == "horovod":
        run_horovod(args)
    elif args.backend == "none":
        run_alone(args)
    else:
        run_cortado(args)


if __name__ == "__main__":
    main()
