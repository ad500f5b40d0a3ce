#!/usr/bin/env bash
# Assembles, on this Debian 12 machine, what the lent GPU machine (Ubuntu,
# no network, no Debian packages) needs to run Cortado's CUDA/NCCL checks and
# the model replay on emulated hosts: the built binaries, the shared
# libraries they link that such a machine lacks, and Debian 12's OpenMPI and
# iproute2 packages (unpacked there by setup.sh). The bundle goes to DEST
# (default .devrun, git-ignored through .git/info/exclude); pass it to the
# device tool's `carry`, then run scripts/device/run_all.sh there (or one of
# gpu_checks.sh, exec_checks.sh, python_checks.sh, model_replay.sh;
# docs/benchmarks.md, "the lent GPU machine"). The Debian development
# packages let python_checks.sh build the Python package there, for that
# machine's own Python and PyTorch.
#
#   scripts/device/bundle.sh [BUILD_DIR] [DEST]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
dest=${2:-$root/.devrun}
mkdir -p "$dest"/{bin,lib,debs}
grep -qx '/.devrun/' "$root/.git/info/exclude" 2>/dev/null || echo '/.devrun/' >>"$root/.git/info/exclude"
bins=("$build/launcher/cortado" "$build/tests/collective/collective_test"
      "$build/tests/compressor/cortado_compressor_cuda_test" "$build/bench/codec/cortado_cuda_codec_bench"
      "$build/tests/device/cortado_device_cuda_test" "$build/tests/multiprocess/exec_check")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "bundle.sh: $b is not built (the CUDA ones need nvcc)" >&2; exit 2; }
  cp "$b" "$dest/bin/"
done
# Libraries that the binaries link, but NCCL and OpenSSL 3 (the GPU machine has its own;
# 200 MB here), glibc, libstdc++ and friends (on any recent Linux).
# Each under its real name with its soname's link, so that the development
# packages' links (libzmq.so -> libzmq.so.5.2.4) find them there.
for b in "${bins[@]}"; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libpthread|libdl|librt|libresolv|libz|libnccl|libssl|libcrypto)\.so' |
  while read -r lib; do
    real=$(readlink -f "$lib")
    cp "$real" "$dest/lib/"
    [[ $(basename "$real") == $(basename "$lib") ]] || ln -sf "$(basename "$real")" "$dest/lib/$(basename "$lib")"
  done
# NCCL's header, for python_checks.sh's build where that machine has none.
mkdir -p "$dest/include"
cp /usr/local/cuda/include/nccl.h "$dest/include/" 2>/dev/null ||
  cp "$(find /usr -name nccl.h | head -1)" "$dest/include/"
# OpenMPI's programs and plugins (mpirun, orted) and iproute2 (ip, tc) for
# the emulated hosts, with what they need.
pkgs=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-2.1-7 libevent-core-2.1-7
      libevent-pthreads-2.1-7 libfabric1 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200
      libnl-route-3-200 libpsm-infinipath1 libpsm2-2 libucx0 libnuma1 libltdl7 libmunge2 libatomic1
      libxnvctrl0 iproute2 libbpf1 libelf1 libmnl0 libxtables12 libcap2 libdb5.3 libtirpc3 libtirpc-common)
# The headers and CMake/pkg-config files that python_checks.sh's build of
# the Python package there needs (with what libzmq.pc names as private
# requirements, which pkg-config looks for too).
pkgs+=(libboost1.74-dev libzmq3-dev libpgm-dev libsodium-dev libnorm-dev libxml2-dev libkrb5-dev
       krb5-multidev comerr-dev libbsd-dev libmd-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
       libfmt-dev libssl-dev libopenmpi-dev libucx-dev)
(cd "$dest/debs" && apt-get download "${pkgs[@]}" >"$dest/apt.log" 2>&1) ||
  { cat "$dest/apt.log" >&2; echo "bundle.sh: apt-get download failed (run apt-get update first)" >&2; exit 1; }
cp "$root/scripts/device/setup.sh" "$dest/"
du -sh "$dest"
