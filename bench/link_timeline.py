#!/usr/bin/env python3
"""Writes every link's load over time on the emulated hosts (bench/multihost.sh --timeline).

Every --interval seconds, until SIGTERM or SIGINT, it reads the bytes each
host sent and received over its link (the bridge end of its veth, as
bench/multihost_monitor.py does) and appends one line to --out: the time in
seconds since the start, then for each host its link's utilization out
(what it sent) and in (what it got), as fractions of --rate-bps. Where the
monitor sums a run up, this shows the moments: the start and end of each
iteration, and which links are idle then.

  link_timeline.py --name NAME --hosts N --rate-bps BPS --out FILE [--interval S]
"""
import argparse
import signal
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--rate-bps", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=0.01)
    a = ap.parse_args()
    if not 0.001 <= a.interval <= 10:
        ap.error(f"--interval {a.interval} is out of range 0.001..10 seconds")

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    paths = []
    for i in range(1, a.hosts + 1):
        for stat in ("rx_bytes", "tx_bytes"):  # the bridge end: rx = host i sent
            paths.append(f"/sys/class/net/{a.name}v{i}/statistics/{stat}")

    def read():
        out = []
        for p in paths:
            with open(p) as f:
                out.append(int(f.read()))
        return out

    try:
        prev = read()
    except FileNotFoundError as e:
        print(f"link_timeline: no link of testbed '{a.name}' with {a.hosts} hosts ({e.filename}):"
              f" start it after the testbed is up, with its --name and --hosts", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        cols = [f"h{i}_{d}" for i in range(1, a.hosts + 1) for d in ("out", "in")]
        f.write("t\t" + "\t".join(cols) + "\n")
        t0 = prev_t = time.monotonic()
        while not stop:
            time.sleep(a.interval)
            try:
                cur = read()
            except FileNotFoundError:
                break  # the testbed went down first
            t = time.monotonic()
            util = [(x - y) * 8 / (t - prev_t) / a.rate_bps for x, y in zip(cur, prev)]
            f.write(f"{t - t0:.4f}\t" + "\t".join(f"{u:.3f}" for u in util) + "\n")
            prev, prev_t = cur, t
    return 0


if __name__ == "__main__":
    sys.exit(main())
