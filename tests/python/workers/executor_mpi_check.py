"""The plan executor of Python workers started under mpirun (`cortado launch
--mpi`), with MPI's collective groups: every kind of option runs, exact
against a plain sum of what every worker gives.

The test starts 4 workers as 2 emulated machines of 2 (CORTADO_FAKE_HOST_SIZE=2).
Covered:
- the executor has collective groups and says where this worker is;
- a plan with a flat allreduce, a hierarchical allreduce, push/pull between
  the machines with reduce-scatter and allgather inside them, and fp16
  allgathers between the machines (encoded on either device), each
  tensor summed exactly over 5 rounds (values that fp16 holds exactly);
- the workers' threads find different parts of the submitted runs queued
  (each worker sleeps a different, random time between its submissions),
  and still run the same batches: the sums stay exact;
- a worker that submits a plan's fused groups at once and drains (wait())
  while the others still submit theirs: each group still runs whole, once a
  round on every worker (group_runs), and sums exactly; a group that no
  worker submits whole runs its tensors on their own once every worker waits;
- DistributedOptimizer(executor=True) with such a plan trains as one process
  does on the whole batch (optimizer_check's reference);
- tensors submitted in different orders on different workers fail with an
  error that names both, instead of summing one into the other;
- MergeComp's search with the codec on each device as an alternative
  ("gpu", "cpu"), screened: every worker keeps the same one and groups.

With --device cuda (and CORTADO_DEVICE=cuda for the job; a GPU machine) the
same runs on CUDA tensors: the executor's CUDA device, NCCL inside and
between the emulated machines, the CUDA codecs where the plan says gpu, and
DistributedOptimizer on a CUDA model; every worker uses GPU 0.
"""

import json
import random
import sys
import time

import torch

import cortado
import cortado.torch as ct
from common import parse_args, plan_of, write_result
from optimizer_check import batches, make_model, max_diff, reference, train_until_searched

PER_WORKER = 8

FLAT_ALLREDUCE = {"scheme": "flat", "steps": [
    {"op": "allreduce", "scope": "flat", "compressed": False}]}
HIER_ALLREDUCE = {"scheme": "hierarchical", "steps": [
    {"op": "reduce_scatter", "scope": "intra", "compressed": False},
    {"op": "allreduce", "scope": "inter", "compressed": False},
    {"op": "allgather", "scope": "intra", "compressed": False}]}
HIER_PUSH_PULL = {"scheme": "hierarchical", "steps": [
    {"op": "reduce_scatter", "scope": "intra", "compressed": False},
    {"op": "push", "scope": "inter", "compressed": False},
    {"op": "pull", "scope": "inter", "compressed": False},
    {"op": "allgather", "scope": "intra", "compressed": False}]}
FP16_ALLGATHER_GPU = {"scheme": "hierarchical", "codec": "fp16", "steps": [
    {"op": "reduce_scatter", "scope": "intra", "compressed": False},
    {"op": "encode", "device": "gpu"},
    {"op": "allgather", "scope": "inter", "compressed": True},
    {"op": "decode", "device": "gpu"},
    {"op": "allgather", "scope": "intra", "compressed": False}]}
FP16_REDUCE_CPU = {"scheme": "hierarchical", "codec": "fp16", "steps": [
    {"op": "reduce", "scope": "intra", "compressed": False},
    {"op": "encode", "device": "cpu"},
    {"op": "allgather", "scope": "inter", "compressed": True},
    {"op": "decode", "device": "cpu"},
    {"op": "broadcast", "scope": "intra", "compressed": False}]}
OPTIONS = {"flat": FLAT_ALLREDUCE, "hier": HIER_ALLREDUCE, "pushpull": HIER_PUSH_PULL,
           "fp16_gpu": FP16_ALLGATHER_GPU, "fp16_cpu": FP16_REDUCE_CPU}
SIZES = [3, 1000, 70001, 8, 4096]
MISMATCHED = ["order.a", "order.b"]
ROUNDS = 5


def values(rank, i, n, rnd):
    """Small integers, so that sums over 4 workers are exact in fp16 too."""
    return ((torch.arange(n, dtype=torch.float32) * (rank + 3) + i + rnd) % 16).float()


DEV = torch.device("cpu")


