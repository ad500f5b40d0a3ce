// `cortado bench pushpull`: the push-pull benchmark, in the manner of
// nccl-tests. Run outside a job, it launches a local job of itself (W workers,
// S servers); inside a job, each worker sweeps sizes, checks every result,
// and rank 0 prints time, algorithm bandwidth and bus bandwidth per size.
#pragma once

#include <cstdint>
#include <string>

#include "core/common/dtype.h"

namespace cortado::launcher {

struct PushPullBenchOptions {
  int workers = 4;
  int servers = 2;
  uint64_t minBytes = 4ull << 10;
  uint64_t maxBytes = 256ull << 20;
  int iters = 0;    // 0: chosen per size (more for small sizes)
  int warmup = 2;
  bool json = false;
  std::string dtype = "float32";
  std::string transport;  // empty: CORTADO_TRANSPORT or zmq
  // A codec spec (core/worker.h TensorOptions), e.g. "topk:ratio=0.01"; empty:
  // uncompressed. Results are checked exactly for fp16 and bf16 (the inputs
  // are small integers, which they carry exactly); other codecs are lossy and
  // their column says "lossy" (tests/multiprocess checks them).
  std::string codec;
  // Also run every size through the plan executor (core/executor/executor.h) with its
  // default plan (intra reduce-scatter, push/pull of each shard, intra
  // allgather), the workers under mpirun, and print its time next to plain
  // push_pull's, measured in the same run. float32, uncompressed.
  bool executor = false;
};

int runPushPullBench(const PushPullBenchOptions& opts);

}  // namespace cortado::launcher
