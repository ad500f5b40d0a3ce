"""Helpers for the worker scripts that the Python tests run under `cortado launch`."""

import argparse
import json
import os
import pathlib
import time


def parse_args(extra=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="folder for result.<rank>.json")
    if extra:
        extra(parser)
    return parser.parse_args()


def write_result(out, rank, **data):
    """Writes <out>/result.<rank>.json atomically."""
    data["rank"] = rank
    data["time"] = time.time()
    path = pathlib.Path(out) / f"result.{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def env_rank():
    return int(os.environ["CORTADO_RANK"])


# A plan option (as `cortado plan --json` writes it) that sends a gradient
# through fp16 push/pull: encoded on the CPU before the push; the servers
# decode, sum and re-encode for the pull.
FP16_PUSH_PULL = {"scheme": "hierarchical", "codec": "fp16", "steps": [
    {"op": "reduce_scatter", "scope": "intra", "compressed": False},
    {"op": "encode", "device": "cpu"},
    {"op": "push", "scope": "inter", "compressed": True},
    {"op": "pull", "scope": "inter", "compressed": True},
    {"op": "decode", "device": "cpu"},
    {"op": "allgather", "scope": "intra", "compressed": False}]}


def plan_of(names, option, version=1):
    """A plan (cortado-plan JSON as a dict) with `option` for every tensor."""
    return {"format": "cortado-plan", "version": version, "tensors": {n: option for n in names}}


def image_batches(world, steps, per_worker, seed=42):
    """`steps` batches of world * per_worker random 1x8x8 images and labels
    in 0..9, the same on every worker (worker r's slice: micro_rows)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(world * per_worker, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (world * per_worker,), generator=g)
        yield x, y


def micro_rows(rank, m, micro, per_worker):
    """Worker `rank`'s micro-batch m of `micro` in a batch of image_batches:
    (lo, hi), a slice of its per_worker rows."""
    base = rank * per_worker
    return base + m * per_worker // micro, base + (m + 1) * per_worker // micro


def whole_batch_rows(world, m, micro, per_worker):
    """Every worker's micro-batch m, concatenated (the one-process reference
    of a run with backward_passes_per_step=micro): row indices in worker order."""
    import torch
    return torch.cat([torch.arange(*micro_rows(r, m, micro, per_worker)) for r in range(world)])
