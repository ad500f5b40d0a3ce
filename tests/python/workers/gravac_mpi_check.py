"""GraVAC in the plan executor of Python workers started under mpirun
(`cortado launch --mpi`, one worker a machine: the executor has MPI's
collective groups, and the workers agree on every batch). Each worker submits an iteration's tensors
with random sleeps between them and then waits, so its thread and its
peers' find different parts of the iteration queued, and a worker drains
while a peer still submits: every batch must still be one whole iteration
on every worker (GraVAC refuses part of one).

Every gradient has at most n/4 non-zeros (multiples of 1/8), so GraVAC's
candidate (CF 4) and minimum (CF 2) keep all of it: each step sends the
candidate and its output is the plain sum over the workers, exactly.
"""

import json
import random
import time

import torch

import cortado.torch as ct

from common import FP16_PUSH_PULL, parse_args, plan_of, write_result

SIZES = [64, 128, 32]
STEPS = 8


def gradient(rank, t, step, n):
    g = torch.Generator().manual_seed(1000 * rank + 100 * t + step)
    out = torch.zeros(n)
    where = torch.randperm(n, generator=g)[: n // 8]
    out[where] = (torch.randint(1, 64, (n // 8,), generator=g).float() - 32) / 8
    return out


def main():
    args = parse_args()
    ct.init()
    from cortado import _C, _runtime
    ex = _C.Executor(_runtime.require("gravac_mpi_check"))
    assert ex.collectives, "the executor has no collective groups under mpirun"
    assert ex.topology["local_size"] == 1, ex.topology
    rank, world = ex.topology["rank"], ex.topology["size"]
    names = [f"gm.{t}" for t in range(len(SIZES))]
    # Compressed push/pull (common.py's steps) with top-k as the codec.
    option = {**FP16_PUSH_PULL, "codec": "topk:ratio=0.5"}
    for name, n in zip(names, SIZES):
        ex.declare(name, n)
    ex.set_plan(json.dumps(plan_of(names, option)))
    ex.enable_gravac(codec="topk", min_ratio=2.0, max_ratio=64.0, window=1000, epsilon=0.99,
                     alpha=1.0)
    rng = random.Random(7 + rank)
    wrong = []
    for step in range(STEPS):
        ins = [gradient(rank, t, step, n) for t, n in enumerate(SIZES)]
        outs = [torch.full((n,), -1.0) for n in SIZES]
        for t, (name, n) in enumerate(zip(names, SIZES)):
            time.sleep(rng.uniform(0, 0.05))
            ex.submit(name, n, ins[t].data_ptr(), outs[t].data_ptr(), False)
        ex.wait(timeout=120)
        for t, n in enumerate(SIZES):
            want = sum(gradient(r, t, step, n) for r in range(world))
            if not torch.equal(outs[t], want):
                wrong.append((step, t, (outs[t] - want).abs().max().item()))
    history = ex.gravac_history
    levels = [h["level"] for h in history]
    ratios = [h["ratio"] for h in history]
    ok = not wrong and len(history) == STEPS and set(levels) == {"candidate"}
    ct.shutdown()
    write_result(args.out, rank, ok=ok, wrong=wrong[:5], levels=levels, ratios=ratios)


if __name__ == "__main__":
    main()
