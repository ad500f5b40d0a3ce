"""cortado.torch with CUDA tensors: push_pull (new, in place, async), fp16
compression, broadcast and broadcast_parameters of a CUDA model, and
DistributedOptimizer on a CUDA model, each checked against sums computed on
the CPU. Run on a machine with a GPU (tests/python/test_bindings.py skips it
elsewhere); every worker uses GPU 0 (the tensors only stage through it)."""

import torch

import cortado
import cortado.torch as ct
from common import parse_args, write_result

from torch_ops import DTYPES, expected_sum, values  # the CPU test's inputs and reference

DEV = torch.device("cuda", 0)


def check_push_pull(rank, world):
    checked = 0
    for dtype in DTYPES:
        for n in (1, 33, 300_000):
            x = values(dtype, n, rank, 1).to(DEV)
            name = f"cuda.{str(dtype).split('.')[-1]}.{n}"
            for _ in range(2):  # the second round reuses the pinned buffer
                got = ct.push_pull(x, average=False, name=name)
                assert got.device == DEV and got.dtype == dtype and got.data_ptr() != x.data_ptr()
                assert torch.equal(got.cpu(), expected_sum(dtype, n, world, 1)), (dtype, n)
                assert torch.equal(x.cpu(), values(dtype, n, rank, 1))  # input untouched
                checked += 1
            y = x.clone()
            assert ct.push_pull_(y, average=False, name=name) is y
            assert torch.equal(y.cpu(), expected_sum(dtype, n, world, 1))
            checked += 1
    # Produced by a kernel just before the call: the staging copy waits for it.
    big = torch.full((1 << 20,), float(rank + 1), device=DEV) * 3.0
    got = ct.push_pull(big, average=True, name="cuda.after_kernel")
    assert torch.equal(got.cpu(), torch.full((1 << 20,), 3.0 * (world + 1) / 2))
    # Async: several in flight at once, then synchronized in reverse.
    xs = [values(torch.float32, 5000 + t, rank, 30 + t).to(DEV) for t in range(6)]
    hs = [ct.push_pull_async(x, average=False, name=f"cuda.async.{t}") for t, x in enumerate(xs)]
    for t in reversed(range(6)):
        assert torch.equal(ct.synchronize(hs[t]).cpu(), expected_sum(torch.float32, 5000 + t, world,
                                                                        30 + t))
    # fp16 compression of a CUDA tensor (small integers: exact in fp16).
    m = values(torch.float32, 4096, rank, 2).to(DEV)
    got = ct.push_pull(m, average=False, name="cuda.fp16", compression=ct.Compression.fp16)
    assert got.device == DEV and torch.equal(got.cpu(), expected_sum(torch.float32, 4096, world, 2))
    return checked + 9


def check_errors(rank):
    try:
        ct.push_pull(torch.ones(4, 4, device=DEV).t(), name="cuda.nc")
    except cortado.CortadoError as e:
        assert "not contiguous" in str(e), str(e)
        return
    raise AssertionError("a non-contiguous CUDA tensor was accepted")


def check_broadcast_and_optimizer(rank, world):
    root = world - 1
    x = values(torch.float32, 777, rank, 60).to(DEV)
    assert torch.equal(ct.broadcast(x, root, name="cuda.b").cpu(), values(torch.float32, 777, root, 60))
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(DEV)
    ct.broadcast_parameters(model.state_dict(), root_rank=root)
    torch.manual_seed(root)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for (name, mine), (_, theirs) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(mine.cpu(), theirs), name
    # One SGD step on every worker's own batch: the averaged gradient equals
    # the gradient of the mean loss over all workers' batches (computed here,
    # on the CPU, from every worker's batch).
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    batches = [torch.randn(8, 16, generator=torch.Generator().manual_seed(500 + r)) for r in range(world)]
    opt.zero_grad()
    model(batches[rank].to(DEV)).pow(2).mean().backward()
    opt.step()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_opt.zero_grad()
    (sum(ref(b).pow(2).mean() for b in batches) / world).backward()
    ref_opt.step()
    for (name, mine), (_, theirs) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.allclose(mine.cpu(), theirs, rtol=1e-5, atol=1e-6), name
    return 3


def main():
    args = parse_args()
    ct.init()
    rank, world = ct.rank(), ct.size()
    checked = check_push_pull(rank, world)
    check_errors(rank)
    checked += check_broadcast_and_optimizer(rank, world)
    write_result(args.out, rank, ok=True, checked=checked)
    ct.shutdown()


if __name__ == "__main__":
    main()
