#include "scheduler/planner/gravac_plan.h"

#include <cmath>
#include <tuple>

#include "core/common/error.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/fusion_search.h"

namespace cortado::planner {

std::string gravacCarrierSpec(double cf) {
  CORTADO_ENFORCE(std::isfinite(cf) && cf >= 1.0, ErrorCode::kInvalidArgument,
                  "GraVAC re-plan: CF {} is not a compression factor (>= 1)", cf);
  return fmt::format("topk:ratio={}", 1.0 / cf);
}

ResolvedCodec codecAtRatio(const ResolvedCodec& base, double cf) {
  ResolvedCodec c = base;
  c.spec = gravacCarrierSpec(cf);
  c.selectedFraction = 1.0 / cf;
  return c;
}

plan::Plan planAtRatio(const Simulator& base, double cf, bool fuse, uint64_t version) {
  ResolvedCodec codec = codecAtRatio(base.codec(), cf);
  std::vector<plan::TensorOption> options = base.options();
  for (auto& o : options)
    if (!o.codec.empty()) o.codec = codec.spec;
  Simulator sim(base.cluster(), codec, base.profile(), std::move(options));
  Planner pl(sim);
  Strategy s = pl.decide();
  if (fuse) s = FusionSearch(sim).search(s);
  plan::Plan p = toPlan(sim, s, version);
  plan::validate(p);
  return p;
}

plan::Plan planAtRatio(PlanConfig config, double cf, bool fuse, uint64_t version) {
  config.codec = gravacCarrierSpec(cf);
  config.fuse = fuse;
  config.upperBound = false;
  config.planVersion = version;
  return runPlanner(config).plan;
}

PlanAtRatio gravacReplanner(PlanConfig config) {
  // Fail at start, not at the first re-plan: the profile, the links and the
  // cost models load here (a CF every codec table accepts).
  config.upperBound = false;
  {
    PlanConfig probe = config;
    probe.codec = gravacCarrierSpec(10);
    probe.fuse = false;
    if (!probe.profile)
      probe.profile = std::make_shared<const ModelProfile>(
          loadModel(probe.model, resolveDataDir(probe.dataDir)));
    config.profile = probe.profile;
    (void)runPlanner(probe);
  }
  struct Cache {
    std::mutex mu;
    std::map<std::pair<double, bool>, plan::Plan> plans;
  };
  auto cache = std::make_shared<Cache>();
  return [config, cache](const plan::Plan& current, double cf) {
    const bool fuse = !current.groups.empty();
    std::lock_guard<std::mutex> lock(cache->mu);
    auto it = cache->plans.find({cf, fuse});
    if (it == cache->plans.end())
      it = cache->plans.emplace(std::make_pair(cf, fuse), planAtRatio(config, cf, fuse, 0)).first;
    plan::Plan p = it->second;
    p.version = current.version + 1;
    return p;
  };
}

}  // namespace cortado::planner
