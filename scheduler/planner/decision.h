// The Espresso decision algorithm (ESPRESSO.md §3) over the option tree and the
// timeline simulator: a GPU-only pass, then the optimal CPU offload of the
// GPU pass's choices; plus the reference points it is judged against (no
// compression, compress-everything-on-GPU, an upper bound with free
// compression) and an exhaustive search for small instances.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/planner/option_tree.h"
#include "scheduler/planner/simulator.h"

namespace cortado::planner {

struct Strategy {
  std::vector<int> choice;  // option index per tensor
  double iterUs = 0;        // simulated synchronization end (backward + sync)
  // Fused groups (Cupcake, fusion_search.h): [first, last] tensor ranges,
  // last > first, ascending and disjoint, whose members share one option in
  // `choice` and run it once on their concatenation; every other tensor runs
  // alone. Empty for the per-tensor searches. Simulate with
  // Simulator::simulateGroups(); toPlan() turns them into Plan::groups.
  std::vector<std::pair<int, int>> groups = {};
};

struct DecisionStats {
  int evaluations = 0;
  int gpuPassVisited = 0;
  int pruned = 0;
  int offloadGroups = 0;
  int refineChanges = 0;
  bool offloadExhaustive = true;
  // Where decide() spends its time: simulations and milliseconds per phase.
  int gpuPassEvaluations = 0, offloadEvaluations = 0, refineEvaluations = 0;
  int screened = 0;  // options scored a few tensors ahead instead of in full
  int estimates = 0;  // estimated search: options scored by Simulator::estimate()
  int rejected = 0;   // estimated search: changes undone after the exact simulation
  int windowed = 0;   // estimated search: estimates with a window simulated
  double gpuPassMs = 0, offloadMs = 0, refineMs = 0;
};

class Planner {
 public:
  // `sim` is used, not owned; its option list must be closed under
  // withCodecDevice(option, kCpu) for the offload pass to move tensors.
  explicit Planner(Simulator& sim);

  // The best single uncompressed option used by every tensor.
  Strategy noCompression();
  // The best single GPU-compressed option used by every tensor.
  Strategy compressAllGpu();
  // The best single compressed option whose codec steps all run on the CPU,
  // used by every tensor; an empty choice (iterUs kInf) when there is none.
  Strategy compressAllCpu();
  // The best single compressed option of each codec device (GPU codec steps
  // only, as compressAllGpu; CPU codec steps only, as compressAllCpu) and
  // path between machines (flat collectives, hierarchical collectives, the
  // servers' push and pull), used by every tensor: up to six, the fastest
  // predicted first (among equal times GPU codecs, then flat, hierarchical,
  // servers, then the first option). With one GPU per machine the
  // hierarchical collectives are the flat ones (their intra-machine steps
  // have nothing to do) and are left out: up to four. MergeComp's
  // alternatives in `cortado bench model`: its search times them instead of
  // trusting the predictions' choice of path. `price` (default: the
  // simulated time with every tensor on its own) prices an option used by
  // every tensor: the bench prices each in the byte-balanced groups that
  // MergeComp's search will run it in, where another collective than
  // layer-wise's can be the kind's best (compressed reduce-scatter and
  // allgather rather than one allgather, for large groups). Each Strategy's
  // iterUs is its price.
  using UniformPrice = std::function<double(const std::vector<int>& choice)>;
  std::vector<Strategy> compressAllByPath(const UniformPrice& price = {});
  // GPU pass from `start`; never worse than `start`.
  Strategy gpuPass(const Strategy& start);
  // Moves, per (size, option) group of GPU-compressed tensors, the best number
  // of earliest-ready tensors to the CPU. Exhaustive over the counts while the
  // product of (group size + 1) is at most `maxCombos`, otherwise coordinate
  // descent over groups until no count changes.
  Strategy offloadPass(const Strategy& fromGpuPass, int64_t maxCombos = 256);
  // Ours, after Espresso's two passes: one more sweep in the GPU pass's order
  // where each tensor may also take the all-CPU variant of its candidates
  // (so a tensor that only gains when compressed on CPU can), then the
  // offload pass again. Never worse than `from`.
  Strategy refinePass(const Strategy& from);
  // noCompression -> gpuPass -> offloadPass -> refinePass (when `refine`).
  // When tensors run one at a time the GPU pass starts from the best of no
  // compression, compressAllGpu() and compressAllCpu() (each with its small
  // tensors on a fused uncompressed option, fusedSmallStart), so the plan is
  // never predicted slower than any of them.
  // By default (the estimated search, docs/planner.md) models of more than
  // 64 tensors score each tensor's options with estimates of the rest of the
  // iteration (Simulator::estimateOptions, Simulator::estimate) and simulate
  // in full only the option about to be taken (up to 512 tensors) or each
  // sweep's result (past that). With setExact(true) every option compared
  // is simulated to the end (the search before the estimates, its
  // refinement capped at max(1200, the GPU pass's simulations)): what the
  // estimated search is measured against.
  Strategy decide(bool refine = true);
  void setExact(bool on) { exact_ = on; }
  bool exact() const { return exact_; }

