#!/usr/bin/env bash
# On the lent GPU machine, from the checkout with its bundle in .devrun
# (scripts/device/bundle.sh): the plan executor on CUDA buffers
# (CORTADO_DEVICE=cuda: the CUDA codecs, NCCL groups, pinned copies), 4 MPI
# ranks on the one GPU as emulated machines (CORTADO_FAKE_HOST_SIZE, each
# rank its own machine to NCCL: NCCL_HOSTID, as the collective suite does),
# with 2 servers. First the CUDA device's conformance suite, then the
# executor checks against reference sums: every option of the planner's tree
# on 2x2 and 4x1 (exact: fp16 on integer inputs), the lossy sweeps with
# error feedback (top-k, efsignsgd; terngrad has no CUDA codec, so its gpu
# steps run on the CPU), fused groups, tensor fusion, the encode pipeline and
# the refusals. Logs to $OUT, one file a check, and a summary line per check
# here. Four ranks on one GPU are slow at NCCL (each collective kernel
# waits for its peers' processes to get the GPU; no MPS there): 7 ms per
# option and iteration on an H200 on 2026-11-28, 13-20 ms on 2026-11-30,
# which puts the whole suite at 20-40 minutes. By default the checks are
# sized to about 4 minutes at the slower rate (the limits add up to 400 s;
# most checks end well inside theirs): half the tree's options, a quarter
# in each layout, the lossy sweeps on every 64th to 256th compressed
# option, the groups on a 32nd of the tree, no pipeline check; FULL=1 runs
# everything.
#
#   scripts/device/exec_checks.sh            # sized to about 4 minutes
#   SHARDS='2 3' scripts/device/exec_checks.sh  # the other half of the options
#   FULL=1 scripts/device/exec_checks.sh     # everything, 20-40 minutes
#   ONLY='all_2x2 lossy_topk_2x2' scripts/device/exec_checks.sh
set -u
source "$(dirname "$0")/../../.devrun/setup.sh"  # sets D, REPO, OUT
cd "$REPO"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
export CORTADO_LOG_LEVEL=warn NCCL_DEBUG=WARN
start=$(date +%s)
declare -a summary

# check NAME LIMIT_S CMD...: runs CMD under `timeout`, logs to $OUT/NAME.txt.
check() {
  local name=$1 limit=$2
  shift 2
  if [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]]; then return; fi
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  local verdict
  verdict=$(grep -hE "^rank [0-9]+: (PASSED|FAILED)|\[  (PASSED|FAILED|SKIPPED) " "$OUT/$name.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  summary+=("$name rc=$rc $(($(date +%s) - t0))s $verdict")
  echo "=== $name: rc=$rc ($(($(date +%s) - t0)) s) $verdict"
  [[ $rc -eq 0 ]] || tail -15 "$OUT/$name.txt"
}

check device_conformance 60 "$D/bin/cortado_device_cuda_test"

# exec NAME FAKE LIMIT ARGS...: exec_check under cortado launch --mpi.
exec_run() {
  local name=$1 fake=$2 limit=$3
  shift 3
  check "$name" "$limit" env CORTADO_DEVICE=cuda CORTADO_FAKE_HOST_SIZE="$fake" \
    "$D/bin/cortado" launch --mpi -w 4 -s 2 -- "$D/bin/exec_check" "$@"
}
if [[ -n ${FULL:-} ]]; then
  # Every option in both layouts and every sweep in full: about 20 minutes
  # with 4 ranks on one GPU (see above), minutes on a machine of 4 GPUs.
  exec_run all_2x2 2 400 --mode all
  exec_run all_4x1 1 400 --mode all
  exec_run lossy_topk_2x2 2 300 --mode lossy --codec topk:ratio=0.25 --stride 8 --iters 30 --bound 40
  exec_run lossy_efsignsgd_4x1 1 600 --mode lossy --codec efsignsgd --stride 16 --iters 90
  exec_run lossy_terngrad_2x2 2 60 --mode lossy --codec terngrad --stride 64 --iters 30
  exec_run groups_2x2 2 400 --mode groups --elements 300 --iters 6
  exec_run pipeline_2x2 2 200 --mode pipeline --elements 300 --iters 2
else
  # Half the options: those numbered 0 mod 4 on 2x2 (about 48 s), 1 mod 4
  # on 4x1 (about 33 s); the other half is the next run's (SHARDS='2 3').
  read -r s22 s41 <<<"${SHARDS:-0 1}"
  exec_run all_2x2 2 70 --mode all --shards 4 --shard "$s22"
  exec_run all_4x1 1 55 --mode all --shards 4 --shard "$s41"
  exec_run lossy_topk_2x2 2 30 --mode lossy --codec topk:ratio=0.25 --stride 128 --iters 30 --bound 40
  exec_run lossy_efsignsgd_4x1 1 40 --mode lossy --codec efsignsgd --stride 256 --iters 90
  exec_run lossy_terngrad_2x2 2 30 --mode lossy --codec terngrad --stride 64 --iters 30
  exec_run groups_2x2 2 40 --mode groups --elements 300 --iters 6 --shards 32
fi
exec_run fusion_4x1 1 30 --mode fusion --elements 300
# Plans set directly: setPlan's flush round (zeroed device input, its sums
# copied back) on CUDA buffers.
exec_run switch_direct_efsignsgd_2x2 2 30 --mode switch --codec efsignsgd --elements 40 --iters 12 \
  --switch-at 5 --switch-at2 10 --direct-switch
exec_run errors_2x2 2 15 --mode errors

echo "=== summary ($(($(date +%s) - start)) s in all)" | tee "$OUT/summary.txt"
printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"
