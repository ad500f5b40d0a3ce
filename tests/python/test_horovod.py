"""Horovod's torch API on cortado.torch (`import cortado.torch as hvd`): real
jobs through `cortado launch` on 2 and 4 workers, running
workers/horovod_api.py (every call against references computed without
Cortado, the errors between workers, the optimizer and SyncBatchNorm) and
the Horovod-style example. ctest runs this file as `python_horovod`."""

import re

import pytest

from conftest import REPO
from test_bindings import assert_all_ok


@pytest.mark.parametrize("workers", [2, 4])
def test_horovod_collectives_against_references(run_job, workers):
    # Every Horovod-named collective (sync, async, in place, autograd) on every
    # dtype, against references each worker computes without Cortado.
    job = run_job(workers, 2, "horovod_api.py", "--part", "ops", timeout=300,
                  env={"CORTADO_PARTITION_BYTES": "32K"})
    results = assert_all_ok(job, workers)
    assert all(r["checked"] > 100 for r in results.values()), results


@pytest.mark.parametrize("workers", [2, 4])
def test_horovod_errors_between_workers(run_job, workers):
    # Mismatched shapes, dtypes, ops, roots and calls: every worker raises
    # CortadoError (mismatch) naming both sides, within seconds; unknown ops
    # and Adasum are refused before anything is sent; the job goes on.
    job = run_job(workers, 1, "horovod_api.py", "--part", "errors", timeout=180)
    results = assert_all_ok(job, workers)
    for label, message in sorted(results[0]["messages"].items()):
        print(f"{label}: {message}")


@pytest.mark.parametrize("workers", [2, 4])
def test_horovod_optimizer_and_sync_batch_norm(run_job, workers):
    # DistributedOptimizer with op=, gradient_predivide_factor, groups,
    # backward_passes_per_step, synchronize()/skip_synchronize() and sparse
    # gradients, and SyncBatchNorm, against one-process runs on the global batch.
    job = run_job(workers, 2, "horovod_api.py", "--part", "train", timeout=300)
    assert_all_ok(job, workers)


def test_horovod_style_example(run_job):
    # A script written as Horovod's examples are (SyncBatchNorm, op=hvd.Average,
    # broadcast_optimizer_state, metric averaging with allreduce), unchanged
    # but for its import, under `cortado launch`.
    example = REPO / "bindings" / "python" / "examples" / "horovod_style.py"
    job = run_job(2, 1, example, "--epochs", "3", timeout=240, out_arg=False)
    assert job.returncode == 0, job.describe()
    # The launcher passes the workers' output on as it comes, so one worker's
    # line may continue another's: match anywhere, not by line.
    accuracy = re.findall(r"Test set: loss [0-9.]+, Accuracy: ([0-9.]+)%", job.stdout)
    assert len(accuracy) == 3, job.describe()
    assert float(accuracy[-1]) / 100 > 0.8, job.describe()
    sums = re.findall(r"weights checksum (-?[0-9]+\.[0-9]+(?:e[-+][0-9]+)?)", job.stdout)
    assert len(sums) == 2 and len(set(sums)) == 1, job.describe()  # the same weights
