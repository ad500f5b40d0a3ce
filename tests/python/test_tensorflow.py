"""cortado.tensorflow end to end: two jobs of 2 workers under `cortado launch`
(workers/tf_check.py), each worker checking against references computed
without Cortado, whose reports the tests below read; and a third job, the
Keras example (examples/train_digits_keras.py).

ctest runs this file as python_tensorflow, with the Python of the project's
virtual environment (run_venv.sh), where scripts/install_deps.sh installs
TensorFlow and Keras. Without TensorFlow the tests skip, saying so, only
while that install step has not run (no <venv>/cortado-requirements.txt):
once it ran, a TensorFlow that does not import fails them.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

import conftest
from conftest import WORKERS, _cortado_bin

VENV = pathlib.Path(os.environ.get("CORTADO_VENV") or sys.prefix)
INSTALLED = VENV / "cortado-requirements.txt"


def _tensorflow_missing():
    """None when TensorFlow and Keras import here, else why not."""
    missing = [m for m in ("tensorflow", "keras") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} cannot be imported by {sys.executable}" if missing else None


MISSING = _tensorflow_missing()


@pytest.fixture(autouse=True)
def _require_tensorflow():
    # Per test, not for the module: a module skipped whole collects no test,
    # which pytest reports with exit status 5 (a failure for ctest).
    if MISSING is None:
        return
    if INSTALLED.exists():
        pytest.fail(f"{MISSING}, although scripts/install_deps.sh installed the TensorFlow "
                    f"binding's packages into {VENV} ({INSTALLED} exists): run the tests with "
                    f"{VENV}/bin/python (ctest's python_tensorflow does)", pytrace=False)
    pytest.skip(f"{MISSING}: TensorFlow is installed by scripts/install_deps.sh into the "
                f"virtual environment {VENV} (CORTADO_VENV), which has not run here; the "
                f"TensorFlow binding's tests need it")


class _Jobs:
    """Runs each mode's job once for the module; the tests read its reports.
    A job that failed fails every test that reads it, with its first report,
    without running it again."""

    def __init__(self, base):
        self.base = base
        self.done = {}
        self.failed = {}

    def get(self, mode, workers=2, timeout=480):
        if mode in self.failed:
            pytest.fail(f"the '{mode}' job failed (reported by the first test that ran it):\n"
                        f"{self.failed[mode]}", pytrace=False)
        if mode not in self.done:
            try:
                self.done[mode] = self._run(mode, workers, timeout)
            except AssertionError as e:
                self.failed[mode] = str(e)
                raise
        return self.done[mode]

    def _run(self, mode, workers, timeout):
        out = self.base / f"job-{mode}-{time.monotonic_ns()}"
        out.mkdir()
        cmd = [_cortado_bin(), "launch", "-w", str(workers), "-s", "1", "--", sys.executable,
               str(WORKERS / "tf_check.py"), "--out", str(out), "--mode", mode]
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
        env.setdefault("CORTADO_LOG_LEVEL", "warn")
        # Two workers importing TensorFlow on a busy 2-core machine take a while.
        env.setdefault("CORTADO_CONNECT_TIMEOUT_MS", "240000")
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"job {' '.join(cmd)} did not end within {timeout} s (a hang)\n"
                                 f"stdout: {e.stdout}\nstderr: {e.stderr}") from None
        job = conftest.Job(proc, out, time.monotonic() - start)
        results = job.results()
        assert job.returncode == 0 and sorted(results) == list(range(workers)), job.describe()
        for rank, r in results.items():
            assert r.get("ok"), (rank, r, job.describe())
        return {rank: r["report"] for rank, r in results.items()}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return _Jobs(tmp_path_factory.mktemp("tensorflow"))


def test_push_pull_eager_and_in_tf_function(jobs):
    # Every worker compared its results with NumPy sums of every worker's
    # inputs: push_pull and allreduce eagerly (8 dtypes, 3 shapes, sum and
    # average), fp16 compression, a tf.function traced once and run 3 times,
    # and the gradient through push_pull (sum and average, eager and traced).
    reports = jobs.get("ops")
    for r in reports.values():
        assert r["sums_checked"] == 59 and r["graph_traces"] == 1, r


def test_distributed_gradient_tape_matches_one_process_on_the_summed_batch(jobs):
    # 3 SGD steps, eagerly and traced: the averaged gradients and the weights
    # against a plain tape on both workers' batches together, with the
    # gradients fused into groups in three ways (the groups made checked, and
    # the fused runs' gradients equal to the unfused one's bit for bit). Every
    # step wrote into the same result arrays (eagerly, a tape wrapped anew
    # each step found the same reduction), and each step's gradients, checked
    # again after the last step, still held that step's sums.
    reports = jobs.get("ops")
    for r in reports.values():
        assert r["tape_fusion_cases"] == 3, r
        diffs = {k: v for k, v in r.items() if k.startswith("tape_") and k.endswith("_max_diff")}
        assert len(diffs) == 6 and all(v < 1e-5 for v in diffs.values()), r


def test_broadcast_of_differing_initial_values(jobs):
    # Variables (float32, int64, uint32) that start different on each worker
    # hold the root's values after broadcast_variables, eagerly and inside a
    # tf.function; and model.fit's BroadcastGlobalVariablesCallback gives
    # every worker rank 0's initial weights (checked before the first batch).
    assert all(r["broadcast"] == "ok" for r in jobs.get("ops").values())
    assert all(r["epochs"] == 2 for r in jobs.get("fit").values())


def test_model_fit_two_epochs_ends_with_identical_weights(jobs):
    reports = jobs.get("fit")
    assert reports[0]["weights"] == reports[1]["weights"], "the workers' weights differ"
    assert reports[0]["optimizer_iterations"] == reports[1]["optimizer_iterations"] == 16
    # MetricAverageCallback: every worker saw the same (averaged) epoch loss.
    assert reports[0]["losses"] == reports[1]["losses"]
    assert reports[0]["losses"][1] < reports[0]["losses"][0], reports[0]["losses"]
    print(json.dumps({"losses": reports[0]["losses"]}))


def test_eager_fit_compression_custom_loop_and_load_model_keep_workers_equal(jobs):
    # model.fit run eagerly, with top-k (error feedback) and with fp16
    # compression, a custom loop through DistributedOptimizer.apply_gradients,
    # and the fitted model saved, loaded with cortado.tensorflow.keras.load_model
    # (its DistributedOptimizer and state back) and trained on: every worker
    # ends on the same weights.
    for r in jobs.get("fit").values():
        assert r["same_weights"] == {"eager": True, "topk": True, "topk_unfused": True,
                                     "fp16": True, "loop": True, "loaded": True}, r
        assert r["loaded_iterations"] == 18, r


def test_backward_passes_per_step_matches_one_step_on_the_union_of_the_batches(jobs):
    # Horovod's backward_passes_per_step=2 through Keras's gradient
    # accumulation, the sum (default) and the mean over the passes, against
    # plain SGD on the union of every worker's batches of each update.
    for r in jobs.get("fit").values():
        for label in ("accumulate_sum", "accumulate_mean"):
            assert r[f"{label}_moved"] > 1e-3, r
            assert r[f"{label}_max_diff"] < 1e-5, r
        assert r["accumulation_refusals"] == 4, r


def test_dgc_momentum_and_the_optimizers_momentum_are_warned_of(jobs):
    # DGC's momentum correction meets SGD's momentum: a warning; not with
    # either of them off, nor with another codec (tf_check.py).
    for r in jobs.get("fit").values():
        assert r["momentum_twice_warned"] is True, r


def test_xla_is_refused_with_a_clear_error(jobs):
    # tf.function(jit_compile=True) around push_pull, and model.fit of a model
    # compiled with jit_compile=True: CortadoError at trace time, saying what
    # to do.
    for r in jobs.get("ops").values():
        assert "jit_compile=False" in r["xla_refusal"], r["xla_refusal"]
    for r in jobs.get("fit").values():
        assert "jit_compile=False" in r["fit_xla_refusal"], r["fit_xla_refusal"]
        print(r["fit_xla_refusal"])


def test_misuse_is_refused_naming_the_tensor(jobs):
    # A codec on an integer tensor (eagerly and in a tf.function), an op other
    # than Average/Sum, an unsupported dtype, a root rank out of range, a
    # DistributedOptimizer around something that is not a Keras optimizer.
    errors = jobs.get("ops")[0]["errors"]
    assert len(errors) == 6, errors
    print("\n".join(errors))


def test_import_without_init_names_the_call():
    # Needs no job: calls before init() raise CortadoError naming the call.
    # cortado.tensorflow.keras has cortado.tensorflow's names (docs/tensorflow.md)
    # but the tape and itself, plus `callbacks`.
    code = ("import cortado.tensorflow as ct, cortado.tensorflow.keras as ck, tensorflow as tf\n"
            "print('ONLY', sorted(set(ct.__all__) ^ set(ck.__all__)))\n"
            "assert all(hasattr(m, n) for m in (ct, ck) for n in m.__all__)\n"
            "try:\n    ct.push_pull(tf.ones(2))\nexcept ct.CortadoError as e:\n"
            "    print('ERR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    want = "ERR cortado.tensorflow.push_pull() was called before cortado.init()"
    assert r.returncode == 0 and want in r.stdout, (r.stdout, r.stderr)
    assert "ONLY ['DistributedGradientTape', 'callbacks', 'keras']" in r.stdout, r.stdout


def test_keras_digits_example(tmp_path):
    # bindings/python/examples/train_digits_keras.py for 3 epochs on 2 workers:
    # one line per epoch from rank 0, and the small CNN already classifies
    # most held-out digits (about 0.97 in the runs so far).
    example = conftest.REPO / "bindings" / "python" / "examples" / "train_digits_keras.py"
    cmd = [_cortado_bin(), "launch", "-w", "2", "-s", "1", "--", sys.executable, str(example),
           "--epochs", "3"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               CORTADO_CONNECT_TIMEOUT_MS="240000")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=480, env=env)
    lines = [l for l in r.stdout.splitlines() if l.startswith("epoch ")]
    assert r.returncode == 0 and len(lines) == 3, (r.stdout[-4000:], r.stderr[-4000:])
    accuracy = float(lines[-1].split("test-acc")[1].split()[0])
    print("\n".join(lines))
    assert accuracy > 0.85, lines
