#!/usr/bin/python3
"""Runs `cortado bench pushpull` and its peers in the same run, on the same
machine, with the same sizes and process counts, and prints Cortado's
algorithm bandwidth as a ratio of each peer's:

  - OpenMPI MPI_Allreduce over shared memory (btl vader,self)
  - OpenMPI MPI_Allreduce over TCP (btl tcp,self)
  - torch.distributed all_reduce with Gloo

Usage: bench/compare_pushpull.py [-w 4] [-s 2] [--min-bytes 4096]
       [--max-bytes 268435456] [--markdown]
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_lines(text):
    rows = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["size_bytes"]] = r
    return rows


def run(name, cmd, env=None):
    print(f"# running {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=3600)
    if p.returncode != 0:
        print(f"# {name} failed (exit {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
        return {}
    return parse_lines(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-w", "--workers", type=int, default=4)
    ap.add_argument("-s", "--servers", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--transport", default="zmq")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()

    sizes = ["--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
             "--iters", str(args.iters)]
    cortado = os.path.join(args.build, "launcher", "cortado")
    results = {}
    results["cortado"] = run("cortado", [cortado, "bench", "pushpull", "-w", str(args.workers),
                                         "-s", str(args.servers), "--transport", args.transport,
                                         "--json"] + sizes)
    mpi_bench = os.path.join(args.build, "bench", "mpi", "mpi_allreduce_bench")
    mpirun = shutil.which("mpirun")
    if mpirun and os.path.exists(mpi_bench):
        base = [mpirun, "-np", str(args.workers), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            base.append("--allow-run-as-root")
        results["mpi_shm"] = run("MPI_Allreduce shm", base + ["--mca", "btl", "vader,self", mpi_bench] + sizes)
        results["mpi_tcp"] = run("MPI_Allreduce tcp", base + ["--mca", "btl", "tcp,self",
                                                              "--mca", "btl_tcp_if_include", "lo",
                                                              mpi_bench] + sizes)
    else:
        print("# MPI peer skipped: mpirun or build/bench/mpi/mpi_allreduce_bench missing", file=sys.stderr)
    results["gloo"] = run("gloo", ["/usr/bin/python3", os.path.join(ROOT, "bench", "gloo_allreduce.py"),
                                   "-w", str(args.workers)] + sizes)

    peers = [p for p in ("mpi_shm", "mpi_tcp", "gloo") if results.get(p)]
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    header = (f"{now}, {platform.node()}, {os.cpu_count()} cores, "
              f"{args.workers} workers / {args.servers} servers, transport {args.transport}")
    cols = ["size", "cortado GB/s"] + [f"{p} GB/s" for p in peers] + [f"x {p}" for p in peers] + ["ok"]
    rows = []
    for size in sorted(results["cortado"]):
        c = results["cortado"][size]
        row = [human(size), f"{c['algbw_gbps']:.3f}"]
        for p in peers:
            r = results[p].get(size)
            row.append(f"{r['algbw_gbps']:.3f}" if r else "-")
        for p in peers:
            r = results[p].get(size)
            row.append(f"{c['algbw_gbps'] / r['algbw_gbps']:.2f}" if r and r["algbw_gbps"] > 0 else "-")
        ok = c["ok"] and all(results[p].get(size, {}).get("ok", True) for p in peers)
        row.append("ok" if ok else "WRONG")
        rows.append(row)
    if args.markdown:
        print(f"{header}\n")
        print("| " + " | ".join(cols) + " |")
        print("|" + " --- |" * len(cols))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        print(f"# {header}")
        widths = [max(len(c), 10) for c in cols]
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        for r in rows:
            print("  ".join(v.rjust(w) for v, w in zip(r, widths)))
    return 0 if results["cortado"] else 1


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
