#!/usr/bin/env bash
# ctest: `cortado launch --hosts` on emulated hosts (testbed.sh), through the
# testbed's host agent, with the launcher on host 1 as on a head node.
#
#   launch_hosts_test.sh CORTADO PUSHPULL_CHECK 2x2|4x1|linkdown
#   launch_hosts_test.sh CORTADO EXEC_CHECK exec_2x2|exec_4x1
#
# 2x2, 4x1: 2 hosts x 2 workers / 4 hosts x 1 worker, one server per host,
#   pushpull_check (every result against the plain sum of all workers'
#   inputs); and the bytes that left the last host over its link must be at
#   least half of what it had to send to servers on other hosts, which shows
#   that shared memory (chosen by hostname) was not used across hosts; then
#   a job that names no chunk size, whose workers must run 256 KiB chunks.
# linkdown: 3 hosts x 1 worker; host 3's link is set down mid-run; the
#   launcher must exit non-zero within 30 s naming host 3, and no process may
#   be left in any host.
# exec_2x2, exec_4x1: the plan executor's check program (exec_check) on the
#   same layouts, each worker an MPI rank of the launcher's mpirun and every
#   emulated host its own machine (MPI's shared-memory split, no fake host
#   size): every option the planner can emit (4919, with the parameter
#   server) once, each result equal to the plain sum; then every 24th
#   compressed option with top-k and error feedback over 30 iterations, the
#   running sums within the bound that the loopback test uses (which runs
#   every 8th). Links at 10 Gbit/s, as for 2x2 and 4x1: each option run is
#   a handful of small collectives and pushes over TCP between the hosts.
# Skips (exit 77) where it cannot run: not root, no network namespaces.
set -uo pipefail

CORTADO=$1
CHECK=$2
CASE=$3
HERE=$(cd "$(dirname "$0")" && pwd)
TB=$HERE/testbed.sh
NAME=l$(printf '%04x%03x' $((RANDOM % 65536)) $(($$ % 4096)))
OUT=$(mktemp -d /tmp/cortado-hosts-test.XXXXXX)
source "$HERE/host_test_lib.sh"

case $CASE in
  2x2) hosts=2 per=2 ;;
  4x1) hosts=4 per=1 ;;
  linkdown) hosts=3 per=1 ;;
  exec_2x2) hosts=2 per=2 ;;
  exec_4x1) hosts=4 per=1 ;;
  *) echo "unknown case '$CASE' (2x2, 4x1, linkdown, exec_2x2, exec_4x1)" >&2; exit 2 ;;
esac
"$TB" up "$NAME" "$hosts" --rate 10gbit >/dev/null || { echo "FAIL: testbed.sh up failed" >&2; exit 1; }
list=$(seq -s, -f "$NAME-h%g" 1 "$hosts")
LIMIT=80  # seconds per job
[[ $CASE == exec_* ]] && LIMIT=150
launch() {
  "$TB" exec "$NAME" 1 timeout -s KILL "$LIMIT" "$CORTADO" launch --hosts "$list" -w "$per" -s 1 \
    --agent "$TB exec-host {host}" -- "$CHECK" "$@"
}
tx_bytes() { cat "/sys/class/net/${NAME}v$1/statistics/rx_bytes"; }  # the bridge end receives what host $1 sends

if [[ $CASE == exec_* ]]; then
  W=$((hosts * per))
  # Every option, exactly. exec_check prints "N of N options ..., W ranks on
  # M machines" (rank 0) and "rank R: PASSED (0 failures)" (every rank).
  start=$(date +%s)
  CORTADO_LOG_LEVEL=warn launch --mode all --iters 1 >"$OUT/log" 2>&1
  rc=$?
  echo "all options: exit $rc after $(($(date +%s) - start)) s"
  ((rc == 0)) || fail "exec_check --mode all exited with $rc"
  line=$(grep -m1 ' options (shard 0 of 1)' "$OUT/log")
  echo "$line"
  [[ $line =~ ^([0-9]+)\ of\ ([0-9]+)\ options.*\ ([0-9]+)\ ranks\ on\ ([0-9]+)\ machines ]] ||
    fail "exec_check did not say how many options it ran"
  if [[ -n ${BASH_REMATCH[1]:-} ]]; then
    ((BASH_REMATCH[1] == BASH_REMATCH[2] && BASH_REMATCH[1] > 0)) ||
      fail "ran ${BASH_REMATCH[1]} of ${BASH_REMATCH[2]} options"
    ((BASH_REMATCH[3] == W)) || fail "exec_check saw ${BASH_REMATCH[3]} ranks, not $W"
    ((BASH_REMATCH[4] == hosts)) ||
      fail "exec_check saw ${BASH_REMATCH[4]} machines, not the $hosts emulated hosts"
  fi
  for ((r = 0; r < W; r++)); do
    grep -q "^rank $r: PASSED (0 failures)" "$OUT/log" || fail "rank $r did not pass every option"
  done
  cp "$OUT/log" "$OUT/log.all"
  # Lossy: top-k with error feedback, the running sums within the bound.
  start=$(date +%s)
  CORTADO_LOG_LEVEL=warn launch --mode lossy --codec topk:ratio=0.25 --stride 24 --iters 30 \
    --bound 40 >"$OUT/log" 2>&1
  rc=$?
  echo "top-k with error feedback: exit $rc after $(($(date +%s) - start)) s"
  ((rc == 0)) || fail "exec_check --mode lossy exited with $rc"
  for ((r = 0; r < W; r++)); do
    grep -q "^rank $r: PASSED (0 failures)" "$OUT/log" || fail "rank $r: lossy options out of bound"
  done
  grep -m1 ' options (shard 0 of 1)' "$OUT/log"
  grep "worst running-sum error" "$OUT/log" | head -"$W"
  ((FAILED)) && { echo "---- all options ----"; tail -30 "$OUT/log.all"; }
