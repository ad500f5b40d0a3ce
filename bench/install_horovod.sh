#!/usr/bin/env bash
# Installs Horovod 0.28.1 from PyPI into the project's virtual environment, so
# that the training benchmark (bench/train.sh) can run Horovod with Gloo as a
# peer (issue 33). Horovod is built from its source package against Debian's
# torch 1.13 (python3-torch, seen through --system-site-packages) with Gloo for
# CPU operations and without MPI, TensorFlow and MXNet. Not part of the test
# command; the benchmark skips Horovod where it is not installed.
#
#   bench/install_horovod.sh [--force]
#
#   CORTADO_VENV   the virtual environment (default <repo>/.venv; made from
#                  /usr/bin/python3 with --system-site-packages if missing)
#   MAKEFLAGS      passed to Horovod's build (default -j2: Horovod's own default
#                  is -j8, too much for a 2-core machine)
#
# Idempotent: does nothing when the environment already imports horovod.torch
# 0.28.1 with Gloo built (--force rebuilds). The build takes 20-40 minutes on
# 2 cores. As root for the apt step (skipped when the packages are present).
set -Eeuo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${CORTADO_VENV:-$here/.venv}
version=0.28.1
force=""
while (($#)); do
  case $1 in
    --force) force=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/install_horovod.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done

check() {
  "$venv/bin/python" - "$version" <<'EOF' 2>/dev/null
import sys
import horovod
import horovod.torch as hvd
ok = horovod.__version__ == sys.argv[1] and hvd.gloo_built()
print(f"horovod {horovod.__version__} (gloo {hvd.gloo_built()}, mpi {hvd.mpi_built()})")
sys.exit(0 if ok else 1)
EOF
}

# Debian's packages the build needs: a compiler, CMake, Python's headers, and
# torch with its C++ headers (libtorch-dev).
need=()
for p in g++ make cmake python3-dev python3-venv python3-torch libtorch-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  echo "install_horovod: apt-get install ${need[*]}" >&2
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

if [[ ! -x $venv/bin/python ]]; then
  echo "install_horovod: creating $venv (from /usr/bin/python3, --system-site-packages)" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "install_horovod: $venv does not import torch; it must be made from /usr/bin/python3 with --system-site-packages (Debian's python3-torch)" >&2
  exit 1
fi

if [[ -z $force ]] && check; then
  echo "install_horovod: already installed in $venv" >&2
  exit 0
fi

# Debian's torch is 1.13 and built against numpy 1.x: keep numpy below 2.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo 'numpy<2' >"$constraints"
# Build-time modules, without build isolation: the build must see Debian's
# torch, which PyPI's isolated build environment would not.
"$venv/bin/python" -m pip install -q -c "$constraints" setuptools wheel packaging

# The GPU toolkit that may be on the machine stays out: Horovod enables CUDA
# when nvcc is on PATH, and Debian's torch is CPU-only.
path=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd: -)
start=$(date +%s)
echo "install_horovod: building horovod==$version (MAKEFLAGS=${MAKEFLAGS:--j2})" >&2
env PATH="$path" MAKEFLAGS="${MAKEFLAGS:--j2}" \
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo \
  HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  "$venv/bin/python" -m pip install -v --no-build-isolation --no-cache-dir \
  ${force:+--force-reinstall --no-deps} -c "$constraints" "horovod==$version"
echo "install_horovod: built in $(($(date +%s) - start)) s" >&2
check
