"""DistributedOptimizer on W workers against single-process training.

Each worker trains on its slice of every batch; each also trains a reference
model, in one process, on the whole (concatenated) batch. With equal slices
and a mean loss, the average of the workers' gradients is the whole batch's
gradient, so after N steps the parameters must match within float tolerance.
Covered: uncompressed SGD with momentum, backward_passes_per_step=2 (local
accumulation), fp16 compression (looser tolerance), and that the gradients'
push_pulls start during backward (the hooks), before step().
"""

import json
import sys
import time

import torch

import cortado.torch as ct
from common import image_batches, micro_rows, parse_args, whole_batch_rows, write_result

STEPS = 6
PER_WORKER = 8


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 3), torch.nn.ReLU(), torch.nn.Conv2d(6, 8, 3), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 10))


def batches(world):
    return image_batches(world, STEPS, PER_WORKER)


def reference(world, micro):
    """One process, the whole batch, `micro` accumulated micro-batches per step."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in batches(world):
        opt.zero_grad()
        # Worker r's micro-batch m is rows [r*P + m*P/micro, ...): the same
        # rows the distributed run uses, so the accumulation order matches.
        for m in range(micro):
            rows = whole_batch_rows(world, m, micro, PER_WORKER)
            (loss_fn(model(x[rows]), y[rows]) / micro).backward()
        opt.step()
    return model


def distributed(rank, world, micro, compression, prefix):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=compression, backward_passes_per_step=micro,
                                  name_prefix=prefix)
    assert isinstance(opt, torch.optim.SGD)
    ct.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"{prefix}.init")
    loss_fn = torch.nn.CrossEntropyLoss()
    n_params = len(list(model.parameters()))
    overlapped = 0
    for x, y in batches(world):
        opt.zero_grad()
        for m in range(micro):
            lo, hi = micro_rows(rank, m, micro, PER_WORKER)
            (loss_fn(model(x[lo:hi]), y[lo:hi]) / micro).backward()
        # The hooks started every gradient's push_pull during backward.
        overlapped += len(opt._handles) == n_params
        opt.step()
    assert overlapped == STEPS, f"hooks started the push_pulls in {overlapped}/{STEPS} steps"
    return model


def train_until_searched(rank, prefix, settings, seed, device=None, slow=0.0):
    """DistributedOptimizer(executor=True, compression="fp16") with MergeComp's
    search (fusion_search=settings), training make_model() on random
    batches until the search is done (300 steps at most; this worker sleeps
    `slow` seconds a step). Returns the model, the optimizer, the search's
    state, the steps taken, the plan in force and the devices its encodes
    and decodes name."""
    device = device or torch.device("cpu")
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  name_prefix=prefix, executor=True, compression="fp16",
                                  fusion_search=settings)
    ct.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"{prefix}.init")
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed)

    def step():
        opt.zero_grad()
        x = torch.randn(PER_WORKER, 1, 8, 8, generator=g).to(device)
        y = torch.randint(0, 10, (PER_WORKER,), generator=g).to(device)
        loss_fn(model(x), y).backward()
        if slow:
            time.sleep(slow)
        opt.step()

    steps = 0
    while steps < 300:
        state = opt.executor.fusion_search
        if state is not None and state["done"]:
            break
        step()
        steps += 1
    state = opt.executor.fusion_search
    assert state is not None and state["done"], (steps, state)
    # The kept grouping (and alternative) switches in at the next iteration
    # boundary where another candidate ran last: at most one step more.
    if not state["in_force"]:
        step()
        steps += 1
        state = opt.executor.fusion_search
    assert state["in_force"], (steps, state)
    plan = json.loads(opt.executor.plan_json)
    # The plan in force has the kept cuts' groups (those of two tensors or
    # more, FusionSearch::groupsOf) over the model's gradients.
    n = sum(1 for _ in model.parameters())
    bounds = [0] + sorted(state["cuts"]) + [n]
    sizes = sorted(b - a for a, b in zip(bounds, bounds[1:]) if b - a >= 2)
    assert sorted(len(g) for g in plan.get("groups", [])) == sizes, (state, plan.get("groups"))
    used = sorted({s["device"] for o in plan["tensors"].values() for s in o["steps"]
                   if s["op"] in ("encode", "decode")})
    return model, opt, state, steps, plan, used


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def main():
    args = parse_args()
    torch.set_num_threads(1)
    ct.init()
    rank, world = ct.rank(), ct.size()
    report = {}
    for label, micro, compression, tol in (("none", 1, "none", 1e-5),
                                           ("accumulate2", 2, "none", 1e-5),
                                           ("fp16", 1, ct.Compression.fp16, 1e-3)):
        ref = reference(world, micro)
        got = distributed(rank, world, micro, compression, f"grad.{label}")
        diff = max_diff(ref, got)
        moved = max_diff(make_model(), ref)
        report[label] = {"max_diff": diff, "moved": moved}
        assert moved > 0.05, f"{label}: training barely moved the parameters ({moved})"
        assert diff <= tol, f"{label}: parameters differ from single-process training by {diff}"
    write_result(args.out, rank, ok=True, report=report)
    ct.shutdown()
    print(f"worker {rank}: {report}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