elif [[ $CASE != linkdown ]]; then
  W=$((hosts * per))
  before=$(tx_bytes "$hosts")
  # 4 MiB tensor in 512 KiB chunks (a named size, not the launcher's 256 KiB
  # across hosts): each server gets an equal share.
  CORTADO_LOG_LEVEL=warn CORTADO_PARTITION_BYTES=524288 launch --tensors 6 --iters 3 \
    --max-elements 20000 --big-elements 1048576 >"$OUT/log" 2>&1
  rc=$?
  sent=$(($(tx_bytes "$hosts") - before))
  ((rc == 0)) || fail "the job exited with $rc"
  for ((r = 0; r < W; r++)); do
    grep -q "^worker $r: 3 iterations of 7 tensors correct.*chunks of 524288 bytes" "$OUT/log" ||
      fail "worker $r did not report correct sums in the 512 KiB chunks it was told"
  done
  # Workers on the last host push (hosts-1)/hosts of 4 MiB per iteration to
  # servers elsewhere.
  need=$((per * 3 * 4194304 * (hosts - 1) / hosts / 2))
  echo "host $hosts sent $sent bytes over its link (at least $need expected)"
  ((sent >= need)) || fail "host $hosts sent only $sent bytes over its link: did it use shared memory with another host?"
  # Without a named chunk size, a job across hosts gets 256 KiB chunks.
  (unset CORTADO_PARTITION_BYTES BYTEPS_PARTITION_BYTES
    CORTADO_LOG_LEVEL=warn launch --tensors 2 --iters 1 --max-elements 1000 \
      --big-elements 1048576 >"$OUT/log.default" 2>&1) ||
    fail "the job without CORTADO_PARTITION_BYTES exited with $?"
  for ((r = 0; r < W; r++)); do
    grep -q "^worker $r: 1 iterations of 3 tensors correct.*chunks of 262144 bytes" "$OUT/log.default" ||
      fail "worker $r did not run 256 KiB chunks by default across hosts: $(grep "^worker $r" "$OUT/log.default")"
  done
else
  progress=$OUT/progress
  CORTADO_LOG_LEVEL=warn launch --tensors 4 --iters 100000 --max-elements 1000 --slow-ms 10 \
    --progress-file "$progress" >"$OUT/log" 2>&1 &
  job=$!
  for _ in $(seq 300); do [[ -s $progress ]] && break; sleep 0.1; done
  [[ -s $progress ]] || fail "the job made no progress within 30 s"
  "$TB" link "$NAME" 3 down
  cut=$(date +%s%N)
  wait "$job"
  rc=$?
  took_ms=$((($(date +%s%N) - cut) / 1000000))
  echo "after host 3's link went down the launcher exited with $rc in $took_ms ms"
  ((rc != 0)) || fail "the job exited 0 although host 3 was cut off"
  ((took_ms < 30000)) || fail "the launcher took $took_ms ms (limit 30 s)"
  grep "cortado launch: job failed:" "$OUT/log" | grep -q "$NAME-h3" ||
    fail "the launcher's error does not name host $NAME-h3: $(grep 'job failed' "$OUT/log")"
  for _ in $(seq 50); do [[ -z $(left_in_hosts) ]] && break; sleep 0.2; done
fi
left=$(left_in_hosts)
[[ -z $left ]] || fail "processes left in the hosts: $(ps -o pid,args -p ${left// /,} | cut -c1-160)"

if ((FAILED)); then
  echo "---- job output ----"
  tail -60 "$OUT/log"
  exit 1
fi
grep "job failed" "$OUT/log" || true
echo "launch across hosts ($CASE) passed"
