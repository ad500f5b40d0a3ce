#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of Cortado from Debian's
# packages. Safe to run again: apt-get skips what is already installed, and the
# package index is refreshed only when it is older than a day.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi

PACKAGES=(
  # build
  build-essential cmake ninja-build pkg-config git
  # control plane, data plane, collectives
  libboost-dev libboost-system-dev libzmq3-dev cppzmq-dev libucx-dev ucx-utils
  libopenmpi-dev openmpi-bin libssl-dev
  # well-kept libraries
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # bindings and the peer benchmarks
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest
  python3-torch libtorch-dev python3-torchvision python3-sklearn python3-tqdm
  # emulated hosts for multi-machine tests
  iproute2 procps psmisc util-linux iputils-ping iperf3
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
