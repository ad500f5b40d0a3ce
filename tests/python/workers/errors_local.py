"""Errors a PyTorch user makes inside a running job, each a CortadoError with a
clear message and no effect on the job: after all of them, push_pull still
works. Records each message in result.<rank>.json."""

import sys
import warnings

import numpy as np
import torch

import cortado
import cortado.torch as ct
from common import parse_args, write_result


class FakeCudaTensor(torch.Tensor):
    """Reports a CUDA device, as a tensor moved with .cuda() would (this
    machine's torch has no CUDA, so a real one cannot be made)."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    @property
    def is_cuda(self):
        return True


def expect_error(messages, label, fn, *needles, code=None):
    try:
        fn()
    except cortado.CortadoError as e:
        text = str(e)
        for needle in needles:
            assert needle.lower() in text.lower(), f"{label}: '{needle}' not in: {text}"
        if code is not None:
            assert getattr(e, "code", None) == code, f"{label}: code {getattr(e, 'code', None)}"
        messages[label] = text
        return
    raise AssertionError(f"{label}: no CortadoError")


def main():
    args = parse_args()
    ct.init()
    rank, world = ct.rank(), ct.size()
    m = {}
    base = torch.arange(12, dtype=torch.float32).view(3, 4)

    expect_error(m, "non-contiguous tensor", lambda: ct.push_pull(base.t(), name="nc"),
                 "not contiguous", ".contiguous()", code="invalid_argument")
    expect_error(m, "non-contiguous tensor (async)",
                 lambda: ct.push_pull_async(base[:, ::2], name="nc2"), "not contiguous")
    expect_error(m, "non-contiguous array", lambda: cortado.push_pull(np.ones((4, 4))[:, 1],
                                                                      name="nc3"),
                 "not C-contiguous", "ascontiguousarray")
    fake = torch.ones(4).as_subclass(FakeCudaTensor)
    # CUDA tensors travel through pinned host buffers (tests/python/workers/
    # torch_cuda.py, on a GPU machine); a CUDA tensor in a process whose torch
    # has no usable CUDA is refused before anything moves.
    if not torch.cuda.is_available():
        expect_error(m, "CUDA tensor without CUDA", lambda: ct.push_pull(fake, name="cuda"),
                     "cuda:0", "torch.cuda.is_available() is False", code="invalid_argument")
    expect_error(m, "meta tensor", lambda: ct.push_pull(torch.empty(3, device="meta"), name="meta"),
                 "meta")
    expect_error(m, "unsupported dtype", lambda: ct.push_pull(torch.ones(2, dtype=torch.complex64),
                                                              name="cplx"),
                 "complex64", "supported")
    expect_error(m, "sparse tensor", lambda: ct.push_pull(torch.eye(3).to_sparse(), name="sp"),
                 "layout")
    expect_error(m, "name not a string (Horovod's argument order)",
                 lambda: ct.push_pull(torch.ones(2), False), "name must be a string", "keyword")
    expect_error(m, "not a tensor", lambda: ct.push_pull([1.0, 2.0], name="list"), "torch.Tensor")
    expect_error(m, "unknown compression", lambda: ct.push_pull(torch.ones(2), name="c",
                                                                compression="zip"),
                 "unknown compression 'zip'", "none, fp16, auto, topk")
    expect_error(m, "codec parameter out of range",
                 lambda: ct.push_pull(torch.ones(2), name="c2", compression="topk:ratio=2"),
                 "ratio=2", "out of range")
    expect_error(m, "PowerSGD in push-pull", lambda: ct.Compression.powersgd(4),
                 "two reductions")
    model = torch.nn.Linear(3, 2)
    expect_error(m, "DistributedOptimizer unknown compression",
                 lambda: ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                 model.named_parameters(), compression="fp8"),
                 "unknown compression 'fp8'")
    # DGC's momentum correction and an optimizer's momentum: a warning that
    # names both, only where both are on.
    for label, momentum, comp, warns in (
            ("dgc and SGD momentum", 0.9, ct.Compression.dgc(0.01), True),
            ("dgc without SGD momentum", 0.0, ct.Compression.dgc(0.01), False),
            ("dgc:momentum=0 and SGD momentum", 0.9, "dgc:ratio=0.01,momentum=0", False),
            ("topk and SGD momentum", 0.9, ct.Compression.topk(0.01), False)):
        net = torch.nn.Linear(3, 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ct.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum),
                                    net.named_parameters(), compression=comp)
        texts = [str(w.message) for w in caught if "momentum counts twice" in str(w.message)]
        assert bool(texts) == warns, f"{label}: warnings {[str(w.message) for w in caught]}"
        if texts:
            assert "momentum=0.9" in texts[0] and "dgc:momentum=0" in texts[0], texts[0]
            m[label] = texts[0]
    expect_error(m, "root out of range", lambda: ct.broadcast(torch.ones(2), root_rank=world,
                                                              name="b"),
                 "root_rank", "out of range")
    # A name keeps its dtype and size.
    ct.push_pull(torch.ones(4), name="fixed")
    expect_error(m, "same name, other size", lambda: ct.push_pull(torch.ones(5), name="fixed"),
                 "fixed", "4", "5")
    expect_error(m, "same name, other dtype",
                 lambda: ct.push_pull(torch.ones(4, dtype=torch.float64), name="fixed"),
                 "fixed", "float64", "float32")
    # One operation in flight at a time per name (64 MiB: still in flight
    # when the second call comes).
    big = torch.ones(16 << 20)
    h = ct.push_pull_async(big, name="big")
    expect_error(m, "same name in flight", lambda: ct.push_pull_async(big, name="big"),
                 "big", "in flight")
    ct.synchronize(h)
    expect_error(m, "synchronize(non-handle)", lambda: ct.synchronize(42), "handle")

    # The job still works.
    assert torch.equal(ct.push_pull(torch.ones(4), average=False, name="fixed"),
                       torch.full((4,), float(world)))
    write_result(args.out, rank, ok=True, messages=m)
    ct.shutdown()


if __name__ == "__main__":
    sys.exit(main())
