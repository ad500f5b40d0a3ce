"""Horovod's torch API on cortado.torch (`import cortado.torch as hvd`): every
call against a reference that each worker computes without Cortado (every
worker's input is a function of its rank, so each can build the others').

--part ops: the collectives, their async and in-place forms, autograd, and
the rank/build functions. --part errors: mismatched shapes, dtypes, ops and
roots between workers, unknown ops, Adasum; every worker records what it got.
--part train: DistributedOptimizer with Horovod's arguments and SyncBatchNorm,
against one-process computations on the global batch.
"""

import sys
import time
import warnings

import torch

import cortado.torch as hvd
from common import parse_args, write_result

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]


def values(dtype, shape, rank, salt, lo=-4, hi=5):
    g = torch.Generator().manual_seed(1000003 * rank + 7919 * salt + 17 * len(shape))
    if dtype == torch.uint8:
        lo, hi = 0, max(hi, 1)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def every(dtype, shape, world, salt, **kw):
    return [values(dtype, shape, r, salt, **kw) for r in range(world)]


def reference(op, xs):
    dtype = xs[0].dtype
    wide = torch.stack([x.double() if dtype != torch.bool else x.to(torch.uint8) for x in xs])
    if op is hvd.Sum:
        if dtype in (torch.uint8, torch.int8):  # the servers wrap as C++ does
            return torch.stack(xs).sum(0, dtype=torch.int64).to(dtype)
        out = wide.sum(0)
    elif op is hvd.Average:
        out = wide.sum(0) / len(xs)
        if not dtype.is_floating_point:  # integer averages truncate
            out = torch.trunc(out)
    elif op is hvd.Min:
        out = wide.amin(0)
    elif op is hvd.Max:
        out = wide.amax(0)
    else:
        out = wide.prod(0)
    return out.to(dtype)


def same(got, want, what, exact=True):
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (what, tuple(got.shape), tuple(want.shape))
    if exact or not want.dtype.is_floating_point:
        assert torch.equal(got, want), (what, got, want)
    else:
        tol = 1e-2 if want.dtype in (torch.float16, torch.bfloat16) else 1e-5
        assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol), (what, got, want)


def check_basics(rank, world):
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (rank, world)
    assert hvd.local_rank() == rank and hvd.local_size() == world
    assert hvd.cross_rank() == 0 and hvd.cross_size() == 1 and hvd.is_homogeneous()
    for f in (hvd.nccl_built, hvd.mpi_built, hvd.gloo_built, hvd.cuda_built, hvd.rocm_built,
              hvd.mpi_enabled, hvd.gloo_enabled, hvd.mpi_threads_supported):
        assert isinstance(f(), bool), f
    assert hvd.gloo_built() is False and hvd.mpi_threads_supported() is False
    assert int(hvd.Average) != int(hvd.Sum) and repr(hvd.Max) == "cortado.torch.Max"
    hvd.barrier()
    hvd.barrier(30)
    hvd.barrier(timeout=30)
    return 4


