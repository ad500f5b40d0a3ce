"""`pip install` of Cortado's wheel, for real: builds the wheel from this
checkout with `pip wheel --no-build-isolation` (scikit-build-core, CMake,
Debian's ninja; ccache when installed), installs it into a fresh virtual
environment made from /usr/bin/python3 with --system-site-packages (Debian's
torch and NumPy), and from a folder outside the checkout, with no PYTHONPATH,
CORTADO_BIN or CORTADO_PLANNER_DATA, imports cortado.torch, runs the
installed `cortado plan` and a `cortado launch -w 2 -s 1` job whose workers
check their sums against a plain sum (pip_worker.py).

Run by ctest (tests/install/CMakeLists.txt) with
  CORTADO_SOURCE_DIR   the checkout to build
  CORTADO_BUILD_DIR    the CMake build the test belongs to (its package is
                       checked to find that build's launcher)
  CORTADO_WHEEL_BUILD  the wheel's CMake build folder, kept between runs so
                       that a second run rebuilds only what changed
  CORTADO_VENV         the environment that builds it (scikit-build-core is
                       installed there by scripts/install_deps.sh)
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = pathlib.Path(os.environ.get("CORTADO_SOURCE_DIR", HERE.parent.parent)).resolve()
VENV = pathlib.Path(os.environ.get("CORTADO_VENV") or SOURCE / ".venv")
WHEEL_BUILD = pathlib.Path(os.environ.get("CORTADO_WHEEL_BUILD") or SOURCE / "build-wheel")
CMAKE_BUILD = pathlib.Path(os.environ.get("CORTADO_BUILD_DIR") or SOURCE / "build")


def run(cmd, timeout, **kwargs):
    """Runs cmd, fails the test with its output when it fails or runs out of time."""
    start = time.monotonic()
    try:
        p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{' '.join(map(str, cmd))} ran past {timeout} s:\n{out[-6000:]}")
    took = time.monotonic() - start
    print(f"$ {' '.join(map(str, cmd))}  # {took:.1f} s, exit {p.returncode}")
    if p.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout[-8000:]}")
    return p.stdout


def clean_env(**extra):
    """The environment of a user who only ran `pip install`: none of the
    variables that point Cortado at a build tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CORTADO_BIN", "CORTADO_PLANNER_DATA", "VIRTUAL_ENV",
                        "PYTHONHOME", "CORTADO_TEST_PYTHON")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no virtual environment at {VENV}: run scripts/install_deps.sh")
    probe = subprocess.run([python, "-c", "import scikit_build_core"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail(f"{python} has no scikit-build-core: run scripts/install_deps.sh")
    dist = tmp_path_factory.mktemp("dist")
    settings = [f"--config-settings=build-dir={WHEEL_BUILD}"]
    env = clean_env()
    if shutil.which("ccache"):
        for lang in ("C", "CXX", "CUDA"):
            settings.append(f"--config-settings=cmake.define.CMAKE_{lang}_COMPILER_LAUNCHER=ccache")
        # Paths relative to the checkout: a cache filled from one checkout
        # serves another at any other place.
        env["CCACHE_BASEDIR"] = str(SOURCE)
        # And the compilers of the CMake build this test belongs to: pip's
        # build would otherwise take the interpreter's (x86_64-linux-gnu-g++
        # for /usr/bin/c++, the same compiler under another name, which
        # ccache counts as another compiler: every object compiled again,
        # 439 s instead of about a minute on the 2-core VM).
        cache = CMAKE_BUILD / "CMakeCache.txt"
        if cache.exists():
            for line in cache.read_text(encoding="utf-8").splitlines():
                for lang in ("C", "CXX", "CUDA"):
                    key = f"CMAKE_{lang}_COMPILER:"
                    if line.startswith(key) and "=" in line and line.split("=", 1)[1]:
                        settings.append(f"--config-settings=cmake.define.CMAKE_{lang}_COMPILER="
                                        f"{line.split('=', 1)[1]}")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir",
         "--disable-pip-version-check", "-w", dist, *settings, SOURCE],
        timeout=1500, env=env, cwd=dist)
    wheels = list(dist.glob("cortado-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh environment from /usr/bin/python3 with the wheel installed
    (offline: NumPy, its one dependency, is Debian's)."""
    where = tmp_path_factory.mktemp("venv") / "env"
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", where], timeout=120)
    run([where / "bin" / "python", "-m", "pip", "install", "--no-index", "--no-cache-dir",
         "--disable-pip-version-check", wheel], timeout=300, env=clean_env())
    return where


def test_wheel_contents(wheel):
    """The package, the extension module, the command and the planner's data,
    each where pip installs it; no file names a path of this checkout or of
    the wheel's build folder."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        data = ".data/"
        assert "cortado/__init__.py" in names
        assert "cortado/torch/__init__.py" in names
        assert "cortado/tensorflow/__init__.py" in names
        assert "cortado/paths.py" in names
        assert any(n.startswith("cortado/_C.") and n.endswith(".so") for n in names), names
        assert any(n.endswith(data + "scripts/cortado") for n in names), names
        assert any(n.endswith(data + "data/share/cortado/planner/costs/hardware.json")
                   for n in names), names
        assert any(n.endswith(data + "data/share/cortado/planner/profiles/resnet50.json")
                   for n in names), names
        for n in names:
            content = z.read(n)
            for path in (SOURCE, WHEEL_BUILD):
                assert str(path).encode() not in content, f"{n} names {path}"


def test_import_and_paths(venv, tmp_path):
    """import cortado.torch from the installed package, which finds its own
    command and planner data under the environment's prefix."""
    out = run([venv / "bin" / "python", "-c",
               "import json, cortado, cortado.paths, cortado.torch; print(json.dumps("
               "[cortado.__file__, cortado.paths.command(), cortado.paths.planner_data()]))"],
              timeout=180, env=clean_env(), cwd=tmp_path)
    package, command, data = json.loads(out.strip().splitlines()[-1])
    prefix = venv.resolve()
    assert pathlib.Path(package).resolve().is_relative_to(prefix), package
    assert pathlib.Path(command) == prefix / "bin" / "cortado"
    assert pathlib.Path(data) == prefix / "share" / "cortado" / "planner"


def test_installed_command_plans(venv, tmp_path):
    """The installed `cortado plan` reads the installed cost models and
    profiles (found from the command's own path)."""
    out = run([venv / "bin" / "cortado", "plan", "--model", "resnet50", "--codec",
               "dgc:ratio=0.01", "--machines", "2", "--json"],
              timeout=300, env=clean_env(), cwd=tmp_path)
    plan = json.loads(out[out.index("{"):])
    assert len(plan["tensors"]) > 100  # resnet50 has 161 gradient tensors


def test_command_without_data_says_what_to_do(venv, tmp_path):
    """A copy of the command with no planner data next to it falls back to
    nothing of the checkout: `cortado plan` fails naming where it looked and
    what to do."""
    bin_dir = tmp_path / "elsewhere" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(venv / "bin" / "cortado", bin_dir / "cortado")
    p = subprocess.run([bin_dir / "cortado", "plan", "--model", "resnet50"], capture_output=True,
                       text=True, timeout=120, env=clean_env(), cwd=tmp_path)
    assert p.returncode != 0, p.stdout
    assert "planner's data" in p.stderr, p.stderr
    # The one place it looked: next to the command (none compiled in).
    tried = p.stderr.split(" is not in ", 1)[1].split(": install", 1)[0]
    assert tried == str(tmp_path / "elsewhere" / "share" / "cortado" / "planner"), p.stderr
    assert "CORTADO_PLANNER_DATA" in p.stderr and "pip install" in p.stderr, p.stderr


def test_environment_comes_first(venv, tmp_path):
    """CORTADO_BIN and CORTADO_PLANNER_DATA override the installed copies; a
    data folder without the cost models makes Compression.auto raise
    CortadoError naming the missing file (no crash)."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    code = ("import json, cortado, cortado.paths\n"
            "r = [cortado.paths.command(), cortado.paths.planner_data()]\n"
            "try:\n"
            "    cortado.Compression.auto.plan([('w', 1000, 4)], 2)\n"
            "    r.append('planned')\n"
            "except cortado.CortadoError as e:\n"
            "    r.append(str(e))\n"
            "print(json.dumps(r))\n")
    out = run([venv / "bin" / "python", "-c", code], timeout=180, cwd=tmp_path,
              env=clean_env(CORTADO_BIN="/opt/other/cortado", CORTADO_PLANNER_DATA=str(empty)))
    command, data, planned = json.loads(out.strip().splitlines()[-1])
    assert command == "/opt/other/cortado"
    assert data == str(empty)
    assert str(empty / "costs" / "hardware.json") in planned, planned


def test_build_tree_package_finds_the_build(venv, tmp_path):
    """The package used from the CMake build (PYTHONPATH) finds the build's
    launcher and leaves the planner data to the C++ default, though the
    environment it runs in has an installed copy of cortado (whose files it
    must not take)."""
    package = CMAKE_BUILD / "bindings" / "python"
    if not (package / "cortado" / "paths.py").exists():
        pytest.fail(f"no built package in {package}: build the target cortado_python")
    out = run([venv / "bin" / "python", "-c",
               "import json, cortado, cortado.paths as p; "
               "print(json.dumps([cortado.__file__, p.command(), p.planner_data()]))"],
              timeout=120, env=clean_env(PYTHONPATH=str(package)), cwd=tmp_path)
    init, command, data = json.loads(out.strip().splitlines()[-1])
    assert pathlib.Path(init).resolve() == (package / "cortado" / "__init__.py").resolve()
    assert pathlib.Path(command) == CMAKE_BUILD / "launcher" / "cortado"
    assert data is None


def test_launch_job(venv, tmp_path):
    """cortado launch -w 2 -s 1 -- python pip_worker.py, all from the
    environment (PATH), none from the checkout's build."""
    worker = tmp_path / "pip_worker.py"
    shutil.copy(HERE / "pip_worker.py", worker)  # the script too is outside the checkout
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = clean_env(PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                    CORTADO_LOG_LEVEL="warn", CORTADO_CONNECT_TIMEOUT_MS="180000")
    run(["cortado", "launch", "-w", "2", "-s", "1", "--", "python", worker, "--out", out_dir],
        timeout=300, env=env, cwd=tmp_path)
    results = {json.loads(f.read_text())["rank"]: json.loads(f.read_text())
               for f in out_dir.glob("result.*.json")}
    assert sorted(results) == [0, 1], results
    prefix = venv.resolve()
    for r in results.values():
        assert r["world"] == 2
        assert r["torch_ok"] and r["numpy_ok"], r
        assert pathlib.Path(r["prefix"]).resolve() == prefix, r
        assert pathlib.Path(r["package"]).is_relative_to(prefix), r
        assert pathlib.Path(r["command"]) == prefix / "bin" / "cortado", r
        assert pathlib.Path(r["planner_data"]) == prefix / "share" / "cortado" / "planner", r
        assert r["auto_codec"], r


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
