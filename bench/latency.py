#!/usr/bin/python3
"""Small-message latency of `cortado bench pushpull` against MPI_Allreduce
over shared memory, measured in the same run and repeated, with medians.

Each repetition runs, in turn, for every layout (workers x servers):
MPI_Allreduce over shared memory (OpenMPI, `btl vader,self`; as many ranks as
workers, but 2 for a single worker, so that there is a peer to reduce with),
then Cortado once per transport, and, with --baseline, the same again with
another build's `cortado` (before/after in one run). The table gives the
median time of one round trip (one push_pull on every worker, or one
MPI_Allreduce), min-max in brackets, and the median of each repetition's
ratio to MPI_Allreduce of the same repetition.

Usage: bench/latency.py [--layouts 1x1,4x2] [--transports zmq,ucx]
       [--bytes 4096] [--iters 2000] [--reps 5] [--baseline OTHER_BUILD]
       [--baseline-label before]
       [--env CORTADO_BUSY_POLL_US=50 ...] [--markdown] [--plot FILE]

--plot FILE writes a PNG of the median round trips, Cortado's and
MPI_Allreduce's, per layout (matplotlib: Debian's python3-matplotlib).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

import plot_figures  # bench/, this script's folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def seconds(cmd, env=None):
    """Runs one benchmark; returns the seconds per iteration of its one size."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=600)
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            if not r.get("ok", False):
                sys.exit(f"latency: wrong result from {' '.join(cmd)}")
            return r["seconds"]
    sys.exit(f"latency: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="1x1,4x2", help="workers x servers, comma-separated")
    ap.add_argument("--transports", default="zmq,ucx")
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--baseline", help="another build directory whose cortado runs beside")
    ap.add_argument("--baseline-label", default="before",
                    help="the baseline rows' label (e.g. 'defaults' when --baseline is this build "
                         "and --env changes a setting)")
    ap.add_argument("--env", action="append", default=[],
                    help="VAR=VALUE for this build's Cortado runs (not the baseline's)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--plot", metavar="FILE", help="write a PNG of the round trips (matplotlib)")
    args = ap.parse_args()
    if args.plot:
        plot_figures.require_matplotlib("latency")

    layouts = []
    for item in args.layouts.split(","):
        try:
            w, s = (int(x) for x in item.split("x"))
        except ValueError:
            sys.exit(f"latency: bad layout '{item}': expected WORKERSxSERVERS, e.g. 4x2")
        if w < 1 or s < 1:
            sys.exit(f"latency: bad layout '{item}': at least 1 worker and 1 server")
        layouts.append((w, s))
    extra = {}
    for kv in args.env:
        if "=" not in kv:
            sys.exit(f"latency: --env {kv}: expected VAR=VALUE")
        k, v = kv.split("=", 1)
        extra[k] = v
    mpirun = shutil.which("mpirun")
    mpi_bench = os.path.join(args.build, "bench", "mpi", "mpi_allreduce_bench")
    if not mpirun or not os.path.exists(mpi_bench):
        sys.exit("latency: needs mpirun and build/bench/mpi/mpi_allreduce_bench (OpenMPI; "
                 "scripts/install_deps.sh)")
    builds = [("", args.build, extra)]
    if args.baseline:
        builds.insert(0, (args.baseline_label + " ", args.baseline, {}))
    size = ["--min-bytes", str(args.bytes), "--max-bytes", str(args.bytes),
            "--iters", str(args.iters)]

    times = {}  # (layout, variant) -> [seconds per rep]
    for rep in range(args.reps):
        for w, s in layouts:
            ranks = max(w, 2)
            cmd = [mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
            cmd += ["--mca", "btl", "vader,self", mpi_bench] + size
            times.setdefault(((w, s), "mpi"), []).append(seconds(cmd))
            for label, build, env_extra in builds:
                for t in args.transports.split(","):
                    cortado = os.path.join(build, "launcher", "cortado")
                    env = dict(os.environ, **env_extra)
                    cmd = [cortado, "bench", "pushpull", "-w", str(w), "-s", str(s),
                           "--transport", t, "--json"] + size
                    times.setdefault(((w, s), label + t), []).append(seconds(cmd, env))
        print(f"# repetition {rep + 1} of {args.reps} done", file=sys.stderr, flush=True)

    rows = []
    for (layout, variant), ts in times.items():
        if variant == "mpi":
            continue
        peer = times[(layout, "mpi")]
        ratios = [t / p for t, p in zip(ts, peer)]
        rows.append([f"{layout[0]}x{layout[1]}", variant,
                     f"{statistics.median(ts) * 1e6:.0f} ({min(ts) * 1e6:.0f}-{max(ts) * 1e6:.0f})",
                     f"{statistics.median(peer) * 1e6:.1f} ({min(peer) * 1e6:.1f}-{max(peer) * 1e6:.1f})",
                     f"{statistics.median(ratios):.1f}"])
    cols = ["workers x servers", "cortado", "round trip us, median (min-max)",
            "MPI_Allreduce us (ranks: workers, at least 2)", "x MPI_Allreduce (median)"]
    settings = " ".join(args.env) or "defaults"
    print(f"# {args.bytes} bytes, {args.iters} iterations, {args.reps} repetitions, "
          f"cortado settings: {settings}")
    if args.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + " --- |" * len(cols))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [cols] + rows:
            print("  ".join(f"{v:>14}" for v in r))
    if args.plot:
        plot(args, layouts, times)
    return 0


def plot(args, layouts, times):
    """Grouped bars: per layout, the median round trip of MPI_Allreduce and of each Cortado variant."""
    import matplotlib
    matplotlib.use("Agg")
    variants = ["mpi"] + [v for (layout, v) in times if layout == layouts[0] and v != "mpi"]
    names = ["MPI_Allreduce" if v == "mpi" else f"cortado {v}" for v in variants]
    series = [[statistics.median(times[(layout, v)]) * 1e6 for layout in layouts] for v in variants]
    settings = " ".join(args.env) or "default settings"
    plot_figures.draw_table([f"{w} workers x {s} servers" for w, s in layouts], names, series,
                            f"{args.bytes}-byte round trip, us, median of {args.reps} ({settings})",
                            args.plot, log=True)
    print(f"# plot written to {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
