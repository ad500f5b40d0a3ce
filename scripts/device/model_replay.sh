#!/usr/bin/env bash
# On the lent GPU machine, from the checkout with its bundle in .devrun:
# issue 8's model replay (bench/model.sh) on 4 emulated hosts at 1 Gbit/s.
# Arguments go to bench/model.sh (default: bert-base and resnet101 with
# EFSignSGD and DGC, strategies gpu,cpu,plan, one round). JSON lines to
# $OUT/model.jsonl as each cell ends, the log to $OUT/model.err.xz.
set -u
source "$(dirname "$0")/../../.devrun/setup.sh"  # sets D, REPO, OUT
cd "$REPO"
args=("$@")
((${#args[@]})) || args=(--models bert-base,resnet101 --codecs efsignsgd,dgc:ratio=0.01 --iterations 3
                         --warmup 1 --rounds 1 --strategies gpu,cpu,plan)
CORTADO=$D/bin/cortado CORTADO_LOG_LEVEL=info bench/model.sh "${args[@]}" --json >"$OUT/model.jsonl" 2>"$OUT/model.err"
echo "bench/model.sh: exit $?"
grep -o '"machines":[0-9]*' "$OUT/model.jsonl" | sort | uniq -c
xz -9 "$OUT/model.err"
