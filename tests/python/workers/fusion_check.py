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
- without compression, Zen's candidates (gradients of more than 4096
  elements) travel on their own at the first step and join the groups once
  their density is agreed to be dense: the groups before and after that
  step against the brute force with the candidates (then only the Zen
  ones) kept apart, the same groups on every worker (compared by the test),
  the same parameters as one gradient at a time (also with
  backward_passes_per_step=2), while a mostly-zero dense embedding and an
  nn.Embedding(sparse=True) still go through Zen; the engine tensors no
  step pushes any more are released, and a second optimizer under the
  same names declares them again and ends with the same parameters;
- a bad fusion_bytes is refused with a message naming it.
"""

import sys

import torch

import cortado.torch as ct
from cortado import _runtime
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


def expected_groups(opt, fusion_bytes, apart=()):
    """Brute force: walk the parameters in backward order and cut (before
    and after every parameter in `apart`, which travels alone)."""
    params = [p for _, p in reversed(opt._ordered)]
    groups, cur, size = [], [], 0
    for p in params:
        if any(p is q for q in apart):
            groups.append(cur)
            cur, size = [], 0
            continue
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


class Wide(torch.nn.Module):
    """Every weight but the last is one of Zen's candidates (more than 4096
    elements): a mostly-zero dense embedding (Zen), an
    nn.Embedding(sparse=True) (Zen's sparse way) and dense layers."""
    ROWS = 20000

    def __init__(self):
        super().__init__()
        torch.manual_seed(78)
        self.sparse = torch.nn.Embedding(1200, 8, sparse=True)
        self.table = torch.nn.Embedding(self.ROWS, 8)
        self.l1 = torch.nn.Linear(8 + 8 + 12, 256)
        self.l2 = torch.nn.Linear(256, 256)
        self.l3 = torch.nn.Linear(256, 64)
        self.out = torch.nn.Linear(64, 5)

    def forward(self, ids, x):
        h = torch.cat([self.sparse(ids % 1200), self.table(ids), x], dim=1)
        return self.out(torch.tanh(self.l3(torch.tanh(self.l2(torch.tanh(self.l1(h)))))))


def train_wide(rank, label, passes=1, **kw):
    """Trains Wide; returns the model, the optimizer and its groups (sorted
    lists of ids) before the first step and after it."""
    model = Wide()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = ct.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  name_prefix=f"grad.{label}", backward_passes_per_step=passes,
                                  **kw)
    snapshots = [[sorted(id(p) for p in g) for g in opt._groups]]
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(STEPS):
        opt.zero_grad()
        for k in range(passes):
            g = torch.Generator().manual_seed(1000 * step + 10 * rank + k)
            ids = torch.randint(0, Wide.ROWS, (PER_WORKER,), generator=g)
            x = torch.randn(PER_WORKER, 12, generator=g)
            y = torch.randint(0, 5, (PER_WORKER,), generator=g)
            loss_fn(model(ids, x), y).backward()
        opt.step()
        assert model.sparse.weight.grad.is_sparse, f"{label}: the sparse embedding densified"
        if step == 0:
            snapshots.append([sorted(id(p) for p in g) for g in opt._groups])
    return model, opt, snapshots


def check_dense_candidates_join(rank, report):
    rt = _runtime.require("fusion_check")
    for passes in (1, 2):
        plain, _, _ = train_wide(rank, f"wide{passes}.single", passes, fusion_bytes=0)
        for label, fb in ((f"wide{passes}.default", ct.DEFAULT_ENGINE_FUSION_BYTES),
                          (f"wide{passes}.small", 100000)):
            kw = {} if fb == ct.DEFAULT_ENGINE_FUSION_BYTES else {"fusion_bytes": fb}
            model, opt, (before, after) = train_wide(rank, label, passes, **kw)
            weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
            candidates = weights[:-1]  # every weight but out's
            zen_ones = [model.sparse.weight, model.table.weight]
            want_before = expected_groups(opt, fb, candidates)
            want_after = expected_groups(opt, fb, zen_ones)
            assert sorted(before) == sorted(want_before), f"{label}: first groups {before}"
            assert sorted(after) == sorted(want_after), f"{label}: groups {after} != {want_after}"
            grouped = {i for g in after for i in g}
            assert id(model.l2.weight) in grouped and id(model.l1.weight) in grouped, \
                f"{label}: the dense candidates are not in groups"
            assert not grouped & {id(p) for p in zen_ones}, f"{label}: a Zen gradient was grouped"
            chosen = {n[len(f"grad.{label}."):]: v[1] for n, v in opt.sparse_densities.items()}
            assert chosen == {"sparse.weight": True, "table.weight": True, "l1.weight": False,
                              "l2.weight": False, "l3.weight": False}, f"{label}: {chosen}"
            for name in ("table.weight", "sparse.weight"):
                assert rt.is_declared(f"grad.{label}.{name}.zen"), f"{label}: {name} not Zen's"
            diff = max((p - q).abs().max().item()
                       for p, q in zip(model.parameters(), plain.parameters()))
            assert diff <= 1e-5, f"{label}: fused parameters differ from unfused by {diff}"
            names = {id(p): n for n, p in model.named_parameters()}
            # The engine tensors no step pushes any more are released (the
            # servers free them): the candidates' own tensors once they are
            # in a group or on Zen, the first step's groups that changed.
            gone = [n for n in ("l1.weight", "l2.weight", "l3.weight")
                    if getattr(model, n.split(".")[0]).weight in opt._group_of]
            gone += ["table.weight"]
            for n in gone:
                assert rt.is_released(f"grad.{label}.{n}"), f"{label}: {n} was not released"
            for g in range(len(opt._groups)):
                assert _runtime.usable(rt, opt._group_name(g)), f"{label}: group {g} released"
            if passes == 1:
                # A second optimizer under the same names declares the
                # released ones again and trains as the first did.
                again, _, _ = train_wide(rank, label, passes, **kw)
                diff2 = max((p - q).abs().max().item()
                            for p, q in zip(again.parameters(), plain.parameters()))
                assert diff2 <= 1e-5, f"{label}: a second optimizer differs by {diff2}"
            report[label] = {"released": gone, "groups": sorted(sorted(names[i] for i in g) for g in after),
                             "first_groups": sorted(sorted(names[i] for i in g) for g in before),
                             "max_diff": diff}


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

    # Without compression: the dense candidates join the groups.
    check_dense_candidates_join(rank, report)

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
