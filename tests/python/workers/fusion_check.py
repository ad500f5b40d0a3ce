"""DistributedOptimizer's default path fuses gradients into groups by size
(fusion_bytes, docs/python.md "Fused gradients").

Checked against independent references:
- the groups: consecutive in backward order, of one dtype and compression,
  each closed at the first gradient that brings it to fusion_bytes, against
  a brute-force recomputation from the parameters' sizes;
- fused and one-gradient-at-a-time (fusion_bytes=0) runs end with the same
  parameters after several steps without compression (exact up to float
  rounding), and with DGC the same loss curve within a stated bound;
- a sparse embedding gradient inside a fused group keeps its own way: it is
  still sparse after step() and the embedding moves by the workers' average;
- a bad fusion_bytes is refused with a message naming it.
"""

import sys

import torch

import cortado.torch as ct
from common import parse_args, write_result

STEPS = 5
PER_WORKER = 8
LOSSY_BOUND = 0.05  # DGC: |loss fused - loss unfused| per step, relative


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(77)
        self.emb = torch.nn.Embedding(16, 4, sparse=True)
        self.l1 = torch.nn.Linear(4 + 12, 64)
        self.l2 = torch.nn.Linear(64, 64)
        self.l3 = torch.nn.Linear(64, 32)
        self.out = torch.nn.Linear(32, 5)

    def forward(self, ids, x):
        h = torch.cat([self.emb(ids), x], dim=1)
        return self.out(torch.tanh(self.l3(torch.tanh(self.l2(torch.tanh(self.l1(h)))))))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(0, 16, (PER_WORKER,), generator=g)
    x = torch.randn(PER_WORKER, 12, generator=g)
    y = torch.randint(0, 5, (PER_WORKER,), generator=g)
    return ids, x, y


def train(rank, label, **kw):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  name_prefix=f"grad.{label}", **kw)
    losses = []
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(STEPS):
        opt.zero_grad()
        ids, x, y = batch(rank, step)
        loss = loss_fn(model(ids, x), y)
        loss.backward()
        before = model.emb.weight.detach().clone()
        opt.step()
        assert model.emb.weight.grad.is_sparse, f"{label}: the embedding's gradient was densified"
        # Only the rows some worker looked up move.
        moved = (before - model.emb.weight.detach()).abs().sum(dim=1) > 0
        looked_up = torch.zeros(16, dtype=torch.bool)
        for r in range(ct.size()):
            looked_up[batch(r, step)[0]] = True
        assert torch.equal(moved, looked_up), f"{label}: rows moved {moved} vs {looked_up}"
        losses.append(ct.allreduce(loss.detach(), name=f"loss.{label}.{step}").item())
    return model, opt, losses


def expected_groups(opt, fusion_bytes):
    """Brute force: walk the parameters in backward order and cut."""
    params = [p for _, p in reversed(opt._ordered)]
    groups, cur, size = [], [], 0
    for p in params:
        if p.dtype != (cur[0].dtype if cur else p.dtype):
            groups.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += p.numel() * p.element_size()
        if size >= fusion_bytes:
            groups.append(cur)
            cur, size = [], 0
    groups.append(cur)
    return [sorted(id(p) for p in g) for g in groups if len(g) > 1]


def main():
    args = parse_args()
    torch.set_num_threads(1)
    ct.init()
    rank = ct.rank()
    report = {}

    # Lossless: fused (the default, and small groups) against one at a time.
    plain, opt0, loss0 = train(rank, "single", fusion_bytes=0)
    assert not opt0._groups, "fusion_bytes=0 made groups"
    for label, kw in (("default", {}), ("small", {"fusion_bytes": 20000})):
        fused, opt, losses = train(rank, label, **kw)
        fb = kw.get("fusion_bytes", ct.DEFAULT_ENGINE_FUSION_BYTES)
        got = [sorted(id(p) for p in g) for g in opt._groups]
        want = expected_groups(opt, fb)
        assert sorted(got) == sorted(want), f"{label}: groups {got} != {want}"
        assert got, f"{label}: no groups"
        diff = max((p - q).abs().max().item()
                   for p, q in zip(fused.parameters(), plain.parameters()))
        assert diff <= 1e-5, f"{label}: fused parameters differ from unfused by {diff}"
        report[label] = {"groups": [len(g) for g in opt._groups], "max_diff": diff}

    # Lossy: DGC fused against DGC one at a time, the same loss curve.
    _, _, lossy0 = train(rank, "dgc.single", fusion_bytes=0, compression=ct.Compression.dgc(0.1))
    _, optd, lossy = train(rank, "dgc.fused", compression=ct.Compression.dgc(0.1))
    assert optd._groups, "DGC: no groups"
    worst = max(abs(a - b) / abs(b) for a, b in zip(lossy, lossy0))
    assert worst <= LOSSY_BOUND, f"DGC fused loss {lossy} vs unfused {lossy0}"
    report["dgc"] = {"losses": lossy, "unfused": lossy0, "worst": worst}

    # Errors.
    for bad in (-1, 1.5, True):
        m = Net()
        try:
            ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                    named_parameters=m.named_parameters(),
                                    name_prefix="grad.bad", fusion_bytes=bad)
        except ct.CortadoError as e:
            assert "fusion_bytes" in str(e), str(e)
        else:
            raise AssertionError(f"fusion_bytes={bad!r} was accepted")
    write_result(args.out, rank, ok=True, report=report)
    ct.shutdown()
    print(f"worker {rank}: {report}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
