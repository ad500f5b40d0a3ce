"""cortado.torch with a fresh tensor every step (a torch.cat of the pieces, a
clone), as a training script that concatenates its gradients does; 2 workers.

- Uncompressed and topk:ratio=1 (lossless): every step's result equals the
  sum over the workers of their inputs, computed here (integer values, so
  the float sums are exact), in place on a fresh torch.cat and out of place
  on a fresh clone.
- Lossy codecs with error feedback (top-k 10%, EFSignSGD): the same inputs
  pushed under one name through one tensor kept across steps and under
  another name through a fresh tensor every step give identical results at
  every step: the residuals belong to the tensor's name, whatever address
  its data has (with 2 workers the servers' sums do not depend on the order
  the pushes arrive in, so identical means bit for bit).
- The core lets go of a tensor once its handle was waited on: a fresh tensor
  dies with the caller's last reference, not at the next push_pull.
- cortado.init() tuned glibc's malloc (CORTADO_MALLOC_KEEP_BYTES) unless the
  environment configures malloc itself.
"""

import gc
import os
import weakref

import torch

import cortado
import cortado.torch as ct
from cortado import _runtime
from common import parse_args, write_result

# Two pieces: the second spans two 4 MiB chunks (the default partition).
SIZES = (200_000, 1_100_000)
STEPS = 6


def pieces(rank, step):
    g = torch.Generator().manual_seed(7919 * rank + 104729 * step + 1)
    return [torch.randint(-8, 9, (n,), generator=g).float() for n in SIZES]


def reference(world, step):
    return torch.cat([torch.cat(pieces(r, step)) for r in range(world)]
                     ).reshape(world, -1).sum(0)


def check_lossless(rank, world, codec, report):
    tag = codec or "none"
    for step in range(STEPS):
        expect = reference(world, step)
        flat = torch.cat(pieces(rank, step))  # fresh every step, pushed in place
        got = ct.synchronize(ct.push_pull_async_(flat, name=f"fresh.cat.{tag}", average=False,
                                                 compression=codec))
        assert got is flat
        assert torch.equal(got, expect), (tag, step, (got - expect).abs().max().item())
        clone = torch.cat(pieces(rank, step)).clone()  # fresh, out of place
        out = ct.push_pull(clone, name=f"fresh.clone.{tag}", average=False, compression=codec)
        assert out.data_ptr() != clone.data_ptr()
        assert torch.equal(out, expect), (tag, step)
    report[f"{tag} exact steps"] = STEPS


def check_error_feedback(rank, codec, report):
    kept = torch.zeros(sum(SIZES))
    worst = 0.0
    # Every step's fresh tensor stays alive, so that each has its own address.
    olds = []
    for step in range(STEPS):
        data = torch.cat(pieces(rank, step))
        kept.copy_(data)
        a = ct.synchronize(ct.push_pull_async_(kept, name=f"ef.kept.{codec}", average=False,
                                               compression=codec))
        fresh = data.clone()
        b = ct.synchronize(ct.push_pull_async_(fresh, name=f"ef.fresh.{codec}", average=False,
                                               compression=codec))
        assert all(fresh.data_ptr() != o.data_ptr() for o in olds)
        olds.append(fresh)
        assert torch.equal(a, b), (codec, step, (a - b).abs().max().item())
        worst = max(worst, (a - b).abs().max().item())
        # A lossy round is not the sum, but it carries something of it.
        assert torch.count_nonzero(a).item() > 0, (codec, step)
    report[f"{codec} kept vs fresh max difference"] = worst


def check_release(report):
    t = torch.randn(300_000)
    ref = weakref.ref(t)
    h = ct.push_pull_async_(t, name="release.fresh", average=False)
    assert h._core.holds_buffers
    ct.synchronize(h)
    assert not h._core.holds_buffers
    del t, h
    gc.collect()
    assert ref() is None, "the core still references a tensor whose handle was waited on"
    report["released at synchronize"] = True


def check_malloc(report):
    applied, detail = _runtime.require("test").malloc_tuning
    configured = [v for v in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                              "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_") if v in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        configured.append("GLIBC_TUNABLES")
    if os.environ.get("CORTADO_MALLOC_KEEP_BYTES") == "0":
        assert not applied and "CORTADO_MALLOC_KEEP_BYTES=0" in detail, detail
    elif configured:
        assert not applied and configured[0] in detail, (configured, detail)
    else:
        assert applied, detail
    report["malloc"] = detail


def main():
    args = parse_args()
    torch.set_num_threads(1)
    cortado.init()
    rank, world = cortado.rank(), cortado.size()
    assert world == 2, "this check runs on 2 workers (order-free sums)"
    report = {}
    check_malloc(report)
    check_lossless(rank, world, None, report)
    check_lossless(rank, world, "topk:ratio=1", report)
    for codec in ("topk:ratio=0.1", "efsignsgd"):
        check_error_feedback(rank, codec, report)
    check_release(report)
    write_result(args.out, rank, ok=True, report=report)
    cortado.shutdown()


if __name__ == "__main__":
    main()
