#!/usr/bin/env bash
# The model-replay benchmark of issue 8 on emulated hosts (tests/testbed/testbed.sh):
# `cortado bench model` for every model x codec on H hosts with 1 worker and
# 1 server each, links shaped at --rate, launched from host 1 as on a head
# node. Prints each run's table (and JSON lines with --json) on stdout,
# progress on stderr. As root.
#
#   bench/model.sh [--models resnet101,bert-base] [--codecs dgc:ratio=0.01,efsignsgd]
#                  [--hosts 4] [--rate 1gbit] [--iterations 5] [--warmup 1]
#                  [--compute-scale 1] [--rounds 1] [--probe-once] [--strategies none,gpu,cpu,pertensor,plan] [--json]
#                  [--gravac codec=topk,window=5,...]   (the gravac strategy's settings: GraVAC in the executor,
#                  one batch per iteration, re-planned by the planner with the measured costs at a 2x CF move)
#                  [--plot FILE]   (a PNG of every cell's measured and predicted times; implies --json)
#                  (strategies: docs/model_bench.md; plan is the planner's plan with Cupcake's fused
#                  groups, pertensor the same without groups, mergecomp the options and groups MergeComp's
#                  search finds by timing iterations (the best compress-everything option of each codec
#                  device and path between machines, priced in groups). CORTADO_FUSION_BYTES defaults to 0
#                  here: the plan's groups take the place of fusion by size, which the group search does not
#                  compose with)
#                  (with replan among the strategies: CORTADO_PROFILE_WINDOW, default 3, and
#                  CORTADO_REPLAN_CODEC, default the run's codec, are set for the job)
#                  [--sync-skew auto|off|US,FRACTION]   (the workers' skew in the predictions:
#                                   cortado bench model --sync-skew; default auto, measured at start-up)
#                  [--trace DIR]   (per run under DIR/<model>-<codec>/: the stage traces in run/,
#                                   the predicted timelines predicted.json (plan) and
#                                   predicted-<strategy>.json; compare with `cortado trace compare`)
set -Eeuo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
CORTADO=${CORTADO:-$here/build/launcher/cortado}
TB=$here/tests/testbed/testbed.sh
PROG=model.sh
# shellcheck source=bench/lib_testbed.sh
source "$here/bench/lib_testbed.sh"  # codec_threads_per_host
models=resnet101,bert-base codecs=dgc:ratio=0.01,efsignsgd hosts=4 rate=1gbit
iterations=5 warmup=1 rounds=1 scale=1 strategies=none,gpu,cpu,pertensor,plan json="" trace="" once="" plot="" gravac="" skew=""
while (($#)); do
  case $1 in
    --models) models=$2; shift 2 ;;
    --codecs) codecs=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --iterations) iterations=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --compute-scale) scale=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --strategies) strategies=$2; shift 2 ;;
    --gravac) gravac=$2; shift 2 ;;
    --json) json=--json; shift ;;
    --plot) plot=$(realpath -m "$2"); json=--json; shift 2 ;;
    --probe-once) once=--probe-once; shift ;;
    --trace) trace=$(realpath -m "$2"); shift 2 ;;
    --sync-skew) skew=$2; shift 2 ;;
    *) echo "bench/model.sh: unknown option '$1' (see the header of this file)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "bench/model.sh: the emulated hosts need root" >&2; exit 2; }
[[ -z $plot ]] || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
  { echo "bench/model.sh: --plot needs matplotlib (scripts/install_deps.sh installs python3-matplotlib)" >&2; exit 2; }
lines=$(mktemp)
[[ -x $CORTADO ]] || { echo "bench/model.sh: build first (ninja -C build cortado), or set CORTADO" >&2; exit 2; }
# A testbed name of its own (8 characters at most): "bmodel" + the first two
# digits of the PID let two runs whose PIDs share them take down each
# other's hosts.
NAME=m$(printf '%07x' $(( (($$ << 15) ^ RANDOM) & 0xfffffff )))
trap '"$TB" down "$NAME" >/dev/null 2>&1 || true; rm -f "$lines"' EXIT
"$TB" up "$NAME" "$hosts" --rate "$rate" >/dev/null
list=$(seq -s, -f "$NAME-h%g" 1 "$hosts")
codec_threads=${CORTADO_CODEC_THREADS:-$(codec_threads_per_host "$hosts")}
echo "# bench/model.sh: $(date -u +%F), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load $(cut -d' ' -f1-3 /proc/loadavg), $hosts hosts at $rate, 1 worker + 1 server each"
IFS=, read -ra M <<<"$models"
IFS=, read -ra C <<<"$codecs"
for m in "${M[@]}"; do
  for c in "${C[@]}"; do
    echo "## $m, $c" >&2
    targs=()
    pargs=()
    if [[ -n $trace ]]; then
      mkdir -p "$trace/$m-${c%%:*}"
      targs=(--trace "$trace/$m-${c%%:*}/run")
      pargs=(--predicted-trace "$trace/$m-${c%%:*}/predicted.json")
    fi
    # replan: online profiling for the job, the scheduler re-plans with this run's codec.
    renv=()
    [[ ,$strategies, == *,replan,* ]] &&
      renv=(CORTADO_PROFILE_WINDOW="${CORTADO_PROFILE_WINDOW:-3}" CORTADO_REPLAN_CODEC="${CORTADO_REPLAN_CODEC:-$c}")
    env "${renv[@]}" CORTADO_FUSION_BYTES="${CORTADO_FUSION_BYTES:-0}" CORTADO_CODEC_THREADS="$codec_threads" CORTADO_LOG_LEVEL=${CORTADO_LOG_LEVEL:-warn} "$TB" exec "$NAME" 1 timeout -s KILL 3000 \
      "$CORTADO" launch --hosts "$list" -w 1 -s 1 --agent "$TB exec-host {host}" "${targs[@]}" -- \
      "$CORTADO" bench model --profile "$m" --codec "$c" --strategies "$strategies" \
      --iterations "$iterations" --warmup "$warmup" --rounds "$rounds" --compute-scale "$scale" "${pargs[@]}" \
      ${gravac:+--gravac "$gravac"} ${skew:+--sync-skew "$skew"} $json $once |
      tee -a "$lines"
  done
done
if [[ -n $plot ]]; then
  /usr/bin/python3 "$here/bench/plot_figures.py" --run replay "$lines" "$plot" \
    --note "$hosts emulated hosts at $rate, $(date -u +%F)"
fi
