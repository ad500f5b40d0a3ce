"""A tiny Cortado PyTorch job: every worker allreduces (Sum) a tensor that
depends on its rank and compares the result with the plain sum of every
worker's tensor, computed locally. Used by the Slurm and torchrun tests
(tests/launchers); prints one line per worker, exits 1 on a wrong result.
ALLREDUCE_SUM_DIE_RANK=R makes rank R exit with 3 after joining the job."""
import os
import socket
import sys

import torch

import cortado.torch as cdt


def rank_input(k):
    # Integers in float64: the sum is exact in any order.
    return torch.arange(1000, dtype=torch.float64) * (k + 1) + k


cdt.init()
r, n, local = cdt.rank(), cdt.size(), cdt.local_rank()
if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
    # Started by torchrun: Cortado's rank and size are torch's.
    if (r, n) != (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])):
        print(f"rank {r} of {n}: torch's RANK={os.environ['RANK']} "
              f"WORLD_SIZE={os.environ['WORLD_SIZE']} differ", flush=True)
        sys.exit(1)
if os.environ.get("ALLREDUCE_SUM_DIE_RANK") == str(r):
    # The error path of the tests: this worker dies after joining the job.
    print(f"rank {r} of {n}: exiting with 3 as asked", flush=True)
    os._exit(3)
got = cdt.allreduce(rank_input(r), op=cdt.Sum, name="sum_check")
want = sum(rank_input(k) for k in range(n))
cdt.shutdown()
if not torch.equal(got, want):
    bad = int((got != want).sum())
    print(f"rank {r} of {n}: allreduce sum WRONG in {bad} of {want.numel()} elements", flush=True)
    sys.exit(1)
print(f"rank {r} of {n}: allreduce sum correct (host {socket.gethostname()}, "
      f"local rank {local})", flush=True)
