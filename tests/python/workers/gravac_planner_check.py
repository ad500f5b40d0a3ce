"""Compression.gravac(replan="planner") through DistributedOptimizer(
executor=True): at every ratio that moved 2x the plan executor asks the
Espresso planner (on a profile of the parameters) for the plan at the new
ratio. Every worker reports its ratios, its re-plans, what re-planned and the
plan it ended on (the test compares them across workers), and checks that
the plan is the carrier at the ratio of the last re-plan: compressed options
as "topk:ratio=1/CF", push/pull only (no MPI collectives here).
"""

import json

import torch

import cortado.torch as ct
from common import parse_args, write_result

STEPS = 10
SETTINGS = dict(codec="topk", min_ratio=2.0, max_ratio=256.0, window=2, epsilon=0.1, omega=0.0,
                alpha=1.0, replan="planner")


def main():
    args = parse_args()
    ct.init()
    rank = ct.rank()
    torch.manual_seed(5)
    # One large weight (256 KiB) and small ones: the planner's choice for
    # them differs with the ratio.
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 4))
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters(),
                                  compression=ct.Compression.gravac(**SETTINGS),
                                  name_prefix="gravac-planner", executor=True)
    g = torch.Generator().manual_seed(11 + rank)
    for _ in range(STEPS):
        opt.zero_grad()
        x = torch.randn(8, 256, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    ratios = opt.compression_ratio_history
    plan_cf, replans = opt.executor.gravac_plan
    plan = json.loads(opt.executor.plan_json)
    problems = []
    for name, option in plan["tensors"].items():
        steps = option["steps"]
        if any(s.get("scope") == "flat" or (s.get("scope") == "inter" and
                                              s["op"] not in ("push", "pull")) for s in steps):
            problems.append(f"{name}: a collective step {steps}")
        compressed = any(s.get("compressed") for s in steps)
        if compressed and option.get("codec") != f"topk:ratio={1.0 / plan_cf!r}":
            problems.append(f"{name}: codec {option.get('codec')} at plan CF {plan_cf}")
    params = [p.detach().reshape(-1).tolist()[:8] for p in model.parameters()]
    replanner = opt.executor.gravac_replanner
    ct.shutdown()
    write_result(args.out, rank, ratios=ratios, replans=replans, plan_cf=plan_cf, plan=plan,
                 replanner=replanner, problems=problems, params=params)


if __name__ == "__main__":
    main()
