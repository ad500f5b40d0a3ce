// The online re-planner's decision on each profiling window (replan.h): the
// checks of the last switch, the drift of the links, and a new plan when it
// pays. Its fits from the workers' reports are in replan_fit.cc.
#include "scheduler/replan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "core/common/error.h"
#include "core/common/logging.h"
#include "scheduler/planner/compile.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/fusion_search.h"
#include "scheduler/planner/report.h"
#include "scheduler/planner/simulator.h"
#include "scheduler/replan_fit.h"

namespace cortado::scheduler {

using plan::CommOp;
using plan::Scope;

namespace {

// Each communication step of option `o` for a tensor of `elements`: its
// link, operation, group size and bytes as commTimeUs takes them (the option
// compiled on unit links, no latency and 1 us per byte, each step's time
// divided by its formula's time for one byte).
struct StepSize {
  bool intra;
  CommOp op;
  bool compressed;
  int p;
  double bytes;
};
std::vector<StepSize> stepSizes(const planner::Cluster& cl, const planner::ResolvedCodec& codec,
                                int64_t elements, const plan::TensorOption& o) {
  planner::LinkCost unit;
  unit.base = {0.0, 8.0 / 1000.0};
  planner::Cluster u = cl;
  u.intra = u.inter = unit;
  std::vector<StepSize> out;
  for (const planner::SimOp& op : planner::compileOption(u, codec, elements, 4, o).ops) {
    if (op.kind != planner::OpKind::kComm) continue;
    const int p = op.scope == Scope::kFlat    ? cl.machines * cl.gpusPerMachine
                  : op.scope == Scope::kInter ? cl.machines
                                              : cl.gpusPerMachine;
    const double perByte = planner::commTimeUs(unit, op.comm, p, 1.0);
    if (perByte > 0) out.push_back({op.res == planner::Res::kIntra, op.comm, op.compressed, p, op.us / perByte});
  }
  return out;
}

// The measured curve commTimeUs uses for a step, if any.
const planner::MeasuredCurve* curveFor(const planner::LinkCost& l, const StepSize& st) {
  auto find = [&](const std::map<CommOp, planner::MeasuredCurve>& m) -> const planner::MeasuredCurve* {
    auto it = m.find(st.op);
    return it != m.end() && it->second.p == st.p && !it->second.points.empty() ? &it->second : nullptr;
  };
  if (st.compressed) {
    if (const auto* c = find(l.curvesCompressed)) return c;
    if (l.perOpCompressed.count(st.op)) return nullptr;
  }
  return find(l.curves);
}

}  // namespace

using detail::curvePoint;
using detail::median;
using detail::usable;

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
  CORTADO_ENFORCE(opts_.confirmWindows >= 1, ErrorCode::kInvalidArgument,
                  "re-planning: confirmWindows must be at least 1 (got {})", opts_.confirmWindows);
}

