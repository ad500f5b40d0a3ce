"""Engine codecs through the binding, against NumPy references.

- top-k: the first round (error-feedback residuals still zero) must equal the
  sum over workers of each worker's own top-k, computed here with NumPy from
  every worker's seeded input (ties to the lower index, as the codec does);
  later rounds with error feedback must add up, over the rounds, to the sum
  of everything pushed minus what is still held back (at most the unsent
  residual of each worker, which the test bounds).
- topk:ratio=1 sends everything: exact sums, averaged too.
- every other codec of the registry runs and returns a finite result of the
  right shape, close to the true sum in the codec's own terms (fp16/bf16:
  one rounding; the sign and quantizing codecs: correlated with the sum).
- "auto" plans a model and DistributedOptimizer trains with it.
- errors: a codec on a float64 tensor, one name pushed with two compressions.
"""

import sys

import numpy as np
import torch

import cortado
import cortado.torch as ct
from common import parse_args, write_result

N = 5000


def grad(rank, salt, n=N):
    return np.random.default_rng([rank, salt]).standard_normal(n).astype(np.float32)


def topk_of(x, k):
    # The k largest magnitudes, ties to the lower index: a stable sort of -|x|.
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


def check_topk(rank, world, report):
    ratio = 0.02
    k = int(N * ratio)
    x = grad(rank, 1)
    got = cortado.push_pull(x, name="topk.first", average=False,
                            compression=cortado.Compression.topk(ratio))
    ref = sum(topk_of(grad(r, 1), k) for r in range(world))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    assert np.count_nonzero(got) <= world * k
    report["topk first round nonzeros"] = int(np.count_nonzero(got))

    # Error feedback: the same gradient every round. What arrives over R
    # rounds is R * sum(g) minus the residuals still held on the workers; a
    # residual never exceeds what top-k left out of one round's corrected
    # gradient, so the shortfall per element is bounded and shrinks relative
    # to R * sum(g).
    rounds, ratio = 50, 0.1
    k = int(N * ratio)
    xs = [grad(r, 2) for r in range(world)]
    total = np.zeros(N, np.float64)
    for _ in range(rounds):
        total += cortado.push_pull(xs[rank], name="topk.ef", average=False,
                                   compression=cortado.Compression.topk(ratio))
    expect = rounds * np.sum(xs, axis=0, dtype=np.float64)
    rel = np.linalg.norm(total - expect) / np.linalg.norm(expect)
    # Without error feedback the same rounds deliver only the top-k part each
    # time: relative error about sqrt(1 - energy of the top 10%), about 0.75;
    # with it, the residuals stay below about sum|g| / k per element while
    # the total grows with the rounds.
    total_noef = np.zeros(N, np.float64)
    for _ in range(rounds):
        total_noef += cortado.push_pull(
            xs[rank], name="topk.noef", average=False,
            compression=cortado.Compression.topk(ratio, error_feedback=False))
    rel_noef = np.linalg.norm(total_noef - expect) / np.linalg.norm(expect)
    np.testing.assert_allclose(total_noef, rounds * sum(topk_of(x, k) for x in xs), rtol=1e-4,
                               atol=1e-3)
    report["topk EF relative error after 50 rounds"] = float(rel)
    report["topk without EF relative error"] = float(rel_noef)
    assert rel < 0.5 * rel_noef, (rel, rel_noef)

    # ratio=1: everything is sent, so sums and averages are exact.
    ints = np.random.default_rng([rank, 3]).integers(-8, 9, N).astype(np.float32)
    ref = np.sum([np.random.default_rng([r, 3]).integers(-8, 9, N).astype(np.float32)
                  for r in range(world)], axis=0)
    got = cortado.push_pull(ints, name="topk.all", average=False,
                            compression=cortado.Compression.topk(1.0))
    np.testing.assert_array_equal(got, ref)
    got = ct.push_pull(torch.from_numpy(ints), name="topk.all.avg", average=True,
                       compression="topk:ratio=1")
    np.testing.assert_allclose(got.numpy(), ref / world, rtol=1e-6)


def check_other_codecs(rank, world, report):
    xs = [grad(r, 4) for r in range(world)]
    true = np.sum(xs, axis=0)
    for spec in ("bf16", "onebit", "signsgd", "efsignsgd", "randomk:ratio=0.1", "dgc:ratio=0.05",
                 "qsgd:levels=15", "terngrad", "natural"):
        codec = cortado.Compression.codec(spec)
        got = ct.push_pull(torch.from_numpy(xs[rank]), name=f"codec.{spec}", average=False,
                           compression=codec).numpy()
        assert got.shape == (N,) and np.all(np.isfinite(got)), spec
        corr = float(np.corrcoef(got, true)[0, 1])
        report[f"{spec} correlation with the true sum"] = corr
        if spec == "bf16":
            # Each push rounded to bf16 (8 significant bits), the sum once more.
            bound = (np.sum(np.abs(xs), axis=0) + np.abs(true)) * 2.0 ** -8
            assert np.all(np.abs(got - true) <= bound), np.max(np.abs(got - true) - bound)
        else:
            assert corr > 0.1, (spec, corr)


def check_auto(rank, world, report):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  model.named_parameters(), compression="auto",
                                  name_prefix="auto")
    chosen = {n: opt._compressors[p] for n, p in model.named_parameters()}
    plan = cortado.Compression.auto.last_report
    assert plan is not None and plan["codec"] in cortado.compression.AUTO_CANDIDATES, plan
    # The planner's choice is applied per tensor: compressed exactly where it says.
    for n, c in chosen.items():
        assert (c is not cortado.Compression.none) == (f"auto.{n}" in plan["compressed"]), \
            (n, c, plan)
    ct.broadcast_parameters(model.state_dict(), root_rank=0, prefix="auto.init")
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 256, generator=g)
    y = (x[:, :10].argmax(1))
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    report["auto"] = {"codec": plan["codec"], "compressed": plan["compressed"],
                      "loss": [losses[0], losses[-1]]}


def check_errors(report):
    def expect(label, fn, *needles):
        try:
            fn()
        except cortado.CortadoError as e:
            for needle in needles:
                assert needle in str(e), (label, needle, str(e))
            report[f"error: {label}"] = str(e)
            return
        raise AssertionError(f"{label}: no CortadoError")

    expect("codec on float64", lambda: ct.push_pull(torch.ones(4, dtype=torch.float64),
                                                    name="f64", compression="topk"),
           "float64", "float32", "topk")
    ct.push_pull(torch.ones(8), name="once", compression=cortado.Compression.topk(0.5))
    expect("other compression, same name",
           lambda: ct.push_pull(torch.ones(8), name="once", compression="none"),
           "once", "topk:ratio=0.5", "none")


def main():
    args = parse_args()
    torch.set_num_threads(1)
    cortado.init()
    rank, world = cortado.rank(), cortado.size()
    report = {}
    check_topk(rank, world, report)
    check_other_codecs(rank, world, report)
    check_auto(rank, world, report)
    check_errors(report)
    write_result(args.out, rank, ok=True, report=report)
    cortado.shutdown()
    print(f"worker {rank}: {report}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
