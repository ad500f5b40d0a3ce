"""Workers disagree about one tensor: the last rank pushes it with another
element count (--kind count, NumPy) or dtype (--kind dtype, torch), or
pushes a model's gradients one by one where the others fuse them
(--kind fusion, torch's DistributedOptimizer with fusion_bytes=0 against
the default: other tensor names). Every worker must raise CortadoError
naming the tensor; each records what it got."""

import sys
import time

from common import parse_args, write_result


def main():
    args = parse_args(lambda p: p.add_argument("--kind", choices=["count", "dtype", "fusion"],
                                               required=True))
    import cortado
    cortado.init()
    rank, world = cortado.rank(), cortado.size()
    odd = rank == world - 1
    start = time.monotonic()
    try:
        # A tensor that all agree on first: the job works until the mismatch.
        if args.kind == "count":
            import numpy as np
            cortado.push_pull(np.ones(3, np.float32), name="agreed")
            cortado.push_pull(np.ones(5 if odd else 4, np.float32), name="weights")
        elif args.kind == "fusion":
            import torch
            import cortado.torch as ct
            ct.push_pull(torch.ones(3), name="agreed")
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
            opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                          named_parameters=model.named_parameters(),
                                          fusion_bytes=0 if odd else None)
            model(torch.ones(2, 8)).sum().backward()
            opt.step()
        else:
            import torch
            import cortado.torch as ct
            ct.push_pull(torch.ones(3), name="agreed")
            ct.push_pull(torch.ones(4, dtype=torch.float64 if odd else torch.float32),
                         name="weights")
        write_result(args.out, rank, raised=False)
        return 0
    except cortado.CortadoError as e:
        write_result(args.out, rank, raised=True, code=getattr(e, "code", None), message=str(e),
                     seconds=time.monotonic() - start)
        return 3


if __name__ == "__main__":
    sys.exit(main())
