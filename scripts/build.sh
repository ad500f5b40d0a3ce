#!/usr/bin/env bash
# Configures and builds Cortado into build/ (Release). Extra arguments go to
# CMake, e.g. scripts/build.sh -DCORTADO_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
# Two compile jobs keep a 2-core, small-memory machine responsive.
cmake --build build -j "${CORTADO_BUILD_JOBS:-2}"
