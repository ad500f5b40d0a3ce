#!/usr/bin/env python3
"""Horovod's allreduce (sum, float32, over Gloo) as a peer of `cortado bench
pushpull` and bench/mpi/mpi_allreduce_bench on emulated hosts
(bench/multihost.sh's `horovod` job): the same fill, iteration counts and
JSON fields from rank 0 as the MPI benchmark.

    # the launcher: a Gloo rendezvous here (horovodrun --gloo's), then one
    # worker per host through the agent command ("{host}" is replaced):
    horovod_allreduce.py --hosts tb-h1,tb-h2 --agent "tests/testbed/testbed.sh exec-host {host}" \\
        --bytes 67108864 --iters 5 --warmup 1

The launcher runs on the first host (its address is the rendezvous's); every
worker gets HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo and the
rendezvous settings, runs --worker, and rank 0 prints
{"size_bytes", "seconds", "algbw_gbps", "busbw_gbps", "ok", "iters"}. Needs
Horovod with Gloo in this interpreter (bench/install_horovod.sh).
"""

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time


def worker(args):
    import torch
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    n = max(1, args.bytes // 4)
    pattern = (torch.arange(n, dtype=torch.int64) % 13 + 1).to(torch.float32)
    data = pattern * (rank + 1)
    for i in range(args.warmup):
        hvd.allreduce(data, op=hvd.Sum, name="warmup")
    hvd.allreduce(torch.zeros(1), op=hvd.Sum, name="barrier")
    t0 = time.perf_counter()
    for i in range(args.iters):
        out = hvd.allreduce(data, op=hvd.Sum, name="timed")
    secs = (time.perf_counter() - t0) / args.iters
    wrong = float(not torch.equal(out, pattern * (size * (size + 1) // 2)))
    any_wrong = hvd.allreduce(torch.tensor([wrong]), op=hvd.Sum, name="check").item()
    if rank == 0:
        algbw = n * 4 / secs / 1e9
        print(json.dumps({"size_bytes": n * 4, "seconds": secs, "algbw_gbps": round(algbw, 4),
                          "busbw_gbps": round(algbw * 2 * (size - 1) / size, 4),
                          "ok": any_wrong == 0, "iters": args.iters}), flush=True)
    hvd.shutdown()


def launch(args):
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer
    from horovod_rendezvous import slot_settings  # beside this file

    hosts = [h for h in args.hosts.split(",") if h]
    slots = get_host_assignments(parse_hosts(",".join(f"{h}:1" for h in hosts)), len(hosts))
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(slots)
    addr = socket.gethostbyname(hosts[0])
    procs = []
    try:
        for s in slots:
            env = {**slot_settings(s), "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
                   "HOROVOD_GLOO_RENDEZVOUS_PORT": port, "HOROVOD_CONTROLLER": "gloo",
                   "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": args.iface,
                   "PYTHONUNBUFFERED": 1}
            cmd = (shlex.split(args.agent.format(host=s.hostname))
                   + ["env"] + [f"{k}={v}" for k, v in env.items()]
                   + [sys.executable, os.path.abspath(__file__), "--worker",
                      "--bytes", str(args.bytes), "--iters", str(args.iters),
                      "--warmup", str(args.warmup)])
            procs.append(subprocess.Popen(cmd))
        deadline = time.monotonic() + args.timeout
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                rcs.append(None)
        if any(rc is None for rc in rcs):
            sys.exit(f"horovod_allreduce.py: a worker did not finish within {args.timeout:.0f} s")
        if any(rcs):
            sys.exit(f"horovod_allreduce.py: workers exited with {rcs}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", help="the launcher: the workers' hosts, one worker each; the "
                                   "first is this one")
    p.add_argument("--agent", default="{host}",
                   help="the launcher: the command prefix that runs on a host ({host})")
    p.add_argument("--iface", default="eth0", help="the launcher: HOROVOD_GLOO_IFACE")
    p.add_argument("--timeout", type=float, default=600, help="the launcher: seconds at most")
    p.add_argument("--worker", action="store_true", help="one worker (set by the launcher)")
    p.add_argument("--bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args()
    if args.bytes < 4 or args.iters < 1 or args.warmup < 0:
        p.error("--bytes must be at least 4, --iters at least 1, --warmup at least 0")
    if args.worker:
        worker(args)
    elif args.hosts:
        launch(args)
    else:
        p.error("give --hosts (the launcher) or --worker")


if __name__ == "__main__":
    main()
