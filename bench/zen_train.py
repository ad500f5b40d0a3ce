#!/usr/bin/python3
"""A DeepFM-like click model through Cortado's DistributedOptimizer, with its
embedding's dense gradient sent through Zen (the default sparse_threshold)
and dense (sparse_threshold=0), against DDP with Gloo: samples per second,
one after the other in the same run (issue 37).

    /usr/bin/python3 bench/zen_train.py --workers 4 --servers 4   # this machine
    bench/zen_train_multihost.sh                                  # 4 emulated hosts (root)

The model: an nn.Embedding of --rows x --dim (a plain one: its gradient is a
dense tensor with a few rows set), --fields ids per sample drawn Zipf-like
(most from the first rows, shared by the workers; the rest each worker's
own), their embeddings concatenated into a 2-layer MLP with a logistic loss
on random labels. Every run starts from the same seed and sees the same
batches, so the loss after the last step compares them too. Prints a
markdown table (and the date, the load average and the command) from the
parent; the children are `cortado launch` jobs and spawned DDP processes.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--rows", type=int, default=500000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256, help="per worker")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--role", choices=["parent", "cortado", "ddp", "table"], default="parent",
                   help=argparse.SUPPRESS)
    p.add_argument("--command", default=None, help=argparse.SUPPRESS)
    p.add_argument("--load", default=None, help=argparse.SUPPRESS)
    p.add_argument("--threshold", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


class ClickModel(torch.nn.Module):
    def __init__(self, rows, dim, fields):
        super().__init__()
        self.emb = torch.nn.Embedding(rows, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(fields * dim, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def forward(self, ids):
        return self.mlp(self.emb(ids).flatten(1)).squeeze(1)


def batch(args, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    ids = (torch.rand(args.batch_size, args.fields, generator=g) ** 3 * args.rows).long()
    labels = (torch.rand(args.batch_size, generator=g) < 0.3).float()
    return ids, labels


def train(args, model, opt, rank, sync=None):
    """Runs warmup + timed steps; returns (seconds of the timed steps, last loss)."""
    start = None
    loss = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if sync:
                sync()
            start = time.perf_counter()
        ids, labels = batch(args, rank, step)
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(ids), labels)
        loss.backward()
        opt.step()
    if sync:
        sync()
    return time.perf_counter() - start, float(loss)


def run_cortado(args):
    import cortado.torch as ct
    ct.init()
    torch.set_num_threads(1)
    rank = ct.rank()
    torch.manual_seed(7)
    model = ClickModel(args.rows, args.dim, args.fields)
    kwargs = {} if args.threshold is None else {"sparse_threshold": args.threshold}
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters(), **kwargs)
    barrier = torch.zeros(1)
    seconds, loss = train(args, model, opt, rank,
                          sync=lambda: ct.allreduce(barrier, name="zen_train.barrier"))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"seconds": seconds, "loss": loss,
                       "densities": {k: v[0] for k, v in opt.sparse_densities.items()},
                       "zen": [k for k, v in opt.sparse_densities.items() if v[1]]}, f)
    ct.shutdown()


def ddp_worker(rank, args, port):
    import torch.distributed as dist
    torch.set_num_threads(1)
    if port is None:  # one process of a job started elsewhere (RANK, MASTER_ADDR, ...)
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.workers)
    torch.manual_seed(7)
    model = torch.nn.parallel.DistributedDataParallel(ClickModel(args.rows, args.dim,
                                                                 args.fields))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seconds, loss = train(args, model, opt, rank, sync=dist.barrier)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"seconds": seconds, "loss": loss}, f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_args(args):
    return ["--workers", str(args.workers), "--servers", str(args.servers), "--rows",
            str(args.rows), "--dim", str(args.dim), "--fields", str(args.fields),
            "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup",
            str(args.warmup)]


def parent(args):
    here = os.path.dirname(os.path.abspath(__file__))
    cortado = os.environ.get("CORTADO_BIN", os.path.join(here, "..", "build", "launcher",
                                                         "cortado"))
    load_before = os.getloadavg()
    results = {}
    for name, threshold in (("zen", None), ("dense", 0.0)):
        out = f"/tmp/zen_train.{os.getpid()}.{name}.json"
        cmd = [cortado, "launch", "-w", str(args.workers), "-s", str(args.servers), "--",
               sys.executable, os.path.abspath(__file__), "--role", "cortado", "--out", out,
               *child_args(args)]
        if threshold is not None:
            cmd += ["--threshold", str(threshold)]
        env = dict(os.environ, CORTADO_LOG_LEVEL=os.environ.get("CORTADO_LOG_LEVEL", "warn"),
                   OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, timeout=1200)
        with open(out) as f:
            results[name] = json.load(f)
        os.unlink(out)
    out = f"/tmp/zen_train.{os.getpid()}.ddp.json"
    import torch.multiprocessing as mp
    args.out = out
    mp.spawn(ddp_worker, args=(args, free_port()), nprocs=args.workers, join=True)
    with open(out) as f:
        results["ddp"] = json.load(f)
    os.unlink(out)
    load_after = os.getloadavg()
    report(args, results, " ".join(f"{x:.2f}" for x in load_before),
           " ".join(f"{x:.2f}" for x in load_after),
           " ".join(["bench/zen_train.py", *child_args(args)]))


def report(args, results, load_before, load_after, command):
    samples = args.workers * args.batch_size * args.steps
    rate = {k: samples / v["seconds"] for k, v in results.items()}
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average before: "
          f"{load_before}, after: {load_after}")
    print(f"# {command}")
    print(f"# embedding density measured per worker: "
          f"{results['zen']['densities']}; through Zen: {results['zen']['zen']}")
    print("| run | samples/s | loss after the last step | Zen / this |")
    print("|---|---|---|---|")
    labels = {"zen": "Cortado, embedding through Zen (default sparse_threshold)",
              "dense": "Cortado, dense push/pull (sparse_threshold=0)",
              "ddp": "DDP with Gloo"}
    for k in ("zen", "dense", "ddp"):
        print(f"| {labels[k]} | {rate[k]:.0f} | {results[k]['loss']:.5f} | "
              f"{rate['zen'] / rate[k]:.2f} |")


def main():
    args = parse_args()
    if args.role == "cortado":
        run_cortado(args)
    elif args.role == "ddp":
        ddp_worker(int(os.environ["RANK"]), args, None)
    elif args.role == "table":
        results = {}
        for k in ("zen", "dense", "ddp"):
            with open(os.path.join(args.out, k + ".json")) as f:
                results[k] = json.load(f)
        before, after = args.load.split(",")
        report(args, results, before, after, args.command)
    elif args.role == "parent":
        parent(args)


if __name__ == "__main__":
    main()
