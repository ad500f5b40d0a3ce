"""One worker is killed (SIGKILL) mid-run; the others, blocked in push_pull,
must raise CortadoError naming it. Each records when; the dying one records
when it died."""

import os
import signal
import sys
import time

import numpy as np

import cortado
from common import parse_args, write_result


def main():
    args = parse_args(lambda p: p.add_argument("--die-at", type=int, default=20))
    cortado.init()
    rank, world = cortado.rank(), cortado.size()
    victim = world - 1
    x = np.ones(10_000, np.float32)
    it = 0
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if rank == victim and it == args.die_at:
                write_result(args.out, rank, died=True, iteration=it)
                os.kill(os.getpid(), signal.SIGKILL)
            cortado.push_pull(x, name="step", average=False)
            it += 1
        write_result(args.out, rank, raised=False, iterations=it)
        return 0
    except cortado.CortadoError as e:
        write_result(args.out, rank, raised=True, code=getattr(e, "code", None), message=str(e),
                     iteration=it)
        return 3


if __name__ == "__main__":
    sys.exit(main())
