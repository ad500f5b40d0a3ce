// The planner at a GraVAC compression factor (docs/codecs.md, "GraVAC in the
// plan executor"). GraVAC changes its CF while the job runs, and with it the
// bytes of every compressed tensor, so the best placement moves: a tensor
// whose payload becomes tiny may be better off on a cheaper option. The
// executor asks its re-planner (executor::GravacReplanner, a function of the
// running plan and the new CF) when the CF moves 2x or more; these make
// that re-planner from the planner.
//
// The plan's compressed steps carry GraVAC's messages as top-k at the CF
// (executor::gravacCarrierPlan), so the planner plans with top-k keeping
// 1 / CF of every tensor: 16 header bytes + 8 bytes (value, index) per kept
// element. Espresso's decision runs at that codec, then Cupcake's fusion
// search when the running plan has groups (a plan without groups stays
// without). The planner is deterministic (no clocks, no randomness), so
// every worker that runs it on the same inputs gets the same plan, as the
// executor requires.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "core/plan/plan.h"
#include "scheduler/planner/report.h"
#include "scheduler/planner/simulator.h"

namespace cortado::planner {

// "topk:ratio=<1/cf>": the codec spec the executor's carrier plan runs at
// `cf` (the same text as executor::gravacCarrierPlan writes). Throws
// kInvalidArgument for a CF below 1 or not finite.
std::string gravacCarrierSpec(double cf);

// `base` (its cost terms and measured curves) keeping 1 / cf of the
// elements, its spec gravacCarrierSpec(cf): the payload sizes at the CF.
ResolvedCodec codecAtRatio(const ResolvedCodec& base, double cf);

// The planner's plan at `cf` for the job `base` models: `base`'s cluster,
// profile and options (each compressed option's codec made the carrier
// spec), codecAtRatio(base.codec(), cf); Espresso's decision, then the
// fusion search when `fuse`. `version`: the plan's version.
plan::Plan planAtRatio(const Simulator& base, double cf, bool fuse, uint64_t version);

// The same from planner settings (runPlanner): `config` with its codec made
// gravacCarrierSpec(cf), fusion when `fuse`, no upper bound.
plan::Plan planAtRatio(PlanConfig config, double cf, bool fuse, uint64_t version);

// A GraVAC re-planner (the signature of executor::GravacReplanner) from
// planner settings: for the running plan `current` and the new CF, the
// planner's plan at the CF (fusion when `current` has groups), version
// current.version + 1. Plans are cached per (CF, fusion): a CF GraVAC
// returns to is not planned twice. Checks `config` at once (loads the
// profile and the cost models): throws kInvalidArgument like runPlanner.
using PlanAtRatio = std::function<plan::Plan(const plan::Plan& current, double cf)>;
PlanAtRatio gravacReplanner(PlanConfig config);

}  // namespace cortado::planner
