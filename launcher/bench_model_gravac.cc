#include "launcher/bench_model_gravac.h"

#include <map>
#include <sstream>

#include "compressor/gravac_compressor.h"
#include "core/common/error.h"
#include "scheduler/planner/gravac_plan.h"

namespace cortado::launcher::replay {

compressor::GravacOptions parseGravacSettings(const std::string& text,
                                              const std::string& benchCodec) {
  compressor::GravacOptions o;
  const std::string name = benchCodec.substr(0, benchCodec.find(':'));
  o.codec = name == "topk" || name == "dgc" || name == "randomk" ? name : "topk";
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    CORTADO_ENFORCE(eq != std::string::npos && eq > 0, ErrorCode::kInvalidArgument,
                    "--gravac '{}': '{}' is not key=value (e.g. codec=topk,window=5,min_ratio=10)",
                    text, item);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "codec") {
      o.codec = value;
      continue;
    }
    if (key == "policy") {
      o.policy = compressor::parseGravacPolicy(value);
      continue;
    }
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(value, &used);
      CORTADO_ENFORCE(used == value.size(), ErrorCode::kInvalidArgument, "trailing text");
    } catch (const std::exception&) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--gravac '{}': {}={} is not a number", text, key, value));
    }
    if (key == "min_ratio") {
      o.minRatio = v;
    } else if (key == "max_ratio") {
      o.maxRatio = v;
    } else if (key == "window") {
      CORTADO_ENFORCE(v >= 1 && v == double(uint64_t(v)), ErrorCode::kInvalidArgument,
                      "--gravac '{}': window={} is not a whole number of iterations >= 1", text,
                      value);
      o.window = uint64_t(v);
    } else if (key == "epsilon") {
      o.epsilon = v;
    } else if (key == "omega") {
      o.omega = v;
    } else if (key == "step") {
      o.step = v;
    } else if (key == "alpha") {
      o.alpha = v;
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--gravac '{}': unknown setting '{}' (valid: codec, min_ratio, "
                              "max_ratio, window, epsilon, omega, policy, step, alpha)",
                              text, key));
    }
  }
  o.validate();
  return o;
}

executor::GravacReplanner gravacBenchReplanner(World& world,
                                               std::shared_ptr<planner::Simulator> sim, bool lead) {
  CORTADO_ENFORCE(!lead || sim, ErrorCode::kInvalidArgument,
                  "the gravac strategy's re-planner needs rank 0's simulator");
  return [&world, sim, lead](const plan::Plan& current, double cf) {
    std::string text, err;
    if (lead) {
      try {
        text = plan::toJsonString(
            planner::planAtRatio(*sim, cf, !current.groups.empty(), current.version + 1));
      } catch (const Error& e) {
        err = e.what();
      }
    }
    err = world.broadcast(err);
    if (!err.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("gravac: planning at CF {}: {}", cf, err));
    return plan::planFromJsonString(world.broadcast(text));
  };
}

std::string gravacSummary(const executor::Executor& ex, const std::vector<double>& timedRatios,
                          size_t tensors) {
  std::map<double, int> sent;
  for (double cf : timedRatios) ++sent[cf];
  std::string cfs;
  for (const auto& [cf, n] : sent)
    cfs += fmt::format("{}{}x in {}", cfs.empty() ? "" : ", ", cf, n);
  // The plan running at the end, and its CF (its carrier codec's ratio);
  // a re-plan decided in the last iteration has not run.
  const plan::Plan& p = ex.currentPlan();
  std::map<std::string, int> count;
  int compressed = 0;
  double runningCf = 0;
  for (const auto& [name, opt] : p.tensors) {
    ++count[opt.describe()];
    compressed += opt.compressed();
    const auto at = opt.codec.find("ratio=");
    if (opt.compressed() && at != std::string::npos)
      runningCf = 1.0 / std::stod(opt.codec.substr(at + 6));
  }
  const std::string pending =
      runningCf > 0 && ex.gravacPlanRatio() != runningCf
          ? fmt::format(" (a re-plan at CF {} decided in the last iteration)", ex.gravacPlanRatio())
          : std::string();
  const auto* g = ex.gravac();
  const compressor::GravacOptions o = g ? g->controller().options() : compressor::GravacOptions{};
  return fmt::format(
      "GraVAC {} [{}x, {}x], window {}, epsilon {}: CF sent {} timed iterations; {} re-plans by "
      "the planner (measured costs); the plan at the end, for CF {}{}: {} distinct options, {} "
      "of {} tensors compressed, {} groups",
      o.codec, o.minRatio, o.maxRatio, o.window, o.epsilon, cfs.empty() ? "none in" : cfs,
      ex.gravacReplans(),
      runningCf > 0
          ? fmt::format("{:.4g}", runningCf)
          : fmt::format("{} (the executor's; no option compressed)", ex.gravacPlanRatio()),
      pending, count.size(), compressed, tensors, p.groups.size());
}

}  // namespace cortado::launcher::replay
