#!/usr/bin/env bash
# On the lent GPU machine, from the checkout with its bundle in .devrun
# (scripts/device/bundle.sh): the Python binding on CUDA tensors.
#
# 1. Builds the `cortado` command and the Python package for the machine's
#    own python3 (the one with PyTorch on CUDA; the bundle's binaries are
#    built for Debian's Python 3.11): CMake and ninja from that machine, the
#    headers and libraries from the Debian packages that setup.sh unpacked,
#    NCCL from the machine (its pip package's nccl.h and libnccl.so.2, else
#    the bundle's nccl.h). The build folder is $PYBUILD (default
#    /tmp/cortado-py; BUILD_LIMIT_S, default 400 s, bounds it); BUILD_ONLY=1
#    stops after it (run_all.sh starts it so, in the background, while the
#    executor checks run).
# 2. The binding's CUDA tests (tests/python/test_bindings.py -k cuda): CUDA
#    tensors through pinned host buffers and the servers, and the plan
#    executor on CUDA parameters under `cortado launch --mpi` (NCCL, the CUDA
#    codecs; 4 workers on the one GPU as 2x2 emulated machines).
# 3. resnet50 on the GPU, 2 workers on the one GPU (each its own machine:
#    CORTADO_FAKE_HOST_SIZE=1), DistributedOptimizer against DDP with Gloo
#    and DDP with NCCL (bindings/python/examples/benchmark_synthetic.py
#    --peers gloo,nccl): the default path (gradients in fused groups), then
#    the executor with every gradient a flat allreduce (NCCL between the
#    ranks), then BytePS's path (every gradient pushed through the CPU
#    servers from pinned buffers).
#    BENCH=0 skips them.
# Logs to $OUT, one file a stage; a summary line per stage here.
#
#   scripts/device/python_checks.sh
set -u
source "$(dirname "$0")/../../.devrun/setup.sh"  # sets D, REPO, OUT
cd "$REPO"
export PY=${PY:-$(command -v python3)} PYBUILD=${PYBUILD:-/tmp/cortado-py} D REPO
declare -a summary

stage() {  # stage NAME LIMIT_S CMD...: runs CMD under `timeout`, logs to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  summary+=("$name rc=$rc $(($(date +%s) - t0))s")
  echo "=== $name: rc=$rc ($(($(date +%s) - t0)) s)"
  [[ $rc -eq 0 ]] || tail -20 "$OUT/$name.txt"
  return $rc
}

build() {
  set -e
  "$PY" -c 'import sys, torch, pybind11; print(sys.version); print("torch", torch.__version__,
    "cuda", torch.cuda.is_available())'
  local nccl_h nccl_so
  nccl_h=$(find / -name nccl.h -path '*include*' -type f -not -path '/proc/*' -not -path '*/.debug/*' \
    -not -path "$D/*" 2>/dev/null | head -1)
  [[ -n $nccl_h ]] || nccl_h=$D/include/nccl.h
  # A library file or link (not perf's build-id cache, /root/.debug, whose
  # folders carry the library's name).
  nccl_so=$(find / \( -name 'libnccl.so' -o -name 'libnccl.so.2*' \) \( -type f -o -type l \) \
    -not -path '/proc/*' -not -path '*/.debug/*' -not -path "$PYBUILD/*" 2>/dev/null | sort | head -1)
  [[ -n $nccl_so ]] || { echo "python_checks.sh: no libnccl.so* on this machine"; exit 1; }
  # find_library needs the unversioned name.
  mkdir -p "$PYBUILD/nccl"
  ln -sf "$nccl_so" "$PYBUILD/nccl/libnccl.so"
  echo "NCCL: $nccl_h, $nccl_so"
  local launchers=()  # ccache where there is one (this machine, not the lent one)
  command -v ccache >/dev/null && launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S "$REPO" -B "$PYBUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launchers[@]}" \
    -DCORTADO_WITH_TESTS=OFF -DCORTADO_WITH_PYTHON=ON -DCORTADO_WITH_CUDA=ON \
    -DCORTADO_WITH_NCCL=ON -DCORTADO_WITH_MPI=ON -DPython3_EXECUTABLE="$PY" \
    -DMPI_C_COMPILER="$(command -v mpicc.openmpi || command -v mpicc)" \
    -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
    -DNCCL_INCLUDE_DIR="$(dirname "$nccl_h")" -DNCCL_LIBRARY="$PYBUILD/nccl/libnccl.so"
  nice -n 5 ninja -C "$PYBUILD" cortado cortado_python
}
export -f build

if [[ ! -e $PYBUILD/.built ]]; then
  stage python_build "${BUILD_LIMIT_S:-400}" bash -c build && touch "$PYBUILD/.built"
fi
[[ -n ${BUILD_ONLY:-} ]] && exit 0
[[ -e $PYBUILD/.built ]] || { echo "python_checks.sh: the build failed ($OUT/python_build.txt)"; exit 1; }

export PYTHONPATH=$PYBUILD/bindings/python CORTADO_BIN=$PYBUILD/launcher/cortado \
  CORTADO_TEST_PYTHON=$PY CORTADO_LOG_LEVEL=warn PYTHONUNBUFFERED=1
stage python_cuda_tests 150 "$PY" -m pytest -q -rs -p no:cacheprovider --basetemp=/tmp/cortado-pytest \
  tests/python/test_bindings.py -k cuda

if [[ ${BENCH:-1} != 0 ]] && ! "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "=== resnet50 benchmarks skipped: $PY's torch sees no CUDA device"
elif [[ ${BENCH:-1} != 0 ]]; then
  bench=(bindings/python/examples/benchmark_synthetic.py --compare --device cuda --workers 2
         --servers 1 --model resnet50 --image-size 224 --batch-size 32 --num-warmup-batches 3
         --num-batches-per-iter 5 --num-iters 3 --rounds 1 --cortado-bin "$CORTADO_BIN" --json)
  export CORTADO_FAKE_HOST_SIZE=1
  # The default path first (what a training script gets), then the
  # executor's two paths; about 50, 65 and 60 s on an H200 (2026-11-30).
  stage resnet50_default_path 100 "$PY" "${bench[@]}" --peers gloo
  stage resnet50_executor_allreduce 150 env CORTADO_DEVICE=cuda "$PY" "${bench[@]}" --executor \
    --plan-option allreduce --peers gloo,nccl
  stage resnet50_executor_pushpull 100 env CORTADO_DEVICE=cuda "$PY" "${bench[@]}" --executor \
    --plan-option pushpull --peers gloo
  for f in resnet50_default_path resnet50_executor_allreduce resnet50_executor_pushpull; do
    grep -E "^\| |^Cortado /" "$OUT/$f.txt"
  done
fi
echo "=== summary" | tee "$OUT/python_summary.txt"
printf '%s\n' "${summary[@]}" | tee -a "$OUT/python_summary.txt"
