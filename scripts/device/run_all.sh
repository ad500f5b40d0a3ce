#!/usr/bin/env bash
# The one prepared call for a lent GPU machine (docs/benchmarks.md, "the lent
# GPU machine"): after scripts/device/bundle.sh here, the device tool runs
#
#   bash scripts/device/run_all.sh        (carry: .devrun)
#
# which runs exec_checks.sh (the plan executor on CUDA buffers, every
# option), then gpu_checks.sh (the CUDA codec tests, the NCCL collective
# suite in three layouts) and, when BUDGET_S (default 500) leaves time for
# it, the CUDA codec benchmark. Each stage's logs go into $OUT/logs.tgz as
# soon as it ends, so a call stopped at its limit still brings back what
# ran; the summaries are also printed here.
set -u
real=${OUT:?"OUT: the folder whose files come back (set by the device tool)"}
export OUT=/tmp/cortado-logs
rm -rf "$OUT" && mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
budget=${BUDGET_S:-500}
t0=$(date +%s)
pack() { tar czf "$real/logs.tgz" -C /tmp cortado-logs; }
left() { echo $((budget - ($(date +%s) - t0))); }

echo "### exec_checks.sh"
timeout -k 10 "$(left)" bash "$here/exec_checks.sh" 2>&1 | tee "$OUT/exec_checks.log"
pack
echo "### gpu_checks.sh ($(left) s left)"
bench=
(($(left) > 330)) && bench=1
BENCH=$bench timeout -k 10 "$(left)" bash "$here/gpu_checks.sh" 2>&1 | tee "$OUT/gpu_checks.log"
pack
echo "### done in $(($(date +%s) - t0)) s"
