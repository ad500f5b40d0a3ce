#!/usr/bin/env bash
# The Python training benchmark (issues 32 and 33): synthetic images through a
# torchvision model (bindings/python/examples/benchmark_synthetic.py) with
# Cortado's DistributedOptimizer, DDP with Gloo and Horovod with Gloo, one
# after the other in the same run, on H emulated hosts (tests/testbed/testbed.sh,
# links shaped at --rate, 1 worker per host and the servers beside them as in
# BytePS's layout) or on this machine alone (--local). Every run trains the
# same model from the same seed on the same per-worker batches for the same
# number of steps, so the loss after the last step compares them too.
# Prints a markdown table on stdout (images/sec, the loss, the ratios against
# DDP with Gloo and against one gradient at a time), progress on stderr.
# With --framework tensorflow the same for the TensorFlow binding: a
# keras.applications model (bindings/python/examples/benchmark_synthetic_keras.py)
# through cortado.tensorflow's DistributedGradientTape, against TensorFlow's
# own MultiWorkerMirroredStrategy (ring all-reduce over gRPC).
# As root for the emulated hosts.
#
#   bench/train.sh [options]
#
# Options:
#   --hosts H            emulated hosts, 1 worker each (default 4)
#   --local              no emulated hosts: --workers workers on this machine
#   --workers N          --local: workers (default 4)
#   --servers S          Cortado servers per host (default 1), or in all with --local (default 2)
#   --dedicated-hosts D  Cortado's servers on D more emulated hosts of their own, none
#                        beside the workers (BytePS's layout with CPU machines; `cortado
#                        launch --dedicated-servers`); DDP and Horovod use the H worker
#                        hosts only (default 0: the servers beside the workers)
#   --rate R             link rate, tc syntax (default 1gbit)
#   --framework F        torch (default) or tensorflow: which binding and peers
#   --configs LIST       what to run, in this order (default
#                        cortado-fused,cortado-single,cortado-none,ddp,horovod,horovod-fp16;
#                        with --framework tensorflow cortado-engine,cortado-engine-single,tf-mwms,
#                        and only those three and compute are known there):
#                          cortado-fused   executor, --codec, gradients fused into groups of
#                                          --fusion-bytes (Cupcake's fused compression), no search
#                          cortado-single  executor, --codec, one gradient at a time (fusion_bytes 0)
#                          cortado-search  executor, --codec, MergeComp's online search for the
#                                          groups (the binding's default with a codec)
#                          cortado-none    executor, no compression, fused by --fusion-bytes
#                          cortado-engine  the binding's default path: no executor, --codec,
#                                          gradients fused by size (the binding's fusion_bytes)
#                          cortado-engine-single  the same, one push_pull per gradient
#                                          (fusion_bytes 0)
#                          cortado-engine-cb  cortado-engine with cross_barrier=model: each
#                                          group's update waits for its push_pull in the next
#                                          forward pass, not in step()
#                          ddp             torch DistributedDataParallel with Gloo
#                          compute         no communication: the workers, started together,
#                                          each train alone (the compute bound: no library's
#                                          training on these cores can be faster)
#                          horovod         Horovod's DistributedOptimizer over Gloo
#                          horovod-fp16    the same with hvd.Compression.fp16
#                          tf-mwms         tensorflow: tf.distribute.MultiWorkerMirroredStrategy
#                                          (ring all-reduce over gRPC), the same custom loop
#                        (Horovod runs are skipped, with a line saying so, where
#                        horovod.torch does not import: bench/install_horovod.sh)
#   --codec C            Cortado's codec (default dgc:ratio=0.01)
#   --fusion-bytes B     group size for cortado-fused and cortado-none (default 25M; K/M suffixes)
#   --engine-fusion-bytes B  group size for cortado-engine (default: the binding's,
#                        DEFAULT_ENGINE_FUSION_BYTES, 4 MiB; K/M suffixes)
#   --model M            torchvision model (default resnet18), or with --framework
#                        tensorflow a keras.applications model (default ResNet50)
#   --image-size P       (default 32)    --batch-size B  per worker (default 16)
#   --num-classes K      (default 10)    --data-batches D  per worker, in turn (default 4)
#   --warmup N           untimed steps (default 2)
#   --iters N            timed iterations (default 5) of --steps-per-iter steps (default 2)
#   --threads T          torch threads per worker (default 1)
#   --lr LR              SGD learning rate per worker (default 0.01; times the workers)
#   --seed S             model and data seed (default 0)
#   --rounds R           runs of every configuration, alternating; medians reported (default 1)
#   --run-timeout S      seconds one run may take (default 900)
#   --json FILE          also write every run's result and the table's rows as JSON
#   --plot FILE          also draw the table's images/sec as a PNG (matplotlib)
#   --logs DIR           keep every run's output under DIR
#   --build DIR          Cortado's build directory (default <repo>/build)
#   --python PY          the interpreter for every run (default $CORTADO_VENV/bin/python
#                        where it exists, else /usr/bin/python3)
#   --name NAME          testbed name, 1-8 of [a-z0-9] (default: t + random)
set -Eeuo pipefail

