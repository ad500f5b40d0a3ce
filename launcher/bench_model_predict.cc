// The predictions of `cortado bench model` (bench_model_predict.h): the
// replay's timeline on the planner's simulator, and the cost models built
// from the probes.
#include "launcher/bench_model_predict.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <string_view>

#include "core/common/logging.h"
#include "core/executor/executor.h"
#include "scheduler/planner/compile.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/fusion_search.h"
#include "scheduler/planner/option_tree.h"
#include "scheduler/planner/report.h"
#include "scheduler/replan.h"

namespace cortado::launcher::replay {
namespace {

using nlohmann::json;
using planner::AlphaBeta;

// The replay's timeline: the executor runs one batch at a time
// (Executor::runBatch is synchronous, on one thread). Tensor j is ready at the
// profile's backward times (a wall-clock schedule that codec work does not
// delay). Without fusion (Cluster::fusionBytes 0) each tensor is a batch of
// its own: its synchronization starts when it is ready and tensor j-1's has
// ended. With fusion, each time the executor is free every tensor ready by
// then is the batch (none: the next one, when it is ready); the workers agree
// on it (Cluster::batchAgreeUs); its lone tensors run first, then per
// fusible option its tensors packed in order within the threshold, each
// group as one execution of its summed size. An execution takes
// what it takes alone (Simulator::runAlone: its operations chained on free
// lanes). The planner's simulator models the same rule when oneTensorAtATime
// is set, and the same ready times with Cluster::gpuCodecPausesCompute off
// (predict() sets it: the replay's buffers are host memory; until
// 2026-11-26 the planner searched with "gpu" codec work delaying the
// gradients, which the replay's are not). Returns the end of the last
// synchronization after the forward pass (us); `trace` gets the events on
// that timeline.
//
// The plan's fused groups ([first, last] ranges, Plan::groups): a batch that
// would end inside a group takes the rest of it and starts when its last
// tensor is ready (the replay waits for it), and the group runs as one
// execution of its summed size at the place of its last tensor.
double serialized(planner::Simulator& sim, const std::vector<int>& choice,
                  const std::vector<std::pair<int, int>>& groups, std::vector<planner::TraceEvent>* trace) {
  const auto& ts = sim.profile().tensors;
  const int N = sim.tensors();
  const uint64_t threshold = sim.cluster().fusionBytes;
  std::vector<double> ready(N);
  double readyUs = 0;
  for (int j = 0; j < N; ++j) {
    const double bw = ts[j].backwardUs;
    readyUs += bw;
    ready[j] = readyUs;
    if (trace && bw > 0) trace->push_back({"backward " + ts[j].name, -1, j, readyUs - bw, bw});
  }
  std::vector<int> groupLast(N), groupFirst(N);
  for (int j = 0; j < N; ++j) groupLast[j] = groupFirst[j] = j;
  for (const auto& [first, last] : groups)
    for (int j = first; j <= last; ++j) groupFirst[j] = first, groupLast[j] = last;
  std::vector<planner::TraceEvent> ev;
  double free = 0;
  if (sim.pipelined()) {
    // The encode pipeline (Cluster::pipeline): the replay hands the whole
    // iteration over as one batch whose items the executor waits for
    // (Executor::runBatch with an AwaitItem), every execution (a tensor, or
    // a plan group at its last tensor) in ready order. Its leading local
    // steps start when it is ready and the previous execution's first
    // communication step has begun (the second thread is free); its first
    // communication step when they are done and the previous execution has
    // ended.
    double exchangeStart = 0;
    for (int j = 0; j < N;) {
      const int last = groupLast[j];
      int64_t elements = 0;
      for (int k = j; k <= last; ++k) elements += ts[k].elements;
      const int count = last - j + 1;
      const std::string label =
          count > 1 ? fmt::format("fused{}:{}..{}", count, ts[j].name, ts[last].name)
                    : std::string();
      ev.clear();
      double lead = 0;
      std::vector<planner::TraceEvent>* into = trace ? &ev : nullptr;
      const double d = count > 1 ? sim.runGroup(last, elements, choice[last], into, &label, &lead)
                                 : sim.runAlone(last, elements, choice[last], into, nullptr, &lead);
      const double encodeStart = std::max(ready[last], exchangeStart);
      exchangeStart = std::max(encodeStart + lead, free);
      for (planner::TraceEvent& e : ev) {
        e.start += e.start < lead ? encodeStart : exchangeStart - lead;
        trace->push_back(std::move(e));
      }
      free = exchangeStart + (d - lead);
      j = last + 1;
    }
    return free;
  }
  for (int j = 0; j < N;) {
    double formed = std::max(free, ready[j]);
    int end = j + 1;
    if (threshold > 0)
      while (end < N && ready[end] <= formed) ++end;
    end = groupLast[end - 1] + 1;  // a group is handed over whole
    formed = std::max(formed, ready[end - 1]);
    double t = formed + (threshold > 0 ? sim.cluster().batchAgreeUs : 0.0);
    auto execute = [&](int last, int64_t elements, int option, int count, int first, bool group = false) {
      const std::string label =
          count > 1 ? fmt::format("fused{}:{}..{}", count, ts[first].name, ts[last].name) : std::string();
      ev.clear();
      const double d = group ? sim.runGroup(last, elements, option, trace ? &ev : nullptr, &label)
                             : sim.runAlone(last, elements, option, trace ? &ev : nullptr,
                                            label.empty() ? nullptr : &label);
      for (planner::TraceEvent& e : ev) {
        e.start += t;
        trace->push_back(std::move(e));
      }
      t += d;
    };
    // Executor::runBatch: the lone executions in order, then per fusible
    // option (in the order of its first tensor) its tensors packed in order
    // within the threshold.
    std::vector<std::vector<int>> byOption;
    for (int i = j; i < end; ++i) {
      if (groupLast[i] != groupFirst[i]) {  // a plan group: once, at its last tensor
        if (i != groupLast[i]) continue;
        int64_t elements = 0;
        for (int k = groupFirst[i]; k <= i; ++k) elements += ts[k].elements;
        execute(i, elements, choice[i], i - groupFirst[i] + 1, groupFirst[i], true);
        continue;
      }
      if (threshold == 0 || !sim.options()[choice[i]].fusible()) {
        execute(i, ts[i].elements, choice[i], 1, i);
        continue;
      }
      auto it = std::find_if(byOption.begin(), byOption.end(), [&](const std::vector<int>& g) {
        return choice[g.front()] == choice[i] && ts[g.front()].dtypeBytes == ts[i].dtypeBytes;
      });
      if (it == byOption.end()) byOption.push_back({i});
      else it->push_back(i);
    }
    for (const std::vector<int>& members : byOption) {
      int first = -1, count = 0, last = -1;
      int64_t elements = 0;
      for (int i : members) {
        if (count > 0 && double(elements + ts[i].elements) * ts[i].dtypeBytes > double(threshold)) {
          execute(last, elements, choice[last], count, first);
          count = 0, elements = 0;
        }
        if (count == 0) first = i;
        last = i, elements += ts[i].elements, ++count;
      }
      if (count > 0) execute(last, elements, choice[last], count, first);
    }
    free = t;
    j = end;
  }
  return free;
}

}  // namespace

plan::TensorOption chainOption(const std::string& codec, bool servers) {
  using plan::CommOp;
  using plan::Scope;
  using plan::Step;
  plan::TensorOption x;
  if (!servers) {
    x.codec = codec;
    x.steps = {Step::encode(plan::Device::kCpu), Step::comm(Scope::kFlat, CommOp::kAllgather, true),
               Step::decode(plan::Device::kCpu)};
    return x;
  }
  x.hierarchical = true;
  x.codec = codec;
  x.steps = {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
             Step::encode(plan::Device::kCpu),
             Step::comm(Scope::kInter, CommOp::kPush, true),
             Step::comm(Scope::kInter, CommOp::kPull, true),
             Step::comm(Scope::kIntra, CommOp::kAllgather, true),
             Step::decode(plan::Device::kCpu)};
  return x;
}

std::string predictedTracePath(const std::string& file, const std::string& strategy) {
  if (strategy == "plan") return file;
  const size_t slash = file.find_last_of('/');
  const size_t dot = file.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return file + "-" + strategy;
  return file.substr(0, dot) + "-" + strategy + file.substr(dot);
}

std::optional<std::pair<double, double>> predictPlan(const planner::Simulator& base,
                                                     const plan::Plan& p, const std::string& tracePath) {
  std::vector<plan::TensorOption> options = base.options();
  std::vector<int> choice;
  const std::vector<std::pair<int, int>> groups = planner::groupRanges(base.profile(), p);
  if (groups.size() != p.groups.size()) return std::nullopt;
  for (const auto& t : base.profile().tensors) {
    auto it = p.tensors.find(t.name);
    if (it == p.tensors.end()) return std::nullopt;
    if (it->second.compressed() && it->second.codec != base.codec().spec) return std::nullopt;
    auto at = std::find(options.begin(), options.end(), it->second);
    if (at == options.end()) at = options.insert(options.end(), it->second);
    choice.push_back(int(at - options.begin()));
  }
  planner::Simulator sim(base.cluster(), base.codec(), base.profile(), options);
  if (!tracePath.empty()) {
    std::vector<planner::TraceEvent> ev;
    serialized(sim, choice, groups, &ev);
    std::ofstream f(tracePath);
    f << planner::chromeTrace(sim, ev) << "\n";
  }
  return std::make_pair(base.profile().forwardUs + serialized(sim, choice, groups, nullptr),
                        base.profile().forwardUs +
                            (groups.empty() ? sim.simulate(choice) : sim.simulateGroups(choice, groups)));
}


int applyExchangeCurves(const std::vector<plan::ProfileReport>& reports, planner::Cluster& cl,
                        const planner::ResolvedCodec& codec) {
  if (reports.empty()) return 0;
  planner::LinkCost fitted;
  scheduler::OnlineReplanner::measuredCurves(reports, false, fitted, &cl, &codec);
  int n = 0;
  for (const plan::CommOp op : {plan::CommOp::kPush, plan::CommOp::kPull})
    if (auto it = fitted.curvesCompressed.find(op);
        it != fitted.curvesCompressed.end() && it->second.p == cl.machines && !it->second.points.empty()) {
      cl.inter.curvesCompressed[op] = it->second;
      ++n;
    }
  return n;
}

namespace {

// What `bare` (a cluster without a skew) and `codec` price for the stages
// of one chain step of `elements` (chainOption()): its encode, its
// communication and its decode (with the zeroing pass), us on the timeline.
struct ChainStagePrices {
  double encode = 0, comm = 0, decode = 0;
};
ChainStagePrices chainStagePrices(const planner::Cluster& bare, const planner::ResolvedCodec& codec,
                                  uint64_t elements, bool servers = false) {
  ChainStagePrices p;
  const plan::TensorOption f = chainOption(codec.spec, servers);
  for (const planner::SimOp& op : planner::compileOption(bare, codec, int64_t(elements), 4, f).ops) {
    const double us = planner::opDurationUs(bare, op);
    if (op.kind == planner::OpKind::kEncode) p.encode += us;
    if (op.kind == planner::OpKind::kDecode) p.decode += us;
    if (op.kind == planner::OpKind::kComm) p.comm += us;
  }
  return p;
}

}  // namespace

std::vector<std::array<double, 3>> applyChainContention(const std::vector<Measured::ChainPoint>& chains,
                                                        planner::Cluster& cl,
                                                        planner::ResolvedCodec& codec, bool hostTwin) {
  planner::Cluster bare = cl;
  bare.syncSkew = {};
  bare.pushSkew = {};
  std::map<double, std::array<double, 3>> byElements;  // elements -> (sums of E and D stretch, count)
  for (const Measured::ChainPoint& c : chains) {
    if (!(c.elements > 0 && c.encodeUs > 0 && c.decodeUs > 0)) continue;  // not traced
    const ChainStagePrices priced = chainStagePrices(bare, codec, c.elements);
    if (!(priced.encode > 0 && priced.decode > 0)) continue;
    auto& [e, d, n] = byElements[double(c.elements)];
    e += c.encodeUs / priced.encode, d += c.decodeUs / priced.decode, n += 1;
  }
  std::vector<std::array<double, 3>> rows;
  for (const auto& [elements, v] : byElements) rows.push_back({elements, v[0] / v[2], v[1] / v[2]});
  if (rows.empty()) return rows;
  auto stretch = [&](double elements, int which) {
    if (elements <= rows.front()[0]) return rows.front()[which];
    if (elements >= rows.back()[0]) return rows.back()[which];
    size_t k = 1;
    while (rows[k][0] < elements) ++k;
    const auto& a = rows[k - 1];
    const auto& b = rows[k];
    const double t = std::log(elements / a[0]) / std::log(b[0] / a[0]);
    return a[which] + t * (b[which] - a[which]);
  };
  // Beyond the largest chain the curve grows from that chain's call, as
  // stretched, in proportion to the size, or as probed where the probe is
  // higher: the probe's calls of more than a few ms share the cores with
  // the other workers' probe calls already (every worker probes at once),
  // so stretching them again would count that twice (resnet50/DGC's
  // 2.3 Mi-element probe took 3.7 ns an element where the 1 Mi one took
  // 2.0 and the 1 Mi chain's calls 3.8).
  auto scale = [&](planner::MeasuredCurve& curve, int which) {
    const double largest = rows.back()[0];
    const double atLargest = curve.us(largest) * rows.back()[which];
    for (auto& [x, us] : curve.points)
      us = x <= largest ? us * stretch(x, which) : std::max(us, atLargest * x / largest);
  };
  for (const int d : {int(plan::Device::kCpu), int(plan::Device::kGpu)}) {
    if (d == int(plan::Device::kGpu) && !hostTwin) continue;
    scale(codec.encodeCurve[d], 1);
    scale(codec.decodeCurve[d], 2);
    scale(codec.decodeFirstCurve[d], 2);
  }
  scale(cl.cpuFillCurve, 2);
  if (hostTwin) scale(cl.gpuFillCurve, 2);
  return rows;
}

std::vector<std::pair<double, double>> applyChainSkew(const std::vector<Measured::ChainPoint>& chains,
                                                      planner::Cluster& cl,
                                                      const planner::ResolvedCodec& codec,
                                                      std::string* breakdown, bool servers) {
  planner::Cluster bare = cl;
  bare.syncSkew = {};
  bare.pushSkew = {};
  const plan::TensorOption f = chainOption(codec.spec, servers);
  planner::SyncSkew& skew = servers ? cl.pushSkew : cl.syncSkew;
  std::map<double, std::pair<double, double>> byWork;  // work us -> (sum of excess us, count)
  for (const Measured::ChainPoint& c : chains) {
    CORTADO_ENFORCE(c.elements > 0 && c.steps > 0 && std::isfinite(c.stepUs) && c.stepUs >= 0,
                    ErrorCode::kInvalidArgument,
                    "skew chain: {} steps of {} elements at {} us per step; give at least one "
                    "step of at least one element and a time >= 0",
                    c.steps, c.elements, c.stepUs);
    planner::ModelProfile chain;
    chain.model = "skew chain";
    for (int k = 0; k < c.steps; ++k) {
      planner::TensorProfile t;
      t.name = fmt::format("chain.{}", k);
      t.elements = int64_t(c.elements);
      chain.tensors.push_back(std::move(t));
    }
    planner::Simulator sim(bare, codec, chain, {f});
    const double priced =
        serialized(sim, std::vector<int>(size_t(c.steps), 0), {}, nullptr) / double(c.steps);
    // The work before the allgather as applySyncSkew counts it: the encode,
    // its tasks in rounds over the cores; and the step's other stages as
    // priced, for the breakdown.
    const ChainStagePrices stage = chainStagePrices(bare, codec, c.elements, servers);
    const double work = stage.encode, comm = stage.comm, decode = stage.decode;
    if (breakdown && c.encodeUs + c.collectiveUs + c.decodeUs > 0)
      *breakdown += fmt::format(
          "{}{}x{}: {:.0f} ({:.0f}): E {:.0f} ({:.0f}), {} {:.0f} ({:.0f}), D {:.0f} ({:.0f}), "
          "the rest {:.0f}",
          breakdown->empty() ? "" : "; ", c.steps, c.elements, c.stepUs, priced, c.encodeUs, work,
          servers ? "x.push*+pull*" : "ag*", c.collectiveUs, comm, c.decodeUs, decode,
          c.stepUs - c.encodeUs - c.collectiveUs - c.decodeUs);
    if (!(work > 0)) continue;  // no work, no wait (SyncSkew::after)
    auto& [sum, n] = byWork[work];
    sum += std::max(0.0, c.stepUs - priced);
    n += 1;
  }
  std::vector<std::array<double, 3>> rows;
  for (const auto& [work, v] : byWork) rows.push_back({work, v.first / v.second, v.second});
  skew = {};
  if (rows.empty()) return {};
  skew.curve = planner::MeasuredCurve::monotone(rows, 1);
  // Then concave through (0, 0), the least such curve above the points: a
  // larger step's wait is no larger a share of its work (traced on
  // resnet101/DGC, the workers' lateness at a collective grew about as the
  // square root of the work before it), so a chain's excess that grows
  // faster is the probe's noise or the codec's pricing at that size, and
  // the planner's groups should not be steered by it.
  auto& pts = skew.curve.points;
  std::vector<std::pair<double, double>> hull = {{0.0, 0.0}};
  for (const auto& pt : pts) {
    while (hull.size() >= 2) {
      const auto& [ax, ay] = hull[hull.size() - 2];
      const auto& [bx, by] = hull.back();
      if ((by - ay) * (pt.first - ax) > (pt.second - ay) * (bx - ax)) break;  // b above a -> pt
      hull.pop_back();
    }
    hull.push_back(pt);
  }
  planner::MeasuredCurve upper;
  upper.points = std::move(hull);
  for (auto& pt : pts) pt.second = upper.us(pt.first);
  skew.check(servers ? "the skew chains' curve through the servers" : "the skew chains' curve");
  return skew.curve.points;
}

std::shared_ptr<planner::Simulator> buildSimulator(const ModelBenchOptions& o,
                                                   const planner::ModelProfile& profile,
                                                   const collective::Topology& topo, const Measured& m,
                                                   int cpuCores, uint64_t chunkBytes,
                                                   uint64_t fusionBytes, bool pipeline,
                                                   std::string* costNote, int* bytepsIndex) {
  const std::string dir = planner::resolveDataDir(o.dataDir);
  planner::CodecModel codecs = planner::CodecModel::load(dir + "/costs/codecs.json");
  json fits = {{"schema", "cortado.codec_costs.v1"},
               {"date", "this run"},
               {"machine", "this job's workers"},
               {"threads", 1},
               {"entries", json::array()}};
  // On host memory a "gpu" encode or decode runs the CPU twin, so both
  // devices get the CPU's fits; on a device with the codec (CUDA), "gpu"
  // gets the device's (measureDeviceCodec).
  for (const char* dev : {"cpu", "gpu"}) {
    const bool own = m.hasDeviceCodec && std::string_view(dev) == "gpu";
    fits["entries"].push_back({{"codec", o.codec}, {"device", dev}, {"op", "encode"},
                               {"alpha", own ? m.gpuEncodeAlpha : m.encodeAlpha},
                               {"beta", own ? m.gpuEncodeBeta : m.encodeBeta}});
    fits["entries"].push_back({{"codec", o.codec}, {"device", dev}, {"op", "decompress_add"},
                               {"alpha", own ? m.gpuDecodeAlpha : m.decodeAlpha},
                               {"beta", own ? m.gpuDecodeBeta : m.decodeBeta}});
  }
  codecs.applyMeasured(fits, "cortado bench model");
  planner::Cluster cl;
  cl.machines = topo.numMachines;
  cl.gpusPerMachine = topo.localSize;
  // Every operation as measured on its own (OpenMPI's reduce ran at 0.35
  // Gbit/s where its allreduce ran at 7-18 in a traced run; a compressed
  // allgather is two collectives).
  cl.inter.name = "measured inter";
  cl.inter.base = m.hasInter ? m.inter.at(plan::CommOp::kAllreduce) : m.pushPull;
  if (m.hasInter) {
    cl.inter.perOp = m.inter, cl.inter.perOpCompressed = m.interCompressed;
    cl.inter.curves = m.interCurves, cl.inter.curvesCompressed = m.interCurvesCompressed;
  }
  cl.inter.perOp[plan::CommOp::kPush] = m.pushPull;
  cl.inter.perOp[plan::CommOp::kPull] = m.pushPull;
  cl.inter.curves[plan::CommOp::kPush] = m.pushPullCurve;
  cl.inter.curves[plan::CommOp::kPull] = m.pushPullCurve;
  cl.intra.name = "measured intra";
  cl.intra.base = m.hasIntra ? m.intra.at(plan::CommOp::kAllreduce) : cl.inter.base;
  if (m.hasIntra) {
    cl.intra.perOp = m.intra, cl.intra.perOpCompressed = m.intraCompressed;
    cl.intra.curves = m.intraCurves, cl.intra.curvesCompressed = m.intraCurvesCompressed;
  }
  // On host memory no copies, and a "gpu" step runs the CPU twin on the
  // executor's thread; on a device, the measured copies between its memory
  // and pinned host memory. Either way the replay's compute is a wait on
  // the wall clock, which device codec work does not slow (the planner's
  // searches then see serialized()'s timeline).
  cl.d2h = m.hasCopies ? m.d2h : AlphaBeta{0, 1e9};
  cl.h2d = m.hasCopies ? m.h2d : AlphaBeta{0, 1e9};
  cl.gpuCodecPausesCompute = false;
  cl.cpuCores = cpuCores;
  cl.cpuSumGbps = m.sumGbps;
  // The decode's zeroing pass over its region, which the decode curves leave
  // out; a "gpu" decode runs the CPU twin unless the device has the codec.
  cl.cpuFillCurve = m.fillCurve;
  if (!m.hasDeviceCodec) cl.gpuFillCurve = m.fillCurve;
  cl.parameterServer = true;
  cl.chunkBytes = double(chunkBytes);
  cl.oneTensorAtATime = true;  // Executor::runBatch: one tensor (or fused group) at a time
  // The replay's batches and fusion, as the executor runs them (serialized()).
  cl.fusionBytes = fusionBytes;
  cl.batchAgreeUs = m.agreeUs;
  // The encode pipeline (CORTADO_PIPELINE), modelled without fusion by size.
  cl.pipeline = pipeline;
  // The workers' skew at each step after CPU work as --sync-skew sets it
  // (with auto: from the chains, below): the replay's collectives wait for
  // their last worker.
  cl.syncSkew = m.syncSkew;
  planner::ResolvedCodec codec = codecs.resolve(o.codec);
  for (int d = 0; d < 2; ++d) {  // the CPU's curves, and the device's where it has the codec
    const bool own = m.hasDeviceCodec && d == int(plan::Device::kGpu);
    codec.encodeCurve[d] = own ? m.gpuEncodeCurve : m.encodeCurve;
    codec.decodeCurve[d] = own ? m.gpuDecodeCurve : m.decodeCurve;
    // The CPU's decode: the first payload's add apart from the others'.
    if (!own && !m.decodeFirstCurve.points.empty() && !m.decodeFurtherCurve.points.empty()) {
      codec.decodeFirstCurve[d] = m.decodeFirstCurve;
      codec.decodeCurve[d] = m.decodeFurtherCurve;
    }
  }
  // Compressed push and pull as the executor's own exchanges took them
  // (measureCompressedExchange), less the servers' work as the simulator
  // adds it (the online re-planner's fit of the same timings), instead of
  // the uncompressed probe's curve at the payloads' sizes.
  applyExchangeCurves(m.exchangeReports, cl, codec);
  // The CPU codec priced as the executor calls it, at the rate of workers
  // that code at once as the skew chains meet them; then the workers' skew
  // as the chains meet it (measureSkewChain): what a step took beyond its
  // price, by the work before its collective.
  std::string chainBreakdown, contention;
  cl.cpuCodecByCall = true;
  for (const auto& [elements, e, d] : applyChainContention(m.chainPoints, cl, codec, !m.hasDeviceCodec))
    contention += fmt::format("{}{:.0f}: E {:.2f}x, D {:.2f}x", contention.empty() ? "" : "; ",
                              elements, e, d);
  if (!m.chainPoints.empty()) applyChainSkew(m.chainPoints, cl, codec, &chainBreakdown);
  // And before a push, as the chains through the servers meet it.
  std::string serverBreakdown;
  if (!m.serverChainPoints.empty())
    applyChainSkew(m.serverChainPoints, cl, codec, &serverBreakdown, /*servers=*/true);
  auto options = planner::plannerOptions(cl, codec.spec);
  const plan::TensorOption byteps = executor::defaultOption();
  int bytepsIdx = -1;
  for (size_t i = 0; i < options.size(); ++i)
    if (options[i] == byteps) bytepsIdx = int(i);
  if (bytepsIdx < 0) {
    options.push_back(byteps);
    bytepsIdx = int(options.size()) - 1;
  }
  if (bytepsIndex) *bytepsIndex = bytepsIdx;
  if (costNote)
    *costNote = fmt::format(
        "links (per operation; every probe point on stderr): intra allreduce {:.0f} us + {:.2f} "
        "Gbit/s{}, inter allreduce {:.0f} us + {:.2f} Gbit/s{}, push/pull {:.0f} us + {:.2f} Gbit/s; "
        "codec {} per-size medians (the planner's curves), as a line: encode {:.1f} us + {:.2f} "
        "ns/elem, decode {:.1f} us + {:.2f} ns/elem (CPU{}); sum {:.1f} Gbit/s, a decode's zeroing "
        "pass {:.1f} Gbit/s; {} CPU cores per machine; "
        "workers' skew at a step after CPU work {}{}{}",
        cl.intra.base.alphaUs, cl.intra.base.gbps, m.hasIntra ? "" : " (not measured)",
        cl.inter.base.alphaUs, cl.inter.base.gbps, m.hasInter ? "" : " (not measured)",
        m.pushPull.alphaUs, m.pushPull.gbps, o.codec, m.encodeAlpha * 1e6, m.encodeBeta * 4e9,
        m.decodeAlpha * 1e6, m.decodeBeta * 4e9,
        m.hasDeviceCodec
            ? fmt::format("; on the device: encode {:.1f} us + {:.2f} ns/elem, decode {:.1f} us + "
                          "{:.2f} ns/elem",
                          m.gpuEncodeAlpha * 1e6, m.gpuEncodeBeta * 4e9, m.gpuDecodeAlpha * 1e6,
                          m.gpuDecodeBeta * 4e9)
            : std::string(", also used for \"gpu\""),
        m.sumGbps, m.fillGbps, cpuCores, cl.syncSkew.describe(),
        cl.pushSkew.any() ? ", before a push " + cl.pushSkew.describe() : std::string(),
        m.hasCopies ? fmt::format("; copies device to host {:.0f} us + {:.2f} Gbit/s, host to "
                                  "device {:.0f} us + {:.2f} Gbit/s",
                                  m.d2h.alphaUs, m.d2h.gbps, m.h2d.alphaUs, m.h2d.gbps)
                    : std::string());
  if (costNote && !contention.empty())
    *costNote += "; CPU codec calls priced as the executor makes them, stretched as the skew chains' "
                 "calls of workers coding at once ran against that price (by elements): " +
                 contention;
  if (costNote && !chainBreakdown.empty())
    *costNote += "; the skew chains' steps traced against their prices (us per step, priced in "
                 "brackets; ag* the fastest worker's): " + chainBreakdown;
  if (costNote && !serverBreakdown.empty())
    *costNote += "; through the servers (x.push*+pull* the fastest worker's): " + serverBreakdown;
  return std::make_shared<planner::Simulator>(cl, codec, profile, options);
}

planner::Planner::UniformPrice mergecompPrice(planner::Simulator& sim) {
  std::vector<uint64_t> bytes;
  executor::FusionSearch::Cuts forced;  // a group is one buffer: one dtype
  const auto& ts = sim.profile().tensors;
  for (size_t j = 0; j < ts.size(); ++j) {
    bytes.push_back(uint64_t(ts[j].bytes()));
    if (j > 0 && ts[j].dtypeBytes != ts[j - 1].dtypeBytes) forced.insert(j);
  }
  const uint64_t cap = executor::maxGroupsFor(executor::FusionSearchOptions{}, bytes.size());
  return [&sim, bytes, forced, cap](const std::vector<int>& choice) {
    double best = sim.simulate(choice);
    // PowerSGD's tensors never share a group (the search's forced cuts).
    if (choice.empty() || sim.options()[size_t(choice.front())].codec.rfind("powersgd", 0) == 0)
      return best;
    for (uint64_t k = 1; k <= cap; k *= 2) {
      std::vector<std::pair<int, int>> groups;  // [first, last], as simulateGroups takes them
      for (auto [begin, end] : executor::FusionSearch::groupsOf(
               executor::FusionSearch::balanced(bytes, forced, k), bytes.size()))
        groups.emplace_back(int(begin), int(end - 1));
      // No group of two: layer-wise again, already priced.
      if (!groups.empty()) best = std::min(best, sim.simulateGroups(choice, groups));
    }
    return best;
  };
}

std::vector<Prediction> predict(const ModelBenchOptions& o, const planner::ModelProfile& profile,
                                const collective::Topology& topo, const Measured& m,
                                int cpuCores, uint64_t chunkBytes, uint64_t fusionBytes,
                                bool pipeline, std::string* costNote,
                                std::shared_ptr<planner::Simulator>* keep) {
  int bytepsIdx = -1;
  *keep = buildSimulator(o, profile, topo, m, cpuCores, chunkBytes, fusionBytes, pipeline, costNote,
                         &bytepsIdx);
  planner::Simulator& sim = **keep;
  const auto& options = sim.options();
  planner::Planner pl(sim);
  const int T = sim.tensors();
  // The same cost models without the workers' skew, for predicted_noskew_ms.
  planner::Cluster noSkew = sim.cluster();
  noSkew.syncSkew = {};
  noSkew.pushSkew = {};
  planner::Simulator simNoSkew(noSkew, sim.codec(), sim.profile(), options);
  auto uniform = [&](int option) {
    planner::Strategy s;
    s.choice.assign(T, option);
    s.iterUs = sim.simulate(s.choice);
    return s;
  };
  std::vector<Prediction> out;
  for (const std::string& name : o.strategies) {
    planner::Strategy s;
    std::vector<planner::Strategy> mergecompAlts;
    if (name == "none") {
      s = uniform(bytepsIdx);
    } else if (name == "gpu") {
      s = pl.compressAllGpu();
    } else if (name == "cpu") {
      s = pl.compressAllCpu();
      CORTADO_ENFORCE(!s.choice.empty(), ErrorCode::kInvalidArgument,
                      "codec '{}' has no option compressed on the CPU", o.codec);
    } else if (name == "pertensor" || name == "replan" || name == "gravac") {
      // Espresso's per-tensor decision. replan starts from it (what the
      // scheduler switches it to is reported after the run); so does gravac,
      // whose first sparse iteration plans again at its CF.
      s = pl.decide();
    } else if (name == "mergecomp") {
      // MergeComp's setting: one codec for every tensor, no model of the
      // system; the replay searches the groups by timing iterations (the
      // groups it ends on are predicted after the run). The alternatives are
      // the best compress-everything option of each codec device and path
      // (the start-up probes can price the wrong path best: run AD had
      // compress-everything through the servers where the flat path ran
      // 1.4x faster in other runs), each option priced in the groups the
      // search will run it in (mergecompPrice); the search times each one's
      // layer-wise window and searches the groups of the fastest two, the
      // better predicted first.
      mergecompAlts = pl.compressAllByPath(mergecompPrice(sim));
      s = mergecompAlts.empty() ? pl.compressAllGpu() : mergecompAlts.front();
    } else if (name == "plan") {
      // The planner's plan: Espresso's decision with Cupcake's fused groups
      // where they are predicted to pay.
      planner::FusionSearch fs(sim);
      s = fs.search(pl.decide());
    }
    if (name != "replan" && name != "mergecomp" && !o.predictedTrace.empty()) {
      std::vector<planner::TraceEvent> ev;
      serialized(sim, s.choice, s.groups, &ev);
      const std::string path = predictedTracePath(o.predictedTrace, name);
      std::ofstream f(path);
      f << planner::chromeTrace(sim, ev) << "\n";
      CORTADO_ENFORCE(f.good(), ErrorCode::kInvalidArgument, "--predicted-trace: cannot write '{}'",
                      path);
    }
    Prediction p;
    p.strategy = name;
    p.plan = planner::toPlan(sim, s, 1);
    if (name == "mergecomp") {
      p.alternatives.push_back(p.plan);
      for (size_t a = 1; a < mergecompAlts.size(); ++a)
        p.alternatives.push_back(planner::toPlan(sim, mergecompAlts[a], 1));
    }
    p.predictedUs = profile.forwardUs + serialized(sim, s.choice, s.groups, nullptr);
    p.noSkewUs = sim.cluster().syncSkew.any() || sim.cluster().pushSkew.any()
                     ? profile.forwardUs + serialized(simNoSkew, s.choice, s.groups, nullptr)
                     : p.predictedUs;
    p.overlappedUs = profile.forwardUs + (s.groups.empty() ? s.iterUs : sim.simulateGroups(s.choice, s.groups));
    std::map<std::string, int> count;
    for (int c : s.choice) ++count[options[c].describe() + (options[c].codec.empty() ? "" : " " + options[c].codec)];
    if (count.size() == 1) {
      p.options = count.begin()->first;
    } else {
      int compressed = 0;
      for (int c : s.choice) compressed += options[c].compressed();
      p.options = fmt::format("{} distinct options, {} of {} tensors compressed", count.size(),
                              compressed, T);
    }
    if (!s.groups.empty()) {
      int fused = 0;
      for (const auto& [first, last] : s.groups) fused += last - first + 1;
      p.options += fmt::format("; {} fused groups of {} tensors", s.groups.size(), fused);
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace cortado::launcher::replay
