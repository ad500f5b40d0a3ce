// Espresso's decision tree (ESPRESSO.md §1), with the CPU servers' push and
// pull added as one more inter-machine divisible pair. Enumerating the tree
// gives every option a tensor can take; the planner searches over them.
#pragma once

#include <string>
#include <vector>

#include "core/plan/plan.h"

namespace cortado::planner {

struct TreeConfig {
  bool flat = true;
  bool hierarchical = true;
  bool compression = true;       // options with compressed steps
  bool cpuCodecs = true;         // CPU as well as GPU for each worker encode/decode
  bool parameterServer = false;  // push + pull through the CPU servers
  std::string codec = "codec";   // spec put into the compressed options
  // Zen's options for sparse tensors (docs/zen.md, "In a plan"), appended
  // after the tree's: "F: zen.bp" and "F: zen.hc", and with `hierarchical`
  // "H: i.rs x.zen.bp i.ag" and "H: i.rs x.zen.hc i.ag".
  bool zen = false;
};

// Every option of the tree under `config`, uncompressed ones first, then
// (with `zen`) Zen's two. The order is deterministic, so an option's index is
// stable for a given config.
std::vector<plan::TensorOption> enumerateOptions(const TreeConfig& config);

// Zen's option for one scheme: its one step flat zen_bp or zen_hc, or
// hierarchical: intra reduce-scatter, inter Zen, intra allgather.
plan::TensorOption zenOption(plan::CommOp op, bool hierarchical = false);

// The same option with every worker-side encode and decode on `device`.
plan::TensorOption withCodecDevice(const plan::TensorOption& option, plan::Device device);

// True when some worker-side encode or decode runs on the GPU.
bool usesGpuCodec(const plan::TensorOption& option);
bool usesCpuCodec(const plan::TensorOption& option);

}  // namespace cortado::planner
