#!/usr/bin/env bash
# Sourced on the lent GPU machine from a bundle (scripts/device/bundle.sh):
# unpacks Debian 12's OpenMPI and iproute2 beside /, copies them in without
# replacing anything there (under /usr where / is merged), adds the bundle's
# libraries, and makes the checkout reachable at the path compiled into the
# binaries (the planner's data). Sets CORTADO_PLANNER_DATA, LD_LIBRARY_PATH
# (NCCL), OMPI_MCA_plm_rsh_agent (where ssh is missing), D (the bundle), REPO (the checkout) and OUT
# (where the scripts write their logs; made here).
D=${DEVRUN:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
REPO=$(cd "$D/.." && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# Once per machine (the scripts source this file each; run_all.sh first).
if [ ! -e /tmp/cortado-setup.done ]; then
  mkdir -p /tmp/root
  for f in "$D"/debs/*.deb; do
    dpkg-deb -x "$f" /tmp/root 2>/dev/null || (cd /tmp/root && ar p "$f" data.tar.xz | tar xJ)
  done
  for d in bin sbin lib lib64; do
    if [ -L "/$d" ] && [ -d "/tmp/root/$d" ]; then cp -rn "/tmp/root/$d/." "/usr/$d/" 2>/dev/null; rm -rf "/tmp/root/$d"; fi
  done
  cp -rn /tmp/root/* / 2>&1 | grep -v "non-portable\|dangling" | head -3
  cp -nP "$D"/lib/* /usr/lib/x86_64-linux-gnu/ 2>/dev/null
  [ -e /usr/bin/mpirun ] || ln -s orterun /usr/bin/mpirun
  ldconfig
  touch /tmp/cortado-setup.done
fi
[ -e /work/main ] || { mkdir -p /work && ln -s "$REPO" /work/main; }
export CORTADO_PLANNER_DATA=$REPO/scheduler/planner
NCCL_DIR=$(dirname "$(find / -name 'libnccl.so.2*' \( -type f -o -type l \) -not -path '/proc/*' \
  -not -path '*/.debug/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openmpi/lib:$NCCL_DIR:${LD_LIBRARY_PATH:-}"
# OpenMPI's rsh launcher refuses to start, even for ranks on this machine
# alone, when its agent (ssh) is missing, as on the H200 machine of
# 2026-11-28; it never calls the agent for local ranks, so any program will
# do. `cortado launch --hosts --agent` names its own agent and launcher
# (run D2 in docs/benchmarks.md).
command -v ssh >/dev/null || export OMPI_MCA_plm_rsh_agent=/bin/false