PROG=bench/train.sh
# shellcheck source=bench/lib_testbed.sh
source "$(dirname "$0")/lib_testbed.sh"
BENCH=$ROOT/bindings/python/examples/benchmark_synthetic.py
VENV=${CORTADO_VENV:-$ROOT/.venv}

HOSTS=4 LOCAL="" WORKERS=4 SERVERS="" RATE=1gbit DED=0
CONFIGS=cortado-fused,cortado-single,cortado-none,ddp,horovod,horovod-fp16
CODEC=dgc:ratio=0.01 FUSION=25M ENGINE_FUSION="" MODEL="" IMAGE=32 BATCH=16 CLASSES=10 DATA=4
FRAMEWORK=torch CONFIGS_GIVEN=""
WARMUP=2 ITERS=5 PER_ITER=2 THREADS=1 LR=0.01 SEED=0 ROUNDS=1 RUN_TIMEOUT=900
JSON="" PLOT="" LOGS="" BUILD=$ROOT/build PY="" NAME=t$(printf '%07x' $(((($$ << 15) ^ RANDOM) & 0xfffffff)))

ARGS=("$@")
while (($#)); do
  case $1 in
    --hosts) need_value "$@"; HOSTS=$2; shift 2 ;;
    --local) LOCAL=1; shift ;;
    --workers) need_value "$@"; WORKERS=$2; shift 2 ;;
    --servers) need_value "$@"; SERVERS=$2; shift 2 ;;
    --dedicated-hosts) need_value "$@"; DED=$2; shift 2 ;;
    --rate) need_value "$@"; RATE=$2; shift 2 ;;
    --framework) need_value "$@"; FRAMEWORK=$2; shift 2 ;;
    --configs) need_value "$@"; CONFIGS=$2; CONFIGS_GIVEN=1; shift 2 ;;
    --codec) need_value "$@"; CODEC=$2; shift 2 ;;
    --fusion-bytes) need_value "$@"; FUSION=$2; shift 2 ;;
    --engine-fusion-bytes) need_value "$@"; ENGINE_FUSION=$2; shift 2 ;;
    --model) need_value "$@"; MODEL=$2; shift 2 ;;
    --image-size) need_value "$@"; IMAGE=$2; shift 2 ;;
    --batch-size) need_value "$@"; BATCH=$2; shift 2 ;;
    --num-classes) need_value "$@"; CLASSES=$2; shift 2 ;;
    --data-batches) need_value "$@"; DATA=$2; shift 2 ;;
    --warmup) need_value "$@"; WARMUP=$2; shift 2 ;;
    --iters) need_value "$@"; ITERS=$2; shift 2 ;;
    --steps-per-iter) need_value "$@"; PER_ITER=$2; shift 2 ;;
    --threads) need_value "$@"; THREADS=$2; shift 2 ;;
    --lr) need_value "$@"; LR=$2; shift 2 ;;
    --seed) need_value "$@"; SEED=$2; shift 2 ;;
    --rounds) need_value "$@"; ROUNDS=$2; shift 2 ;;
    --run-timeout) need_value "$@"; RUN_TIMEOUT=$2; shift 2 ;;
    --json) need_value "$@"; JSON=$2; shift 2 ;;
    --plot) need_value "$@"; PLOT=$(realpath -m "$2"); shift 2 ;;
    --logs) need_value "$@"; LOGS=$2; shift 2 ;;
    --build) need_value "$@"; BUILD=$2; shift 2 ;;
    --python) need_value "$@"; PY=$2; shift 2 ;;
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

