"""DistributedOptimizer(cross_barrier=model) against independent references.

Each worker trains on its slice of every batch and also trains, in one
process, a reference model on the whole batch with the plain optimizer (no
Cortado): with equal slices and a mean loss, the workers' average gradient is
the whole batch's, so after the steps the parameters must match within float
tolerance. The model is built to catch the cases a forward pre-hook can miss:
a module called twice, one weight tied into two modules, a parameter of the
root module itself, and a parameter held by a module that is never called
(the root reads it directly: no pre-hook reaches it, so step() must update
it). Covered: SGD with momentum (also in two param groups with their own
lr) and Adam (with a learning-rate scheduler
changing lr after every step, which the pending updates must not see), one
group, several groups and one gradient at a time, backward_passes_per_step=2,
zero_grad(set_to_none=True), gradient_predivide_factor; fp16 and DGC
(engine codec with error feedback) against the same compression on the
normal path; that the deferred path ran (updates pending after step(),
applied by the pre-hooks); the parameters read through model.state_dict()
without waiting; and the errors: a cross_barrier that is not a model, one
that holds none of the parameters, executor=True, GraVAC, and a backward
pass through a parameter whose update is still pending.
"""

import sys

import torch
import torch.nn.functional as F

import cortado.torch as ct
from common import image_batches, micro_rows, parse_args, whole_batch_rows, write_result

STEPS = 6
PER_WORKER = 8


