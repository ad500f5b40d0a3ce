#!/bin/bash
# Starts a job's scheduler and servers on loopback, then the workers as the
# MPI ranks of `mpirun -np NP` running exec_check, and cleans up.
#   run_exec_check.sh CORTADO_BIN EXEC_CHECK MPIEXEC NP FAKE_HOST_SIZE SERVERS [exec_check args...]
# NP 0: NO_MPI - 2 workers started directly (exec_check --no-mpi).
set -u
cortado=$1 check=$2 mpiexec=$3 np=$4 fake=$5 servers=$6
shift 6
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export CORTADO_SCHEDULER_PORT=$port CORTADO_SCHEDULER_HOST=127.0.0.1
export CORTADO_JOB_TOKEN=exec-check-$$-$RANDOM CORTADO_NUM_SERVERS=$servers
export CORTADO_LOG_LEVEL=${CORTADO_LOG_LEVEL:-warn}
workers=$np; [ "$np" = 0 ] && workers=2
export CORTADO_NUM_WORKERS=$workers
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
CORTADO_ROLE=scheduler timeout 300 "$cortado" scheduler --port "$port" & pids+=($!)
for ((s = 0; s < servers; s++)); do
  CORTADO_ROLE=server CORTADO_RANK=$s timeout 300 "$cortado" server & pids+=($!)
done
if [ "$np" = 0 ]; then
  wp=()
  for ((w = 0; w < workers; w++)); do
    CORTADO_ROLE=worker CORTADO_RANK=$w timeout 120 "$check" --no-mpi "$@" & wp+=($!)
  done
  rc=0
  for p in "${wp[@]}"; do wait "$p" || rc=1; done
  exit $rc
fi
timeout 280 "$mpiexec" --allow-run-as-root -np "$np" --oversubscribe --bind-to none \
  -x CORTADO_ROLE=worker -x CORTADO_FAKE_HOST_SIZE="$fake" -x CORTADO_SCHEDULER_PORT -x CORTADO_SCHEDULER_HOST \
  -x CORTADO_JOB_TOKEN -x CORTADO_NUM_SERVERS -x CORTADO_NUM_WORKERS -x CORTADO_LOG_LEVEL \
  "$check" "$@"
