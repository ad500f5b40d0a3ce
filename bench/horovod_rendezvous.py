#!/usr/bin/env python3
"""Horovod's Gloo rendezvous server, for Horovod workers started by hand on
emulated hosts (bench/train.sh), where horovodrun would reach the hosts over
ssh. It does what horovodrun --gloo does before it starts the workers: it
assigns ranks to the hosts' slots, serves the rendezvous over HTTP, and says
which HOROVOD_* settings each worker gets.

    horovod_rendezvous.py --hosts tb-h1:1,tb-h2:1 [--timeout 3600]

Prints, then flushes:
    port PORT
    RANK HOSTNAME HOROVOD_RANK=.. HOROVOD_SIZE=.. ... (one line per slot)
    ready
and serves until SIGTERM, SIGINT, or --timeout seconds. The workers also
need HOROVOD_GLOO_RENDEZVOUS_ADDR (this host's address), _PORT (PORT),
HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo and HOROVOD_GLOO_IFACE.
"""

import argparse
import signal
import sys
import threading

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer


def slot_settings(s):
    """The HOROVOD_* settings of one slot (horovodrun's), by name."""
    return {"HOROVOD_HOSTNAME": s.hostname, "HOROVOD_RANK": s.rank, "HOROVOD_SIZE": s.size,
            "HOROVOD_LOCAL_RANK": s.local_rank, "HOROVOD_LOCAL_SIZE": s.local_size,
            "HOROVOD_CROSS_RANK": s.cross_rank, "HOROVOD_CROSS_SIZE": s.cross_size}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", required=True, help="HOST:SLOTS,... as horovodrun -H takes it")
    p.add_argument("--timeout", type=float, default=3600, help="seconds to serve at most")
    args = p.parse_args()
    hosts = parse_hosts(args.hosts)
    slots = get_host_assignments(hosts, sum(h.slots for h in hosts))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(slots)
    lines = [f"port {port}"]
    for s in slots:
        env = slot_settings(s)
        lines.append(f"{s.rank} {s.hostname} " + " ".join(f"{k}={v}" for k, v in env.items()))
    lines.append("ready")
    print("\n".join(lines), flush=True)
    stop.wait(args.timeout)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
