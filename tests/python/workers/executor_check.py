"""DistributedOptimizer(executor=True) on W workers against single-process
training (the reference of optimizer_check.py: the whole batch in one
process; the workers' averaged gradients are its gradient).

Covered: the executor's default plan (BytePS's push/pull, exact), a plan set
from Python (fp16 push/pull for every gradient: looser tolerance), and online
re-planning (CORTADO_PROFILE_WINDOW, given by the test): the workers profile
a window, every worker switches to the scheduler's plan at the same
iteration, and training still matches the reference. The optimizer hands
each gradient to the executor's thread (Executor.submit) and waits in step();
submit/wait are also checked on their own. Bad arguments are refused with
messages that say what to do.
"""

import json
import sys

import torch

import cortado
import cortado.torch as ct
from cortado import _C, _runtime
from common import FP16_PUSH_PULL, parse_args, plan_of, write_result
from optimizer_check import (STEPS, batches, make_model, max_diff, reference,
                             train_until_searched)

PER_WORKER = 8


def distributed(rank, world, prefix, set_to_none=False, **kwargs):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  name_prefix=prefix, executor=True, **kwargs)
    ct.broadcast_parameters(model.state_dict(), root_rank=0, prefix=f"{prefix}.init")
    loss_fn = torch.nn.CrossEntropyLoss()
    versions = [opt.executor.plan_version]
    for x, y in batches(world):
        opt.zero_grad(set_to_none=set_to_none)
        lo, hi = rank * PER_WORKER, (rank + 1) * PER_WORKER
        loss_fn(model(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
        versions.append(opt.executor.plan_version)
    return model, opt, versions


def raw_submit(rank, world):
    """Executor.submit/wait on their own: four tensors queued at once come
    back summed exactly (against a plain sum of what every rank gives); a
    tensor never declared fails at wait() naming it, the run queued after it
    is dropped (on every worker alike), and the executor goes on."""
    ex = _C.Executor(_runtime.require("executor_check"))
    sizes = [5, 1000, 70000, 3]
    for i, n in enumerate(sizes):
        ex.declare(f"raw.{i}", n)
    bufs = [torch.arange(n, dtype=torch.float32) * (rank + 1) + i for i, n in enumerate(sizes)]
    for i, b in enumerate(bufs):
        ex.submit(f"raw.{i}", b.numel(), b.data_ptr(), b.data_ptr(), False)
    ex.wait()
    assert ex.pending == 0, ex.pending
    ranks = sum(r + 1 for r in range(world))
    for i, (n, b) in enumerate(zip(sizes, bufs)):
        want = torch.arange(n, dtype=torch.float32) * ranks + i * world
        assert torch.equal(b, want), (i, (b - want).abs().max().item())
    # An error on the executor's thread reaches wait(); the next run queued
    # behind it is not run (its buffer keeps its values).
    keep = torch.full((5,), 7.0)
    ex.submit("raw.never_declared", 4, keep.data_ptr(), keep.data_ptr(), False)
    ex.submit("raw.0", 5, keep.data_ptr(), keep.data_ptr(), False)
    message = expect_error("an undeclared tensor on the executor's thread", "raw.never_declared",
                           ex.wait)
    assert torch.equal(keep, torch.full((5,), 7.0)), keep
    assert ex.pending == 0, ex.pending
    # Still usable: run() (synchronous) and submit() again.
    again = torch.ones(5)
    ex.run("raw.0", 5, again.data_ptr(), again.data_ptr(), False)
    ex.submit("raw.3", 3, bufs[3].data_ptr(), bufs[3].data_ptr(), True)
    ex.wait(timeout=60)
    assert torch.equal(again, torch.full((5,), float(world))), again
    return message


# The parameters of make_model(), in model order.
MODEL_PARAMS = [f"{layer}.{kind}" for layer in (0, 2, 5, 7) for kind in ("weight", "bias")]

# Lossy training, fused against one gradient at a time, each as far from the
# lossless reference after STEPS steps as its codec takes it. Fused may be no
# further than LOSSY_FACTOR times one-at-a-time's distance plus
# LOSSY_SLACK, and neither further than LOSSY_OF_MOVED of how far training
# moved the parameters. Measured (3 workers): top-k and DGC select over the
# whole group and end closer when fused (0.005-0.006 against 0.020-0.034);
# efsignsgd sends one scale per group, coarser across tensors of different
# magnitudes (0.077 fused against 0.034 alone, training moved 0.081).
LOSSY_FACTOR = 2.5
LOSSY_SLACK = 0.005
LOSSY_OF_MOVED = 1.2


def fused_against_unfused(rank, world, ref, fused_default, moved):
    """Fused groups (the default) against one gradient at a time
    (fusion_bytes=0) and smaller groups: lossless, the same parameters;
    compressed (fp16, efsignsgd, DGC, top-k), the same training within the
    bounds above."""
    out = {}
    alone, opt, _ = distributed(rank, world, "grad.alone", fusion_bytes=0)
    assert "groups" not in json.loads(opt.executor.plan_json), opt.executor.plan_json
    assert opt.executor.group_runs == 0
    out["fused_vs_alone"] = max_diff(fused_default, alone)
    assert out["fused_vs_alone"] <= 1e-5, out
    # Groups of about 2 KiB: the large linear layer alone, the others fused.
    small, opt, _ = distributed(rank, world, "grad.small", fusion_bytes=2048)
    groups = json.loads(opt.executor.plan_json)["groups"]
    assert len(groups) >= 2, groups
    assert opt.executor.group_runs == STEPS * len(groups), (opt.executor.group_runs, groups)
    # The gradients are views into one flat buffer in backward order: every
    # group runs in place.
    assert opt.executor.in_place_group_runs == opt.executor.group_runs, \
        (opt.executor.in_place_group_runs, opt.executor.group_runs)
    out["small_groups"] = max_diff(ref, small)
    assert out["small_groups"] <= 1e-5, out
    # zero_grad(set_to_none=True) drops the views; each gradient goes back
    # into its view when submitted, and the groups still run in place.
    dropped, opt, _ = distributed(rank, world, "grad.to_none", set_to_none=True)
    assert opt.executor.in_place_group_runs == opt.executor.group_runs == STEPS, \
        (opt.executor.in_place_group_runs, opt.executor.group_runs)
    out["set_to_none"] = max_diff(ref, dropped)
    assert out["set_to_none"] <= 1e-5, out
    for codec in ("fp16", "efsignsgd", "dgc:ratio=0.1", "topk:ratio=0.1"):
        fused, opt, _ = distributed(rank, world, f"grad.{codec}.fused", compression=codec,
                                    fusion_search=False)
        plan = json.loads(opt.executor.plan_json)
        name = codec.split(":")[0]
        assert plan["groups"] and all(o["codec"].split(":")[0] == name
                                      for o in plan["tensors"].values()), plan
        one, _, _ = distributed(rank, world, f"grad.{codec}.alone", compression=codec,
                                fusion_bytes=0, fusion_search=False)
        d_fused, d_one = max_diff(ref, fused), max_diff(ref, one)
        out[codec] = {"fused": d_fused, "alone": d_one}
        if codec == "fp16":
            assert d_fused <= 1e-3 and d_one <= 1e-3, out
        else:
            assert max(d_fused, d_one) <= LOSSY_OF_MOVED * moved, (out, moved)
            assert d_fused <= LOSSY_FACTOR * d_one + LOSSY_SLACK, out
    return out


def held_groups(rank, world):
    """A plan group's tensors submitted one at a time, with the executor's
    thread idle in between: it holds them back until the last one comes and
    runs the group once (on every worker alike); a group whose tensors do not
    all come runs them on their own at wait(). Exact sums either way."""
    import time
    ex = _C.Executor(_runtime.require("executor_check"))
    sizes = [7, 300, 2]
    names = [f"held.{i}" for i in range(len(sizes))]
    for n, k in zip(names, sizes):
        ex.declare(n, k)
    plan = plan_of(names + ["held.lone"], FP16_PUSH_PULL, version=0)
    plan["groups"] = [names]
    ex.declare("held.lone", 5)
    ex.set_plan(json.dumps(plan))
    ranks = sum(r + 1 for r in range(world))
    for round_, subset in ((0, names), (1, names[:2])):
        bufs = [torch.arange(k, dtype=torch.float32) * (rank + 1) + round_ for k in sizes]
        before = ex.group_runs
        for n, b in zip(names, bufs):
            if n not in subset:
                continue
            ex.submit(n, b.numel(), b.data_ptr(), b.data_ptr(), False)
            time.sleep(0.2)  # the thread is free: it takes each one as it comes
        ex.wait(timeout=60)
        assert ex.group_runs - before == (1 if subset == names else 0), (round_, ex.group_runs)
        for n, k, b in zip(names, sizes, bufs):
            if n in subset:
                want = torch.arange(k, dtype=torch.float32) * ranks + round_ * world
                assert torch.equal(b, want), (n, (b - want).abs().max().item())
    return ex.group_runs


def search(rank, world, devices=None):
    """MergeComp's search (fusion_search) from Python: the workers time real
    steps (rank 1 slower by 30 ms a step), agree on each candidate's time, and
    end with the same groups; their parameters stay identical throughout.
    With `devices` (codec_devices), one alternative per device, screened
    (searched 1: each one's every-gradient-on-its-own grouping timed, the
    faster searched on)."""
    settings = {"warmup": 1, "window": 2, "settle": 0, "step": 1}
    if devices:
        settings.update(codec_devices=devices, searched=1)
    model, opt, state, steps, plan, used = train_until_searched(
        rank, "grad.search", settings, 7 + rank, slow=0.03 if rank == 1 else 0.0)
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    # The plan in force is the kept alternative's: its codec on that device.
    if devices:
        assert used == [devices[state["alternative"]]], (used, state)
    return {"steps": steps, "cuts": state["cuts"], "timed": state["timed"],
            "alternative": state["alternative"], "devices": used,
            "groups": plan.get("groups", []), "summary": state["summary"], "checksum": checksum}


def with_env(settings, fn):
    """fn() with the environment variables `settings` set, then as before."""
    import os
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        return fn()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def expect_error(label, needle, fn):
    try:
        fn()
    except cortado.CortadoError as e:
        assert needle in str(e), f"{label}: {e}"
        return str(e)
    raise AssertionError(f"{label}: accepted")


def main():
    args = parse_args(lambda p: p.add_argument("--mode",
                                               choices=["plans", "online", "file", "shutdown",
                                                        "search", "search-devices"],
                                               required=True))
    torch.set_num_threads(1)
    ct.init()
    rank, world = ct.rank(), ct.size()
    if args.mode == "shutdown":
        # cortado.shutdown() with submitted runs still queued: the runs finish
        # first (every worker runs the same ones, so none waits on a peer
        # that dropped one), then the executor's thread ends before the
        # worker goes; nothing runs on a closed worker.
        ex = _C.Executor(_runtime.require("executor_check"))
        bufs = [torch.ones(1 << 20) for _ in range(12)]
        for i, b in enumerate(bufs):
            ex.declare(f"late.{i}", b.numel())
        for i, b in enumerate(bufs):
            ex.submit(f"late.{i}", b.numel(), b.data_ptr(), b.data_ptr(), False)
        queued = ex.pending
        ct.shutdown()
        assert ex.pending == 0, ex.pending
        ex.wait(timeout=30)
        done = [i for i, b in enumerate(bufs) if torch.equal(b, torch.full_like(b, float(world)))]
        assert len(done) == len(bufs), [b[0].item() for b in bufs]
        outcome = "every run finished"
        expect_error("submit after shutdown", "shut down",
                     lambda: ex.submit("late.0", 4, bufs[0].data_ptr(), bufs[0].data_ptr(), False))
        report = {"queued": queued, "done": len(done), "outcome": outcome}
        write_result(args.out, rank, ok=True, report=report)
        print(f"worker {rank}: {report}", flush=True)
        return 0
    if args.mode in ("search", "search-devices"):
        report = search(rank, world, ["gpu", "cpu"] if args.mode == "search-devices" else None)
        write_result(args.out, rank, ok=True, report=report)
        ct.shutdown()
        print(f"worker {rank}: {report}", flush=True)
        return 0
    ref = reference(world, 1)
    moved = max_diff(make_model(), ref)
    assert moved > 0.05, f"training barely moved the parameters ({moved})"
    report = {"moved": moved}
    if args.mode == "plans":
        got, opt, versions = distributed(rank, world, "grad.default")
        report["default"] = max_diff(ref, got)
        assert report["default"] <= 1e-5, report
        # The default plan is version 0 and stays (no re-planning in this job).
        assert versions == [0] * (STEPS + 1), versions
        plan = json.loads(opt.executor.plan_json)
        assert all(o.get("codec", "") == "" for o in plan["tensors"].values()), plan
        # Fused by default: the small model's 8 gradients are one group (in
        # backward order), run once per step.
        assert plan["groups"] == [[f"grad.default.{n}" for n in reversed(MODEL_PARAMS)]], plan
        assert opt.executor.group_runs == STEPS, opt.executor.group_runs
        assert opt.executor.in_place_group_runs == STEPS, opt.executor.in_place_group_runs
        assert not opt.executor.collectives  # not under mpirun
        report.update(fused_against_unfused(rank, world, ref, got, moved))
        # Every gradient through fp16 push/pull.
        plan = plan_of([n.replace("grad.default.", "grad.fp16.", 1) for n in plan["tensors"]],
                       FP16_PUSH_PULL)
        got, opt, _ = distributed(rank, world, "grad.fp16", plan=plan)
        used = json.loads(opt.executor.plan_json)
        assert all(o.get("codec") == "fp16" for o in used["tensors"].values()), used
        report["fp16"] = max_diff(ref, got)
        assert report["fp16"] <= 1e-3, report
        report["submit_error"] = raw_submit(rank, world)
        report["held_group_runs"] = held_groups(rank, world)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        report["errors"] = [
            expect_error("a plan with a compression", "leave compression none",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         compression="fp16", executor=True,
                                                         plan=plan)),
            expect_error("per-gradient compression with executor", "one compression",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         compression="auto", executor=True)),
            expect_error("fusion_bytes not a size", "fusion_bytes",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         name_prefix="grad.bad2", executor=True,
                                                         fusion_bytes="big")),
            expect_error("codec_devices without a codec", "needs compression naming a codec",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         name_prefix="grad.bad3", executor=True,
                                                         fusion_search={"codec_devices": ["gpu"]})),
            expect_error("codec_devices not a list of devices", "distinct values from ['gpu', 'cpu']",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         name_prefix="grad.bad4", executor=True,
                                                         compression="fp16",
                                                         fusion_search={"codec_devices": "gpu"})),
            expect_error("codec_devices twice the same", "got ['cpu', 'cpu']",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         name_prefix="grad.bad5", executor=True,
                                                         compression="fp16",
                                                         fusion_search={"codec_devices":
                                                                        ["cpu", "cpu"]})),
            expect_error("an unknown fusion_search setting", "fusion_search has no setting 'alternatives'",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         name_prefix="grad.bad6", executor=True,
                                                         compression="fp16",
                                                         fusion_search={"alternatives": []})),
            expect_error("plan without executor", "executor=True",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         plan={"tensors": {}})),
            # Without mpirun the executor has no collective groups.
            expect_error("a collective plan without mpirun", "cortado launch --mpi",
                         lambda: ct.DistributedOptimizer(
                             opt, model.named_parameters(), name_prefix="grad.flat",
                             executor=True,
                             plan=plan_of([f"grad.flat.{n}" for n in MODEL_PARAMS],
                                          {"scheme": "flat", "steps": [
                                              {"op": "allreduce", "scope": "flat",
                                               "compressed": False}]}))),
            # CUDA buffers need CORTADO_DEVICE=cuda under mpirun (and a GPU).
            expect_error("CPU parameters with CORTADO_DEVICE=cuda", "CUDA gradients",
                         lambda: with_env({"CORTADO_DEVICE": "cuda"},
                                          lambda: ct.DistributedOptimizer(
                                              opt, model.named_parameters(),
                                              name_prefix="grad.cuda", executor=True))),
            # CORTADO_DEVICE=cuda turns the executor on by default.
            expect_error("CPU parameters with CORTADO_DEVICE=cuda, executor by default",
                         "because CORTADO_DEVICE=cuda; pass executor=False",
                         lambda: with_env({"CORTADO_DEVICE": "cuda"},
                                          lambda: ct.DistributedOptimizer(
                                              opt, model.named_parameters(),
                                              name_prefix="grad.cuda2"))),
            expect_error("the CUDA device without mpirun", "mpirun",
                         lambda: with_env({"CORTADO_DEVICE": "cuda"},
                                          lambda: _C.Executor(_runtime.require("check")))),
            expect_error("a plan that is not one", "plan must be",
                         lambda: ct.DistributedOptimizer(opt, model.named_parameters(),
                                                         name_prefix="grad.bad", executor=True,
                                                         plan="no-such-file.json")),
        ]
    elif args.mode == "file":
        # `cortado launch --plan FILE` (CORTADO_PLAN): fp16 push/pull for
        # every gradient, without plan= here.
        got, opt, _ = distributed(rank, world, "grad.file")
        used = json.loads(opt.executor.plan_json)
        assert sorted(used["tensors"]) == sorted(f"grad.file.{n}" for n, _ in
                                                 make_model().named_parameters()), used
        assert all(o.get("codec") == "fp16" for o in used["tensors"].values()), used
        report["file"] = max_diff(ref, got)
        assert report["file"] <= 1e-3, report
    else:
        got, opt, versions = distributed(rank, world, "grad.online")
        report["online"] = max_diff(ref, got)
        report["versions"] = versions
        # One warm-up iteration, a window of 2, the verdict 1 iteration later:
        # a new plan (version 1), or the workers' plan kept when the new one
        # is not predicted faster (the re-planner's gain rule applies to the
        # first window too). Either way every worker takes it at the same
        # step (the test compares the workers' versions).
        assert versions[0] == 0 and versions == sorted(versions) and versions[-1] <= 1, versions
        switched = [i for i in range(1, len(versions)) if versions[i] != versions[i - 1]]
        report["switched_at"] = switched
        assert opt.executor.last_report, "no profiling window closed"
        # The re-planner's codec is fp16: lossy, within fp16's tolerance.
        assert report["online"] <= 1e-3, report
    write_result(args.out, rank, ok=True, report=report)
    ct.shutdown()
    print(f"worker {rank}: {report}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
