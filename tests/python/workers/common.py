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
