"""Dense gradients that are mostly zeros go through Zen without any change
to the script: an nn.Embedding without sparse=True (a few of its rows get a
gradient), a dense nn.Linear and a small embedding. The optimizer measures
the densities at the first step; from the second on the embedding's
gradient travels as pairs ("<name>.zen" declared), the Linear's and the
small one's stay dense. Every worker recomputes every worker's lookups, so
the expected update is a plain sum; the gradients stay dense tensors.
"""

import torch

import cortado.torch as ct
from cortado import _runtime
from common import parse_args, write_result

ROWS, DIM, SMALL, STEPS = 20000, 8, 100, 4


def ids(rank, step):
    """Zipf-like rows: most near 0 (shared), one this rank's own; index 0
    and the last row always (about 0.2% of the rows per worker)."""
    g = torch.Generator().manual_seed(100 * rank + step)
    head = (torch.rand(30, generator=g) ** 4 * ROWS).long()
    return torch.cat([head, torch.tensor([0, ROWS - 1, 13 * rank + 5])])


def main():
    args = parse_args()
    ct.init()
    rank, world = ct.rank(), ct.size()
    torch.manual_seed(5)
    emb = torch.nn.Embedding(ROWS, DIM)
    small = torch.nn.Embedding(SMALL, DIM)
    lin = torch.nn.Linear(DIM, 600)
    named = [("emb.weight", emb.weight), ("small.weight", small.weight),
             ("lin.weight", lin.weight), ("lin.bias", lin.bias)]
    opt = ct.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=1.0),
                                  named_parameters=named)
    x = torch.ones(2, DIM)
    for step in range(STEPS):
        before = {n: p.detach().clone() for n, p in named}
        opt.zero_grad()
        loss = (emb(ids(rank, step)).sum() * (rank + 1) + small(ids(rank, step) % SMALL).sum()
                + lin(x).sum() * (rank + 1))
        loss.backward()
        opt.step()
        assert all(p.grad.layout == torch.strided for _, p in named)
        want_e = torch.zeros(ROWS, DIM)
        want_s = torch.zeros(SMALL, DIM)
        for r in range(world):
            rows = ids(r, step)
            want_e.index_add_(0, rows, torch.full((len(rows), DIM), r + 1.0))
            want_s.index_add_(0, rows % SMALL, torch.ones(len(rows), DIM))
        scale = sum(r + 1.0 for r in range(world)) / world
        assert torch.allclose(before["emb.weight"] - emb.weight.detach(), want_e / world,
                              atol=1e-5), step
        assert torch.allclose(before["small.weight"] - small.weight.detach(), want_s / world,
                              atol=1e-5), step
        assert torch.allclose(before["lin.weight"] - lin.weight.detach(),
                              torch.full((600, DIM), 2.0 * scale), atol=1e-4), step
        assert torch.allclose(before["lin.bias"] - lin.bias.detach(),
                              torch.full((600,), 2.0 * scale), atol=1e-4), step
    rt = _runtime.require("zen_dense_check")
    chosen = {n: opt.sparse_densities[f"grad.{n}"][1] for n in ("emb.weight", "lin.weight")}
    declared = {n: rt.is_declared(f"grad.{n}.zen")
                for n in ("emb.weight", "lin.weight", "small.weight", "lin.bias")}
    ok = (chosen == {"emb.weight": True, "lin.weight": False}
          and "grad.small.weight" not in opt.sparse_densities
          and declared == {"emb.weight": True, "lin.weight": False, "small.weight": False,
                           "lin.bias": False})
    # Off: nothing measured, nothing declared.
    emb2 = torch.nn.Embedding(ROWS, DIM)
    opt2 = ct.DistributedOptimizer(torch.optim.SGD(emb2.parameters(), lr=1.0),
                                   named_parameters=[("emb2.weight", emb2.weight)],
                                   sparse_threshold=0)
    for step in range(2):
        opt2.zero_grad()
        emb2(ids(rank, step)).sum().backward()
        opt2.step()
    ok = ok and not opt2.sparse_densities and not rt.is_declared("grad.emb2.weight.zen")
    # A threshold that is no density is refused, naming the setting.
    try:
        ct.DistributedOptimizer(torch.optim.SGD(emb2.parameters(), lr=1.0), sparse_threshold=2)
        refused = ""
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        refused = str(e)
    ok = ok and "sparse_threshold must be a density between 0 and 1" in refused
    write_result(args.out, rank, ok=ok, chosen=chosen, declared=declared,
                 densities={k: v[0] for k, v in opt.sparse_densities.items()}, refused=refused)
    ct.shutdown()


if __name__ == "__main__":
    main()
