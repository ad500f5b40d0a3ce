#!/usr/bin/env bash
# ctest: Cortado workers started by torchrun (Debian's torch, python3 -m
# torch.distributed.run), the recipes of docs/launchers.md. Each worker takes
# its rank, the number of workers and the scheduler's address from
# torchrun's RANK, WORLD_SIZE and MASTER_ADDR; the scheduler and the servers
# run alongside:
#
#   torchrun_test.sh CORTADO PYTHONPATH roles|servers-only
#
# roles         `cortado scheduler` and one `cortado server`; then a worker
#               that torchrun starts without CORTADO_SCHEDULER_PORT must be
#               refused with a message naming it.
# servers-only  `cortado launch --servers-only -w 4 -s 2`; then a job of 2
#               workers (one agent) whose rank 1 exits after joining: the
#               launcher must fail naming worker 1, within its deadline.
#
# In both, two torchrun agents (--nnodes 2, static rendezvous on this
# machine) of 2 workers each run allreduce_sum.py: each rank checks that
# Cortado's rank and size are torch's and that its allreduce equals the
# plain sum. Every process has a deadline; what the test started is killed
# at its end.
set -uo pipefail

CORTADO=$1
export PYTHONPATH=$2
CASE=$3
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
[[ $CASE == roles || $CASE == servers-only ]] || { echo "unknown case '$CASE' (roles, servers-only)" >&2; exit 2; }

/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null ||
  { echo "SKIP: /usr/bin/python3 has no torch.distributed.run (scripts/install_deps.sh installs python3-torch)"; exit 77; }

source "$HERE/free_port.sh"
CPORT=$(free_port)
MPORT=$(free_port)
while [[ $MPORT == "$CPORT" ]]; do MPORT=$(free_port); done

# Debian's torch 1.13 under Python 3.11 cannot parse torchrun's default
# --redirects 0 / --tee 0 (Std.from_str("0") finds no member: Python 3.11's
# flag enums leave 0 out of iteration, and torchrun then fails with
# "'NoneType' object has no attribute 'get'"); 1 (stdout) parses: stdout
# goes to a file under --log_dir and is copied to the console, each line
# prefixed with "[default<local rank>]:".
TORCHRUN_STD=(--redirects 1 --tee 1 --monitor_interval 1)

# The job's settings, shared by every process: the token and the
# scheduler's port. Workers get the number of workers from WORLD_SIZE.
export CORTADO_JOB_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export CORTADO_SCHEDULER_PORT=$CPORT CORTADO_LOG_LEVEL=warn

# Starts the scheduler and the servers in the background (their pids in
# SIDE) and two torchrun agents of 2 workers each; waits for the agents.
# $1: the run's name (log files).
run_job() {
  local name=$1 node rc
  SIDE=()
  if [[ $CASE == roles ]]; then
    CORTADO_NUM_WORKERS=4 CORTADO_NUM_SERVERS=1 timeout -s KILL 60 "$CORTADO" scheduler \
      >"$DIR/$name.scheduler.log" 2>&1 &
    SIDE+=($!)
    CORTADO_NUM_WORKERS=4 CORTADO_NUM_SERVERS=1 CORTADO_RANK=0 timeout -s KILL 60 "$CORTADO" server \
      >"$DIR/$name.server.log" 2>&1 &
    SIDE+=($!)
  else
    CORTADO_LOG_LEVEL=info timeout -s KILL 60 "$CORTADO" launch --servers-only -w 4 -s 2 \
      >"$DIR/$name.launch.log" 2>&1 &
    SIDE+=($!)
  fi
  PIDS+=("${SIDE[@]}")
  local agents=()
  for node in 0 1; do
    CORTADO_ROLE=worker CORTADO_NUM_SERVERS=$([[ $CASE == roles ]] && echo 1 || echo 2) \
      timeout -s KILL 60 /usr/bin/python3 -m torch.distributed.run --nnodes 2 --node_rank $node \
      --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$MPORT" --max_restarts 0 \
      "${TORCHRUN_STD[@]}" --log_dir "$DIR/$name.torchrun.$node" "$HERE/allreduce_sum.py" \
      >"$DIR/$name.torchrun.$node.log" 2>&1 &
    agents+=($!)
  done
  PIDS+=("${agents[@]}")
  AGENT_RC=()
  for node in 0 1; do
    wait "${agents[node]}"
    AGENT_RC+=($?)
  done
}
show_logs() {
  local f
  for f in "$DIR"/$1.*.log; do
    echo "---- $f ----"
    tail -25 "$f"
  done
}

