// One planner run as the `plan` and `bench plan` commands use it: load the
// cost models and the profile, build the cluster, decide, and compute the
// reference points; then render the summary, the per-tensor table, the plan.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/plan/plan.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/fusion_search.h"

namespace cortado::planner {

struct PlanConfig {
  std::string model = "resnet50";  // bundled name or a profile .json
  int machines = 8;
  int gpusPerMachine = 8;
  std::string intra = "nvlink";
  std::string inter = "25gbit";
  std::string codec = "dgc:ratio=0.01";
  int cpuCores = 16;
  bool parameterServer = true;
  std::string dataDir;       // empty: the built-in default
  std::string hardwareFile;  // empty: <dataDir>/costs/hardware.json
  // Loaded in turn on top of <dataDir>/costs/codecs.json: a table replaces
  // what is loaded so far, measured fits apply on top (e.g. the CPU's, then the GPU's).
  std::vector<std::string> codecFiles;
  uint64_t planVersion = 1;
  bool upperBound = true;
  // The exact search (every candidate simulated to the end) instead of the
  // default estimated one: slower, what the estimated search is measured against.
  bool exact = false;
  // Cupcake's fusion search after the decision (fusion_search.h): the plan
  // carries fused groups where they are predicted faster. The upper bound
  // is searched the same way, so that it stays a bound.
  bool fuse = true;
  // The fusion search's FusionConfig::oneOptionMargin (the plan's search
  // only: the upper bound's keeps the mixed optimum, so that it stays a
  // bound).
  double oneOptionMargin = FusionConfig{}.oneOptionMargin;
  // Only the options a job without MPI collectives runs (the Python
  // binding's executor): no flat collectives, push/pull across machines
  // (pushPullOptions).
  bool pushPullOnly = false;
  // When set, used instead of loading `model` (the benchmark's synthetic model).
  std::shared_ptr<const ModelProfile> profile;
};

struct PlanRun {
  PlanConfig config;
  std::unique_ptr<Simulator> sim;
  PlanReport report;
  plan::Plan plan;
  std::vector<TensorTiming> timings;  // of the plan (report.espresso, its groups included)
  FusionStats fusion;                 // of the plan's fusion search (when config.fuse)
};

// Throws cortado::Error (kInvalidArgument) with the valid values on a bad
// model, link or codec.
PlanRun runPlanner(const PlanConfig& config);

// The plan the runtime executes for a strategy, its fused groups included.
plan::Plan toPlan(const Simulator& sim, const Strategy& s, uint64_t version);

// The plan's groups as [first, last] ranges of the profile's tensors (in its
// order), sorted: Strategy::groups of a plan. A group that is not a run of
// consecutive profile tensors is left out.
std::vector<std::pair<int, int>> groupRanges(const ModelProfile& profile, const plan::Plan& p);

std::string summaryText(const PlanRun& run);
std::string tensorTable(const PlanRun& run);
std::string traceJson(PlanRun& run);  // Chrome trace of the plan

std::string resolveDataDir(const std::string& dataDir);

}  // namespace cortado::planner
