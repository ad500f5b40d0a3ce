"""Shared pieces of the Python binding tests.

The tests run under ctest (tests/python/CMakeLists.txt sets PYTHONPATH to the
build's bindings/python and CORTADO_BIN to the launcher). By hand:

    PYTHONPATH=build/bindings/python CORTADO_BIN=build/launcher/cortado \
        /usr/bin/python3 -m pytest -q tests/python

Importing the core here makes a missing or broken build an error of the whole
run, never a skip.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

import cortado._C  # noqa: F401  (fails the run when the bindings did not build)

HERE = pathlib.Path(__file__).resolve().parent
WORKERS = HERE / "workers"
REPO = HERE.parent.parent
PYTHON = os.environ.get("CORTADO_TEST_PYTHON", "/usr/bin/python3")


def _cortado_bin():
    explicit = os.environ.get("CORTADO_BIN")
    if explicit:
        return explicit
    for build in ("build", "build-py"):
        candidate = REPO / build / "launcher" / "cortado"
        if candidate.exists():
            return str(candidate)
    raise RuntimeError("set CORTADO_BIN to the cortado launcher (build/launcher/cortado)")


class Job:
    def __init__(self, proc, out_dir, seconds):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.out_dir = out_dir
        self.seconds = seconds

    def results(self):
        """The JSON each worker wrote to <out>/result.<rank>.json, by rank."""
        found = {}
        for f in sorted(self.out_dir.glob("result.*.json")):
            data = json.loads(f.read_text())
            found[data["rank"]] = data
        return found

    def describe(self):
        return (f"exit {self.returncode} after {self.seconds:.1f} s\n--- stdout ---\n"
                f"{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-6000:]}")


@pytest.fixture
def run_job(tmp_path):
    """run_job(workers, servers, script, *args, timeout=120, env=None) -> Job.

    Starts `cortado launch -w W -s S -- /usr/bin/python3 workers/<script>
    --out <dir> args...` (`script` may also be an absolute path; out_arg=False
    leaves out --out) and waits for it, at most `timeout` seconds.
    """
    def run(workers, servers, script, *args, timeout=120, env=None, out_arg=True, launch_args=()):
        out_dir = tmp_path / f"job-{pathlib.Path(script).stem}-{time.monotonic_ns()}"
        out_dir.mkdir()
        cmd = [_cortado_bin(), "launch", "-w", str(workers), "-s", str(servers),
               *[str(a) for a in launch_args], "--", PYTHON, str(WORKERS / script)]
        if out_arg:
            cmd += ["--out", str(out_dir)]
        cmd += [str(a) for a in args]
        full_env = dict(os.environ)
        full_env.setdefault("CORTADO_LOG_LEVEL", "warn")
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env["OMP_NUM_THREADS"] = "1"
        # Four workers importing torch on a busy 2-core machine can take
        # longer than the default 30 s registration window.
        full_env.setdefault("CORTADO_CONNECT_TIMEOUT_MS", "120000")
        if env:
            full_env.update(env)
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=full_env)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"job {' '.join(cmd)} did not end within {timeout} s (a hang)\n"
                        f"stdout: {e.stdout}\nstderr: {e.stderr}")
        return Job(proc, out_dir, time.monotonic() - start)

    return run


def pytest_report_header(config):
    return f"cortado core: {cortado._C.__file__}; launcher: {_cortado_bin()}; python {sys.version.split()[0]}"
