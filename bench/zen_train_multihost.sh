#!/usr/bin/env bash
# bench/zen_train.py's click model across emulated hosts (tests/testbed/
# testbed.sh, links shaped with tc tbf at --rate; the machinery of
# bench/zen_multihost.sh and bench/train.sh): 1 worker and 1 server per
# host. One after the other: Cortado's DistributedOptimizer with the
# embedding's gradient through Zen (the default sparse_threshold), the same
# with sparse_threshold=0 (dense push/pull), and DDP with Gloo. Prints the
# markdown table with the date, the command and the load average.
#
#   bench/zen_train_multihost.sh [--rate R] [--hosts H] [--rows N] [--steps N] [--build DIR]
#                                [--plot FILE]   (as root; --plot: samples/s as a PNG, matplotlib)
set -Eeuo pipefail

PROG=zen_train_multihost.sh
# shellcheck source=bench/lib_testbed.sh
source "$(dirname "$0")/lib_testbed.sh"
RATE=1gbit HOSTS=4 ROWS=500000 STEPS=20 BUILD=$ROOT/build NAME=zt$(($$ % 100000)) PLOT=""
while (($#)); do
  case $1 in
    --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
    --hosts) HOSTS=${2:?--hosts needs a value}; shift 2 ;;
    --rows) ROWS=${2:?--rows needs a value}; shift 2 ;;
    --steps) STEPS=${2:?--steps needs a value}; shift 2 ;;
    --build) BUILD=${2:?--build needs a value}; shift 2 ;;
    --plot) PLOT=$(realpath -m "${2:?--plot needs a value}"); shift 2 ;;
    -h | --help) usage 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ $HOSTS =~ ^[2-8]$ ]] || die "--hosts must be 2 to 8 (got '$HOSTS')"
[[ $ROWS =~ ^[0-9]+$ && $STEPS =~ ^[0-9]+$ ]] || die "--rows and --steps must be numbers"
[[ $(id -u) -eq 0 ]] || die "must run as root: the emulated hosts are network namespaces"
CORTADO=$BUILD/launcher/cortado
[[ -x $CORTADO ]] || die "$CORTADO is missing: build it first"
PY=/usr/bin/python3
[[ -z $PLOT ]] || "$PY" -c 'import matplotlib' 2>/dev/null ||
  die "--plot needs matplotlib (scripts/install_deps.sh installs Debian's python3-matplotlib)"
SCRIPT=$HERE/zen_train.py
OUT=$(mktemp -d)
bench_cleanup_after() { rm -rf "$OUT"; }
tb_traps

tb_up "$HOSTS" "$RATE" >"$OUT/hosts"
HOST_LIST=$(tb_hosts 1 "$HOSTS")
ADDR1=$(awk '$1 == 1 { print $3 }' "$OUT/hosts")
ARGS=(--workers "$HOSTS" --servers "$HOSTS" --rows "$ROWS" --steps "$STEPS")
export PYTHONPATH=$BUILD/bindings/python OMP_NUM_THREADS=1 CORTADO_LOG_LEVEL=warn
BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for run in zen dense; do
  extra=()
  [[ $run == dense ]] && extra=(--threshold 0)
  echo "# $run" >&2
  "$TB" exec "$NAME" 1 timeout -s KILL 1200 "$CORTADO" launch --hosts "$HOST_LIST" -w 1 -s 1 \
    --agent "$TB exec-host {host}" -- \
    env PYTHONPATH="$PYTHONPATH" OMP_NUM_THREADS=1 "$PY" "$SCRIPT" --role cortado --out "$OUT/$run.json" \
    "${ARGS[@]}" "${extra[@]}"
done
echo "# ddp" >&2
port=$((20000 + RANDOM % 20000))
pids=()
for ((i = 1; i <= HOSTS; i++)); do
  "$TB" exec "$NAME" "$i" env RANK=$((i - 1)) WORLD_SIZE="$HOSTS" MASTER_ADDR="$ADDR1" \
    MASTER_PORT="$port" GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 timeout -s KILL 1200 \
    "$PY" "$SCRIPT" --role ddp --out "$OUT/ddp.json" "${ARGS[@]}" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
"$PY" "$SCRIPT" --role table --out "$OUT" --load "$BEFORE,$AFTER" \
  --command "bench/zen_train_multihost.sh --rate $RATE --hosts $HOSTS --rows $ROWS --steps $STEPS" "${ARGS[@]}" |
  tee "$OUT/table.md"
[[ -z $PLOT ]] || "$PY" "$HERE/plot_figures.py" --table "$OUT/table.md" "$PLOT" --x run --y samples/s \
  --note "A click model with a $ROWS-row embedding through Zen, dense and DDP, $HOSTS emulated hosts at $RATE"
