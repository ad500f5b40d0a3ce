#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of Cortado: Debian's
# packages, then the PyPI packages of the TensorFlow binding (pinned in
# scripts/requirements-tensorflow.txt) and of `pip install .`'s build
# (scikit-build-core, scripts/requirements-build.txt) into a virtual
# environment made from /usr/bin/python3 with --system-site-packages, so
# that it still sees Debian's torch and NumPy. The environment is
# CORTADO_VENV (default: .venv in the repository). Safe to run again:
# apt-get skips what is already installed, the package index is refreshed
# only when it is older than a day, and pip runs only when a pinned package
# is missing or at another version.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi

PACKAGES=(
  # build
  build-essential cmake ninja-build pkg-config git ccache
  # control plane, data plane, collectives
  libboost-dev libboost-system-dev libzmq3-dev cppzmq-dev libucx-dev ucx-utils
  libopenmpi-dev openmpi-bin libssl-dev
  # well-kept libraries
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # bindings and the peer benchmarks
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest python3-venv
  python3-torch libtorch-dev python3-torchvision python3-sklearn python3-tqdm
  # the benchmarks' plots (bench/plot_figures.py)
  python3-matplotlib
  # the language model example's corpus (bindings/python/examples/train_lm.py):
  # the King James Bible, bible-kjv-text, printed by bible-kjv's `bible`
  bible-kjv
  # emulated hosts for multi-machine tests
  iproute2 procps psmisc util-linux iputils-ping iperf3
  # Slurm (cortado launch inside an allocation; tests/slurm runs its own
  # munged, slurmctld and slurmd with a generated configuration)
  slurmd slurmctld slurm-client munge
  # fuzzing
  clang libclang-rt-14-dev
  # developer checks: scripts/tidy.sh, git clang-format
  clang-tidy clang-format
)

stamp=/var/lib/apt/periodic/update-success-stamp
lists_age=999999
if [[ -d /var/lib/apt/lists ]] && compgen -G "/var/lib/apt/lists/*Packages*" >/dev/null; then
  newest=$(stat -c %Y /var/lib/apt/lists/*Packages* 2>/dev/null | sort -n | tail -1)
  lists_age=$(( $(date +%s) - newest ))
fi
if (( lists_age > 86400 )); then
  $SUDO apt-get update
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if (( ${#missing[@]} )); then
  echo "cortado: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "cortado: all dependencies are installed"
fi

# The TensorFlow binding's packages and the wheel build's, from PyPI, into
# the virtual environment.
venv=${CORTADO_VENV:-$repo/.venv}
requirements=$repo/scripts/requirements-tensorflow.txt
build_requirements=$repo/scripts/requirements-build.txt
if [[ ! -x $venv/bin/python ]]; then
  echo "cortado: creating the virtual environment $venv (/usr/bin/python3, --system-site-packages)"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# Every pinned package at its version? (importlib.metadata reads what pip
# installed; a second run finds them all and skips pip.)
if "$venv/bin/python" - "$requirements" "$build_requirements" <<'PY'
import importlib.metadata as md, re, sys
wrong = []
for line in (l for f in sys.argv[1:] for l in open(f)):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, version = re.split(r"==", line)
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have != version:
        wrong.append(f"{name} {have or 'missing'} (want {version})")
import numpy
if int(numpy.__version__.split(".")[0]) >= 2:
    wrong.append(f"numpy {numpy.__version__} (want <2)")
if wrong:
    print("cortado: python packages to install: " + ", ".join(wrong))
    sys.exit(1)
PY
then
  echo "cortado: the python packages of $requirements and $build_requirements are installed in $venv"
else
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --only-binary=:all: \
    -r "$requirements" -r "$build_requirements" "numpy<2"
fi
# Tells the tests that this step ran: from here on, a TensorFlow that does
# not import fails them instead of skipping them.
cp "$requirements" "$venv/cortado-requirements.txt"
