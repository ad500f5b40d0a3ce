#!/usr/bin/env bash
# The main job from a fresh Debian 12 machine: install the dependencies,
# build, and run the push-pull benchmark on a local cluster of 2 servers and
# 4 workers. Extra arguments go to `cortado bench pushpull`. It builds only
# what it runs, the `cortado` command, with the tests configured off (the
# test command, scripts/test.sh, configures and builds them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
CORTADO_BUILD_TARGETS=cortado bash scripts/build.sh -DCORTADO_WITH_TESTS=OFF
exec build/launcher/cortado bench pushpull -w 4 -s 2 "$@"
