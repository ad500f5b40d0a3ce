#!/usr/bin/python3
"""Whether Cortado's small round trips slow a CPU-bound neighbour, and it them.

For each variant (a build and settings), a single-threaded Python loop counts
for --seconds while `cortado bench pushpull` (4 KiB, --layout workers x
servers) runs back to back beside it; the loop's count per second is set
against the loop alone, measured first and last. The variants run in turn,
--rounds times, so that the machine's load falls on each alike.

Usage: bench/latency_neighbour.py [--layout 4x2] [--transport zmq]
       [--seconds 8] [--rounds 2] [--iters 2000]
       --variant LABEL=BUILD_DIR[,VAR=VALUE...] ... [--markdown]

e.g. --variant before=/work/main/build --variant after=build
     --variant spin50=build,CORTADO_SHM_SPIN_US=50
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LOOP = ("import time\n"
        "end = time.time() + {s}\n"
        "n = 0\n"
        "while time.time() < end:\n"
        "    n += 1\n"
        "print(n / {s})\n")


def loop(seconds):
    """Starts the counting loop; returns its process."""
    return subprocess.Popen([sys.executable, "-c", LOOP.format(s=seconds)],
                            stdout=subprocess.PIPE, text=True)


def pushpull(build, env, w, s, transport, iters):
    cmd = [os.path.join(build, "launcher", "cortado"), "bench", "pushpull", "-w", str(w), "-s",
           str(s), "--transport", transport, "-b", "4K", "-e", "4K", "-n", str(iters), "--json"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=300)
    for line in p.stdout.splitlines():
        if line.strip().startswith("{"):
            r = json.loads(line)
            if not r.get("ok"):
                sys.exit(f"latency_neighbour: wrong sums from {' '.join(cmd)}")
            return r["seconds"] * 1e6
    sys.exit(f"latency_neighbour: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", default="4x2")
    ap.add_argument("--transport", default="zmq")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--variant", action="append", required=True,
                    help="LABEL=BUILD_DIR[,VAR=VALUE...]")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    try:
        w, s = (int(x) for x in args.layout.split("x"))
    except ValueError:
        sys.exit(f"latency_neighbour: bad layout '{args.layout}': expected WORKERSxSERVERS")
    variants = []
    for v in args.variant:
        label, _, rest = v.partition("=")
        build, *kvs = rest.split(",")
        if not label or not os.path.exists(os.path.join(build, "launcher", "cortado")):
            sys.exit(f"latency_neighbour: bad --variant '{v}': want LABEL=BUILD_DIR with "
                     "BUILD_DIR/launcher/cortado")
        env = dict(os.environ)
        for kv in kvs:
            k, eq, val = kv.partition("=")
            if not eq:
                sys.exit(f"latency_neighbour: bad setting '{kv}' in --variant: want VAR=VALUE")
            env[k] = val
        variants.append((label, build, env))

    alone = []
    results = {label: {"trips": [], "loop": []} for label, _, _ in variants}

    def measure_alone():
        p = loop(args.seconds)
        alone.append(float(p.communicate()[0]))

    measure_alone()
    for _ in range(args.rounds):
        for label, build, env in variants:
            p = loop(args.seconds)
            end = time.time() + args.seconds
            while time.time() < end and p.poll() is None:
                results[label]["trips"].append(
                    pushpull(build, env, w, s, args.transport, args.iters))
            results[label]["loop"].append(float(p.communicate()[0]))
    measure_alone()

    base = statistics.median(alone)
    if args.markdown:
        print(f"The loop alone: {', '.join(f'{a / 1e6:.1f}' for a in alone)} M loops/s "
              f"(first, last)\n")
        print("| variant | round trips, us (one per back-to-back run) | the loop, M loops/s "
              "(per round) | the loop against alone |")
        print("| --- | --- | --- | --- |")
    for label, r in results.items():
        trips = ", ".join(f"{t:.0f}" for t in r["trips"])
        loops = ", ".join(f"{x / 1e6:.1f}" for x in r["loop"])
        rel = statistics.median(r["loop"]) / base
        if args.markdown:
            print(f"| {label} | {trips} | {loops} | {rel:.2f} |")
        else:
            print(f"{label}: round trips {trips} us; loop {loops} M/s ({rel:.2f} of alone)")


if __name__ == "__main__":
    main()
