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
