// The plan executor's Zen step (core/executor/run.h, Run::zenStep): a sparse
// tensor (or its shard after an intra-machine reduce-scatter) summed by
// core/zen_collective over the world (or inter-machine) group, on host
// buffers (docs/zen.md, "In a plan").
#include "core/executor/run.h"

namespace cortado::executor::detail {

void Run::zenStep(const Step& s, Group g) {
  if (g.size() <= 1) return;  // one worker: its input is the sum
  const auto scheme = s.op == CommOp::kZenBalanced
                          ? compressor::zen::Scheme::kBalancedParallelism
                          : compressor::zen::Scheme::kHierarchicalCentralization;
  if (!t_.zen || t_.zen->nextScheme() != scheme || t_.zen->numElements() != r_.len ||
      t_.zenGroup != g.c) {
    ZenCollectiveOptions o;
    o.scheme = scheme;
    o.compact = compactBlobs();  // CORTADO_COMPACT_SPARSE
    t_.zen = std::make_unique<ZenCollective>(*g.c, t_.name, r_.len, o);
    t_.zenGroup = g.c;
  }
  // ZenCollective reads and writes host memory: the data goes through the
  // state's pinned buffer where the device's memory is not the host's.
  float* at = x_ + r_.off;
  const float* in = lanes_.toHost(t_, at, r_.len, d_);
  float* out = lanes_.stagingFor(t_, at, r_.len, d_);
  t_.zen->allreduceDense(in, out, ReduceOp::kSum, d_);
  lanes_.fromStaging(t_, at, r_.len);
}

}  // namespace cortado::executor::detail
