"""Compression.gravac through DistributedOptimizer on W workers whose
gradients differ (each trains on its own rows).

For each codec (topk, dgc, randomk) every worker trains a model with GraVAC
and, in the same process, replays the whole job: one reference model, W
cores (cortado._C.Gravac, one per simulated worker) fed each worker's
gradient, their sums added in Python and the job's agreed step times, and
the average of their decoded messages computed here. The distributed run
must take the reference's decision (level and ratio) at every step, end
with the reference's parameters, and its ratio sequence (written to the
result) must be every worker's. A pause that one worker marks
(exclude_pause) is left out of every worker's step time; one unmarked is
counted.
"""

import time

import torch

import cortado
import cortado.torch as ct
from common import parse_args, write_result
from gravac_common import batches, decompress_add, loss_of, make_model, prepare_cores

STEPS = 14
# Rank 1 alone marks a pause before step PAUSE (optimizer.exclude_pause) and
# sleeps; rank 0 sleeps before step UNMARKED without a mark. Every worker
# must leave the marked pause out (previous_seconds 0) and time the other.
PAUSE, UNMARKED, SLEEP = 5, 9, 0.3
SETTINGS = dict(min_ratio=4.0, max_ratio=400.0, window=3, epsilon=0.5, alpha=0.5)
# Random-k keeps about 1 / CF of the energy: it starts lower (the paper: 1.5x).
RANDOMK = dict(SETTINGS, min_ratio=1.5, epsilon=0.2)


def settings(codec):
    return RANDOMK if codec == "randomk" else SETTINGS


def distributed(rank, world, codec):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    compression = ct.Compression.gravac(codec=codec, **settings(codec))
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=compression, name_prefix=f"gravac-{codec}")
    for step, (x, y) in enumerate(batches(world, STEPS)):
        if step == PAUSE and rank == 1:
            opt.exclude_pause()
            time.sleep(SLEEP)
        if step == UNMARKED and rank == 0:
            time.sleep(SLEEP)
        opt.zero_grad()
        loss_of(model, x, y, rank).backward()
        opt.step()
    assert opt.compression_ratio_history == compression.ratio_history
    # A worker pushes at most its messages: each payload once (top-k and DGC
    # compact where smaller, through Zen past one chunk), never N of them.
    for h in opt.gravac_history:
        assert 0 < h["bytes"] <= h["message_bytes"], h
    return model, opt.gravac_history


def reference(world, codec, history):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    params = list(model.parameters())
    cores = [ct.Compression.gravac(codec=codec, **settings(codec)).make(world)
             for _ in range(world)]
    mismatches = []
    for step, (x, y) in enumerate(batches(world, STEPS)):
        sums = prepare_cores(model, params, cores, x, y, step)
        seconds = history[step]["previous_seconds"]
        decisions = [c.decide(*sums, seconds) for c in cores]
        if any(d["level"] != decisions[0]["level"] or d["ratio"] != decisions[0]["ratio"]
               for d in decisions):
            mismatches.append(f"step {step}: the simulated workers disagree: {decisions}")
        d = decisions[0]
        if (d["level"], d["ratio"]) != (history[step]["level"], history[step]["ratio"]):
            mismatches.append(f"step {step}: job sent {history[step]['level']} at "
                              f"{history[step]['ratio']}x, reference {d['level']} at "
                              f"{d['ratio']}x")
        for key, p in enumerate(params):
            avg = torch.zeros(p.numel(), dtype=torch.float32)
            for c in cores:
                decompress_add(c, key, avg, 1.0 / world)
            p.grad = avg.view_as(p).clone()
        opt.step()
    return model, mismatches


def main():
    args = parse_args()
    ct.init()
    rank, world = ct.rank(), ct.size()
    report, ok = {}, True
    for codec in ("topk", "dgc", "randomk"):
        model, history = distributed(rank, world, codec)
        ref, mismatches = reference(world, codec, history)
        diff = max((a - b).abs().max().item()
                   for a, b in zip(model.parameters(), ref.parameters()))
        ratios = [h["ratio"] for h in history]
        levels = sorted({h["level"] for h in history})
        paused = [i for i, h in enumerate(history) if h["paused"]]
        untimed = [i for i, h in enumerate(history) if h["previous_seconds"] == 0]
        # The step after the marked pause is not timed, the one after the
        # unmarked pause is, with rank 0's sleep in the workers' mean.
        timing = paused == [PAUSE] and untimed == [0, PAUSE] and \
            history[UNMARKED]["previous_seconds"] >= SLEEP / world
        good = not mismatches and diff < 1e-4 and len(set(ratios)) >= 2 and timing
        ok = ok and good
        report[codec] = {"ratios": ratios, "levels": levels, "max_param_diff": diff,
                         "mismatches": mismatches[:5],
                         "bytes": sum(h["bytes"] for h in history),
                         "paused": paused, "untimed": untimed,
                         "seconds": [h["previous_seconds"] for h in history]}
    # Refused where it cannot work.
    try:
        ct.push_pull(torch.ones(3), name="gravac.refused", compression=ct.Compression.gravac())
        refused = False
    except cortado.CortadoError as e:
        refused = "DistributedOptimizer" in str(e)
    ct.shutdown()
    write_result(args.out, rank, ok=ok and refused, refused=refused, report=report)


if __name__ == "__main__":
    main()