is_count "$HOSTS" 2 8 || die "--hosts must be 2 to 8 (got '$HOSTS')"
is_count "$DED" 0 6 || die "--dedicated-hosts must be 0 to 6 (got '$DED')"
((HOSTS + DED <= 8)) || die "--hosts $HOSTS and --dedicated-hosts $DED make more than the testbed's 8 hosts"
[[ -n $LOCAL && $DED -gt 0 ]] && die "--dedicated-hosts needs emulated hosts: it does not go with --local"
is_count "$WORKERS" 1 64 || die "--workers must be 1 to 64 (got '$WORKERS')"
[[ -z $SERVERS ]] && SERVERS=$([[ -n $LOCAL ]] && echo 2 || echo 1)
is_count "$SERVERS" 1 64 || die "--servers must be 1 to 64 (got '$SERVERS')"
for v in IMAGE BATCH CLASSES DATA ITERS PER_ITER THREADS ROUNDS RUN_TIMEOUT; do
  is_count "${!v}" 1 1000000 || die "--$(tr 'A-Z_' 'a-z-' <<<"$v") must be a positive number (got '${!v}')"
done
is_count "$WARMUP" 0 100000 || die "--warmup must be 0 or more (got '$WARMUP')"
[[ $SEED =~ ^[0-9]+$ ]] || die "--seed must be a number (got '$SEED')"
FUSION_BYTES=$(to_bytes "$FUSION")
ENGINE_FUSION_ARGS=()
[[ -n $ENGINE_FUSION ]] && ENGINE_FUSION_ARGS=(--fusion-bytes "$(to_bytes "$ENGINE_FUSION")")
check_name
case $FRAMEWORK in
  torch) MODEL=${MODEL:-resnet18} ;;
  tensorflow)
    MODEL=${MODEL:-ResNet50}
    BENCH=$ROOT/bindings/python/examples/benchmark_synthetic_keras.py
    [[ -n $CONFIGS_GIVEN ]] || CONFIGS=cortado-engine,cortado-engine-single,tf-mwms
    ;;
  *) die "--framework must be torch or tensorflow (got '$FRAMEWORK')" ;;
esac
IFS=, read -r -a CONFIG_LIST <<<"$CONFIGS"
for c in "${CONFIG_LIST[@]}"; do
  if [[ $FRAMEWORK == tensorflow ]]; then
    case $c in
      cortado-engine | cortado-engine-single | compute | tf-mwms) ;;
      *) die "configuration '$c' in --configs is not one for --framework tensorflow (cortado-engine, cortado-engine-single, compute, tf-mwms)" ;;
    esac
    continue
  fi
  case $c in
    cortado-fused | cortado-single | cortado-search | cortado-none | cortado-engine | cortado-engine-single | cortado-engine-cb | ddp | compute | horovod | horovod-fp16) ;;
    tf-mwms) die "configuration 'tf-mwms' is TensorFlow's: add --framework tensorflow" ;;
    *) die "unknown configuration '$c' in --configs (see --help)" ;;
  esac
done
if [[ -z $PY ]]; then
  PY=/usr/bin/python3
  [[ -x $VENV/bin/python ]] && PY=$VENV/bin/python
