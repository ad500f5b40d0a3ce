#include "scheduler/replan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/common/error.h"
#include "core/common/logging.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/report.h"
#include "scheduler/planner/simulator.h"

namespace cortado::scheduler {

using plan::CommOp;
using plan::Scope;

namespace {

struct Point {
  double a, b, y, w;  // y = alpha * a + beta * b, weight w
};

// Weighted least squares for (alpha >= 0, beta > 0); nullopt without data.
std::optional<planner::AlphaBeta> solve(const std::vector<Point>& pts) {
  double saa = 0, sab = 0, sbb = 0, say = 0, sby = 0;
  for (const Point& p : pts) {
    saa += p.w * p.a * p.a, sab += p.w * p.a * p.b, sbb += p.w * p.b * p.b;
    say += p.w * p.a * p.y, sby += p.w * p.b * p.y;
  }
  if (sbb <= 0) return std::nullopt;
  double alpha = 0, beta = 0;
  const double det = saa * sbb - sab * sab;
  if (det > 1e-12 * saa * sbb) {
    alpha = (say * sbb - sab * sby) / det;
    beta = (saa * sby - sab * say) / det;
  }
  if (!(det > 1e-12 * saa * sbb) || alpha < 0 || beta <= 0) {  // one size, or noise: through the origin
    alpha = 0;
    beta = sby / sbb;
  }
  if (!(beta > 0) || !std::isfinite(beta)) return std::nullopt;
  planner::AlphaBeta ab;
  ab.alphaUs = alpha;
  ab.gbps = 8.0 / (beta * 1000.0);  // beta in us per byte
  return ab;
}

}  // namespace

OnlineReplanner::OnlineReplanner(ReplanOptions opts) : opts_(std::move(opts)) {
  const std::string dir = planner::resolveDataDir(opts_.dataDir);
  hw_ = planner::HardwareModel::load(dir + "/costs/hardware.json");
  codecs_ = planner::CodecModel::load(dir + "/costs/codecs.json");
  hw_.link(opts_.intra);  // throws listing the valid names
  hw_.link(opts_.inter);
  codecs_.resolve(opts_.codec);
  CORTADO_ENFORCE(opts_.threshold > 0 && opts_.ahead >= 1 && opts_.minGain >= 0 && opts_.minGain < 1,
                  ErrorCode::kInvalidArgument,
                  "re-planning: CORTADO_REPLAN_THRESHOLD must be > 0 (got {}), "
                  "CORTADO_REPLAN_AHEAD at least 1 (got {}) and CORTADO_REPLAN_MIN_GAIN in [0, 1) "
                  "(got {})",
                  opts_.threshold, opts_.ahead, opts_.minGain);
}

LinkFit OnlineReplanner::fitLink(const std::vector<plan::ProfileReport>& reports, bool intra,
                           const planner::LinkCost& prior) {
  planner::LinkCost unitA, unitB;
  unitA.base = {1.0, std::numeric_limits<double>::infinity()};
  unitB.base = {0.0, 8.0 / 1000.0};  // beta = 1 us per byte
  std::map<CommOp, std::vector<Point>> byOp;
  std::vector<Point> all;
  for (const auto& r : reports) {
    for (const auto& c : r.comms) {
      if ((c.scope == Scope::kIntra) != intra) continue;
      if (c.calls == 0 || !(c.totalUs > 0) || !std::isfinite(c.totalUs)) continue;
      CommOp op = c.op;
      int p = c.groupSize;
      double us = c.totalUs / double(c.calls);
      if (op == CommOp::kPush) {  // a push and its pull, one round trip
        p = r.machines;
        us /= 2;
      }
      if (p <= 1 || c.bytes == 0) continue;
      Point pt{planner::commTimeUs(unitA, op, p, double(c.bytes)),
               planner::commTimeUs(unitB, op, p, double(c.bytes)), us, double(c.calls) / (us * us)};
      byOp[op].push_back(pt);
      if (op == CommOp::kPush) byOp[CommOp::kPull].push_back(pt);
      all.push_back(pt);
    }
  }
  LinkFit f;
  f.link = prior;
  f.points = int(all.size());
  if (auto ab = solve(all)) f.link.base = *ab;
  else f.points = 0;
  f.link.perOp.clear();
  for (const auto& [op, pts] : byOp)
    if (auto ab = solve(pts)) f.link.perOp[op] = *ab;
  return f;
}

std::vector<CodecFit> OnlineReplanner::fitCodecs(const std::vector<plan::ProfileReport>& reports) {
  std::map<std::pair<std::string, bool>, std::vector<Point>> byCodec;
  for (const auto& r : reports)
    for (const auto& c : r.codecs) {
      if (c.device != plan::Device::kCpu || c.elements == 0 || c.calls == 0 || !(c.totalUs > 0) ||
          !std::isfinite(c.totalUs))
        continue;
      const double us = c.totalUs / double(c.calls);
      byCodec[{c.codec, c.encode}].push_back({1.0, double(c.elements), us, double(c.calls) / (us * us)});
    }
  std::vector<CodecFit> out;
  for (const auto& [k, pts] : byCodec) {
    // solve() reads its b coefficient as bytes; here it is elements.
    auto ab = solve(pts);
    if (!ab) continue;
    CodecFit f;
    f.codec = k.first;
    f.encode = k.second;
    f.cost.fixedUs = ab->alphaUs;
    f.cost.nsPerElement = ab->betaUsPerByte() * 1000.0;
    f.points = int(pts.size());
    out.push_back(std::move(f));
  }
  return out;
}

std::optional<control::PlanUpdate> OnlineReplanner::onWindow(const std::vector<plan::ProfileReport>& reports) {
  CORTADO_ENFORCE(!reports.empty(), ErrorCode::kInvalidArgument, "re-planning without reports");
  const auto& r0 = reports.front();
  for (const auto& r : reports)
    CORTADO_ENFORCE(r.machines == r0.machines && r.localSize == r0.localSize && r.window == r0.window &&
                        r.machines >= 1 && r.localSize >= 1,
                    ErrorCode::kInvalidArgument,
                    "re-planning: rank {} reports window {} on {} machines x {} workers, rank {} "
                    "window {} on {} x {}; the window is skipped and the current plan stays",
                    r0.rank, r0.window, r0.machines, r0.localSize, r.rank, r.window, r.machines,
                    r.localSize);
  // One plan pending at a time: a window that began before the last plan's
  // switch iteration measured the old plan, and a newer plan sent now could
  // reach some workers before that switch and others after it (a worker
  // keeps only the newest plan), so they would run different plans.
  uint64_t first = 0;
  for (const auto& r : reports) first = std::max(first, r.firstIteration);
  if (version_ > 0 && first < switchAt_) {
    reason_ = fmt::format("window {} (iterations from {}) began before plan version {} took effect "
                          "at iteration {}; not re-planned",
                          r0.window, first, version_, switchAt_);
    CORTADO_LOG_DEBUG("[replan] {}", reason_);
    return std::nullopt;
  }
  LinkFit intra = fitLink(reports, true, hw_.link(opts_.intra));
  LinkFit inter = fitLink(reports, false, hw_.link(opts_.inter));
  const double nowInter = inter.link.base.gbps, nowIntra = intra.link.base.gbps;
  if (version_ > 0) {
    auto moved = [&](const LinkFit& f, double now, double was) {
      return f.points > 0 && was > 0 && std::abs(now / was - 1.0) > opts_.threshold;
    };
    const bool interMoved = moved(inter, nowInter, plannedInter_);
    const bool intraMoved = moved(intra, nowIntra, plannedIntra_);
    if (!interMoved && !intraMoved) {
      CORTADO_LOG_DEBUG("[replan] window {}: inter {:.3g} Gbit/s ({} points), intra {:.3g} Gbit/s "
                        "({} points), planned with {:.3g} and {:.3g}: within the threshold",
                        r0.window, nowInter, inter.points, nowIntra, intra.points, plannedInter_,
                        plannedIntra_);
      return std::nullopt;
    }
    reason_ = fmt::format("window {}: {} link rate {:.3g} Gbit/s, planned with {:.3g} (threshold {:.0f}%)",
                          r0.window, interMoved ? "inter-machine" : "intra-machine",
                          interMoved ? nowInter : nowIntra,
                          interMoved ? plannedInter_ : plannedIntra_, opts_.threshold * 100);
  } else {
    reason_ = fmt::format("window {}: first complete profile", r0.window);
  }

  // Codec costs measured on the workers' CPUs.
  planner::CodecModel codecs = codecs_;
  {
    nlohmann::json entries = nlohmann::json::array();
    for (const CodecFit& f : fitCodecs(reports)) {
      // applyMeasured's format: seconds = alpha + beta * input bytes (float32).
      entries.push_back({{"codec", f.codec}, {"device", "cpu"},
                         {"op", f.encode ? "encode" : "decompress_add"},
                         {"alpha", f.cost.fixedUs * 1e-6}, {"beta", f.cost.nsPerElement / 4.0 * 1e-9}});
    }
    if (!entries.empty()) {
      try {
        codecs.applyMeasured({{"schema", "cortado.codec_costs.v1"}, {"threads", 1}, {"entries", entries}},
                             "online profile");
      } catch (const Error& e) {
        CORTADO_LOG_WARN("[replan] measured codec costs not used: {}", e.what());
      }
    }
  }

  // The profile: mean ready time per tensor over the workers.
  struct Ready {
    uint64_t elements = 0;
    double sum = 0;
    int n = 0;
  };
  std::map<std::string, Ready> readySum;
  for (const auto& r : reports)
    for (const auto& t : r.ready) {
      Ready& x = readySum[t.tensor];
      x.elements = t.elements;
      x.sum += t.readyUs;
      ++x.n;
    }
  std::map<std::string, std::pair<uint64_t, double>> ready;
  for (const auto& [name, x] : readySum) ready[name] = {x.elements, x.sum / x.n};
  CORTADO_ENFORCE(!ready.empty(), ErrorCode::kInvalidArgument,
                  "re-planning: the window's reports name no tensor (did the workers run "
                  "Executor::run between beginIteration calls?)");
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, v] : ready) order.push_back({v.second, name});
  std::sort(order.begin(), order.end());
  planner::ModelProfile prof;
  prof.model = "online";
  prof.source = reason_;
  double prev = 0;
  for (const auto& [at, name] : order) {
    planner::TensorProfile t;
    t.name = name;
    t.elements = int64_t(ready[name].first);
    t.backwardUs = std::max(0.0, at - prev);
    prev = std::max(prev, at);
    prof.tensors.push_back(t);
  }

  planner::Cluster cl;
  cl.machines = r0.machines;
  cl.gpusPerMachine = r0.localSize;
  cl.intra = intra.link;
  cl.inter = inter.link;
  cl.d2h = hw_.d2h;
  cl.h2d = hw_.h2d;
  cl.cpuCores = opts_.cpuCores;
  cl.cpuSumGbps = hw_.cpuSumGbps;
  cl.parameterServer = true;
  std::vector<plan::TensorOption> options = planner::plannerOptions(cl, opts_.codec);
  bool collectives = true;
  for (const auto& r : reports) collectives = collectives && r.collectives;
  if (!collectives) {  // workers without MPI run only intra no-ops and push/pull
    std::erase_if(options, [](const plan::TensorOption& o) {
      for (const auto& s : o.steps)
        if (s.kind == plan::StepKind::kComm &&
            (s.scope == Scope::kFlat || (s.scope == Scope::kInter && s.op != CommOp::kPush && s.op != CommOp::kPull)))
          return true;
      return false;
    });
  }
  planner::Simulator sim(cl, codecs.resolve(opts_.codec), prof, options);
  planner::Planner pl(sim);
  planner::Strategy s = pl.decide();
  // The plan the workers run, under the same refitted costs: a new plan must
  // beat it by minGain (a plan with an option this job's workers cannot run
  // any more, or a tensor it does not name, is always replaced).
  if (current_) {
    std::vector<int> cur(size_t(sim.tensors()), -1);
    bool comparable = true;
    for (int j = 0; j < sim.tensors() && comparable; ++j) {
      auto it = current_->tensors.find(sim.profile().tensors[size_t(j)].name);
      if (it == current_->tensors.end()) {
        comparable = false;
        break;
      }
      auto o = std::find(options.begin(), options.end(), it->second);
      if (o == options.end()) comparable = false;
      else cur[size_t(j)] = int(o - options.begin());
    }
    if (comparable) {
      const double curUs = sim.simulate(cur), newUs = sim.simulate(s.choice);
      if (!(newUs < curUs * (1.0 - opts_.minGain))) {
        reason_ += fmt::format("; the new plan is predicted {:.0f} us against {:.0f} us for plan "
                               "version {}, a gain under CORTADO_REPLAN_MIN_GAIN {:.0f}%: the plan "
                               "stays",
                               newUs, curUs, current_->version, opts_.minGain * 100);
        CORTADO_LOG_INFO("[replan] {}", reason_);
        plannedInter_ = nowInter;  // the current plan is what these rates call for
        plannedIntra_ = nowIntra;
        return std::nullopt;
      }
    }
  }
  uint64_t base = 0, end = 0;
  for (const auto& r : reports) base = std::max(base, r.planVersion), end = std::max(end, r.endIteration);
  version_ = std::max(version_, base) + 1;
  plan::Plan p = planner::toPlan(sim, s, version_);
  plannedInter_ = nowInter;
  plannedIntra_ = nowIntra;
  current_ = p;
  control::PlanUpdate u;
  u.version = version_;
  u.switchAt = end + opts_.ahead;
  switchAt_ = u.switchAt;
  u.planJson = plan::toJsonString(p);
  int compressed = 0;
  for (const auto& [n, o] : p.tensors) compressed += o.compressed();
  CORTADO_LOG_INFO("[replan] plan version {} ({}): {} of {} tensors compressed, predicted {:.0f} us, "
                   "inter {:.3g} Gbit/s ({} points), intra {:.3g} Gbit/s ({} points); switch at {}",
                   version_, reason_, compressed, p.tensors.size(), s.iterUs, nowInter, inter.points,
                   nowIntra, intra.points, u.switchAt);
  return u;
}

Replanner makeReplanner(ReplanOptions opts) {
  auto r = std::make_shared<OnlineReplanner>(std::move(opts));
  return [r](const std::vector<plan::ProfileReport>& reports) { return r->onWindow(reports); };
}

}  // namespace cortado::scheduler
