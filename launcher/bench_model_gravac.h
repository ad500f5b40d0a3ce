// The `gravac` strategy of `cortado bench model` (bench_model.cc): GraVAC in
// the plan executor (docs/codecs.md, "GraVAC in the plan executor"), its plan
// re-planned by the Espresso planner with this run's measured costs whenever
// the CF sent moves 2x. Internal to the launcher.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compressor/gravac.h"
#include "core/executor/executor.h"
#include "launcher/bench_model_probe.h"
#include "scheduler/planner/simulator.h"

namespace cortado::launcher::replay {

// --gravac "codec=topk,window=5,min_ratio=10,...": GraVAC's settings (codec,
// min_ratio, max_ratio, window, epsilon, omega, policy, step, alpha), the
// paper's defaults for the rest (compressor::GravacOptions); the codec
// defaults to --codec's name when that is topk, dgc or randomk, else topk.
// Throws kInvalidArgument naming the setting (and GravacOptions::validate's
// errors).
compressor::GravacOptions parseGravacSettings(const std::string& text,
                                              const std::string& benchCodec);

// The strategy's re-planner: rank 0 (`lead`, holding `sim`, the simulator of
// the measured costs) runs planner::planAtRatio at the new CF (the fusion
// search when the running plan has groups) and the plan goes to every worker
// over `world`; the others wait for it. A collective: every worker calls it
// at the same iteration, as GraVAC's agreed decisions make them.
executor::GravacReplanner gravacBenchReplanner(World& world,
                                               std::shared_ptr<planner::Simulator> sim, bool lead);

// Rank 0's line for the strategy's row: the settings, the CFs sent in the
// timed iterations, the re-plans and the plan the executor ends on.
std::string gravacSummary(const executor::Executor& ex, const std::vector<double>& timedRatios,
                          size_t tensors);

}  // namespace cortado::launcher::replay
