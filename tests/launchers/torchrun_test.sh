#!/usr/bin/env bash
# ctest: Cortado workers started by torchrun (Debian's torch, python3 -m
# torch.distributed.run), the recipe of docs/launchers.md: the scheduler and
# the server are `cortado scheduler` and `cortado server` started alongside,
# and each worker takes its rank, the number of workers and the scheduler's
# address from torchrun's RANK, WORLD_SIZE and MASTER_ADDR.
#
#   torchrun_test.sh CORTADO PYTHONPATH
#
# Two torchrun agents (--nnodes 2, static rendezvous on this machine) of 2
# workers each run allreduce_sum.py: each rank checks that Cortado's rank and
# size are torch's and that its allreduce equals the plain sum. Then the
# error path: a worker that torchrun starts without CORTADO_SCHEDULER_PORT is
# refused with a message naming it. Every process has a deadline; what the
# test started is stopped at its end.
set -uo pipefail

CORTADO=$1
export PYTHONPATH=$2
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d /tmp/cortado-torchrun-test.XXXXXX)
PIDS=()
FAILED=0
fail() {
  echo "FAIL: $*" >&2
  FAILED=$((FAILED + 1))
}
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null ||
  { echo "SKIP: /usr/bin/python3 has no torch.distributed.run (scripts/install_deps.sh installs python3-torch)"; exit 77; }

free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 20000))
    ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
  done
  return 1
}
CPORT=$(free_port)
MPORT=$(free_port)
while [[ $MPORT == "$CPORT" ]]; do MPORT=$(free_port); done

# The job's settings for the scheduler and the server; torchrun's workers
# get the same environment less the number of workers (WORLD_SIZE).
export CORTADO_JOB_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export CORTADO_SCHEDULER_PORT=$CPORT CORTADO_NUM_SERVERS=1 CORTADO_LOG_LEVEL=warn
CORTADO_NUM_WORKERS=4 timeout -s KILL 60 "$CORTADO" scheduler >"$DIR/scheduler.log" 2>&1 &
sched=$!
PIDS+=($sched)
CORTADO_NUM_WORKERS=4 CORTADO_RANK=0 timeout -s KILL 60 "$CORTADO" server >"$DIR/server.log" 2>&1 &
server=$!
PIDS+=($server)

# Debian's torch 1.13 under Python 3.11 cannot parse torchrun's default
# --redirects 0 / --tee 0 (Std.from_str("0") finds no member: Python 3.11's
# flag enums leave 0 out of iteration, and torchrun then fails with
# "'NoneType' object has no attribute 'get'"); 1 (stdout) parses: stdout
# goes to a file under --log_dir and is copied to the console, each line
# prefixed with "[default<local rank>]:".
TORCHRUN_STD=(--redirects 1 --tee 1 --monitor_interval 1)
start=$(date +%s)
for node in 0 1; do
  CORTADO_ROLE=worker timeout -s KILL 60 /usr/bin/python3 -m torch.distributed.run --nnodes 2 \
    --node_rank $node --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$MPORT" \
    --max_restarts 0 "${TORCHRUN_STD[@]}" --log_dir "$DIR/torchrun.$node" "$HERE/allreduce_sum.py" \
    >"$DIR/torchrun.$node.log" 2>&1 &
  PIDS+=($!)
done
for node in 0 1; do
  wait "${PIDS[2 + node]}"
  rc=$?
  ((rc == 0)) || fail "torchrun --node_rank $node exited with $rc"
done
wait "$sched"
rc=$?
((rc == 0)) || fail "cortado scheduler exited with $rc"
wait "$server"
rc=$?
((rc == 0)) || fail "cortado server exited with $rc"
echo "torchrun job: $(($(date +%s) - start)) s"
for r in 0 1 2 3; do
  grep -hq "rank $r of 4: allreduce sum correct" "$DIR"/torchrun.*.log ||
    fail "rank $r did not report a correct allreduce sum"
done
grep -h "allreduce sum" "$DIR"/torchrun.*.log
if ((FAILED)); then
  for f in "$DIR"/*.log; do
    echo "---- $f ----"
    tail -30 "$f"
  done
fi

# A worker without the scheduler's port: refused, naming what is missing.
out=$(env -u CORTADO_SCHEDULER_PORT CORTADO_ROLE=worker timeout -s KILL 60 /usr/bin/python3 -m \
  torch.distributed.run --standalone --nproc_per_node 1 --max_restarts 0 "${TORCHRUN_STD[@]}" \
  --log_dir "$DIR/torchrun.bad" "$HERE/allreduce_sum.py" 2>&1)
rc=$?
((rc != 0 && rc != 137)) || fail "a worker without CORTADO_SCHEDULER_PORT: torchrun exited with $rc"
grep -q "missing environment variable(s) CORTADO_SCHEDULER_PORT" <<<"$out" ||
  fail "a worker without CORTADO_SCHEDULER_PORT: no error naming it: $(tail -5 <<<"$out")"

((FAILED)) && exit 1
echo "torchrun recipe passed"