def check_allreduce(rank, world):
    n = 0
    cases = [(op, dtype) for op in (hvd.Sum, hvd.Average) for dtype in FLOATS + INTS] + \
            [(op, dtype) for op in (hvd.Min, hvd.Max, hvd.Product)
             for dtype in FLOATS + INTS + [torch.bool]]
    for op, dtype in cases:
        if op is hvd.Product and dtype in (torch.uint8, torch.int8):
            continue  # overflow differs by accumulator; Horovod's too
        if dtype == torch.bool and op is hvd.Product:
            continue
        for shape in ((3, 4), (), (1000,)):
            salt = 10 + n
            kw = {"lo": -2, "hi": 3} if op is hvd.Product else {}
            x = values(dtype, shape, rank, salt, **kw)
            want = reference(op, every(dtype, shape, world, salt, **kw))
            exact = op not in (hvd.Average,) or not dtype.is_floating_point
            what = f"{op} {dtype} {shape}"
            got = hvd.allreduce(x, op=op, name=f"ar.{n}")
            same(got, want, what, exact)
            assert torch.equal(x, values(dtype, shape, rank, salt, **kw)), what  # untouched
            got = hvd.allreduce(x, op=op)  # unnamed
            same(got, want, what + " unnamed", exact)
            y = x.clone()
            assert hvd.allreduce_(y, op=op, name=f"ar.{n}") is y
            same(y, want, what + " in place", exact)
            h = hvd.allreduce_async(x, op=op, name=f"ar.{n}")
            same(hvd.synchronize(h), want, what + " async", exact)
            y = x.clone()
            h = hvd.allreduce_async_(y, op=op)
            while not hvd.poll(h):
                time.sleep(0.001)
            assert hvd.synchronize(h) is y
            same(y, want, what + " async in place", exact)
            n += 1
    # Ops given as Horovod's plain ints work too.
    x = values(torch.int64, (5,), rank, 2)
    same(hvd.allreduce(x, op=int(hvd.Max), name="int.op"),
         reference(hvd.Max, every(torch.int64, (5,), world, 2)), "op as int")
    # The default op is Average; Horovod's deprecated average= still works.
    x = values(torch.float32, (10,), rank, 1)
    mean = reference(hvd.Average, every(torch.float32, (10,), world, 1))
    same(hvd.allreduce(x, name="default"), mean, "default op", exact=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        same(hvd.allreduce(x, average=False, name="deprecated"),
             reference(hvd.Sum, every(torch.float32, (10,), world, 1)), "average=False")
    # Scale factors and fp16 compression.
    total = reference(hvd.Sum, every(torch.float32, (10,), world, 1))
    same(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled"),
         total * 1.5, "scale factors", exact=False)
    same(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16, name="fp16"), total,
         "fp16 compression", exact=False)
    return n + 4


def check_grouped(rank, world):
    shapes = [((2, 3), torch.float32), ((5,), torch.float64), ((4,), torch.int32),
              ((), torch.float32), ((7, 2), torch.int64)]
    checked = 0
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        xs = [values(d, s, rank, 200 + i) for i, (s, d) in enumerate(shapes)]
        wants = [reference(op, every(d, s, world, 200 + i)) for i, (s, d) in enumerate(shapes)]
        exact = op is not hvd.Average
        for name in (f"g.{op}", None):
            got = hvd.grouped_allreduce(xs, op=op, name=name)
            for g, w, i in zip(got, wants, range(len(shapes))):
                same(g, w, f"grouped {op} {i}", exact or not w.dtype.is_floating_point)
            ys = [x.clone() for x in xs]
            out = hvd.synchronize(hvd.grouped_allreduce_async_(ys, op=op, name=name))
            assert all(a is b for a, b in zip(out, ys))
            for g, w, i in zip(ys, wants, range(len(shapes))):
                same(g, w, f"grouped in place {op} {i}", exact or not w.dtype.is_floating_point)
            got = hvd.synchronize(hvd.grouped_allreduce_async(xs, op=op, name=name))
            for g, w in zip(got, wants):
                same(g, w, f"grouped async {op}", exact or not w.dtype.is_floating_point)
            ys = [x.clone() for x in xs]
            hvd.grouped_allreduce_(ys, op=op, name=name)
            for g, w in zip(ys, wants):
                same(g, w, f"grouped_ {op}", exact or not w.dtype.is_floating_point)
            checked += 4
    return checked


def check_allgather(rank, world):
    checked = 0
    for dtype in FLOATS + INTS + [torch.bool]:
        # First dimensions differ by rank (rank 0 has none at all).
        shape = lambda r: (r, 3)  # noqa: E731
        x = values(dtype, shape(rank), rank, 300)
        want = torch.cat([values(dtype, shape(r), r, 300) for r in range(world)])
        for name in (f"ag.{dtype}", f"ag.{dtype}", None):
            same(hvd.allgather(x, name=name), want, f"allgather {dtype}")
            same(hvd.synchronize(hvd.allgather_async(x, name=name)), want,
                 f"allgather_async {dtype}")
            checked += 2
    # A scalar gathers into one element per worker.
    same(hvd.allgather(torch.tensor(float(rank))), torch.arange(world, dtype=torch.float32),
         "allgather scalar")
    return checked + 1


