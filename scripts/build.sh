#!/usr/bin/env bash
# Configures and builds Cortado into build/ (Release). Extra arguments go to
# CMake, e.g. scripts/build.sh -DCORTADO_WITH_CUDA=OFF. CORTADO_BUILD_TARGETS
# (space-separated) builds only those targets, e.g. "cortado" for the
# launcher alone; unset, everything configured is built.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
targets=()
for t in ${CORTADO_BUILD_TARGETS:-}; do
  targets+=(--target "$t")
done
# Two compile jobs keep a 2-core, small-memory machine responsive.
cmake --build build -j "${CORTADO_BUILD_JOBS:-2}" "${targets[@]}"
