"""Sparse gradients through Zen: DistributedOptimizer on an
nn.Embedding(sparse=True) and an nn.EmbeddingBag(sparse=True), each worker
looking up its own (partly shared) rows. Every worker recomputes every
worker's lookups, so the expected update is a plain sum here; the gradients
must stay sparse and must have gone through the Zen tensors ("<name>.zen").
"""

import torch

import cortado.torch as ct
from cortado import _runtime
from common import parse_args, write_result

ROWS, DIM, BAG_ROWS, BAG_DIM, STEPS = 5000, 8, 300, 3, 3


def ids(rank, step):
    """Zipf-like rows: most near 0 (shared), a few far out (this rank's)."""
    g = torch.Generator().manual_seed(100 * rank + step)
    head = (torch.rand(40, generator=g) ** 4 * ROWS).long()
    return torch.cat([head, torch.tensor([0, ROWS - 1, 17 * rank + 3])])


def bag_ids(rank, step):
    g = torch.Generator().manual_seed(7 + 100 * rank + step)
    return torch.randint(0, BAG_ROWS, (2, 5), generator=g)


def main():
    args = parse_args()
    ct.init()
    rank, world = ct.rank(), ct.size()
    torch.manual_seed(5)
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    bag = torch.nn.EmbeddingBag(BAG_ROWS, BAG_DIM, mode="sum", sparse=True)
    params = list(emb.parameters()) + list(bag.parameters())
    named = [("emb.weight", emb.weight), ("bag.weight", bag.weight)]
    opt = ct.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=named)
    for step in range(STEPS):
        before_e = emb.weight.detach().clone()
        before_b = bag.weight.detach().clone()
        opt.zero_grad()
        loss = emb(ids(rank, step)).sum() * (rank + 1) + bag(bag_ids(rank, step)).sum()
        loss.backward()
        opt.step()
        assert emb.weight.grad.is_sparse and bag.weight.grad.is_sparse
        want_e = torch.zeros(ROWS, DIM)
        want_b = torch.zeros(BAG_ROWS, BAG_DIM)
        for r in range(world):
            want_e.index_add_(0, ids(r, step), torch.full((len(ids(r, step)), DIM), r + 1.0))
            want_b.index_add_(0, bag_ids(r, step).reshape(-1), torch.ones(10, BAG_DIM))
        want_e /= world
        want_b /= world
        assert torch.allclose(before_e - emb.weight.detach(), want_e, atol=1e-5), step
        assert torch.allclose(before_b - bag.weight.detach(), want_b, atol=1e-5), step
    rt = _runtime.require("zen_check")
    zen_used = all(rt.is_declared(f"grad.{n}.weight.zen") for n in ("emb", "bag"))
    write_result(args.out, rank, ok=zen_used, zen_used=zen_used)
    ct.shutdown()


if __name__ == "__main__":
    main()
