#!/usr/bin/env python3
"""Fresh tensors every step against tensors kept across steps, with the
Python binding: what a training script pays when it hands push_pull a new
tensor each step (docs/python.md, "Fresh tensors").

Each job trains a torchvision model on synthetic images on this machine
(W workers and S servers here) and pushes and pulls its gradients in
groups of about --group-bytes (backward order), as the binding's fused
default path did before its groups became views of kept buffers: once
backward has written a group's last gradient (a hook, while the backward
pass goes on) the group is concatenated (torch.cat) and push_pulled in
place; after backward each group is waited for and copied back into the
gradients. Two modes differ only in where the concatenation
goes:

  kept   into one buffer per group, allocated once (torch.cat(out=...))
  fresh  into a new tensor every step (torch.cat)

so the ratio fresh/kept is the cost of the fresh allocation alone. Per step
each worker records the wall time, the process's CPU time (all its threads)
and its minor page faults; the job reports their medians over the timed
steps (rank 0's, and the mean over workers of the CPU and faults).

The driver (the default) runs every (binding, codec, mode) as its own job,
--rounds times alternating, and prints a markdown table with the ratios:

  bench/fresh_buffers.py --binding before=/path/to/old/build/bindings/python \\
      --binding after=build/bindings/python --codecs none,topk:ratio=0.01

`--binding LABEL=DIR[,VAR=VALUE...]` names a PYTHONPATH holding a built
`cortado` package, with extra environment for its jobs (e.g.
`after-keep0=build/bindings/python,CORTADO_MALLOC_KEEP_BYTES=0`). Progress
on stderr, the table on stdout; --plot FILE also draws the ratios
(matplotlib: Debian's python3-matplotlib).
"""

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import plot_figures  # noqa: E402  (bench/, this script's folder)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--worker", action="store_true", help="run as one worker of a job")
    p.add_argument("--mode", choices=["kept", "fresh"], default="kept", help="--worker")
    p.add_argument("--codec", default="none", help="--worker: compression")
    p.add_argument("--binding", action="append", default=[],
                   help="LABEL=DIR[,VAR=VALUE...] (repeatable; default: this build)")
    p.add_argument("--codecs", default="none,topk:ratio=0.01,dgc:ratio=0.01,efsignsgd")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--group-bytes", type=int, default=4 << 20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cortado-bin", default=str(REPO / "build" / "launcher" / "cortado"))
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--plot", metavar="FILE",
                   help="also write a PNG of the fresh/kept ratios (bench/plot_figures.py)")
    return p.parse_args(argv)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def worker(args):
    import torch
    import torch.nn.functional as F
    from torchvision import models

    import cortado.torch as ct
    torch.set_num_threads(1)
    ct.init()
    rank = ct.rank()
    torch.manual_seed(0)
    model = getattr(models, args.model)(num_classes=10)
    params = [p for p in model.parameters() if p.requires_grad][::-1]  # backward order
    groups, cur, size = [], [], 0
    for p in params:
        cur.append(p)
        size += p.numel() * p.element_size()
        if size >= args.group_bytes:
            groups.append(cur)
            cur, size = [], 0
    if cur:
        groups.append(cur)
    kept = [torch.empty(sum(p.numel() for p in g)) for g in groups]
    gen = torch.Generator().manual_seed(rank + 1)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen)
    target = torch.randint(0, 10, (args.batch_size,), generator=gen)
    compression = None if args.codec == "none" else args.codec
    group_of = {p: g for g, members in enumerate(groups) for p in members}
    ready, handles = {}, []

    def push(g):
        with torch.no_grad():
            grads = [p.grad.reshape(-1) for p in groups[g]]
            flat = torch.cat(grads, out=kept[g]) if args.mode == "kept" else torch.cat(grads)
        handles.append((ct.push_pull_async_(flat, name=f"group{g}", average=True,
                                            compression=compression), groups[g]))

    # As DistributedOptimizer's hooks: a group leaves once backward has
    # written its last gradient, while the backward pass goes on.
    def hook_for(p):
        def hook(*_):
            g = group_of[p]
            ready[g] = ready.get(g, 0) + 1
            if ready[g] == len(groups[g]):
                push(g)
        return hook

    accumulators = []
    for p in params:
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(hook_for(p))
        accumulators.append(acc)
    rows = []
    for step in range(args.warmup + args.steps):
        ct.barrier()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=False)
        ready.clear()
        F.cross_entropy(model(data), target).backward()
        with torch.no_grad():
            for h, members in handles:
                flat = ct.synchronize(h)
                at = 0
                for p in members:
                    p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad))
                    at += p.numel()
                    p.add_(p.grad, alpha=-0.01)
        handles.clear()
        del flat
        t1 = time.perf_counter()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if step >= args.warmup:
            rows.append((t1 - t0, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                         r1.ru_minflt - r0.ru_minflt))
    mine = [median([r[i] for r in rows]) for i in range(3)]
    total = ct.push_pull(torch.tensor(mine[1:], dtype=torch.float64), name="bench.cpu_faults",
                         average=True)
    if rank == 0:
        print(json.dumps({"wall_ms": mine[0] * 1e3, "cpu_ms": float(total[0]) * 1e3,
                          "minflt": float(total[1]), "groups": len(groups),
                          "grad_mb": sum(p.numel() * 4 for p in params) / 1e6}), flush=True)
    ct.shutdown()