  // Every option for every tensor (options^tensors simulations, shared
  // prefixes): only for small instances.
  Strategy exhaustive();
  // The offload oracle: every vector of counts, each simulated from scratch.
  Strategy exhaustiveOffload(const Strategy& fromGpuPass);

  const DecisionStats& stats() const { return stats_; }
  // Index of withCodecDevice(option, kCpu), or -1 when not in the list.
  int cpuVariant(int option) const { return cpuVariant_[option]; }
  bool isCompressed(int option) const { return compressed_[option]; }
  bool isGpuOnly(int option) const { return gpuOnly_[option]; }

 private:
  struct Group {
    std::vector<int> tensors;  // ascending: earliest-ready first
    int gpuOption;
    int cpuOption;
  };
  // The best of the options `keep` accepts, used by every tensor (the first
  // among times within kEps); an empty choice (iterUs kInf) when it accepts
  // none. `count`: each simulation counts in stats_.evaluations. `price`:
  // as compressAllByPath's (default: the simulated time).
  Strategy bestUniform(const std::function<bool(int)>& keep, bool count,
                       const UniformPrice& price = {});
  std::vector<Group> offloadGroups(const Strategy& s) const;
  std::vector<std::pair<int, int>> overridesFor(const std::vector<Group>& groups,
                                                const std::vector<int>& counts) const;
  // GPU pass candidates for a size class: the options not dominated in every
  // kind of work and in their own sync time.
  const std::vector<int>& candidates(int sizeClass);
  std::vector<int> front(const std::vector<int>& pool, int64_t elements, int dtypeBytes,
                         const Sparsity& sparsity = {}) const;
  // Under fusion, the better of `best` and "small tensors on one fusible
  // option, the rest as `all`" for several size thresholds (decide()).
  void fusedSmallStart(const Strategy& all, Strategy& best);
  // One sweep over the tensors; `withCpu` adds the CPU variants.
  Strategy sweep(const Strategy& start, bool withCpu);
  // The same sweep, options scored by estimates (exact near the end).
  Strategy sweepEstimated(const Strategy& start, bool withCpu);
  // offloadPass's coordinate descent with estimated counts.
  Strategy offloadEstimated(const Strategy& from);
  Strategy offload(const Strategy& from);  // the one decide() uses
  std::vector<int> visitOrder() const;
  void tries(int tensor, int current, bool withCpu, std::vector<int>& out);

  Simulator& sim_;
  std::vector<bool> compressed_, gpuOnly_;
  std::vector<int> cpuVariant_;
  std::vector<std::vector<int>> candidates_;
  std::vector<bool> candidatesReady_;
  std::vector<int> pool_;  // the options candidates() chooses from
  DecisionStats stats_;
  int gpuPassBubble_ = 0;  // the last idle gap after the latest GPU pass
  int64_t refineBudget_ = 0;  // simulations the refinement may still run
  bool exact_ = false;
  std::vector<double> lowScores_;  // sweep's scratch: the lowest screening scores so far
};

// Everything `cortado plan` reports, for one configuration.
struct PlanReport {
  // `espresso` is the plan: Espresso's per-tensor decision (`perTensor`)
  // with Cupcake's fused groups where they pay (fusion_search.h; equal to
  // it when they do not, or when fusion is off).
  Strategy noCompression, compressAllGpu, espresso, upperBound, perTensor;
  double forwardUs = 0;  // added to iteration times when reporting speedups
  DecisionStats stats;
  double decisionMs = 0;  // wall clock
  double decisionCpuMs =
      0;  // the deciding thread's CPU time (what a shared machine's load does not inflate)
  // The fusion search after the decision (not in decisionMs; 0 when off).
  double fusionMs = 0, fusionCpuMs = 0;
};

// The option list the planner uses for a cluster: the full tree (with the
// parameter server when the cluster has servers), restricted to flat options
// on one machine; with `zen` (a profile with sparse tensors,
// ModelProfile::hasSparse) Zen's two options after them.
std::vector<plan::TensorOption> plannerOptions(const Cluster& cluster, const std::string& codecSpec,
                                               bool zen = false);

// The options among `options` that a job without MPI collectives runs (the
// executor without groups): no flat step, and across machines only push and
// pull. Still closed under withCodecDevice.
std::vector<plan::TensorOption> pushPullOptions(const std::vector<plan::TensorOption>& options);

}  // namespace cortado::planner
