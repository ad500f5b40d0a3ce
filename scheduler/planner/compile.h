// Turns one tensor's option into the sequence of timed operations that the
// simulator schedules: codec calls, PCIe copies, communication steps and the
// servers' work, each with the resource it occupies and its duration from the
// cost models. The rules (docs/planner.md, "Timeline model"):
//  - collectives run on device buffers, CPU codecs and push/pull on host
//    buffers; a copy is inserted wherever the data has to move;
//  - an intra-machine reduce or gather leaves the data on one GPU per machine,
//    so the inter-machine stage then carries one GPU's data, otherwise every
//    GPU's shard crosses the machine's one NIC at the same time;
//  - CPU codec calls are one task per GPU of the machine that holds data, all
//    drawing on the machine's core pool; the servers' decode, sum and
//    re-encode draw on the same pool.
#pragma once

#include <cstdint>
#include <vector>

#include "core/plan/plan.h"
#include "scheduler/planner/cost_model.h"
#include "scheduler/planner/zen_cost.h"

namespace cortado::planner {

// What an operation occupies. kFlat: a collective over all GPUs, which holds
// the intra-machine links and the network at once.
enum class Res : uint8_t { kGpu, kCpu, kIntra, kInter, kFlat, kD2H, kH2D };
// kSparse: Zen's CPU work on the calling thread (zen_cost.h).
enum class OpKind : uint8_t { kEncode, kDecode, kComm, kCopy, kServer, kSparse };

struct SimOp {
  Res res = Res::kGpu;
  OpKind kind = OpKind::kComm;
  plan::CommOp comm = plan::CommOp::kAllreduce;  // kComm only
  plan::Scope scope = plan::Scope::kFlat;        // kComm only
  bool compressed = false;
  uint16_t tasks = 1;  // kCpu: parallel tasks, one core each
  double us = 0;
  // kComm: the workers' skew before it starts (Cluster::skewBefore after the
  // CPU work since the tensor's previous step of communication; no lane).
  double waitUs = 0;
};

// Work per resource kind, used for dominance between options and for the
// simulator's lower bounds.
enum WorkIndex { kWorkGpu, kWorkCpu, kWorkIntra, kWorkInter, kWorkD2H, kWorkH2D, kWorkKinds };

struct CompiledOption {
  std::vector<SimOp> ops;
  double pathUs = 0;  // sum of durations and waits: the sync time of the tensor alone
  double work[kWorkKinds] = {};
  bool gpuCodec = false;
};

// `sparsity`: the tensor's, for a Zen option (zen_cost.h; unknown: priced
// as a dense tensor). A Zen option runs on host buffers: the copies to and
// from the host, the scan and placement on one core, the scheme's
// collectives over all GPUs, then the sums and the decode on one core.
// How long `op` holds its caller: a CPU op's tasks in rounds over the
// cluster's cores, any other op its duration.
double opDurationUs(const Cluster& cluster, const SimOp& op);

// The chunks the workers cut a server key of `elements` into
// (core/partition.h, chunkCount), at least 1, at most 4096: every
// Cluster::chunkBytes of its raw bytes, or for a key with a codec (the
// executor declares a shard key with one when its push or its pull is
// compressed) by its payload's size, spread over the machines' servers
// where each chunk still carries kSpreadPayloadBytes, and at most
// kMaxCompressedChunkBytes of the key a chunk.
double serverKeyChunks(const Cluster& cluster, const ResolvedCodec& codec, double elements,
                       double elementBytes, bool withCodec);

// Sets every communication op's SimOp::waitUs to the cluster's skew after
// the codec and CPU work (encode, decode, group copy, Zen's CPU work; not the
// servers' work nor PCIe copies) since the previous communication op of
// `c` (none before the first op: the execution's own start), a CPU op of
// `tasks` counted as its rounds over the cores, and keeps pathUs the sum
// of durations and waits. compileOption() calls it; call it again after
// changing c.ops.
void applySyncSkew(const Cluster& cluster, CompiledOption& c);

CompiledOption compileOption(const Cluster& cluster, const ResolvedCodec& codec, int64_t elements,
                             int dtypeBytes, const plan::TensorOption& option,
                             const Sparsity& sparsity = {});

}  // namespace cortado::planner
