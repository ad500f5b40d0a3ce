#!/usr/bin/env bash
# The main job from a fresh Debian 12 machine: install the dependencies,
# build, and run the push-pull benchmark on a local cluster of 2 servers and
# 4 workers. Extra arguments go to `cortado bench pushpull`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
exec build/launcher/cortado bench pushpull -w 4 -s 2 "$@"
