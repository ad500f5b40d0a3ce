"""The worker of test_pip_install.py: runs from a wheel-installed cortado, in
a fresh virtual environment, with no PYTHONPATH.

Each rank pushes rank-dependent torch and NumPy tensors; every rank checks
the sums against a plain sum of all ranks' inputs (integer values, so the
sums are exact whatever order the servers add in), and plans a model with
Compression.auto, which reads the planner's cost models from the installed
copy that cortado.paths finds. Writes result.<rank>.json into --out.
"""

import argparse
import json
import pathlib
import sys

import numpy as np
import torch

import cortado
import cortado.paths
import cortado.torch as ct


def inputs(rank, n):
    return np.arange(n, dtype=np.int64) % 97 * (rank + 1) - rank


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    ct.init()
    rank, world = ct.rank(), ct.size()
    n = 70_000  # more than one 64 KiB chunk as float32

    expected = sum(inputs(r, n) for r in range(world))
    got = ct.push_pull(torch.from_numpy(inputs(rank, n).astype(np.float32)), name="pip.torch",
                       average=False)
    torch_ok = bool(np.array_equal(got.numpy(), expected.astype(np.float32)))
    got_np = cortado.push_pull(inputs(rank, n).astype(np.int32), name="pip.numpy",
                               average=False)
    numpy_ok = bool(np.array_equal(got_np, expected.astype(np.int32)))

    auto = cortado.Compression.auto(inter="10gbit")
    auto.plan([("fc.weight", 4 << 20, 4), ("fc.bias", 1000, 4)], world)

    result = {
        "rank": rank, "world": world, "torch_ok": torch_ok, "numpy_ok": numpy_ok,
        "prefix": sys.prefix, "package": str(pathlib.Path(cortado.__file__).resolve()),
        "command": cortado.paths.command(), "planner_data": cortado.paths.planner_data(),
        "auto_codec": auto.last_report["codec"],
    }
    pathlib.Path(args.out, f"result.{rank}.json").write_text(json.dumps(result))
    ct.shutdown()


if __name__ == "__main__":
    main()