std::optional<control::PlanUpdate> OnlineReplanner::onWindow(const std::vector<plan::ProfileReport>& reports) {
  // How long a decision took (in its log lines): it runs on the scheduler's
  // planner thread, on the cores the job's workers and servers use.
  const auto started = std::chrono::steady_clock::now();
  auto tookMs = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  };
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
  // The window over every report: its first and end iteration, the plan
  // version run (and whether every worker ran the same one), and the slowest
  // worker's wall time per iteration (0 when a report has none).
  uint64_t first = 0, windowEnd = 0, runningVersion = 0;
  bool oneVersion = true, allMeasured = true;
  double measuredUs = 0;
  for (const auto& r : reports) {
    first = std::max(first, r.firstIteration);
    windowEnd = std::max(windowEnd, r.endIteration);
    runningVersion = std::max(runningVersion, r.planVersion);
    oneVersion = oneVersion && r.planVersion == r0.planVersion;
    allMeasured = allMeasured && r.iterationUs > 0;
    measuredUs = std::max(measuredUs, r.iterationUs);
  }
  if (!allMeasured) measuredUs = 0;
  // A plan handed out: a version above the scheduler's and the workers',
  // switching `ahead` iterations after this window.
  auto handOut = [&](plan::Plan p) {
    movedWindows_ = 0;
    version_ = std::max(version_, runningVersion) + 1;
    p.version = version_;
    current_ = p;
    control::PlanUpdate u;
    u.version = version_;
    u.switchAt = windowEnd + opts_.ahead;
    switchAt_ = u.switchAt;
    u.planJson = plan::toJsonString(p);
    return u;
  };
  // One plan pending at a time: a window that began before the last plan's
  // switch iteration measured the old plan, and a newer plan sent now could
  // reach some workers before that switch and others after it (a worker
  // keeps only the newest plan), so they would run different plans.
  // A window that begins at the switch is left out too: its first iteration
  // is the new plan's first, which pays its first touches (new residuals and
  // server keys: 4-9 s on bert-base on the emulated hosts, docs/benchmarks.md).
  if (version_ > 0 && first <= switchAt_) {
    // The old plan's windows before its last iteration (which flushes the
    // servers' residuals dense): more measurements of the plan the check
    // compares with.
    if (check_ && oneVersion && measuredUs > 0 && runningVersion == check_->before.version &&
        windowEnd < switchAt_)
      check_->beforeUs.push_back(measuredUs);
    reason_ = fmt::format("window {} (iterations from {}) began before plan version {} took effect "
                          "at iteration {} or with it; not re-planned",
                          r0.window, first, version_, switchAt_);
    CORTADO_LOG_DEBUG("[replan] {}", reason_);
    return std::nullopt;
  }
  LinkFit intra = fitLink(reports, true, hw_.link(opts_.intra));
  LinkFit inter = fitLink(reports, false, hw_.link(opts_.inter));
  const double nowInter = inter.link.base.gbps, nowIntra = intra.link.base.gbps;
  const CommCurves nowCurves = commCurves(reports);
  // The links against the reference (the last decision's window, and kinds
  // added since): a drift counts when the messages compared are at least a
  // third of the link's time in this window.
  constexpr double kCompared = 1.0 / 3;
  const LinkDrift interDrift = drift(reference_, reports, false);
  const LinkDrift intraDrift = drift(reference_, reports, true);
  auto beyond = [&](const LinkDrift& d) {
    return d.coverage >= kCompared && (d.ratio > 1 + opts_.threshold || d.ratio < 1 / (1 + opts_.threshold));
  };
  auto describe = [](const LinkDrift& d) {
    return d.coverage > 0 ? fmt::format("{:.2f}x the time ({:.3g}% of it compared)", d.ratio, d.coverage * 100)
                          : std::string("nothing compared");
  };
  // Message kinds the reference lacks (a new plan's), from their first window.
  auto absorb = [&] {
    for (const auto& [key, curve] : nowCurves.curves) reference_.curves.emplace(key, curve);
  };
  // A decision (a plan handed out, or the workers' kept): its links are this
  // window's, the reference from here on.
  auto anchor = [&] {
    movedWindows_ = 0;
    plannedInter_ = nowInter;
    plannedIntra_ = nowIntra;
    reference_ = nowCurves;
  };
  // The measured check of the last plan handed out: the first window that
  // begins after its switch, against the median of the old plan's windows
  // (Check::beforeUs). A plan kept on the
  // same links takes this window as its reference (its own messages from
  // here on: the kinds both plans send need not take the same time under
  // each).
  bool rebase = false;
  if (check_ && oneVersion && runningVersion == version_) {
    const Check c = *check_;
    check_.reset();
    // Did a link slow down since the window that chose it? The messages
    // both plans send, when they compare; else the fitted rates. Only a
    // slower link excuses a slower plan: on the 2-core VM a link "moved" to
    // 0.74x its reference time (noise) and kept a plan that ran 652 ms per
    // iteration against the offline plan's 471 (docs/benchmarks.md, run R).
    // Nor a link on which the new plan moved more bytes per iteration than
    // the plan before it: its own traffic slows the messages both plans
    // send. Run T (docs/benchmarks.md): a plan that compressed 35 of
    // resnet101's 314 tensors against most of them ran 2838 ms per iteration
    // against 562 on the 1 Gbit/s link and was kept "(a link slowed down)".
    constexpr double kMoreBytes = 1.05;
    const double interBytes = linkBytesPerIteration(reports, false);
    const double intraBytes = linkBytesPerIteration(reports, true);
    const bool interMore = interBytes > c.interBytes * kMoreBytes;
    const bool intraMore = intraBytes > c.intraBytes * kMoreBytes;
    auto slowed = [&](const LinkDrift& d, double now, double was, bool moreOnIt) {
      if (moreOnIt) return false;
      if (d.coverage >= kCompared) return d.ratio > 1 + opts_.threshold;
      return was > 0 && now < was / (1 + opts_.threshold);
    };
    const bool linksMoved =
        slowed(interDrift, nowInter, c.inter, interMore) || slowed(intraDrift, nowIntra, c.intra, intraMore);
    const bool moreBytes = interMore || intraMore;
    const double beforeUs = median(c.beforeUs);
    const std::string over = c.beforeUs.size() == 1 ? std::string("1 window")
                                                    : fmt::format("median of {} windows", c.beforeUs.size());
    if (measuredUs > 0 && measuredUs > beforeUs * (1.0 + opts_.revertMargin) && !linksMoved) {
      reason_ = fmt::format("window {}: plan version {} measured {:.0f} us per iteration against {:.0f} us "
                            "for the plan before it ({}; more than {:.0f}% slower; links: inter {}, "
                            "intra {}, within {:.0f}%{}): that plan again",
                            r0.window, runningVersion, measuredUs, beforeUs, over,
                            opts_.revertMargin * 100,
                            describe(interDrift), describe(intraDrift), opts_.threshold * 100,
                            moreBytes ? fmt::format(", or carrying more of its bytes: inter {:.3g} MB per "
                                                    "iteration against {:.3g}, intra {:.3g} against {:.3g}",
                                                    interBytes / 1e6, c.interBytes / 1e6,
                                                    intraBytes / 1e6, c.intraBytes / 1e6)
                                      : std::string());
      absorb();
      // With the rates it was chosen on (a window that ran it fits other
      // rates from its other messages; the decision windows compare).
      if (current_) reverted_.push_back({*current_, plannedInter_, plannedIntra_, r0.window});
      control::PlanUpdate u = handOut(c.before);
      CORTADO_LOG_WARN("[replan] plan version {} ({}); switch at {}", u.version, reason_, u.switchAt);
      return u;
    }
    reason_ = measuredUs > 0
                  ? fmt::format("window {}: plan version {} measured {:.0f} us per iteration, the plan "
                                "before it {:.0f} us ({}){}: kept",
                                r0.window, runningVersion, measuredUs, beforeUs, over,
                                linksMoved ? " (a link slowed down)" : "")
                  : fmt::format("window {}: plan version {} has no measured time per iteration (a "
                                "report without it): kept",
                                r0.window, runningVersion);
    CORTADO_LOG_INFO("[replan] {}", reason_);
    rebase = !linksMoved;
  }
  if (decided_) {
    const bool interMoved = beyond(interDrift), intraMoved = beyond(intraDrift);
    if (!interMoved && !intraMoved) {
      CORTADO_LOG_DEBUG("[replan] window {}: inter {} ({:.3g} Gbit/s fitted, {} points), intra {} "
                        "({:.3g} Gbit/s, {} points) of the reference's: within the threshold "
                        "(checked in {:.1f} ms)",
                        r0.window, describe(interDrift), nowInter, inter.points, describe(intraDrift),
                        nowIntra, intra.points, tookMs());
      if (rebase) reference_ = nowCurves;
      else absorb();
      movedWindows_ = 0;
      return std::nullopt;
    }
    // One window beyond the threshold is not yet a moved link: the next
    // one, compared with the same reference, must be beyond it too.
    if (++movedWindows_ < opts_.confirmWindows) {
      reason_ = fmt::format("window {}: inter {}, intra {} of the reference's (threshold {:.0f}%): "
                            "waiting for {} more window(s) beyond it before re-planning",
                            r0.window, describe(interDrift), describe(intraDrift), opts_.threshold * 100,
                            opts_.confirmWindows - movedWindows_);
      CORTADO_LOG_INFO("[replan] {}", reason_);
      return std::nullopt;
    }
    // "link rate R Gbit/s" first: tests/testbed/replan_hosts_test.sh reads it.
    reason_ = fmt::format("window {}: {} link rate {:.3g} Gbit/s, planned with {:.3g}: its messages took {} "
                          "at the same sizes (threshold {:.0f}%)",
                          r0.window, interMoved ? "inter-machine" : "intra-machine",
                          interMoved ? nowInter : nowIntra, interMoved ? plannedInter_ : plannedIntra_,
                          describe(interMoved ? interDrift : intraDrift), opts_.threshold * 100);
  } else {
    reason_ = fmt::format("window {}: first complete profile", r0.window);
  }
  bool hostMemory = true;
  for (const auto& r : reports) hostMemory = hostMemory && r.hostMemory;

  // Codec costs measured on the workers' CPUs (with host buffers, what a
  // "gpu" step runs too: below).
  planner::CodecModel codecs = codecs_;
  const std::vector<CodecFit> codecFits = fitCodecs(reports);
  {
    nlohmann::json entries = nlohmann::json::array();
    for (const CodecFit& f : codecFits) {
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
  planner::ResolvedCodec codec = codecs.resolve(opts_.codec);
  for (const CodecFit& f : codecFits)
    if (f.codec == codec.spec || f.codec == opts_.codec)
      (f.encode ? codec.encodeCurve : codec.decodeCurve)[int(plan::Device::kCpu)] = f.curve;
  if (hostMemory) {  // a "gpu" step runs the CPU codec, measured or not
    const int c = int(plan::Device::kCpu), g = int(plan::Device::kGpu);
    codec.cost.encode[g] = codec.cost.encode[c];
    codec.cost.decode[g] = codec.cost.decode[c];
    codec.encodeCurve[g] = codec.encodeCurve[c];
    codec.decodeCurve[g] = codec.decodeCurve[c];
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
  if (hostMemory) {
    // Nothing is copied, and a "gpu" step runs the CPU twin on the
    // executor's thread, not on the GPU that computes the gradients.
    cl.d2h = cl.h2d = planner::AlphaBeta{0, 1e9};
    cl.gpuCodecPausesCompute = false;
  }
  // Each worker runs its codec calls on its own thread (Executor::run).
  cl.cpuCores = std::max(1, std::min(opts_.cpuCores, r0.localSize));
  cl.cpuSumGbps = hw_.cpuSumGbps;
  // cpuFillGbps stays 0: the decode curves below are the executor's calls,
  // whose time includes the pass that zeroes the region.
  cl.parameterServer = true;
  cl.chunkBytes = opts_.chunkBytes;
  cl.oneTensorAtATime = true;  // Executor::run: one tensor at a time
  // Executor::runBatch's fusion, as the workers ran it (the batch's
  // agreement, if the training loop has one, is outside the executor).
  for (const auto& r : reports) cl.fusionBytes = std::max(cl.fusionBytes, r.fusionBytes);
  // The measured curves at the model's own sizes, over the alpha-beta lines
  // (compressed round trips only when the workers compress with this codec:
  // the servers' work in them is costed with it).
  bool sameCodec = true;
  for (const auto& r : reports)
    for (const auto& o : r.options)
      if (o.compressed() && o.codec != codec.spec && o.codec != opts_.codec) sameCodec = false;
  const int interCurves = measuredCurves(reports, false, cl.inter, sameCodec ? &cl : nullptr, &codec);
  const int intraCurves = measuredCurves(reports, true, cl.intra, sameCodec ? &cl : nullptr, &codec);
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
  // The plan the workers run (from the reports; else the last one handed
  // out), under the same refitted costs: a new plan must beat it by minGain.
  // Its options join the search (the workers run them). A plan that names a
  // tensor the window did not, or compresses with another codec, cannot be
  // simulated here and is always replaced.
  std::optional<plan::Plan> running = runningPlan(reports);
  if (!running && current_) running = current_;
  std::vector<int> cur;
  if (running) {
    for (const auto& t : prof.tensors) {
      auto it = running->tensors.find(t.name);
      if (it == running->tensors.end() ||
          (it->second.compressed() && it->second.codec != codec.spec && it->second.codec != opts_.codec)) {
        cur.clear();
        break;
      }
      auto o = std::find(options.begin(), options.end(), it->second);
      if (o == options.end()) o = options.insert(options.end(), it->second);
      cur.push_back(int(o - options.begin()));
    }
  }
  planner::Simulator sim(cl, codec, prof, options);
  planner::Planner pl(sim);
  planner::Strategy s = pl.decide();
  // Moves only onto what was measured: a tensor whose new option sends a
  // message larger than the largest one the window measured for that
  // operation (or, for one without a curve, on that link) keeps its option.
  // Beyond it the curves and lines are extrapolations, and a shaped link's
  // bucket lets the small messages of a compressed plan pass at the wire's
  // speed: nothing in such a window shows the rate that large raw tensors
  // would get (a first plan from one ran 2.1x slower than the offline plan
  // on the emulated hosts).
  int kept = 0;
  if (!cur.empty()) {
    double largest[2] = {0, 0};  // [intra]
    for (const auto& r : reports)
      for (const auto& c : r.comms)
        if (usable(c)) {
          double& l = largest[c.scope == Scope::kIntra];
          l = std::max(l, curvePoint(r, c).bytes);
        }
    for (int j = 0; j < sim.tensors(); ++j) {
      if (s.choice[size_t(j)] == cur[size_t(j)]) continue;
      for (const StepSize& st :
           stepSizes(cl, codec, prof.tensors[size_t(j)].elements, options[size_t(s.choice[size_t(j)])])) {
        // A step priced by a curve: within its sizes (beyond, the last
        // slope between two small sizes is no rate); by a line: within the
        // link's measured sizes.
        const planner::MeasuredCurve* c = curveFor(st.intra ? cl.intra : cl.inter, st);
        const double limit = c ? c->points.back().first : largest[st.intra];
        if (st.bytes > limit * (1 + 1e-9)) {
          s.choice[size_t(j)] = cur[size_t(j)];
          ++kept;
          break;
        }
      }
    }
    if (kept > 0) s.iterUs = sim.simulate(s.choice);
  }
  // Cupcake's groups over the decided options, as for an offline plan
  // (none where the workers fuse by size: FusionSearch returns `s` as it is).
  if (opts_.fuse) s = planner::FusionSearch(sim).search(s);
  if (spdlog::should_log(spdlog::level::debug)) {
    for (const auto* l : {&cl.inter, &cl.intra})
      for (int k = 0; k < 2; ++k)
        for (const auto& [op, c] : k ? l->curvesCompressed : l->curves) {
          std::string pts;
          for (const auto& [b, us] : c.points) pts += fmt::format(" {:.0f}B:{:.0f}us", b, us);
          CORTADO_LOG_DEBUG("[replan] {} {}{} over {}:{}", l == &cl.inter ? "inter" : "intra",
                            plan::toString(op), k ? "*" : "", c.p, pts);
        }
  }
  const bool firstDecision = !decided_;
  decided_ = true;
  predictedNew_ = s.groups.empty() ? sim.simulate(s.choice) : sim.simulateGroups(s.choice, s.groups);
  // The running plan with its groups (the executor runs them whole).
  std::vector<std::pair<int, int>> curGroups;
  if (!cur.empty() && opts_.fuse && cl.fusionBytes == 0) {
    curGroups = planner::groupRanges(prof, *running);
    for (const auto& [first, last] : curGroups)
      for (int j = first + 1; j <= last && !curGroups.empty(); ++j)
        if (cur[size_t(j)] != cur[size_t(first)]) curGroups.clear();  // not a plan the executor runs
  }
  predictedRunning_ = cur.empty()           ? 0
                      : curGroups.empty() ? sim.simulate(cur)
                                          : sim.simulateGroups(cur, curGroups);
  if (!cur.empty()) {
    const double curUs = predictedRunning_, newUs = predictedNew_;
    if (!(newUs < curUs * (1.0 - opts_.minGain))) {
      reason_ += fmt::format("; the new plan is predicted {:.0f} us against {:.0f} us for plan "
                             "version {}{}, a gain under CORTADO_REPLAN_MIN_GAIN {:.0f}%: the plan "
                             "stays",
                             newUs, curUs, running->version, firstDecision ? " (the workers' first)" : "",
                             opts_.minGain * 100);
      CORTADO_LOG_INFO("[replan] {} (decided in {:.0f} ms)", reason_, tookMs());
      anchor();  // the current plan is what these links call for
      return std::nullopt;
    }
    reason_ += fmt::format("; predicted {:.0f} us against {:.0f} us for plan version {}", newUs, curUs,
                           running->version);
    if (kept > 0)
      reason_ += fmt::format(" ({} tensors kept their option: larger messages than measured)", kept);
  }
  const plan::Plan p = planner::toPlan(sim, s, 0);
  // Not a plan the measured check reverted, on links much like those then.
  const double near = (1 + opts_.threshold) * (1 + opts_.threshold);
  auto within = [&](double now, double was) {
    return was <= 0 || now <= 0 || (now < was * near && was < now * near);
  };
  // The same compression on every tensor, and the same options on tensors
  // holding at least 95% of the elements (a slightly different fit moves
  // small tensors between equivalent options).
  auto nearCopy = [&](const plan::Plan& a) {
    double all = 0, differ = 0;
    for (const auto& t : prof.tensors) {
      auto x = a.tensors.find(t.name), y = p.tensors.find(t.name);
      if (x == a.tensors.end() || y == p.tensors.end() ||
          x->second.compressed() != y->second.compressed())
        return false;
      all += double(t.elements);
      if (!(x->second == y->second)) differ += double(t.elements);
    }
    return differ <= 0.05 * all;
  };
  for (const Reverted& rv : reverted_) {
    if (!nearCopy(rv.plan) || !within(nowInter, rv.inter) || !within(nowIntra, rv.intra)) continue;
    reason_ += fmt::format("; the plan found is the one measured slower and reverted after window "
                           "{} (chosen on links of inter {:.3g}, intra {:.3g} Gbit/s; now {:.3g}, "
                           "{:.3g}, within {:.0f}%): the plan stays",
                           rv.window, rv.inter, rv.intra, nowInter, nowIntra, (near - 1) * 100);
    CORTADO_LOG_INFO("[replan] {} (decided in {:.0f} ms)", reason_, tookMs());
    anchor();
    return std::nullopt;
  }
  anchor();
  check_.reset();
  if (running && !cur.empty() && measuredUs > 0)
    check_ = Check{*running, {measuredUs}, nowInter, nowIntra, linkBytesPerIteration(reports, false),
                   linkBytesPerIteration(reports, true)};
  control::PlanUpdate u = handOut(p);
  int compressed = 0;
  for (const auto& [n, o] : p.tensors) compressed += o.compressed();
  CORTADO_LOG_INFO("[replan] plan version {} ({}): {} of {} tensors compressed, predicted {:.0f} us, "
                   "decided in {:.0f} ms, "
                   "inter {:.3g} Gbit/s ({} points), intra {:.3g} Gbit/s ({} points), measured curves "
                   "inter {} intra {}; switch at {}",
                   version_, reason_, compressed, p.tensors.size(), s.iterUs, tookMs(), nowInter, inter.points,
                   nowIntra, intra.points, interCurves, intraCurves, u.switchAt);
  return u;
}

Replanner makeReplanner(ReplanOptions opts) {
  auto r = std::make_shared<OnlineReplanner>(std::move(opts));
  return [r](const std::vector<plan::ProfileReport>& reports) { return r->onWindow(reports); };
}

}  // namespace cortado::scheduler