def check_broadcast(rank, world):
    root = world - 1
    checked = 0
    for dtype in FLOATS + INTS + [torch.bool]:
        x = values(dtype, (6, 2), rank, 400)
        want = values(dtype, (6, 2), root, 400)
        same(hvd.broadcast(x, root, name=f"bc.{dtype}"), want, f"broadcast {dtype}")
        assert torch.equal(x, values(dtype, (6, 2), rank, 400))
        same(hvd.synchronize(hvd.broadcast_async(x, root)), want, f"broadcast_async {dtype}")
        y = x.clone()
        assert hvd.broadcast_(y, root, name=f"bc.{dtype}") is y
        same(y, want, f"broadcast_ {dtype}")
        y = x.clone()
        assert hvd.synchronize(hvd.broadcast_async_(y, 0)) is y
        same(y, values(dtype, (6, 2), 0, 400), f"broadcast_async_ {dtype}")
        checked += 4
    return checked


def check_alltoall(rank, world):
    checked = 0
    # Worker r sends (r + d) % 3 rows to worker d; row k of that block holds
    # 100 * r + 10 * d + k.
    def block(src, dst):
        rows = (src + dst) % 3
        return torch.stack([torch.full((2,), 100 * src + 10 * dst + k) for k in range(rows)]) \
            if rows else torch.zeros(0, 2)

    for dtype in (torch.float32, torch.int64, torch.float16):
        x = torch.cat([block(rank, d) for d in range(world)]).to(dtype)
        splits = [(rank + d) % 3 for d in range(world)]
        want = torch.cat([block(s, rank) for s in range(world)]).to(dtype)
        out, received = hvd.alltoall(x, splits=splits, name=f"a2a.{dtype}")
        same(out, want, f"alltoall {dtype}")
        assert received.dtype == torch.int32
        assert received.tolist() == [(s + rank) % 3 for s in range(world)], received
        out, received = hvd.synchronize(hvd.alltoall_async(x, torch.tensor(splits)))
        same(out, want, f"alltoall_async {dtype}")
        checked += 2
    # Without splits: equal parts, and only the tensor comes back.
    x = torch.arange(2 * world * 3).view(2 * world, 3) + 1000 * rank
    want = torch.cat([(torch.arange(2 * world * 3).view(2 * world, 3) + 1000 * s)
                      [2 * rank:2 * rank + 2] for s in range(world)])
    same(hvd.alltoall(x), want, "alltoall equal parts")
    return checked + 1


def check_reducescatter(rank, world):
    checked = 0
    for op in (hvd.Sum, hvd.Average):
        for rows in (2 * world, 2 * world + 1, 1):
            x = values(torch.float32, (rows, 3), rank, 500 + rows)
            full = reference(op, every(torch.float32, (rows, 3), world, 500 + rows))
            base, extra = divmod(rows, world)
            start = rank * base + min(rank, extra)
            want = full[start:start + base + (1 if rank < extra else 0)]
            same(hvd.reducescatter(x, op=op, name=f"rs.{op}.{rows}"), want,
                 f"reducescatter {op} {rows}", exact=op is hvd.Sum)
            same(hvd.synchronize(hvd.reducescatter_async(x, op=op)), want,
                 f"reducescatter_async {op} {rows}", exact=op is hvd.Sum)
            checked += 2
    return checked


def check_objects(rank, world):
    root = world - 1
    obj = {"rank": rank, "data": list(range(rank * 10)), "text": "x" * rank}
    got = hvd.broadcast_object(obj, root_rank=root)
    assert got == {"rank": root, "data": list(range(root * 10)), "text": "x" * root}, got
    assert hvd.broadcast_object(obj, name="named")["rank"] == 0
    everyone = hvd.allgather_object(obj)
    assert everyone == [{"rank": r, "data": list(range(r * 10)), "text": "x" * r}
                        for r in range(world)], everyone
    assert hvd.allgather_object(("t", rank), name="pairs") == [("t", r) for r in range(world)]
    return 4


def check_autograd(rank, world):
    # allreduce(Sum): d/dx of sum(allreduce(x)) over all workers' losses is
    # the allreduce of the ones each worker's loss gives: world.
    x = torch.ones(4, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum, name="grad.ar").sum().backward()
    assert torch.equal(x.grad, torch.full((4,), float(world))), x.grad
    # allgather: the average over workers of the gathered gradient, this
    # worker's rows; every worker weighs row i by i.
    x = torch.ones(rank + 1, 2, requires_grad=True)
    g = hvd.allgather(x, name="grad.ag")
    (g * torch.arange(g.shape[0]).view(-1, 1)).sum().backward()
    offset = sum(r + 1 for r in range(rank))
    want = torch.arange(offset, offset + rank + 1, dtype=torch.float32).view(-1, 1).expand(-1, 2)
    assert torch.equal(x.grad, want), (x.grad, want)
    # broadcast: the root gets the averaged gradient, the others zero.
    x = torch.ones(3, requires_grad=True)
    (hvd.broadcast(x, 0, name="grad.bc") * (rank + 1)).sum().backward()
    mean = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(x.grad, torch.full((3,), mean if rank == 0 else 0.0)), x.grad
    return 3


