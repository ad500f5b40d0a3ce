#!/usr/bin/env bash
# Every test from a fresh Debian 12 machine: install the dependencies, build
# (tests and bindings required, not optional), and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh -DCORTADO_WITH_TESTS=ON -DCORTADO_WITH_PYTHON=ON
ctest --test-dir build --output-on-failure -j 2 --timeout 600
