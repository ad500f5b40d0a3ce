#!/usr/bin/env python3
"""Samples what limits a job on the emulated hosts (bench/multihost.sh).

Every --interval seconds, until SIGTERM or SIGINT, it reads:
  - the bytes each host sent and received over its link (the statistics of
    the bridge end of its veth: rx = what the host sent, tx = what it got);
  - /proc/stat: how busy the machine's CPUs were (all processes, also other
    users' builds);
  - /proc/stat's softirq time (where veth and tbf forwarding runs);
  - for every process inside the testbed's network namespaces, grouped by
    role (its command line): time on a CPU and time runnable but waiting for
    one (/proc/PID/task/*/schedstat); waiting time comparable to running time
    means the job is short of CPU.

On exit it prints one JSON object that summarizes the "active" intervals,
those in which some link carried at least --active-fraction of its rate
(the data phase, with its gaps, but not the start-up): the busiest link's
utilization (peak interval and mean over them), the bytes each link carried
in them (host I out, host I in, ...) and which link carried most, the machine's busy
and softirq cores, and the job's running and waiting cores (total and by
role), as means over those intervals.

  multihost_monitor.py --name NAME --hosts N --rate-bps BPS [--interval S]
"""
import argparse
import json
import os
import signal
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def read_int(path):
    with open(path) as f:
        return int(f.read())


def cpu_jiffies():
    """(busy, softirq, total) jiffies over all CPUs from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest times are already in user and nice
    return total - idle, fields[6], total


def netns_inodes(name, hosts):
    inodes = set()
    for i in range(1, hosts + 1):
        try:
            inodes.add(os.stat(f"/run/netns/{name}-h{i}").st_ino)
        except FileNotFoundError:
            pass
    return inodes


def role_of(pid):
    """'cortado server', 'cortado bench', 'cortado launch', 'orted', ... (servers
    get their settings on stdin, so the command line names the role)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [x.decode(errors="replace") for x in f.read().split(b"\0") if x]
    except OSError:
        return None
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name == "cortado" and len(argv) > 1:
        return f"cortado {argv[1]}"
    return name


def job_sched(inodes, roles):
    """{pid: (run_ns, wait_ns)} of every process in the testbed, summed over
    its threads (/proc/PID/task/*/schedstat: time on a CPU, and time runnable
    but waiting for one)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.stat(f"/proc/{d}/ns/net").st_ino not in inodes:
                continue
            run = wait = 0
            for tid in os.listdir(f"/proc/{d}/task"):
                with open(f"/proc/{d}/task/{tid}/schedstat") as f:
                    r, w, _ = f.read().split()
                run += int(r)
                wait += int(w)
        except (OSError, ValueError):
            continue
        pid = int(d)
        # Re-read each time: an agent ('ip netns exec', 'sh -c') execs the role.
        roles[pid] = role_of(pid) or roles.get(pid, "?")
        out[pid] = (run, wait)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--rate-bps", type=float, required=True)
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--active-fraction", type=float, default=0.05)
    a = ap.parse_args()

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    inodes = netns_inodes(a.name, a.hosts)
    stats = "/sys/class/net/{}v{}/statistics/{}"

    def links():
        v = []
        for i in range(1, a.hosts + 1):
            v.append(read_int(stats.format(a.name, i, "rx_bytes")))  # host i sent
            v.append(read_int(stats.format(a.name, i, "tx_bytes")))  # host i got
        return v

    roles = {}
    try:
        prev_l = links()
    except FileNotFoundError as e:
        print(f"multihost_monitor: no link of testbed '{a.name}' with {a.hosts} hosts ({e.filename}):"
              f" start the monitor after the testbed is up, with its --name and --hosts",
              file=sys.stderr)
        return 2
    prev_t, prev_c, prev_j = time.monotonic(), cpu_jiffies(), job_sched(inodes, roles)
    active = []
    moved = [0] * (2 * a.hosts)  # bytes per link direction in active intervals
    while not stop:
        time.sleep(a.interval)
        try:
            l = links()
        except FileNotFoundError:
            # The testbed was taken down before this monitor was stopped:
            # the samples so far are the run's.
            break
        t, c, j = time.monotonic(), cpu_jiffies(), job_sched(inodes, roles)
        dt = t - prev_t
        util = [(x - y) * 8 / dt / a.rate_bps for x, y in zip(l, prev_l)]
        ncpu = os.cpu_count()
        busy = (c[0] - prev_c[0]) / max(1, c[2] - prev_c[2]) * ncpu
        softirq = (c[1] - prev_c[1]) / max(1, c[2] - prev_c[2]) * ncpu
        by_role = {}
        for pid, (run, wait) in j.items():
            r0, w0 = prev_j.get(pid, (0, 0))
            k = roles[pid]
            old_run, old_wait = by_role.get(k, (0.0, 0.0))
            by_role[k] = (old_run + (run - r0) / 1e9 / dt, old_wait + (wait - w0) / 1e9 / dt)
        if max(util) >= a.active_fraction:
            active.append((max(util), busy, softirq, by_role))
            for k, (x, y) in enumerate(zip(l, prev_l)):
                moved[k] += x - y
        prev_t, prev_l, prev_c, prev_j = t, l, c, j

    n = len(active)
    if n == 0:
        print(json.dumps({"active_intervals": 0}))
        return 0
    busiest = max(range(len(moved)), key=lambda k: moved[k])
    run_by_role, wait_by_role = {}, {}
    for *_, r in active:
        for k, (run, wait) in r.items():
            run_by_role[k] = run_by_role.get(k, 0.0) + run / n
            wait_by_role[k] = wait_by_role.get(k, 0.0) + wait / n
    print(json.dumps({
        "active_intervals": n,
        "interval_s": a.interval,
        "link_util_peak": round(max(x[0] for x in active), 3),
        "link_util_mean": round(sum(x[0] for x in active) / n, 3),
        "busiest_link": "host {} {}".format(busiest // 2 + 1, "out" if busiest % 2 == 0 else "in"),
        "busiest_link_bytes": moved[busiest],
        "link_bytes": moved,
        "machine_busy_cores": round(sum(x[1] for x in active) / n, 2),
        "machine_softirq_cores": round(sum(x[2] for x in active) / n, 2),
        "job_cores": round(sum(run_by_role.values()), 2),
        "job_wait_cores": round(sum(wait_by_role.values()), 2),
        "job_cores_by_role": {k: round(v, 2) for k, v in sorted(run_by_role.items()) if v >= 0.005},
        "job_wait_cores_by_role": {k: round(v, 2) for k, v in sorted(wait_by_role.items()) if v >= 0.005},
        "cpus": os.cpu_count(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
