// Model profiles: a training job's gradient tensors in gradient-ready order
// (index 0 is ready first during the backward pass) with the backward
// computation time before each becomes ready. Loaded from JSON files
// (profiles/*.json, written by tools/gen_profiles.py) or from a trace of a
// real run converted to the same format.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace cortado::planner {

struct TensorProfile {
  std::string name;
  int64_t elements = 0;
  int dtypeBytes = 4;
  double backwardUs = 0;  // computation between the previous tensor's readiness and this one's
  // Sparse gradients (Zen, docs/zen.md): the fraction of the tensor one
  // worker's gradient holds non-zero, in (0, 1]; 0: not known (the planner
  // takes the tensor as dense). JSON "density".
  double density = 0;
  // How the workers' non-zeros overlap (JSON "overlap", with a density
  // only): each worker's non-zeros are taken as a share `overlap` of a common
  // hot set of density / overlap of the tensor, drawn independently, so the
  // sum of k workers holds (1 - (1 - overlap)^k) / overlap times one
  // worker's non-zeros (compressor::zen::profileFromOverlap). 1: every
  // worker the same indices; = density: indices uniform over the whole
  // tensor, independent between workers (the default, 0 here); towards 0
  // (not below density): disjoint.
  double overlap = 0;
  double bytes() const { return double(elements) * dtypeBytes; }
  bool sparse() const { return density > 0; }
  // The overlap the cost model uses (the default filled in).
  double overlapOrDefault() const { return overlap > 0 ? overlap : density; }
};

struct ModelProfile {
  std::string model;
  std::string source;  // how the shapes and times were obtained
  double forwardUs = 0;  // constant per iteration; only used to report speedups
  std::vector<TensorProfile> tensors;
  // Whether the job hands the executor its gradients as consecutive spans of
  // one buffer in this order (cortado.torch's DistributedOptimizer, DDP's
  // gradient_as_bucket_view, the model replay): a fused group then runs in
  // place. When false, each group's execution pays two copies of its bytes
  // (gathered into a buffer and scattered back; Executor::inPlaceGroupRuns).
  // JSON "contiguous_gradients", default true.
  bool contiguousGradients = true;

  double backwardUs() const;
  double totalBytes() const;
  bool hasSparse() const;  // some tensor has a density

  static ModelProfile fromJson(const nlohmann::json& j);
  static ModelProfile load(const std::string& path);
  nlohmann::json toJson() const;
};

// The names of the bundled profiles (profiles/<name>.json).
std::vector<std::string> bundledModels();
// Loads a bundled profile by name, or a file when `nameOrPath` ends in .json.
// Throws cortado::Error listing the valid names.
ModelProfile loadModel(const std::string& nameOrPath, const std::string& dataDir);

// A synthetic model of `tensors` tensors with sizes drawn log-uniformly from
// [minElements, maxElements] and backward time proportional to size
// (`nsPerElement`), deterministic for a seed. Used by the benchmark.
ModelProfile syntheticModel(int tensors, uint64_t seed, int64_t minElements = 256,
                            int64_t maxElements = 4 << 20, double nsPerElement = 2.0);

}  // namespace cortado::planner
