#!/usr/bin/env bash
# The one prepared call for a lent GPU machine (docs/benchmarks.md, "the lent
# GPU machine"): after scripts/device/bundle.sh here, the device tool runs
#
#   bash scripts/device/run_all.sh        (carry: .devrun; timeout_s 600)
#
# in about 9 minutes (BUDGET_S, default 530 s, bounds it; a machine's start
# takes another 30-40 s of the 15 minutes a lent task has):
# - python_checks.sh's build of the Python package for that machine's
#   Python, in the background from the start;
# - exec_checks.sh: the plan executor on CUDA buffers, half the options
#   (SHARDS, exec_checks.sh);
# - gpu_checks.sh: the CUDA codec tests and the NCCL collective suite in
#   three layouts (and the CUDA codec benchmark when more than 330 s are
#   left, which the default budget never leaves);
# - model_replay.sh: resnet50/DGC replayed on CUDA buffers (the planner's
#   plan against compressing everything on the GPU and on the CPU, each
#   with its prediction), at most 90 s;
# - python_checks.sh: the Python binding's CUDA tests, then resnet50's
#   DistributedOptimizer against DDP with Gloo and with NCCL, with whatever
#   time is left.
# Each stage's logs go into $OUT/logs.tgz as soon as it ends, so a call
# stopped at its limit still brings back what ran; the summaries are also
# printed here.
set -u
real=${OUT:?"OUT: the folder whose files come back (set by the device tool)"}
export OUT=/tmp/cortado-logs
rm -rf "$OUT" && mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
budget=${BUDGET_S:-530}
t0=$(date +%s)
pack() { tar czf "$real/logs.tgz" -C /tmp cortado-logs; }
left() { echo $((budget - ($(date +%s) - t0))); }
atmost() { local l; l=$(left); echo $((l < $1 ? l : $1)); }  # atmost N: min(N, time left)

source "$here/../../.devrun/setup.sh"  # once, before the stages run side by side
echo "### python_checks.sh's build, in the background"
BUILD_ONLY=1 timeout -k 10 "$(atmost 400)" bash "$here/python_checks.sh" >"$OUT/python_build_bg.log" 2>&1 &
build=$!
echo "### exec_checks.sh"
# The replay and the Python stages keep 290 s of the budget.
timeout -k 10 "$(($(left) - 290))" bash "$here/exec_checks.sh" 2>&1 | tee "$OUT/exec_checks.log"
pack
echo "### gpu_checks.sh ($(left) s left)"
bench=
(($(left) > 330)) && bench=1
BENCH=$bench timeout -k 10 "$(atmost $(($(left) - 250)))" bash "$here/gpu_checks.sh" 2>&1 |
  tee "$OUT/gpu_checks.log"
pack
echo "### model_replay.sh ($(left) s left)"
cell=$(atmost $(($(left) - 160)))
((cell > 90)) && cell=90
CELL_S=$cell timeout -k 10 "$((cell + 15))" bash "$here/model_replay.sh" 2>&1 | tee "$OUT/model_replay.log"
pack
echo "### python_checks.sh ($(left) s left; waiting for its build)"
wait "$build"
cat "$OUT/python_build_bg.log"
timeout -k 10 "$(left)" bash "$here/python_checks.sh" 2>&1 | tee "$OUT/python_checks.log"
pack
echo "### done in $(($(date +%s) - t0)) s"
