#!/usr/bin/env bash
# On the lent GPU machine, from the checkout with its bundle in .devrun: the
# model replay (`cortado bench model`) on CUDA buffers, Espresso's claim:
# does a plan that puts some encodes on the CPU beat compressing everything
# on the GPU and everything on the CPU, and how close is its prediction?
#
# Default (MODE=device): CORTADO_DEVICE=cuda, 4 ranks on the one GPU as 2
# machines x 2 (CORTADO_FAKE_HOST_SIZE=2; each rank its own machine to NCCL),
# 2 servers, loopback; for each of MODELS (default resnet50) x CODECS
# (default dgc:ratio=0.01) the strategies gpu (every tensor compressed on the
# GPU), cpu (every tensor compressed on the CPU, after a copy to pinned
# memory) and plan (the planner's plan with the device's measured codec,
# copies and NCCL collectives), ITERATIONS (3) timed after 1 warm-up. Each
# cell's JSON lines to $OUT/device_replay.jsonl, its plan to
# $OUT/plan-<model>-<codec>.json, its log to $OUT/device_replay.err; one
# summary line per cell here: each strategy's measured and predicted ms, the
# plan's encodes by device, and plan / best compress-everything. About 60-90 s
# a cell on 16 cores. REPLAY_DEVICE=queued runs the same on the host device
# with queued streams (--queued-streams: the CUDA path's copies and probes on
# host memory), to check this script on a machine without a GPU.
#
# MODE=hosts: the replay on host buffers over 4 emulated hosts at 1 Gbit/s
# (bench/model.sh; arguments go to it; default: the fused-groups table of
# docs/benchmarks.md, about 10 minutes on 16 cores, a call of its own with
# timeout_s 600), JSON lines to $OUT/model.jsonl, the log to $OUT/model.err.xz.
# With CORTADO_DEVICE=cuda in the environment the workers there run on CUDA
# buffers too (every rank on the one GPU, each a host of its own to NCCL,
# over the emulated links): Espresso's claim where the links are slow enough
# for compression to pay, e.g.
#   CORTADO_DEVICE=cuda MODE=hosts model_replay.sh --models resnet50 \
#       --codecs dgc:ratio=0.01 --strategies gpu,cpu,plan --iterations 3
set -u
source "$(dirname "$0")/../../.devrun/setup.sh"  # sets D, REPO, OUT
cd "$REPO"
if [[ ${MODE:-device} == hosts ]]; then
  args=("$@")
  ((${#args[@]})) || args=(--models resnet50,resnet101,bert-base --codecs dgc:ratio=0.01,efsignsgd
                           --iterations 3 --warmup 1 --rounds 1
                           --strategies gpu,cpu,pertensor,plan,mergecomp)
  CORTADO=$D/bin/cortado CORTADO_LOG_LEVEL=info bench/model.sh "${args[@]}" --json >"$OUT/model.jsonl" 2>"$OUT/model.err"
  echo "bench/model.sh: exit $?"
  grep -o '"machines":[0-9]*' "$OUT/model.jsonl" | sort | uniq -c
  xz -9 "$OUT/model.err"
  exit 0
fi
device=(CORTADO_DEVICE=cuda) queued=()
[[ ${REPLAY_DEVICE:-cuda} == queued ]] && device=(CORTADO_DEVICE=host) queued=(--queued-streams)
IFS=, read -ra models <<<"${MODELS:-resnet50}"
IFS=, read -ra codecs <<<"${CODECS:-dgc:ratio=0.01}"
for model in "${models[@]}"; do
  for codec in "${codecs[@]}"; do
    tag="$model-${codec//[:=]/_}"
    echo "### $model / $codec on ${REPLAY_DEVICE:-cuda} buffers"
    env "${device[@]}" CORTADO_FAKE_HOST_SIZE=2 CORTADO_LOG_LEVEL=warn NCCL_DEBUG=WARN \
      timeout -k 10 "${CELL_S:-240}" "$D/bin/cortado" launch --mpi -w 4 -s 2 -- \
      "$D/bin/cortado" bench model --profile "$model" --codec "$codec" --strategies gpu,cpu,plan \
      --iterations "${ITERATIONS:-3}" --warmup 1 --plan-out "$OUT/plan-$tag.json" --json "${queued[@]}" \
      >"$OUT/replay-$tag.jsonl" 2>>"$OUT/device_replay.err"
    echo "exit $?"
    cat "$OUT/replay-$tag.jsonl" >>"$OUT/device_replay.jsonl"
    python3 - "$OUT/replay-$tag.jsonl" "$OUT/plan-$tag.json" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    if r.get("summary"):
        print("  summary:", {k: v for k, v in r.items() if k not in ("summary", "model", "codec")})
    else:
        print("  %-5s measured %8.1f ms  predicted %s  %s  device %s" % (
            r["strategy"], r["measured_ms"],
            "%.1f ms" % r["predicted_ms"] if r.get("predicted_ms") else "-",
            "WRONG %d" % r["wrong_elements"] if r["wrong_elements"] else "ok",
            r.get("device")))
try:
    plan = json.load(open(sys.argv[2]))
    count = {}
    for opt in plan["tensors"].values():
        for s in opt["steps"]:
            if s.get("op") == "encode":
                count[s["device"]] = count.get(s["device"], 0) + 1
    print("  plan's encodes by device:", count or "none (nothing compressed)")
except (OSError, ValueError, KeyError) as e:
    print("  no plan file:", e)
EOF
  done
done
tail -5 "$OUT/device_replay.err" 2>/dev/null
