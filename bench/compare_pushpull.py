#!/usr/bin/python3
"""Runs `cortado bench pushpull` and its peers in the same run, on the same
machine, with the same sizes and process counts, and prints Cortado's
algorithm bandwidth as a ratio of each peer's:

  - OpenMPI MPI_Allreduce over shared memory (btl vader,self)
  - OpenMPI MPI_Allreduce over TCP (btl tcp,self)
  - torch.distributed all_reduce with Gloo

Cortado runs once per transport in --transports (zmq, ucx) and per
shared-memory setting in --shm (1: same-host workers and servers exchange the
bytes through /dev/shm and the transport carries descriptors; 0: the
transport carries every byte; both). With one Cortado variant the table has
its ratio against each peer; with several, the ratio ucx/zmq for each --shm
setting and each variant's ratio against the peers named in --against.

Usage: bench/compare_pushpull.py [-w 4] [-s 2] [--min-bytes 4096]
       [--max-bytes 268435456] [--transports zmq,ucx] [--shm 1|0|both]
       [--against gloo] [--markdown] [--plot FILE]

--plot FILE writes a PNG of every variant's and peer's algorithm bandwidth
against the size (matplotlib: Debian's python3-matplotlib).
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
    ap.add_argument("--transports", "--transport", default="zmq",
                    help="comma-separated Cortado transports to measure: zmq, ucx, auto, "
                         "ucx-direct (ucx with CORTADO_UCX_DIRECT=1, the default), "
                         "ucx-cm (ucx with CORTADO_UCX_DIRECT=0: connection-manager endpoints only)")
    ap.add_argument("--shm", choices=["1", "0", "both"], default="1",
                    help="CORTADO_SHM for the Cortado runs (default 1)")
    ap.add_argument("--against", default="gloo",
                    help="peers for the ratio columns when several Cortado variants run")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--plot", metavar="FILE", help="write a PNG of bandwidth against size (matplotlib)")
    args = ap.parse_args()
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (checked before the runs, not after them)
        except ImportError:
            print("compare_pushpull: --plot needs matplotlib: run scripts/install_deps.sh "
                  "(Debian's python3-matplotlib)", file=sys.stderr)
            return 2

    sizes = ["--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
             "--iters", str(args.iters)]
    cortado = os.path.join(args.build, "launcher", "cortado")
    results = {}
    variants = []
    for shm in (["1", "0"] if args.shm == "both" else [args.shm]):
        for transport in [t for t in args.transports.split(",") if t]:
            name = transport if shm == "1" else f"{transport} noshm"
            env = dict(os.environ, CORTADO_SHM=shm)
            flag = transport
            if transport == "ucx-direct":
                flag, env["CORTADO_UCX_DIRECT"] = "ucx", "1"
            elif transport == "ucx-cm":
                flag, env["CORTADO_UCX_DIRECT"] = "ucx", "0"
            results[name] = run(f"cortado {name}", [cortado, "bench", "pushpull", "-w", str(args.workers),
                                                    "-s", str(args.servers), "--transport", flag,
                                                    "--json"] + sizes, env=env)
            variants.append(name)
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
    variants = [v for v in variants if results.get(v)]
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    header = (f"{now}, {platform.node()}, {os.cpu_count()} cores, "
              f"{args.workers} workers / {args.servers} servers, cortado {', '.join(variants)}")
    # (column, numerator, denominator)
    ratios = []
    if len(variants) == 1:
        ratios = [(f"x {p}", variants[0], p) for p in peers]
    else:
        for suffix in ("", " noshm"):
            for u in ("ucx", "ucx-direct", "ucx-cm"):
                if f"zmq{suffix}" in variants and f"{u}{suffix}" in variants:
                    ratios.append((f"{u}/zmq{suffix}", f"{u}{suffix}", f"zmq{suffix}"))
        for p in [p for p in args.against.split(",") if p in peers]:
            ratios += [(f"{v} x {p}", v, p) for v in variants]
    cols = (["size"] + [f"{v} GB/s" for v in variants] + [f"{p} GB/s" for p in peers] +
            [r[0] for r in ratios] + ["ok"])
    sizes_seen = sorted(set().union(*[set(results[v]) for v in variants])) if variants else []
    rows = []
    for size in sizes_seen:
        row = [human(size)]
        for name in variants + peers:
            r = results[name].get(size)
            row.append(f"{r['algbw_gbps']:.3f}" if r else "-")
        for _, num, den in ratios:
            a, b = results[num].get(size), results[den].get(size)
            row.append(f"{a['algbw_gbps'] / b['algbw_gbps']:.2f}" if a and b and b["algbw_gbps"] > 0 else "-")
        ok = all(results[n].get(size, {}).get("ok", True) for n in variants + peers)
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
    if args.plot and variants:
        plot(args.plot, header, [(f"cortado {v}", results[v]) for v in variants] +
             [(PEER_NAMES[p], results[p]) for p in peers])
        print(f"# plot written to {args.plot}", file=sys.stderr)
    return 0 if variants else 1


PEER_NAMES = {"mpi_shm": "MPI_Allreduce, shared memory", "mpi_tcp": "MPI_Allreduce, TCP",
              "gloo": "Gloo allreduce"}


def plot(path, title, series):
    """Algorithm bandwidth against size, one line per variant or peer (log-log)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, rows in series:
        points = sorted((size, r["algbw_gbps"]) for size, r in rows.items() if r["algbw_gbps"] > 0)
        style = dict(linewidth=2.5, marker="o") if label.startswith("cortado") else dict(marker="s")
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tensor size (bytes)")
    ax.set_ylabel("algorithm bandwidth (GB/s)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