def check_join(rank, world):
    time.sleep(0.05 * rank)
    last = hvd.join()
    assert 0 <= last < world
    # Every worker learns the same answer.
    assert hvd.allgather_object(last) == [last] * world
    return 1


def part_ops(args, rank, world):
    checked = check_basics(rank, world)
    for f in (check_allreduce, check_grouped, check_allgather, check_broadcast, check_alltoall,
              check_reducescatter, check_objects, check_autograd, check_join):
        checked += f(rank, world)
    return {"checked": checked}


# -- errors -----------------------------------------------------------------------

def part_errors(args, rank, world):
    odd = rank == world - 1
    messages = {}

    def expect(label, call, *needles, code=None):
        start = time.monotonic()
        try:
            call()
        except hvd.CortadoError as e:
            text = str(e)
            for needle in needles:
                assert needle in text, (label, needle, text)
            if code:
                assert getattr(e, "code", None) == code, (label, e.code, text)
            messages[label] = text
            assert time.monotonic() - start < 30, (label, time.monotonic() - start)
            return
        raise AssertionError(f"{label}: no CortadoError")

    x = torch.ones(2, 3)
    # Local refusals: nothing is sent.
    expect("unknown op (int)", lambda: hvd.allreduce(x, op=42), "unknown reduction op 42",
           "Average", code="invalid_argument")
    expect("unknown op (str)", lambda: hvd.allreduce(x, op="max"), "unknown reduction op 'max'",
           code="invalid_argument")
    expect("Adasum", lambda: hvd.allreduce(x, op=hvd.Adasum), "Adasum", "op=Average",
           code="invalid_argument")
    expect("Adasum optimizer", lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), op=hvd.Adasum), "Adasum")
    expect("Max optimizer", lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), op=hvd.Max),
        "op=Max is not supported")
    expect("op and average", lambda: hvd.allreduce(x, average=True, op=hvd.Sum), "not both")
    expect("alltoall splits", lambda: hvd.alltoall(torch.ones(3, 2), splits=[1] * (world + 1)),
           "splits")
    expect("alltoall indivisible", lambda: hvd.alltoall(torch.ones(world + 1, 2)), "divide")
    expect("process set", lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0])),
           "global_process_set")
    expect("int scale", lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32),
                                              prescale_factor=0.5), "floating-point")
    # Disagreements between workers: every worker raises, naming both sides.
    expect("shape", lambda: hvd.allreduce(torch.ones((3, 2) if odd else (2, 3)), name="m.shape"),
           "m.shape", "(2, 3)", "(3, 2)", f"rank {world - 1}", code="mismatch")
    expect("dtype", lambda: hvd.allreduce(torch.ones(4, dtype=torch.float64 if odd else
                                                     torch.float32), name="m.dtype"),
           "m.dtype", "float64", "float32", code="mismatch")
    expect("count", lambda: hvd.allreduce(torch.ones(5 if odd else 4), name="m.count"),
           "m.count", "(5,)", "(4,)", code="mismatch")
    expect("op", lambda: hvd.allreduce(torch.ones(4), op=hvd.Max if odd else hvd.Sum,
                                       name="m.op"), "op Max", "op Sum", code="mismatch")
    expect("unnamed dtype", lambda: hvd.allreduce(torch.ones(4, dtype=torch.int32 if odd else
                                                             torch.int64)),
           "int32", "int64", code="mismatch")
    expect("allgather trailing dims", lambda: hvd.allgather(torch.ones(1, 4 if odd else 3),
                                                            name="m.ag"),
           "(1, 4)", "(1, 3)", code="mismatch")
    expect("allgather dtype", lambda: hvd.allgather(torch.ones(2, dtype=torch.int8 if odd else
                                                               torch.uint8)),
           "int8", "uint8", code="mismatch")
    expect("broadcast root", lambda: hvd.broadcast(torch.ones(3), 0 if odd else 1 % world,
                                                   name="m.root"),
           "root rank", code="mismatch")
    expect("broadcast shape", lambda: hvd.broadcast(torch.ones(3 if odd else 2), 0,
                                                    name="m.bshape"), code="mismatch")
    expect("alltoall dtype", lambda: hvd.alltoall(torch.ones(world, dtype=torch.float64 if odd
                                                             else torch.float32)),
           "float64", code="mismatch")
    expect("different calls", lambda: (hvd.allgather(torch.ones(2)) if odd
                                       else hvd.allreduce(torch.ones(2))),
           "allgather", "allreduce", code="mismatch")
    expect("grouped shapes", lambda: hvd.grouped_allreduce(
        [torch.ones(2), torch.ones(3 if odd else 2)], name="m.group"), code="mismatch")
    # A name keeps its shape (a later call that changes it is refused here).
    hvd.allreduce(torch.ones(2, 3), name="m.kept")
    expect("kept shape", lambda: hvd.allreduce(torch.ones(3, 2), name="m.kept"),
           "differs", code="invalid_argument")
    # The job still works.
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after")
    assert torch.equal(got, torch.full((3,), float(world))), got
    return {"messages": messages}


