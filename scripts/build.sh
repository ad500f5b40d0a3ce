#!/usr/bin/env bash
# Configures and builds Cortado into build/ (Release). Extra arguments go to
# CMake, e.g. scripts/build.sh -DCORTADO_WITH_CUDA=OFF. CORTADO_BUILD_TARGETS
# (space-separated) builds only those targets, e.g. "cortado" for the
# launcher alone; unset, everything configured is built.
set -euo pipefail
cd "$(dirname "$0")/.."
# Through ccache where it is installed (scripts/install_deps.sh installs it),
# with paths relative to the checkout: a rebuild, and the wheel's build of
# `pip install .` (build-wheel, at the same depth), reuse these objects.
launchers=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD
  launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
             -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launchers[@]}" "$@"
targets=()
for t in ${CORTADO_BUILD_TARGETS:-}; do
  targets+=(--target "$t")
done
# Two compile jobs keep a 2-core, small-memory machine responsive.
cmake --build build -j "${CORTADO_BUILD_JOBS:-2}" "${targets[@]}"