def raw_runs(rank, world):
    from cortado import _C, _runtime
    ex = _C.Executor(_runtime.require("executor_mpi_check"))
    assert ex.collectives, "the executor has no collective groups under mpirun"
    assert ex.device == ("cuda" if DEV.type == "cuda" else "host"), (ex.device, DEV)
    topo = ex.topology
    assert topo["size"] == world and topo["rank"] == rank, topo
    assert topo["machines"] == 2 and topo["local_size"] == 2, topo
    assert topo["machine"] == rank // 2 and topo["local_rank"] == rank % 2, topo
    names = []
    for i, n in enumerate(SIZES):
        for kind in OPTIONS:
            names.append((f"raw.{kind}.{i}", kind, i, n))
            ex.declare(f"raw.{kind}.{i}", n)
    tensors = {name: OPTIONS[kind] for name, kind, _, _ in names}
    for name in MISMATCHED:  # for mismatch()
        ex.declare(name, 1000)
        tensors[name] = FLAT_ALLREDUCE
    ex.set_plan(json.dumps({"format": "cortado-plan", "version": 1, "tensors": tensors}))
    rng = random.Random(1000 + rank)
    checked = 0
    for rnd in range(ROUNDS):
        bufs = {}
        for name, kind, i, n in names:
            bufs[name] = values(rank, i, n, rnd).to(DEV)
            ex.submit(name, n, bufs[name].data_ptr(), bufs[name].data_ptr(), False)
            time.sleep(rng.uniform(0, 0.004))  # other batches on every worker
        ex.wait(timeout=120)
        for name, kind, i, n in names:
            want = sum(values(r, i, n, rnd) for r in range(world))
            got = bufs[name].cpu()
            assert torch.equal(got, want), (name, rnd, (got - want).abs().max().item())
            checked += 1
    return ex, checked


DRAIN_SIZES = [5, 300, 4096, 17, 1000, 64]


def early_drain(ex, rank, world):
    """Two fused groups (a flat allreduce and push/pull between the machines)
    whose tensors worker 0 submits at once and then waits for, while the
    other workers sleep 20 ms before each submission: worker 0's drain must
    not cut the groups where the others' submissions stand (each would run
    tensor by tensor, every worker alike, slower), so each group runs whole
    once a round. Returns the group executions counted."""
    names = [f"drain.{i}" for i in range(len(DRAIN_SIZES))]
    plan = json.loads(ex.plan_json)
    for i, (name, n) in enumerate(zip(names, DRAIN_SIZES)):
        ex.declare(name, n)
        plan["tensors"][name] = FLAT_ALLREDUCE if i < 3 else HIER_PUSH_PULL
    plan["groups"] = [names[:3], names[3:]]
    plan["version"] += 1
    ex.set_plan(json.dumps(plan))
    before = ex.group_runs
    for rnd in range(ROUNDS):
        bufs = []
        for i, (name, n) in enumerate(zip(names, DRAIN_SIZES)):
            if rank != 0:
                time.sleep(0.02)
            bufs.append(values(rank, i, n, rnd).to(DEV))
            ex.submit(name, n, bufs[-1].data_ptr(), bufs[-1].data_ptr(), False)
        ex.wait(timeout=120)
        for i, n in enumerate(DRAIN_SIZES):
            want = sum(values(r, i, n, rnd) for r in range(world))
            assert torch.equal(bufs[i].cpu(), want), (names[i], rnd)
    runs = ex.group_runs - before
    assert runs == 2 * ROUNDS, f"{runs} group executions in {ROUNDS} rounds of 2 groups"
    # A group whose last tensor no worker submits: once every worker waits,
    # its other tensors run on their own (no wait for the missing one until
    # the deadline), the whole group beside it once.
    bufs = [values(rank, i, n, ROUNDS).to(DEV) for i, n in enumerate(DRAIN_SIZES[:-1])]
    for i, (name, n) in enumerate(zip(names[:-1], DRAIN_SIZES[:-1])):
        if rank != 0:
            time.sleep(0.02)
        ex.submit(name, n, bufs[i].data_ptr(), bufs[i].data_ptr(), False)
    ex.wait(timeout=120)
    for i, n in enumerate(DRAIN_SIZES[:-1]):
        want = sum(values(r, i, n, ROUNDS) for r in range(world))
        assert torch.equal(bufs[i].cpu(), want), (names[i], "incomplete group")
    assert ex.group_runs - before == runs + 1, (ex.group_runs - before, runs)
    return runs


