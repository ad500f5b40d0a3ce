// The predictions behind `cortado bench model` (bench_model.cc): the replay's
// timeline under the planner's cost models built from the probes
// (bench_model_probe.h), each strategy's plan, and the prediction of a plan
// handed out during the run. Rank 0 runs these. Internal to the launcher.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/collective/collectives.h"
#include "core/plan/plan.h"
#include "core/plan/profile_report.h"
#include "launcher/bench_model.h"
#include "launcher/bench_model_probe.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/profile.h"
#include "scheduler/planner/simulator.h"

namespace cortado::launcher::replay {

struct Prediction {
  std::string strategy;
  plan::Plan plan;
  double predictedUs = 0;  // forward + backward and synchronization, one tensor at a time
  double overlappedUs = 0;  // forward + the simulator's overlapped timeline (the planner's model)
  double noSkewUs = 0;      // predictedUs without the workers' skew (Cluster::syncSkew), same plan
  std::string options;     // the one option everybody runs, or a summary
  // mergecomp: the best compress-everything plan of each codec device and
  // path (Planner::compressAllByPath, priced by mergecompPrice), the better
  // predicted first; the search screens them and searches the fastest
  // (Executor::setFusionSearch's alternatives).
  std::vector<plan::Plan> alternatives;
};

// MergeComp's alternatives' price (Planner::compressAllByPath): an option
// used by every tensor, priced in the byte-balanced groups MergeComp's search
// runs it in (executor::FusionSearch::balanced with 1, 2, 4, ... groups up to
// the search's default cap, and every tensor on its own; cut where the dtype
// changes, as a group is one buffer), the least of those simulated times.
// `sim` must outlive the function.
planner::Planner::UniformPrice mergecompPrice(planner::Simulator& sim);

// --predicted-trace FILE: the plan strategy's timeline goes to FILE, every
// other strategy's beside it with the strategy's name before the extension
// (predicted.json -> predicted-none.json).
std::string predictedTracePath(const std::string& file, const std::string& strategy);

// The prediction for a plan handed out during the run (replan), by the same
// cost models as the other strategies (`base`: the simulator predict() made):
// forward + the serialized timeline, and the overlapped one. Nothing when the
// plan names a tensor the profile lacks or compresses with another codec
// than --codec (no measured costs for it).
std::optional<std::pair<double, double>> predictPlan(const planner::Simulator& base,
                                                     const plan::Plan& p, const std::string& tracePath);


// The compressed push and pull curves of `cl.inter` (curvesCompressed) from
// the executor's own exchanges (Measured::exchangeReports): each entry's
// round trip less the servers' work as the simulator adds it, half to the
// push and half to the pull, a top-k or DGC answer's half at the answer's
// size (scheduler::OnlineReplanner::measuredCurves, the re-planner's fit of
// the same timings). Only entries over cl.machines servers; nothing without
// any. Returns the curves set (0 or 2).
int applyExchangeCurves(const std::vector<plan::ProfileReport>& reports, planner::Cluster& cl,
                        const planner::ResolvedCodec& codec);

// The option each step of the skew chains runs (measureSkewChain): `F:
// E(c) ag* D(c)` with the codec `codec` on the CPU; with `servers`, the
// option of the chains through the servers and of the compressed exchange
// probe (measureCompressedExchange): `H: i.rs E(c) x.push* x.pull* i.ag* D(c)`.
plan::TensorOption chainOption(const std::string& codec, bool servers = false);

// The CPU codec calls of workers that code at the same time, as the skew
// chains meet them (the emulated hosts share this machine's cores, and a
// call longer than the scheduler's slice shares a core with the other
// workers' calls): for each chain whose stages were traced, its workers'
// mean encode and decode over what `cl` and `codec` price for one step of
// chainOption() (the decode with its zeroing pass), by elements. Each point
// of codec's CPU curves (the encode's, the decode's and cl's CPU zeroing
// pass) up to the largest chain's size is multiplied by that stretch at its
// size: interpolated in the logarithm of the elements between the chains'
// sizes, the smallest chain's below them. Beyond the largest chain a point
// is the larger of its own value and the curve's value at that chain,
// stretched, times the ratio of the sizes (the probe's long calls meet the
// other workers' already). The "gpu" curves too where they are the CPU's
// (`hostTwin`: a "gpu" step runs the CPU twin). Returns (elements, encode
// stretch, decode stretch) per traced chain, in increasing size; none (and
// nothing changed) without a traced chain.
std::vector<std::array<double, 3>> applyChainContention(const std::vector<Measured::ChainPoint>& chains,
                                                        planner::Cluster& cl,
                                                        planner::ResolvedCodec& codec, bool hostTwin);

// The workers' skew as chains of steps meet it, into cl.syncSkew (its curve
// alone): each chain's measured time per step (Measured::ChainPoint, the
// slowest worker's) less what `cl` without a skew and `codec` price for one
// step of chainOption() as the replay's timeline runs a batch of them (one
// execution after the other, or the encode pipeline where cl.pipeline is
// set), at least 0, by the work before the step's allgather (its encode, as
// planner::applySyncSkew counts it); chains of equal work averaged, the
// curve made non-decreasing (MeasuredCurve::monotone), then concave through
// no work and no wait (each point raised to the least such curve above
// them all). No curve (and no skew) without a chain of work. Returns the
// curve's points. `breakdown` (optional): for each chain whose stages were
// traced, "STEPSxELEMENTS: step (priced): E traced (priced), ag* ..., D ...,
// the rest" in us per step, the rest being the step less its traced stages
// (the wait for the last worker, and the executor's own time). `servers`:
// the chains through the servers (Measured::serverChainPoints), each step
// chainOption(codec, true)'s, its work the encode before the push, into
// cl.pushSkew instead.
std::vector<std::pair<double, double>> applyChainSkew(const std::vector<Measured::ChainPoint>& chains,
                                                      planner::Cluster& cl,
                                                      const planner::ResolvedCodec& codec,
                                                      std::string* breakdown = nullptr,
                                                      bool servers = false);

// Rank 0: the cost models from the measurements, as a simulator over the
// planner's options for this job (BytePS's default among them, at
// *bytepsIndex); *costNote says what they are. Either may be null.
std::shared_ptr<planner::Simulator> buildSimulator(const ModelBenchOptions& o,
                                                   const planner::ModelProfile& profile,
                                                   const collective::Topology& topo, const Measured& m,
                                                   int cpuCores, uint64_t chunkBytes,
                                                   uint64_t fusionBytes, bool pipeline,
                                                   std::string* costNote, int* bytepsIndex);

// Rank 0: every strategy's plan and predicted iteration time under the cost
// models from the measurements (*keep: their simulator).
std::vector<Prediction> predict(const ModelBenchOptions& o, const planner::ModelProfile& profile,
                                const collective::Topology& topo, const Measured& m,
                                int cpuCores, uint64_t chunkBytes, uint64_t fusionBytes,
                                bool pipeline, std::string* costNote,
                                std::shared_ptr<planner::Simulator>* keep);

}  // namespace cortado::launcher::replay
