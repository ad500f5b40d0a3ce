#!/usr/bin/env python3
"""Where an iteration's time goes with dedicated servers, from a link timeline.

Reads a timeline that bench/link_timeline.py wrote (bench/multihost.sh
--timeline) of a job whose workers are on hosts 1..W and whose servers are
on hosts W+1..W+S alone (the `ps_ded` job): pushes are the workers'
out-links, answers the servers' out-links. An iteration starts when the
workers' mean out-link load rises past --busy and ends when it has stayed
under --idle for --gap seconds. For each it prints how long the pushes
ran, the fill (pushes started, no answer yet: a server answers a chunk only
after every worker pushed all of it), the drain (the last pushes are in,
answers still going), and the time to the next iteration's pushes.
Iterations whose pushes follow each other with no idle gap are read as one.

  timeline_phases.py TIMELINE.tsv --workers W --servers S
"""
import argparse
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--servers", type=int, required=True)
    ap.add_argument("--busy", type=float, default=0.3)
    ap.add_argument("--idle", type=float, default=0.05)
    ap.add_argument("--gap", type=float, default=0.03)
    a = ap.parse_args()
    try:
        with open(a.timeline) as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except OSError as e:
        sys.exit(f"timeline_phases: cannot read {a.timeline}: {e.strerror}")
    need = [f"h{i}_out" for i in range(1, a.workers + a.servers + 1)]
    if not rows or any(c not in rows[0] for c in ["t"] + need):
        sys.exit(f"timeline_phases: {a.timeline} has no columns t, h1_out ... "
                 f"h{a.workers + a.servers}_out (bench/link_timeline.py writes them)")
    t = [float(r["t"]) for r in rows]

    def mean(r, hosts):
        return sum(float(r[f"h{i}_out"]) for i in hosts) / len(hosts)

    push = [mean(r, range(1, a.workers + 1)) for r in rows]
    answer = [mean(r, range(a.workers + 1, a.workers + a.servers + 1)) for r in rows]
    n = len(rows)
    starts = []
    i = 0
    while i < n:
        if push[i] <= a.busy:
            i += 1
            continue
        s = i
        # The end: the first moment from which the pushes stay idle for `gap`.
        while i < n:
            j = i
            while j < n and push[j] < a.idle and t[j] - t[i] < a.gap:
                j += 1
            if j < n and push[j] < a.idle:  # idle all the way to the gap
                break
            if j >= n:
                break
            i = j + 1 if j > i else i + 1
        starts.append((s, max(s, i - 1)))
        while i < n and push[i] <= a.busy:
            i += 1
    print("| iteration | pushes (s) | fill (s) | drain (s) | push start to next (s) |")
    print("| --- | --- | --- | --- | --- |")
    for k, (s, e) in enumerate(starts):
        nxt = starts[k + 1][0] if k + 1 < len(starts) else n
        first = next((x for x in range(s, nxt) if answer[x] > a.busy), None)
        last = max((x for x in range(s, nxt) if answer[x] > a.busy), default=None)
        fill = f"{t[first] - t[s]:.3f}" if first is not None else "-"
        drain = f"{t[last] - t[e]:.3f}" if last is not None else "-"
        to_next = f"{t[nxt] - t[s]:.3f}" if nxt < n else "-"
        print(f"| {k} | {t[e] - t[s]:.3f} | {fill} | {drain} | {to_next} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