start=$(date +%s)
run_job ok
for node in 0 1; do
  ((AGENT_RC[node] == 0)) || fail "torchrun --node_rank $node exited with ${AGENT_RC[node]}"
done
for p in "${SIDE[@]}"; do
  wait "$p"
  rc=$?
  ((rc == 0)) || fail "$(ps -o args= -p "$p" 2>/dev/null || echo "the scheduler or a server") (pid $p) exited with $rc"
done
echo "torchrun job ($CASE): $(($(date +%s) - start)) s"
for r in 0 1 2 3; do
  grep -hq "rank $r of 4: allreduce sum correct" "$DIR"/ok.torchrun.*.log ||
    fail "rank $r did not report a correct allreduce sum"
done
grep -h "allreduce sum" "$DIR"/ok.torchrun.*.log
if [[ $CASE == servers-only ]]; then
  grep -q "all 4 workers and 2 servers registered" "$DIR/ok.launch.log" ||
    fail "the scheduler of cortado launch --servers-only did not see 4 workers and 2 servers"
  grep -q "job finished: 4 workers and 2 servers exited cleanly" "$DIR/ok.launch.log" ||
    fail "cortado launch --servers-only did not report a clean end"
fi
((FAILED)) && show_logs ok

before=$FAILED
if [[ $CASE == roles ]]; then
  # A worker without the scheduler's port: refused, naming what is missing.
  out=$(env -u CORTADO_SCHEDULER_PORT CORTADO_ROLE=worker CORTADO_NUM_SERVERS=1 timeout -s KILL 60 \
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 1 --max_restarts 0 \
    "${TORCHRUN_STD[@]}" --log_dir "$DIR/bad" "$HERE/allreduce_sum.py" 2>&1)
  rc=$?
  ((rc != 0 && rc != 137)) || fail "a worker without CORTADO_SCHEDULER_PORT: torchrun exited with $rc"
  grep -q "missing environment variable(s) CORTADO_SCHEDULER_PORT" <<<"$out" ||
    fail "a worker without CORTADO_SCHEDULER_PORT: no error naming it: $(tail -5 <<<"$out")"
else
  # Rank 1 of 2 (one agent) dies after joining: the launcher fails the
  # job, naming it, and exits non-zero; so does torchrun.
  start=$(date +%s)
  CORTADO_LOG_LEVEL=info timeout -s KILL 60 "$CORTADO" launch --servers-only -w 2 -s 1 \
    >"$DIR/die.launch.log" 2>&1 &
  launcher=$!
  PIDS+=($launcher)
  ALLREDUCE_SUM_DIE_RANK=1 CORTADO_ROLE=worker CORTADO_NUM_SERVERS=1 timeout -s KILL 60 \
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --max_restarts 0 \
    "${TORCHRUN_STD[@]}" --log_dir "$DIR/die.torchrun" "$HERE/allreduce_sum.py" \
    >"$DIR/die.torchrun.log" 2>&1
  agent_rc=$?
  wait "$launcher"
  rc=$?
  echo "a worker died: cortado launch --servers-only exited with $rc, torchrun with $agent_rc, after $(($(date +%s) - start)) s"
  ((rc != 0 && rc != 137)) || fail "a worker died: cortado launch --servers-only exited with $rc"
  ((agent_rc != 0 && agent_rc != 137)) || fail "a worker died: torchrun exited with $agent_rc"
  grep -q "cortado launch: job failed: .*worker 1 .*is dead" "$DIR/die.launch.log" ||
    fail "a worker died: the launcher did not name worker 1: $(grep 'job failed' "$DIR/die.launch.log")"
  grep "cortado launch: job failed:" "$DIR/die.launch.log"
  ((FAILED == before)) || show_logs die
fi

((FAILED)) && exit 1
echo "torchrun recipe ($CASE) passed"