def parse_binding(text):
    label, eq, rest = text.partition("=")
    if not eq or not rest:
        raise SystemExit(f"--binding {text!r}: give LABEL=DIR[,VAR=VALUE...]")
    parts = rest.split(",")
    env = {}
    for item in parts[1:]:
        k, eq, v = item.partition("=")
        if not eq:
            raise SystemExit(f"--binding {text!r}: {item!r} is not VAR=VALUE")
        env[k] = v
    path = pathlib.Path(parts[0]).resolve()
    if not (path / "cortado").is_dir():
        raise SystemExit(f"--binding {text!r}: {path} holds no cortado package")
    return label, str(path), env


def run_job(args, binding, codec, mode):
    label, path, extra = binding
    env = dict(os.environ, PYTHONPATH=path, CORTADO_LOG_LEVEL="warn", PYTHONUNBUFFERED="1",
               **extra)
    cmd = [args.cortado_bin, "launch", "-w", str(args.workers), "-s", str(args.servers), "--",
           args.python, str(pathlib.Path(__file__).resolve()), "--worker", "--mode", mode,
           "--codec", codec, "--model", args.model, "--batch-size", str(args.batch_size),
           "--image-size", str(args.image_size), "--group-bytes", str(args.group_bytes),
           "--warmup", str(args.warmup), "--steps", str(args.steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"job {label} {codec} {mode} failed (exit {proc.returncode}):\n"
                     f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def driver(args):
    bindings = [parse_binding(b) for b in args.binding] or \
        [("this build", str(REPO / "build" / "bindings" / "python"), {})]
    codecs = args.codecs.split(",")
    if args.plot:
        plot_figures.require_matplotlib("fresh_buffers")
    results = {}
    for rnd in range(args.rounds):
        for codec in codecs:
            for b in bindings:
                for mode in ("kept", "fresh"):
                    r = run_job(args, b, codec, mode)
                    results.setdefault((b[0], codec, mode), []).append(r)
                    print(f"round {rnd + 1} {b[0]} {codec} {mode}: {json.dumps(r)}",
                          file=sys.stderr, flush=True)
    first = next(iter(results.values()))[0]
    print(f"{args.model}: {first['grad_mb']:.1f} MB of gradients in {first['groups']} groups "
          f"of >= {args.group_bytes} bytes; {args.workers} workers, {args.servers} servers; "
          f"medians over {args.rounds} rounds of the per-step medians\n")
    print("| binding | codec | kept: ms/step (wall) | fresh: ms/step | fresh / kept (wall) | "
          "kept: CPU ms/step | fresh: CPU ms/step | fresh / kept (CPU) | "
          "kept: page faults/step | fresh: page faults/step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    labels, wall, cpu = [], [], []
    for codec in codecs:
        for b in bindings:
            k = results[(b[0], codec, "kept")]
            f = results[(b[0], codec, "fresh")]

            def m(rs, key):
                return median([r[key] for r in rs])
            print(f"| {b[0]} | {codec} | {m(k, 'wall_ms'):.0f} | {m(f, 'wall_ms'):.0f} | "
                  f"{m(f, 'wall_ms') / m(k, 'wall_ms'):.2f}x | {m(k, 'cpu_ms'):.0f} | "
                  f"{m(f, 'cpu_ms'):.0f} | {m(f, 'cpu_ms') / m(k, 'cpu_ms'):.2f}x | "
                  f"{m(k, 'minflt'):.0f} | {m(f, 'minflt'):.0f} |")
            labels.append(f"{b[0]}, {codec}")
            wall.append(m(f, "wall_ms") / m(k, "wall_ms"))
            cpu.append(m(f, "cpu_ms") / m(k, "cpu_ms"))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        plot_figures.draw_table(labels, ["fresh / kept, wall time", "fresh / kept, CPU time"],
                                [wall, cpu], f"Fresh tensors every step, {args.model}, "
                                f"{args.workers} workers", args.plot)
        print(f"# plot written to {args.plot}", file=sys.stderr)


def main():
    args = parse_args()
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