class Holder(torch.nn.Module):
    """Holds the output layer's parameters; never called."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(10, 32) * 0.2)
        self.b = torch.nn.Parameter(torch.zeros(10))


class Tricky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4321)
        self.conv1 = torch.nn.Conv2d(1, 6, 3)
        self.conv2 = torch.nn.Conv2d(6, 8, 3)
        self.enc = torch.nn.Linear(8 * 4 * 4, 32)
        self.mid = torch.nn.Linear(32, 32)          # called twice
        self.proj = torch.nn.Linear(32, 32, bias=False)
        self.proj2 = torch.nn.Linear(32, 32, bias=False)
        self.proj2.weight = self.proj.weight        # tied: one parameter, two modules
        self.scale = torch.nn.Parameter(torch.ones(1))  # the root's own
        self.holder = Holder()

    def forward(self, x):
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h)).flatten(1)
        h = torch.tanh(self.enc(h))
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.proj(h))
        h = self.proj2(h) * self.scale
        return F.linear(h, self.holder.w, self.holder.b)


def batches(world):
    return image_batches(world, STEPS, PER_WORKER)


def make_optimizer(kind, model):
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if kind == "sgd2":
        # Two param groups with their own settings: the convolutions, the rest.
        convs = [p for n, p in model.named_parameters() if n.startswith("conv")]
        rest = [p for n, p in model.named_parameters() if not n.startswith("conv")]
        return torch.optim.SGD([{"params": convs, "lr": 0.3}, {"params": rest}], lr=0.1,
                               momentum=0.5)
    return torch.optim.Adam(model.parameters(), lr=0.01)


def scheduler(kind, opt):
    # Adam's runs change lr after every step: the pending updates must use
    # the lr their step() saw.
    return torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7) if kind == "adam" else None


def reference(world, kind, micro):
    """One process, the whole batch, `micro` accumulated micro-batches a step."""
    model = Tricky()
    opt = make_optimizer(kind, model)
    sched = scheduler(kind, opt)
    for x, y in batches(world):
        opt.zero_grad()
        for m in range(micro):
            rows = whole_batch_rows(world, m, micro, PER_WORKER)
            (F.cross_entropy(model(x[rows]), y[rows]) / micro).backward()
        opt.step()
        if sched:
            sched.step()
    return model


def distributed(rank, world, label, kind, micro=1, cross=True, set_to_none=False,
                read="wait", deferred=True, **kw):
    """Trains on this worker's slices; returns the parameters and what the
    cross-barrier did. `deferred`: whether the updates of conv1's group are
    left to the next forward pass (not when the holder, whose module never
    runs, shares their group: then the whole group is updated in step())."""
    model = Tricky()
    opt = ct.DistributedOptimizer(make_optimizer(kind, model),
                                  named_parameters=model.named_parameters(),
                                  name_prefix=f"grad.{label}", backward_passes_per_step=micro,
                                  cross_barrier=model if cross else None, **kw)
    sched = scheduler(kind, opt)
    ct.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"{label}.init")
    stats = {"pending_after_step": [], "holder_pending": 0, "stale_before_forward": 0}
    for step, (x, y) in enumerate(batches(world)):
        opt.zero_grad(set_to_none=set_to_none)
        if cross and deferred and step >= 2:
            # The last step's updates are still pending: the first layer's
            # weight moves only once the forward pass reaches it.
            before = model.conv1.weight.detach().clone()
            stats["stale_before_forward"] += int(model.conv1.weight in opt._cross.unit_of)
        for m in range(micro):
            lo, hi = micro_rows(rank, m, micro, PER_WORKER)
            (F.cross_entropy(model(x[lo:hi]), y[lo:hi]) / micro).backward()
        if cross and deferred and step >= 2:
            assert not torch.equal(before, model.conv1.weight.detach()), \
                f"{label}: step {step}: the forward pass did not update conv1.weight"
        opt.step()
        if sched:
            sched.step()
        if cross:
            stats["pending_after_step"].append(opt.pending_updates)
            stats["holder_pending"] += int(model.holder.w in opt._cross.unit_of)
    if cross:
        stats["deferred_steps"] = opt._cross.deferred_steps
        stats["applied_in_forward"] = opt._cross.applied_in_forward
        assert (opt.pending_updates > 0) == deferred, f"{label}: {opt.pending_updates} pending"
    if read == "wait":
        opt.wait_updates()
        params = [p.detach().clone() for p in model.parameters()]
    else:
        # Through the model's state dict, without waiting first: its hook
        # applies the pending updates.
        state = model.state_dict()
        params = [state[n].clone() for n, _ in model.named_parameters()]
    if cross:
        assert opt.pending_updates == 0, f"{label}: updates still pending after reading"
        # Step 1 is the normal one; every later one leaves the updates of
        # the groups that the pre-hooks reach to the next forward pass, and
        # the holder's (whose module never runs) is never left pending.
        want = STEPS - 1 if deferred else 0
        assert stats["deferred_steps"] == want, f"{label}: {stats}"
        assert (stats["applied_in_forward"] > 0) == deferred, f"{label}: {stats}"
        if deferred:
            assert stats["stale_before_forward"] == STEPS - 2, f"{label}: {stats}"
        assert stats["holder_pending"] == 0, f"{label}: the holder's update was deferred"
    return params, stats


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a, b))


def expect_error(what, fn, *words):
    try:
        fn()
    except Exception as e:  # CortadoError, or the same raised through autograd
        text = str(e)
        assert all(w in text for w in words), f"{what}: message {text!r} lacks {words}"
        return text
    raise AssertionError(f"{what}: no error")


def check_errors(rank, report):
    model = Tricky()
    other = Tricky()

    def wrap(**kw):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       name_prefix="grad.err", **kw)
    report["errors"] = [
        expect_error("cross_barrier=True", lambda: wrap(cross_barrier=True),
                     "cross_barrier must be the model", "cross_barrier=model"),
        expect_error("another model", lambda: wrap(cross_barrier=other),
                     "holds none of the optimizer's parameters"),
        expect_error("executor", lambda: wrap(cross_barrier=model, executor=True),
                     "cross_barrier", "executor=True"),
        expect_error("gravac", lambda: wrap(cross_barrier=model,
                                            compression=ct.Compression.gravac()),
                     "gravac", "cross_barrier"),
    ]
    # A backward pass through a parameter whose update is pending, outside
    # the model's forward (which would have applied it). A fresh model: the
    # refused optimizers above hooked the first one's gradients.
    model = Tricky()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  name_prefix="grad.pending", fusion_bytes=0,
                                  cross_barrier=model)
    x, y = next(batches(1))
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert model.enc.weight in opt._cross.unit_of
    report["errors"].append(expect_error(
        "backward while pending", lambda: (model.enc.weight * 2).sum().backward(),
        "enc.weight", "still pending", "wait_updates()"))
    opt.wait_updates()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    ct.init()
    rank, world = ct.rank(), ct.size()
    report = {}
    # label, optimizer, micro-batches, settings, tolerance against the reference
    # One group (the default size): the holder shares it, so it is updated
    # in step(); with groups of 2000 bytes, conv1's group is left pending.
    runs = [("sgd.one_group", "sgd", 1, {"deferred": False}, 1e-5),
            ("sgd.groups", "sgd", 1, {"fusion_bytes": 2000}, 1e-5),
            ("sgd.single", "sgd", 1, {"fusion_bytes": 0, "set_to_none": True}, 1e-5),
            ("sgd.accumulate2", "sgd", 2, {"fusion_bytes": 2000}, 1e-5),
            ("sgd.predivide", "sgd", 1, {"fusion_bytes": 2000, "gradient_predivide_factor": 2.0,
                                         "read": "state_dict"}, 1e-5),
            ("sgd2.groups", "sgd2", 1, {"fusion_bytes": 2000}, 1e-5),
            ("adam.groups", "adam", 1, {"fusion_bytes": 2000}, 1e-4),
            ("adam.single", "adam", 1, {"fusion_bytes": 0}, 1e-4)]
    refs = {}
    for label, kind, micro, kw, tol in runs:
        if (kind, micro) not in refs:
            refs[kind, micro] = [p.detach() for p in reference(world, kind, micro).parameters()]
        ref = refs[kind, micro]
        got, stats = distributed(rank, world, label, kind, micro, **kw)
        diff = max_diff(ref, got)
        moved = max_diff([p.detach() for p in Tricky().parameters()], ref)
        report[label] = {"max_diff": diff, "moved": moved, **stats}
        assert moved > 0.02, f"{label}: training barely moved the parameters ({moved})"
        assert diff <= tol, f"{label}: parameters differ from single-process training by {diff}"

    # Compression: cross-barrier against the normal path with the same codec.
    for label, compression, tol in (("fp16", ct.Compression.fp16, 1e-5),
                                    ("dgc", ct.Compression.dgc(0.25), 1e-3)):
        normal, _ = distributed(rank, world, f"{label}.normal", "sgd", cross=False,
                                compression=compression, fusion_bytes=2000)
        got, stats = distributed(rank, world, f"{label}.cross", "sgd",
                                 compression=compression, fusion_bytes=2000)
        diff = max_diff(normal, got)
        report[label] = {"max_diff_vs_normal": diff, **stats}
        assert diff <= tol, f"{label}: cross-barrier differs from the normal path by {diff}"

    check_errors(rank, report)
    write_result(args.out, rank, ok=True, report=report)
    ct.shutdown()
    print(f"worker {rank}: {report}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
