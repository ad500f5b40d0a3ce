"""cortado.torch: push_pull for every dtype, async handles, broadcast_parameters
and broadcast_optimizer_state, checked against sums computed with NumPy/torch."""

import sys
import time

import numpy as np
import torch

import cortado.torch as ct
from common import parse_args, write_result

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8]


def values(dtype, n, rank, salt):
    g = torch.Generator().manual_seed(1000003 * rank + 7919 * salt + n)
    lo, hi = (0, 40) if dtype == torch.uint8 else (-8, 9)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def expected_sum(dtype, n, world, salt):
    stack = torch.stack([values(dtype, n, r, salt) for r in range(world)])
    if dtype in (torch.float16, torch.bfloat16):
        return stack.float().sum(0).to(dtype)
    # NumPy wraps uint8/int8 the way the servers do.
    np_stack = stack.numpy()
    return torch.from_numpy(np_stack.sum(axis=0, dtype=np_stack.dtype))


def check_dtypes(rank, world):
    checked = 0
    for dtype in DTYPES:
        for n in (1, 33, 40_000):
            x = values(dtype, n, rank, 1)
            name = f"t.{str(dtype).split('.')[-1]}.{n}"
            got = ct.push_pull(x, average=False, name=name)
            assert got.dtype == dtype and got.shape == x.shape and got.data_ptr() != x.data_ptr()
            assert torch.equal(got, expected_sum(dtype, n, world, 1)), (dtype, n)
            assert torch.equal(x, values(dtype, n, rank, 1))  # input untouched
            y = x.clone()
            assert ct.push_pull_(y, average=False, name=name) is y
            assert torch.equal(y, expected_sum(dtype, n, world, 1))
            checked += 2
    # average=True (the default) on floats: the sum times 1/world.
    x = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    ref = torch.stack([torch.randn(1000, generator=torch.Generator().manual_seed(r))
                       for r in range(world)]).double().sum(0) / world
    assert torch.allclose(ct.push_pull(x, name="avg").double(), ref, rtol=1e-5, atol=1e-6)
    # Multi-dimensional and zero-dimensional tensors; fp16 compression.
    m = values(torch.float32, 24, rank, 2).view(2, 3, 4)
    got = ct.push_pull(m, average=False, name="shaped")
    assert got.shape == (2, 3, 4)
    assert torch.equal(got, expected_sum(torch.float32, 24, world, 2).view(2, 3, 4))
    got = ct.push_pull(m, average=False, name="shaped.fp16", compression=ct.Compression.fp16)
    assert got.dtype == torch.float32
    assert torch.equal(got, expected_sum(torch.float32, 24, world, 2).view(2, 3, 4))
    s = ct.push_pull(torch.tensor(float(rank)), average=False, name="scalar")
    assert s.shape == () and s.item() == world * (world - 1) / 2
    # A parameter that requires grad can be pushed (its data is read).
    p = torch.nn.Parameter(torch.ones(3))
    assert torch.equal(ct.push_pull(p, average=False, name="param"), torch.full((3,), world * 1.0))
    return checked + 5


def check_async(rank, world):
    tensors = [values(torch.float32, 5000 + t, rank, 30 + t) for t in range(10)]
    handles = [ct.push_pull_async(x, average=False, name=f"async.{t}", priority=-t)
               for t, x in enumerate(tensors)]
    deadline = time.monotonic() + 60
    while not all(ct.poll(h) for h in handles):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    for t, h in enumerate(handles):
        assert torch.equal(ct.synchronize(h), expected_sum(torch.float32, 5000 + t, world, 30 + t))
    inplace = [values(torch.int64, 100, rank, 50 + t) for t in range(4)]
    handles = [ct.push_pull_async_(x, average=False, name=f"async_.{t}") for t, x in
               enumerate(inplace)]
    for t, h in enumerate(handles):
        assert ct.synchronize(h) is inplace[t]
        assert torch.equal(inplace[t], expected_sum(torch.int64, 100, world, 50 + t))
    return 14


def assert_same_everywhere(t, name, world):
    """Every worker holds the same `t`: the sum over workers is world * t."""
    total = ct.push_pull(t, average=False, name=name)
    if t.is_floating_point():
        assert torch.allclose(total.double(), t.double() * world, rtol=1e-6, atol=0), name
    else:
        assert torch.equal(total, t * world), name


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))


def check_broadcast(rank, world):
    root = world - 1
    for dtype in DTYPES:
        x = values(dtype, 77, rank, 60)
        assert torch.equal(ct.broadcast(x, root, name=f"b.{dtype}"), values(dtype, 77, root, 60))
        assert torch.equal(x, values(dtype, 77, rank, 60))
    flags = torch.tensor([rank % 2 == 0, True, rank == root])
    ct.broadcast_(flags, root, name="b.bool")
    assert flags.tolist() == [root % 2 == 0, True, True]

    # broadcast_parameters: every worker ends with the root's model, buffers included.
    model = make_model(seed=rank)
    model(torch.randn(2, 1, 8, 8))  # moves BatchNorm's running statistics
    ct.broadcast_parameters(model.state_dict(), root_rank=root)
    for (name, mine), (_, theirs) in zip(model.state_dict().items(),
                                         make_model(seed=root).state_dict().items()):
        if "running" in name or "num_batches" in name:
            continue
        assert torch.equal(mine, theirs), name
    # Buffers agree across workers: their sum is world times this worker's.
    for name, t in model.state_dict().items():
        assert_same_everywhere(t, f"verify.{name}", world)
    # named_parameters() works too.
    model2 = make_model(seed=rank + 100)
    ct.broadcast_parameters(model2.named_parameters(), root_rank=0)
    for (_, p), (_, q) in zip(model2.named_parameters(),
                              make_model(seed=100).named_parameters()):
        assert torch.equal(p.detach(), q.detach())

    # broadcast_optimizer_state: the root has stepped (has state, another lr);
    # the others have not. Afterwards every worker holds the root's state.
    model3 = make_model(seed=7)
    opt = torch.optim.Adam(model3.parameters(), lr=0.01 if rank == root else 0.5,
                           betas=(0.8, 0.9) if rank == root else (0.9, 0.999))
    if rank == root:
        for _ in range(3):
            opt.zero_grad()
            model3(torch.randn(4, 1, 8, 8)).sum().backward()
            opt.step()
    before = [p.detach().clone() for p in model3.parameters()]
    ct.broadcast_optimizer_state(opt, root_rank=root)
    assert opt.param_groups[0]["lr"] == 0.01, opt.param_groups[0]["lr"]
    assert opt.param_groups[0]["betas"] == (0.8, 0.9), opt.param_groups[0]["betas"]
    for p, b in zip(model3.parameters(), before):
        assert torch.equal(p.detach(), b)  # the parameters were not touched
    for i, p in enumerate(model3.parameters()):
        state = opt.state[p]
        assert set(state) >= {"step", "exp_avg", "exp_avg_sq"}, state.keys()
        assert float(state["step"]) == 3.0, state["step"]
        for key in ("exp_avg", "exp_avg_sq"):
            assert_same_everywhere(state[key], f"verify.opt.{i}.{key}", world)
    return len(DTYPES) + 4


def main():
    args = parse_args()
    torch.set_num_threads(1)
    ct.init()
    rank, world = ct.rank(), ct.size()
    checked = check_dtypes(rank, world)
    checked += check_async(rank, world)
    checked += check_broadcast(rank, world)
    write_result(args.out, rank, ok=True, checked=checked)
    ct.shutdown()
    print(f"worker {rank}: {checked} checks passed", flush=True)


if __name__ == "__main__":
    sys.exit(main())