fi
[[ -x $PY ]] || die "--python $PY is not an executable"
CORTADO=$BUILD/launcher/cortado
PYPATH=$BUILD/bindings/python
[[ -x $CORTADO ]] || die "$CORTADO is missing: build it first (ninja -C $BUILD cortado cortado_python) or pass --build DIR"
[[ -d $PYPATH/cortado ]] || die "$PYPATH/cortado is missing: configure with -DCORTADO_WITH_PYTHON=ON and build cortado_python"
if [[ $FRAMEWORK == tensorflow ]]; then
  "$PY" -c 'import tensorflow, keras' 2>/dev/null || die "$PY cannot import tensorflow and keras (scripts/install_deps.sh installs them into \$CORTADO_VENV, default .venv; or pass --python)"
else
  "$PY" -c 'import torch, torchvision' 2>/dev/null || die "$PY cannot import torch and torchvision (Debian: python3-torch python3-torchvision)"
fi
[[ -z $PLOT ]] || "$PY" -c 'import matplotlib' 2>/dev/null ||
  die "--plot: $PY cannot import matplotlib (scripts/install_deps.sh installs Debian's python3-matplotlib)"
HAVE_HOROVOD=""
HOROVOD_WHY=""
if [[ ,$CONFIGS, == *,horovod* ]]; then
  if "$PY" -c 'import horovod.torch as h; assert h.gloo_built()' 2>/dev/null; then
    HAVE_HOROVOD=$("$PY" -c 'import horovod; print(horovod.__version__)')
  else
    HOROVOD_WHY="horovod.torch (with Gloo) does not import in $PY; bench/install_horovod.sh installs Horovod 0.28.1"
    echo "# horovod: skipped: $HOROVOD_WHY" >&2
  fi
fi
if [[ -z $LOCAL ]]; then
  [[ $(id -u) -eq 0 ]] || die "must run as root: the emulated hosts are network namespaces with veth pairs and tc (or use --local)"
  NW=$HOSTS
else
  NW=$WORKERS
fi

OUT=$(mktemp -d /tmp/cortado-train.XXXXXX)
PIDS=()     # every job process started (timeout's pid: it signals its process group)
bench_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # A moment for the jobs to stop on TERM, then KILL whatever is left.
  for _ in 1 2 3 4 5; do
    local alive=""
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ -z $alive ]] && break
    sleep 1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
bench_cleanup_after() {
  if [[ -n $LOGS ]]; then
    mkdir -p "$LOGS" && cp -r "$OUT"/. "$LOGS"/ 2>/dev/null || true
  fi
  rm -rf "$OUT"
}
tb_traps

if [[ -z $LOCAL ]]; then
  tb_up "$((HOSTS + DED))" "$RATE" >"$OUT/hosts"
  HOST_LIST=$(tb_hosts 1 "$HOSTS")
  SERVER_LIST=$( ((DED)) && tb_hosts $((HOSTS + 1)) $((HOSTS + DED)) || true)
  ADDR1=$(awk '$1 == 1 { print $3 }' "$OUT/hosts")
  IFACE=eth0
else
  ADDR1=127.0.0.1
  IFACE=lo
fi

# at_host I: sets AT to the words that run a command on emulated host I
# (none with --local), so that the job's pid is the command's own.
at_host() {
  AT=()
  [[ -z $LOCAL ]] && AT=("$TB" exec "$NAME" "$1")
  return 0
}

# The benchmark's settings, the same for every configuration.
COMMON=(--model "$MODEL" --image-size "$IMAGE" --batch-size "$BATCH" --num-classes "$CLASSES"
  --data-batches "$DATA" --num-warmup-batches "$WARMUP" --num-iters "$ITERS"
  --num-batches-per-iter "$PER_ITER" --threads "$THREADS" --lr "$LR" --seed "$SEED" --json)

# start_job LOG CMD...: CMD in the background under a deadline, its pid recorded.
start_job() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  PIDS+=($!)
  LAST_PID=$!
}