def optimizer(rank, world):
    """executor=True with a plan of collectives and push/pull, against one
    process on the whole batch."""
    model = make_model().to(DEV)
    kinds = list(OPTIONS)
    names = [f"grad.mpi.{n}" for n, _ in model.named_parameters()]
    plan = plan_of(names, None)
    for j, name in enumerate(names):  # fp16 only where it is exact enough
        plan["tensors"][name] = OPTIONS[kinds[j % 3]]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  name_prefix="grad.mpi", executor=True, plan=plan)
    assert opt.executor.collectives
    ct.broadcast_parameters(model.state_dict(), root_rank=0, prefix="grad.mpi.init")
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in batches(world):
        opt.zero_grad()
        lo, hi = rank * PER_WORKER, (rank + 1) * PER_WORKER
        loss_fn(model(x[lo:hi].to(DEV)), y[lo:hi].to(DEV)).backward()
        opt.step()
    return max_diff(reference(world, 1), model.cpu())


def search_devices(rank, world):
    """MergeComp's search (fusion_search) with the codec on each device as
    an alternative: on CUDA gradients by default ("gpu": the CUDA codec,
    "cpu": the CPU codec on a host copy), on host memory as codec_devices
    asks. searched=1: each one's every-gradient-on-its-own grouping is timed
    and the faster searched on. Every worker ends on the same alternative
    and groups, the plan in force encodes on the kept device, and the
    parameters stay the same on every worker (checked by the test)."""
    settings = {"warmup": 1, "window": 2, "settle": 0, "step": 1, "searched": 1}
    if DEV.type == "cpu":
        settings["codec_devices"] = ["gpu", "cpu"]
    model, _, state, steps, plan, used = train_until_searched(
        rank, "grad.mpisearch", settings, 11 + rank, device=DEV)
    summary = state["summary"]
    assert summary.startswith("fusion search over 2 option sets") and \
        summary.count("left out, each tensor on its own") == 1, summary
    assert used == [["gpu", "cpu"][state["alternative"]]], (used, state)
    return {"alternative": state["alternative"], "cuts": state["cuts"],
            "groups": plan.get("groups", []), "steps": steps,
            "checksum": float(sum(p.double().sum() for p in model.cpu().parameters()))}


def mismatch(ex, rank):
    """Two tensors of one size and option submitted in different orders on
    the two machines: the first collective stops with an error naming both,
    before any data moves (their buffers keep their values)."""
    a, b = torch.ones(1000, device=DEV), torch.full((1000,), 2.0, device=DEV)
    first, second = (a, b) if rank < 2 else (b, a)
    names = MISMATCHED if rank < 2 else MISMATCHED[::-1]
    ex.submit(names[0], 1000, first.data_ptr(), first.data_ptr(), False)
    ex.submit(names[1], 1000, second.data_ptr(), second.data_ptr(), False)
    try:
        ex.wait(timeout=120)
    except cortado.CortadoError as e:
        message = str(e)
        assert all(n in message for n in MISMATCHED), message
        assert torch.equal(a.cpu(), torch.ones(1000)) and \
            torch.equal(b.cpu(), torch.full((1000,), 2.0))
        return message
    raise AssertionError("tensors submitted in different orders ran without an error")


def main():
    global DEV
    args = parse_args(lambda p: p.add_argument("--device", choices=["cpu", "cuda"],
                                               default="cpu"))
    DEV = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    ct.init()
    rank, world = ct.rank(), ct.size()
    out = {}
    try:
        ex, out["raw_checked"] = raw_runs(rank, world)
        out["early_drain_group_runs"] = early_drain(ex, rank, world)
        out["optimizer_max_diff"] = optimizer(rank, world)
        assert out["optimizer_max_diff"] <= 1e-5, out
        out["search"] = search_devices(rank, world)
        if DEV.type == "cpu":  # the MPI groups' call labels; NCCL's are not checked so
            out["mismatch"] = mismatch(ex, rank)
        ok = True
    except Exception as e:  # reported to the test with the rank
        import traceback
        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {e}"
        ok = False
    write_result(args.out, rank, ok=ok, report=out)
    ct.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