# -- training ---------------------------------------------------------------------

def model_fn(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batch(rank, step):
    g = torch.Generator().manual_seed(50 + 1000 * step + rank)
    return torch.randn(4 + rank, 6, generator=g), torch.randn(4 + rank, 3, generator=g)


def reference_grads(world, step, params, scale):
    """Each worker's gradient computed here in turn, combined: the sum (scale
    1) or the mean (scale 1/world)."""
    model = model_fn(0)
    with torch.no_grad():
        for p, q in zip(model.parameters(), params):
            p.copy_(q)
    total = [torch.zeros_like(p) for p in model.parameters()]
    for r in range(world):
        model.zero_grad()
        x, y = batch(r, step)
        ((model(x) - y) ** 2).sum().backward()
        for t, p in zip(total, model.parameters()):
            t += p.grad
    return [t * scale for t in total]


def run_optimizer(rank, world, label, steps=3, op=hvd.Average, passes=1, groups_of=None, **kw):
    model = model_fn(rank)  # differing initial weights: the broadcast fixes them
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ref = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if groups_of is not None:
        kw["groups"] = groups_of(model)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=op,
                                   name_prefix=f"grad.{label}", backward_passes_per_step=passes,
                                   **kw)
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):  # gradients accumulate over the passes
            x, y = batch(rank, passes * step + k)
            ((model(x) - y) ** 2).sum().backward()
        opt.step()
        grads = [0] * len(ref)
        for k in range(passes):
            part = reference_grads(world, passes * step + k, ref,
                                   1.0 if op is hvd.Sum else 1.0 / world)
            grads = [g + q for g, q in zip(grads, part)]
        ref = [p - 0.05 * g for p, g in zip(ref, grads)]
        for p, q in zip(model.parameters(), ref):
            assert torch.allclose(p.detach(), q, rtol=1e-4, atol=1e-5), (label, step, p, q)
    return 1