# wait_jobs NAME PID...: waits for every PID; when one fails, stops the others.
# Returns the first non-zero status.
wait_jobs() {
  local name=$1 rc=0 first=0 p
  shift
  local left=("$@")
  while ((${#left[@]})); do
    local next=()
    for p in "${left[@]}"; do
      if kill -0 "$p" 2>/dev/null; then
        next+=("$p")
      else
        wait "$p" || rc=$?
        if ((rc != 0 && first == 0)); then
          first=$rc
          echo "# $name: a process exited with status $rc; stopping the others" >&2
          for q in "${left[@]}"; do kill -TERM "$q" 2>/dev/null || true; done
        fi
      fi
    done
    left=("${next[@]}")
    ((${#left[@]})) && sleep 1
  done
  return "$first"
}

# workers_job NAME LOG [VAR=VALUE...] CMD...: one process per worker, worker
# i on emulated host i (every one on this machine with --local), each CMD
# with RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and the VARs set, under the run's
# deadline, its output in LOG.RANK; waits for all (stopping the others when
# one fails), then LOG holds rank 0's output.
workers_job() {
  local name=$1 log=$2 i pids=()
  shift 2
  for ((i = 1; i <= NW; i++)); do
    local h=$i
    [[ -n $LOCAL ]] && h=1
    at_host "$h"
    start_job "$log.$((i - 1))" "${AT[@]}" timeout -s TERM -k 10 "$RUN_TIMEOUT" \
      env RANK=$((i - 1)) WORLD_SIZE="$NW" LOCAL_WORLD_SIZE="$([[ -n $LOCAL ]] && echo "$NW" || echo 1)" "$@"
    pids+=("$LAST_PID")
  done
  local rc=0
  wait_jobs "$name" "${pids[@]}" || rc=$?
  cat "$log.0" >"$log"
  return "$rc"
}

ddp_job() {  # ddp_job LOG
  workers_job ddp "$1" MASTER_ADDR="$ADDR1" MASTER_PORT=$((20000 + RANDOM % 20000)) \
    GLOO_SOCKET_IFNAME="$IFACE" "$PY" "$BENCH" --backend gloo "${COMMON[@]}"
}

compute_job() {  # compute_job LOG: the workers' processes with no communication
  local barrier=$1.barrier rc=0
  mkdir -p "$barrier"
  workers_job compute "$1" "$PY" "$BENCH" --backend none --start-barrier "$barrier" \
    --run-timeout "$RUN_TIMEOUT" "${COMMON[@]}" || rc=$?
  rm -rf "$barrier"
  return "$rc"
}

mwms_job() {  # mwms_job LOG: TensorFlow's MultiWorkerMirroredStrategy, one process per worker
  local i port=$((20000 + RANDOM % 20000)) addrs=()
  for ((i = 1; i <= NW; i++)); do
    if [[ -n $LOCAL ]]; then
      addrs+=("127.0.0.1:$((port + i - 1))")
    else
      addrs+=("$(awk -v h="$i" '$1 == h { print $3 }' "$OUT/hosts"):$port")
    fi
  done
  workers_job tf-mwms "$1" WORKER_ADDRS="$(IFS=,; echo "${addrs[*]}")" "$PY" "$BENCH" \
    --backend mwms --run-timeout "$RUN_TIMEOUT" --label tf-mwms "${COMMON[@]}"
}

horovod_job() {  # horovod_job LOG COMPRESSION
  local log=$1 compression=$2 i slots
  if [[ -n $LOCAL ]]; then slots="localhost:$NW"; else slots=$(seq -s, -f "$NAME-h%g:1" 1 "$HOSTS"); fi
  at_host 1
  start_job "$log.rdv" "${AT[@]}" timeout -s TERM -k 5 "$RUN_TIMEOUT" "$PY" "$HERE/horovod_rendezvous.py" \
    --hosts "$slots" --timeout "$RUN_TIMEOUT"
  local rdv=$LAST_PID
  for _ in $(seq 120); do
    grep -q '^ready$' "$log.rdv" 2>/dev/null && break
    kill -0 "$rdv" 2>/dev/null || break
    sleep 0.5
  done
  grep -q '^ready$' "$log.rdv" || { echo "# horovod: the rendezvous server did not start: $(tail -3 "$log.rdv")" >&2; return 1; }
  local port
  port=$(awk '$1 == "port" { print $2 }' "$log.rdv")
  local pids=()
  while read -r rank _host settings; do
    [[ $rank =~ ^[0-9]+$ ]] || continue
    local h=$((rank + 1))
    [[ -n $LOCAL ]] && h=1
    at_host "$h"
    # shellcheck disable=SC2086  # settings: KEY=VALUE words
    start_job "$log.$rank" "${AT[@]}" env $settings HOROVOD_GLOO_RENDEZVOUS_ADDR="$ADDR1" \
      HOROVOD_GLOO_RENDEZVOUS_PORT="$port" HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo \
      HOROVOD_GLOO_IFACE="$IFACE" PYTHONUNBUFFERED=1 \
      timeout -s TERM -k 10 "$RUN_TIMEOUT" "$PY" "$BENCH" --backend horovod --compression "$compression" "${COMMON[@]}"
    pids+=("$LAST_PID")
  done <"$log.rdv"
  local rc=0
  wait_jobs horovod "${pids[@]}" || rc=$?
  kill -TERM "$rdv" 2>/dev/null || true
  wait "$rdv" 2>/dev/null || true
  cat "$log.0" >"$log"
  return "$rc"
}

cortado_job() {  # cortado_job LOG BENCH-ARGS...
  local log=$1
  shift
  local launch=("$CORTADO" launch -w "$WORKERS" -s "$SERVERS")
  local threads=${CORTADO_CODEC_THREADS:-0}
  if [[ -z $LOCAL ]]; then
    launch=("$CORTADO" launch -w 1 -s "$SERVERS" --hosts "$HOST_LIST" --agent "$TB exec-host {host}")
    [[ -z ${CORTADO_CODEC_THREADS:-} ]] && threads=$(codec_threads_per_host "$HOSTS")
  fi
  ((DED)) && launch+=(--server-hosts "$SERVER_LIST" --dedicated-servers)
  at_host 1  # the launcher runs on host 1, as on a head node
  start_job "$log" "${AT[@]}" env PYTHONPATH="$PYPATH" CORTADO_LOG_LEVEL="${CORTADO_LOG_LEVEL:-warn}" \
    CORTADO_CODEC_THREADS="$threads" CORTADO_CONNECT_TIMEOUT_MS="${CORTADO_CONNECT_TIMEOUT_MS:-180000}" \
    timeout -s TERM -k 10 "$RUN_TIMEOUT" "${launch[@]}" -- "$PY" "$BENCH" --backend cortado "$@" "${COMMON[@]}"
  wait_jobs cortado "$LAST_PID"
}

# run CONFIG ROUND: one run; appends its JSON line (with "config") to $OUT/results.
run() {
  local config=$1 round=$2 log=$OUT/$1.$2.log rc=0 start
  start=$(date +%s)
  echo "# round $round: $config" >&2
  case $config in
    cortado-fused) cortado_job "$log" --label "$config" --executor --compression "$CODEC" \
      --fusion-bytes "$FUSION_BYTES" --fusion-search off || rc=$? ;;
    cortado-single) cortado_job "$log" --label "$config" --executor --compression "$CODEC" \
      --fusion-bytes 0 --fusion-search off || rc=$? ;;
    cortado-search) cortado_job "$log" --label "$config" --executor --compression "$CODEC" \
      --fusion-bytes "$FUSION_BYTES" --fusion-search on || rc=$? ;;
    cortado-none) cortado_job "$log" --label "$config" --executor --compression none \
      --fusion-bytes "$FUSION_BYTES" --fusion-search off || rc=$? ;;
    cortado-engine) cortado_job "$log" --label "$config" --compression "$CODEC" \
      "${ENGINE_FUSION_ARGS[@]}" || rc=$? ;;
    cortado-engine-single) cortado_job "$log" --label "$config" --compression "$CODEC" \
      --fusion-bytes 0 || rc=$? ;;
    cortado-engine-cb) cortado_job "$log" --label "$config" --compression "$CODEC" \
      "${ENGINE_FUSION_ARGS[@]}" --cross-barrier || rc=$? ;;
    ddp) ddp_job "$log" || rc=$? ;;
    compute) compute_job "$log" || rc=$? ;;
    horovod) horovod_job "$log" none || rc=$? ;;
    horovod-fp16) horovod_job "$log" fp16 || rc=$? ;;
    tf-mwms) mwms_job "$log" || rc=$? ;;
  esac
  local line
  line=$(grep '^{"backend"' "$log" | tail -1 || true)
  if ((rc != 0)) || [[ -z $line ]]; then
    echo "---- $config: output (exit $rc) ----" >&2
    tail -30 "$log"* >&2 || true
    # A worker's Python traceback comes before the other roles' reports of
    # its death, and 30 lines may not reach back to it: its first one.
    local tb
    tb=$(awk '/^Traceback \(most recent call last\)/ {on = 1} on {print} on && /^[A-Za-z_.]*(Error|Exception|Interrupt)/ {exit}' "$log"* 2>/dev/null || true)
    if [[ -n $tb ]]; then
      printf -- '---- %s: the first Python traceback ----\n%s\n' "$config" "$tb" >&2
    else
      # Or the benchmark's own refusal (a worker's SystemExit), its first one.
      local refusal
      refusal=$(grep -h -m1 -E '^benchmark_synthetic(_keras)?: ' "$log"* 2>/dev/null | head -1 || true)
      [[ -z $refusal ]] || printf -- '---- %s: %s\n' "$config" "$refusal" >&2
    fi
    ((rc == 124 || rc == 137)) && die "$config did not finish within --run-timeout $RUN_TIMEOUT s"
    die "$config failed (exit $rc); its output is above"
  fi
  echo "{\"config\": \"$config\", \"round\": $round, \"wall_s\": $(($(date +%s) - start)), \"result\": $line}" >>"$OUT/results"
  grep -E '^(Total img/sec|Loss after)' "$log" | sed "s/^/#   /" >&2 || true
}

