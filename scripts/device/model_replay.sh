#!/usr/bin/env bash
# On the lent GPU machine, from the checkout with its bundle in .devrun:
# the model replay (bench/model.sh) on 4 emulated hosts at 1 Gbit/s.
# Arguments go to bench/model.sh (default: the fused-groups table of
# docs/benchmarks.md, every cell of resnet50, resnet101 and bert-base with
# DGC and EFSignSGD, strategies gpu,cpu,pertensor,plan,mergecomp, 3
# iterations after 1, one round: about 10 minutes on 16 cores, so a call of
# its own with timeout_s 600). JSON lines to $OUT/model.jsonl as each cell
# ends, the log to $OUT/model.err.xz.
set -u
source "$(dirname "$0")/../../.devrun/setup.sh"  # sets D, REPO, OUT
cd "$REPO"
args=("$@")
((${#args[@]})) || args=(--models resnet50,resnet101,bert-base --codecs dgc:ratio=0.01,efsignsgd
                         --iterations 3 --warmup 1 --rounds 1
                         --strategies gpu,cpu,pertensor,plan,mergecomp)
CORTADO=$D/bin/cortado CORTADO_LOG_LEVEL=info bench/model.sh "${args[@]}" --json >"$OUT/model.jsonl" 2>"$OUT/model.err"
echo "bench/model.sh: exit $?"
grep -o '"machines":[0-9]*' "$OUT/model.jsonl" | sort | uniq -c
xz -9 "$OUT/model.err"