def check_sync_batch_norm(rank, world):
    # Workers have different batch sizes; the reference normalizes the global
    # batch with torch's BatchNorm in one process.
    def data(r):
        g = torch.Generator().manual_seed(900 + r)
        return torch.randn(r + 2, 3, 4, 4, generator=g) * (r + 1) + r, \
            torch.randn(r + 2, 3, 4, 4, generator=g)

    torch.manual_seed(5)
    sync = hvd.SyncBatchNorm(3, momentum=0.2)
    with torch.no_grad():
        sync.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        sync.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    plain = torch.nn.BatchNorm2d(3, momentum=0.2)
    plain.load_state_dict(sync.state_dict())
    xs, ws = zip(*[data(r) for r in range(world)])
    x = xs[rank].clone().requires_grad_(True)
    y = sync(x)
    (y * ws[rank]).sum().backward()
    xall = torch.cat(xs).requires_grad_(True)
    yall = plain(xall)
    (yall * torch.cat(ws)).sum().backward()
    start = sum(r + 2 for r in range(rank))
    part = slice(start, start + rank + 2)
    assert torch.allclose(y, yall[part], rtol=1e-4, atol=1e-5), "SyncBatchNorm forward"
    assert torch.allclose(x.grad, xall.grad[part], rtol=1e-4, atol=1e-4), "SyncBatchNorm dx"
    assert torch.allclose(sync.running_mean, plain.running_mean, atol=1e-5)
    assert torch.allclose(sync.running_var, plain.running_var, atol=1e-4)
    # The weight and bias gradients are this worker's part: summed, the global ones.
    dw = hvd.allreduce(sync.weight.grad, op=hvd.Sum, name="bn.dw")
    db = hvd.allreduce(sync.bias.grad, op=hvd.Sum, name="bn.db")
    assert torch.allclose(dw, plain.weight.grad, rtol=1e-4, atol=1e-4), (dw, plain.weight.grad)
    assert torch.allclose(db, plain.bias.grad, rtol=1e-4, atol=1e-4)
    # Eval mode uses the running statistics, as BatchNorm does.
    sync.eval()
    plain.eval()
    assert torch.allclose(sync(xs[0]), plain(xs[0]), atol=1e-5)
    # convert_sync_batchnorm keeps the parameters and statistics.
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3))
    model[1].running_mean.fill_(0.5)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], hvd.SyncBatchNorm)
    assert converted[1].weight is model[1].weight
    assert torch.equal(converted[1].running_mean, torch.full((3,), 0.5))
    converted.train()
    converted(xs[rank]).sum().backward()  # runs synchronized, every worker alike
    return 6


def check_optimizer_controls(rank, world):
    # synchronize() then skip_synchronize(): clipping between them, as in
    # Horovod's examples.
    model = model_fn(1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   name_prefix="grad.clip")
    x, y = batch(rank, 0)
    ((model(x) - y) ** 2).sum().backward()
    opt.synchronize()
    grads = reference_grads(world, 0, [p.detach() for p in model.parameters()], 1.0 / world)
    for p, g in zip(model.parameters(), grads):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-5)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()
    # Horovod's positional order: op is the fifth argument.
    m2 = model_fn(2)
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                    m2.named_parameters(), hvd.Compression.none, 1, hvd.Sum)
    assert opt2._average is False
    # Sparse gradients (an embedding; workers look up different rows, rank r
    # r + 1 rows): as dense tensors, or gathered as indices and values.
    for dense in (True, False):
        emb = torch.nn.Embedding(10, 4, sparse=True)
        torch.manual_seed(3)
        with torch.no_grad():
            emb.weight.copy_(torch.randn(10, 4))
        opt3 = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                        named_parameters=emb.named_parameters(),
                                        name_prefix=f"grad.sparse.{dense}",
                                        sparse_as_dense=dense)
        for step in range(2):
            before = emb.weight.detach().clone()
            opt3.zero_grad()
            emb(torch.arange(rank, 2 * rank + 1) + step).sum().backward()
            opt3.step()
            want = torch.zeros(10, 4)
            for r in range(world):
                want[torch.arange(r, 2 * r + 1) + step] += 1.0 / world
            assert torch.allclose(before - emb.weight.detach(), want, atol=1e-6), (dense, step)
            assert emb.weight.grad.is_sparse != dense, emb.weight.grad.layout
    return 4


def part_train(args, rank, world):
    checked = 0
    checked += run_optimizer(rank, world, "avg")
    checked += run_optimizer(rank, world, "sum", op=hvd.Sum)
    checked += run_optimizer(rank, world, "predivide", gradient_predivide_factor=2.0)
    checked += run_optimizer(rank, world, "groups2", groups=2)
    checked += run_optimizer(rank, world, "numgroups", num_groups=1)
    checked += run_optimizer(rank, world, "groupslist", groups_of=lambda m: [
        [m[0].weight, m[2].weight], [m[0].bias, m[2].bias]])
    checked += run_optimizer(rank, world, "bpps", passes=2)
    checked += run_optimizer(rank, world, "executor.groups", executor=True, groups=2)
    checked += check_optimizer_controls(rank, world)
    checked += check_sync_batch_norm(rank, world)
    return {"checked": checked}


def main():
    args = parse_args(lambda p: p.add_argument("--part", choices=["ops", "errors", "train"],
                                               required=True))
    torch.set_num_threads(1)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    part = {"ops": part_ops, "errors": part_errors, "train": part_train}[args.part]
    result = part(args, rank, world)
    write_result(args.out, rank, ok=True, **result)
    hvd.shutdown()
    print(f"worker {rank}: {args.part} passed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
