#!/usr/bin/env bash
# On the lent GPU machine, from the checkout with its bundle in .devrun:
# the CUDA codec tests, the NCCL collective tests in three layouts (4 ranks
# on the one GPU), and with BENCH=1 the CUDA codec benchmark. Logs to $OUT.
set -u
source "$(dirname "$0")/../../.devrun/setup.sh"  # sets D, REPO, OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
echo "=== CUDA codec tests"
timeout 120 "$D/bin/cortado_compressor_cuda_test" >"$OUT/cuda_codec_test.txt" 2>&1
echo "rc=$?"; tail -3 "$OUT/cuda_codec_test.txt"
for cfg in shared:0 fake_2x2:2 fake_3_1:3; do
  name=${cfg%%:*} fake=${cfg##*:}
  echo "=== collective_test, NCCL, $name"
  timeout 100 mpirun --allow-run-as-root -np 4 --oversubscribe --bind-to none -x LD_LIBRARY_PATH \
    -x NCCL_DEBUG=WARN -x CORTADO_FAKE_HOST_SIZE="$fake" "$D/bin/collective_test" >"$OUT/collective_$name.txt" 2>&1
  echo "rc=$?"; grep -E "PASSED|FAILED" "$OUT/collective_$name.txt" | sort | uniq -c
done
if [[ -n ${BENCH:-} ]]; then
  echo "=== CUDA codec benchmark"
  timeout 150 "$D/bin/cortado_cuda_codec_bench" --benchmark_out="$OUT/cuda_codec_bench.json" \
    --benchmark_out_format=json 2>&1 | tail -40
fi