touch "$OUT/results"
for ((round = 1; round <= ROUNDS; round++)); do
  for c in "${CONFIG_LIST[@]}"; do
    if [[ $c == horovod* && -z $HAVE_HOROVOD ]]; then
      continue
    fi
    run "$c" "$round"
  done
done

where="$HOSTS emulated hosts at $RATE, 1 worker and $SERVERS server(s) each"
((DED)) && where="$HOSTS emulated hosts at $RATE with 1 worker each, Cortado's servers on $DED more ($SERVERS each)"
[[ -n $LOCAL ]] && where="this machine, $WORKERS workers, $SERVERS Cortado server(s)"
"$PY" "$HERE/train_table.py" "$OUT/results" \
  --title "bench/train.sh $(date -u +%F), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load $(cut -d' ' -f1-3 /proc/loadavg): $where; $FRAMEWORK $MODEL ${IMAGE}x$IMAGE, batch $BATCH per worker, $THREADS thread(s) per worker; codec $CODEC; fusion $FUSION_BYTES bytes${HAVE_HOROVOD:+; horovod $HAVE_HOROVOD}" \
  --command "bench/train.sh ${ARGS[*]}" --configs "$CONFIGS" \
  ${HOROVOD_WHY:+--skipped "horovod,horovod-fp16=$HOROVOD_WHY"} --json "${JSON:-$OUT/table.json}"
if [[ -n $PLOT ]]; then
  "$PY" "$HERE/plot_figures.py" --run training "${JSON:-$OUT/table.json}" "$PLOT" \
    --note "$MODEL ${IMAGE}x$IMAGE, batch $BATCH per worker, codec $CODEC; $where; $(date -u +%F)"
fi
