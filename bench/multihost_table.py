#!/usr/bin/env python3
"""Prints bench/multihost.sh's markdown table from its results file.

Each line of the file: JOB BYTES ALGBW_GBPS TBF_OVERLIMITS,TBF_DROPS MONITOR_JSON, with
JOB one of mpi, ps, ps_sonly, ps_ded (see bench/multihost.sh).

  multihost_table.py RESULTS --rate 1gbit --hosts 4 --server-only-hosts 2 \\
      [--dedicated-hosts D] [--transport zmq] [--iters 5] [--warmup 1] [--reps 3] [--load '...']
"""
import argparse
import json
import re
import statistics
import sys

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("results")
ap.add_argument("--rate", required=True)
ap.add_argument("--hosts", type=int, required=True)
ap.add_argument("--server-only-hosts", type=int, required=True)
ap.add_argument("--dedicated-hosts", type=int, default=0)
ap.add_argument("--transport", default="zmq")
ap.add_argument("--iters", type=int, default=5)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--reps", type=int, default=1)
ap.add_argument("--load", default="?")
a = ap.parse_args()
m = re.fullmatch(r"(\d+)(kbit|mbit|gbit)", a.rate.lower())
if not m:
    sys.exit(f"multihost_table.py: rate '{a.rate}' is not of the form <number>{{kbit,mbit,gbit}}")
rate_bps = int(m.group(1)) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
rate, H, K, D = a.rate, a.hosts, a.server_only_hosts, a.dedicated_hosts
transport, iters, warmup, reps, load = a.transport, a.iters, a.warmup, a.reps, a.load
path = a.results
link = rate_bps / 8 / 1e9  # GB/s
runs = {}
for line in open(path):
    job, size, algbw, ol, mon = line.split(" ", 4)
    o, _, d = ol.partition(",")  # overlimits,drops (older files: overlimits only)
    runs.setdefault((int(size), job), []).append(
        (float(algbw), (int(o), int(d) if d else float("nan")), json.loads(mon)))
# Link-limited bounds (fraction of the link rate), bytes split evenly over servers.
ring = H / (2 * (H - 1))  # ring allreduce: 2(H-1)/H of the data over each link
T = H + K  # servers, one per host
worker_host = (1 - 1 / T) + (H - 1) / T  # its worker's pushes out + its server's pull answers
sonly_host = H / T
bound = {"mpi": ring, "horovod": ring, "ps": ring, "ps_sonly": 1 / max(worker_host, sonly_host),
         # dedicated: each worker's link carries the tensor once each way,
         # each server host's link H/D of it.
         "ps_ded": 1 / max(1, H / D) if D else 0}
names = {
    "mpi": f"MPI_Allreduce (OpenMPI, TCP), {H} hosts x 1 rank, `launch --mpi-only`",
    "horovod": f"Horovod's allreduce (Gloo), {H} hosts x 1 rank",
    "ps": f"`cortado bench pushpull`, {H} hosts x (1 worker + 1 server)",
    "ps_sonly": f"`cortado bench pushpull`, {H} hosts x (1 worker + 1 server) + {K} server-only hosts",
    "ps_ded": f"`cortado bench pushpull`, {H} hosts x 1 worker, servers only on {D} other hosts (`--dedicated-servers`)",
}
print(f"{H} worker hosts + {max(K, D)} server-only hosts at {rate} (link {link:.4f} GB/s), {transport}, float32, "
      f"{iters} timed iterations after {warmup} warm-up, median of {reps} (min-max); load average at the end {load}")
print()
print("| job | size | algbw (GB/s) | vs MPI_Allreduce | vs link | link bound: model / measured traffic | link load: busiest link / most loaded link at each moment (peak) | machine cores busy (softirq) | job cores running / waiting |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for size in sorted({s for s, _ in runs}):
    mpi = statistics.median(r[0] for r in runs.get((size, "mpi"), [(float("nan"),)]))
    for job in ("mpi", "horovod", "ps", "ps_sonly", "ps_ded"):
        if (size, job) not in runs:
            continue
        rs = runs[(size, job)]
        v = [r[0] for r in rs]
        med = statistics.median(v)
        mons = [r[2] for r in rs if r[2].get("active_intervals")]
        def mean(k):
            return statistics.mean(m[k] for m in mons) if mons else float("nan")
        spread = f" ({min(v):.4f}-{max(v):.4f})" if len(v) > 1 else ""
        # What the busiest link carried per iteration (warm-up and timed), in
        # units of the tensor: the link-limited bound is the link rate / that.
        per_iter = statistics.mean(m["busiest_link_bytes"] / ((int(iters) + int(warmup)) * size)
                                   for m in mons) if mons else float("nan")
        # The busiest link's mean load over the data phase.
        busiest_load = statistics.mean(m["busiest_link_bytes"] * 8 / (m["active_intervals"] * m["interval_s"]) / rate_bps
                                       for m in mons) if mons else float("nan")
        vs_mpi = f"{med / mpi:.2f}" if mpi == mpi else "-"  # no MPI job run: NaN
        print(f"| {names[job]} | {size >> 20} MiB | {med:.4f}{spread} | {vs_mpi} | "
              f"{med / link:.0%} | {bound[job]:.0%} / {1 / per_iter:.0%} | "
              f"{busiest_load:.0%} / {mean('link_util_mean'):.0%} ({mean('link_util_peak'):.0%}) | "
              f"{mean('machine_busy_cores'):.2f} ({mean('machine_softirq_cores'):.2f}) | "
              f"{mean('job_cores'):.2f} / {mean('job_wait_cores'):.2f} |")
print()
print("Job cores by role while data moved, running / waiting for a CPU (mean over runs):")
for (size, job), rs in sorted(runs.items()):
    mons = [r[2] for r in rs if r[2].get("active_intervals")]
    run, wait = {}, {}
    for m in mons:
        for k, x in m["job_cores_by_role"].items():
            run[k] = run.get(k, 0.0) + x / len(mons)
        for k, x in m["job_wait_cores_by_role"].items():
            wait[k] = wait.get(k, 0.0) + x / len(mons)
    ol = statistics.mean(r[1][0] for r in rs)
    drops = statistics.mean(r[1][1] for r in rs)
    busiest = sorted({m["busiest_link"] for m in mons})
    print(f"- {job} {size >> 20} MiB (busiest link: {', '.join(busiest)}): " + ", ".join(
        f"{k} {x:.2f} / {wait.get(k, 0.0):.2f}" for k, x in sorted(run.items(), key=lambda kv: -kv[1]) if x >= 0.01)
        + f"; tbf per run: {ol:.0f} overlimits, {drops:.0f} drops")
