"""One worker leaves out a gradient that the others push (a branch only it
takes): the others' push_pull must raise CortadoError quoting the
scheduler's stall report, which names the tensor and that worker. Each
records what it got; the skipping worker records that it skipped."""

import sys
import time

from common import parse_args, write_result


def main():
    args = parse_args()
    import torch
    import cortado.torch as ct
    ct.init()
    rank, world = ct.rank(), ct.size()
    skipper = 1
    start = time.monotonic()
    try:
        for step in range(3):
            ct.push_pull(torch.ones(100), name="encoder.weight")
            if rank == skipper and step == 1:
                write_result(args.out, rank, skipped=True, step=step)
                # Stays in the job (a worker that left would be reported
                # dead instead) until the others have failed.
                time.sleep(8)
                return 0
            ct.push_pull(torch.ones(50), name="head.weight")
        write_result(args.out, rank, raised=False)
        return 0
    except Exception as e:  # noqa: BLE001 (recorded and checked by the test)
        write_result(args.out, rank, raised=True, type=type(e).__name__, message=str(e),
                     seconds=time.monotonic() - start)
        return 3


if __name__ == "__main__":
    sys.exit(main())
