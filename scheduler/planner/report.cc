#include "scheduler/planner/report.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>

#include "core/common/error.h"

namespace cortado::planner {
namespace {
double threadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
}  // namespace

std::string resolveDataDir(const std::string& dataDir) {
  if (!dataDir.empty()) return dataDir;
  if (const char* env = std::getenv("CORTADO_PLANNER_DATA")) return env;
  return defaultDataDir();
}

PlanRun runPlanner(const PlanConfig& cfg) {
  const std::string dir = resolveDataDir(cfg.dataDir);
  HardwareModel hw = HardwareModel::load(cfg.hardwareFile.empty() ? dir + "/costs/hardware.json"
                                                                  : cfg.hardwareFile);
  CodecModel codecs = CodecModel::load(dir + "/costs/codecs.json");
  for (const std::string& f : cfg.codecFiles) codecs.loadInto(f);
  Cluster cluster;
  cluster.machines = cfg.machines;
  cluster.gpusPerMachine = cfg.gpusPerMachine;
  auto link = [&](const char* option, const std::string& name) {
    try {
      return hw.link(name);
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: {}; add measured links to a hardware model and pass it with "
                              "--hardware (docs/planner.md)",
                              option, e.what()));
    }
  };
  cluster.intra = link("--intra", cfg.intra);
  cluster.inter = link("--inter", cfg.inter);
  cluster.d2h = hw.d2h;
  cluster.h2d = hw.h2d;
  cluster.cpuCores = cfg.cpuCores;
  cluster.cpuSumGbps = hw.cpuSumGbps;
  cluster.cpuFillGbps = hw.cpuFillGbps;
  cluster.zenNsPerPair = hw.zenNsPerPair;
  cluster.syncSkew = hw.syncSkew;
  cluster.pushSkew = hw.pushSkew;
  cluster.parameterServer = cfg.parameterServer;
  ResolvedCodec codec;
  try {
    codec = codecs.resolve(cfg.codec);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("--codec: {}", e.what()));
  }
  ModelProfile profile;
  try {
    profile = cfg.profile ? *cfg.profile : loadModel(cfg.model, dir);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("--model: {}", e.what()));
  }

  PlanRun run;
  run.config = cfg;
  auto options = plannerOptions(cluster, codec.spec, profile.hasSparse());
  if (cfg.pushPullOnly) options = pushPullOptions(options);
  run.sim = std::make_unique<Simulator>(cluster, codec, profile, options);
  run.report.forwardUs = profile.forwardUs;

  Planner planner(*run.sim);
  planner.setExact(cfg.exact);
  const double c0 = threadCpuMs();
  auto t0 = std::chrono::steady_clock::now();
  run.report.espresso = planner.decide();
  auto t1 = std::chrono::steady_clock::now();
  run.report.decisionCpuMs = threadCpuMs() - c0;
  run.report.decisionMs = std::chrono::duration<double, std::milli>(t1 - t0).count();
  run.report.stats = planner.stats();
  run.report.perTensor = run.report.espresso;
  if (cfg.fuse) {
    FusionConfig fc;
    fc.oneOptionMargin = cfg.oneOptionMargin;
    FusionSearch fusion(*run.sim, fc);
    run.report.espresso = fusion.search(run.report.perTensor);
    run.fusion = fusion.stats();
    run.report.fusionMs = run.fusion.ms;
    run.report.fusionCpuMs = run.fusion.cpuMs;
  }
  run.report.noCompression = planner.noCompression();
  run.report.compressAllGpu = planner.compressAllGpu();
  run.sim->simulateGroups(run.report.espresso.choice, run.report.espresso.groups, &run.timings);

  if (cfg.upperBound) {
    // Compression at zero cost: the best any strategy could do with this
    // codec's payload sizes (the paper's upper bound).
    Simulator free(cluster, codec.zeroCost(), profile, options);
    Planner fp(free);
    fp.setExact(cfg.exact);
    Strategy a = fp.decide(), b = fp.compressAllGpu();
    if (cfg.fuse) {
      FusionConfig fc;
      fc.oneOptionMargin = 0;  // the optimum over the groupings: a bound
      a = FusionSearch(free, fc).search(a);
    }
    run.report.upperBound = a.iterUs <= b.iterUs ? a : b;
  }
  run.plan = toPlan(*run.sim, run.report.espresso, cfg.planVersion);
  plan::validate(run.plan);
  return run;
}

std::vector<std::pair<int, int>> groupRanges(const ModelProfile& profile, const plan::Plan& p) {
  std::map<std::string, int> index;
  for (size_t j = 0; j < profile.tensors.size(); ++j) index[profile.tensors[j].name] = int(j);
  std::vector<std::pair<int, int>> out;
  for (const auto& g : p.groups) {
    int first = -1, prev = -1;
    bool consecutive = true;
    for (const std::string& name : g) {
      auto it = index.find(name);
      if (it == index.end() || (prev >= 0 && it->second != prev + 1)) {
        consecutive = false;
        break;
      }
      if (first < 0) first = it->second;
      prev = it->second;
    }
    if (consecutive && first >= 0) out.emplace_back(first, prev);
  }
  std::sort(out.begin(), out.end());
  return out;
}

plan::Plan toPlan(const Simulator& sim, const Strategy& s, uint64_t version) {
  plan::Plan p;
  p.version = version;
  for (int j = 0; j < sim.tensors(); ++j)
    p.tensors[sim.profile().tensors[j].name] = sim.options()[s.choice[j]];
  for (const auto& [first, last] : s.groups) {
    std::vector<std::string>& g = p.groups.emplace_back();
    for (int k = first; k <= last; ++k) g.push_back(sim.profile().tensors[size_t(k)].name);
  }
  return p;
}

namespace {
std::string ms(double us) { return fmt::format("{:9.2f} ms", us / 1000.0); }
}  // namespace

std::string summaryText(const PlanRun& run) {
  const PlanReport& r = run.report;
  const PlanConfig& c = run.config;
  const double fwd = r.forwardUs;
  auto iter = [&](const Strategy& s) { return fwd + s.iterUs; };
  const double base = iter(r.noCompression);
  std::string out = fmt::format(
      "model {} ({} tensors, {:.1f} MB), {} machines x {} GPUs, intra {}, inter {}, codec {}, "
      "{} CPU cores per machine{}\n",
      run.sim->profile().model, run.sim->tensors(), run.sim->profile().totalBytes() / 1e6,
      c.machines, c.gpusPerMachine, c.intra, c.inter, c.codec, c.cpuCores,
      c.parameterServer ? ", CPU servers" : "");
  out += fmt::format("codec costs: {}\n", run.sim->codec().costSource);
  if (const SyncSkew& k = run.sim->cluster().syncSkew; k.any())
    out += fmt::format(
        "workers' skew at a step after CPU work (hardware cpu.sync_skew_*): {}\n", k.describe());
  if (const SyncSkew& k = run.sim->cluster().pushSkew; k.any())
    out += fmt::format("workers' skew at a push to the servers (hardware cpu.push_skew_*): {}\n",
                       k.describe());
  out += fmt::format("predicted iteration time (forward {:.2f} ms + backward and sync):\n",
                     fwd / 1000.0);
  auto line = [&](const char* what, const Strategy& s) {
    out += fmt::format("  {:<28} {}  speedup {:5.2f}x\n", what, ms(iter(s)), base / iter(s));
  };
  line("no compression", r.noCompression);
  line("compress everything on GPU", r.compressAllGpu);
  // With fused groups the plan is Espresso's per-tensor decision with
  // Cupcake's groups: both lines, the plan's last.
  if (!r.espresso.groups.empty()) line("Espresso per tensor", r.perTensor);
  line("Espresso plan", r.espresso);
  if (c.upperBound) {
    line("upper bound (free codec)", r.upperBound);
    out += fmt::format("  Espresso is within {:.1f}% of the upper bound\n",
                       100.0 * (iter(r.espresso) / iter(r.upperBound) - 1.0));
  }
  int compressed = 0, cpu = 0;
  for (int o : r.espresso.choice) {
    compressed += run.sim->options()[o].compressed();
    cpu += usesCpuCodec(run.sim->options()[o]);
  }
  out += fmt::format(
      "decision ({} search): {:.2f} ms ({:.2f} ms CPU), {} simulations{}, {} tensors compressed ({} with CPU codecs), "
      "{} pruned before the last idle gap, offload over {} groups ({})\n",
      c.exact ? "exact" : "estimated", r.decisionMs, r.decisionCpuMs, r.stats.evaluations,
      c.exact ? "" : fmt::format(" and {} estimates", r.stats.estimates), compressed, cpu, r.stats.pruned, r.stats.offloadGroups,
      r.stats.offloadExhaustive ? "exhaustive" : "coordinate descent");
  out += fmt::format(
      "  GPU pass {:.2f} ms ({} simulations), offload {:.2f} ms ({}), refinement {:.2f} ms ({})\n",
      r.stats.gpuPassMs, r.stats.gpuPassEvaluations, r.stats.offloadMs, r.stats.offloadEvaluations,
      r.stats.refineMs, r.stats.refineEvaluations);
  if (run.sim->profile().hasSparse()) {
    // Zen (docs/zen.md, "In a plan"): the tensors with a density, and which
    // of them the plan sends through Zen with which scheme.
    int sparse = 0, bp = 0, hc = 0;
    const auto& ts = run.sim->profile().tensors;
    for (size_t j = 0; j < ts.size(); ++j) {
      sparse += ts[j].sparse();
      const auto& o = run.sim->options()[size_t(r.espresso.choice[j])];
      for (const plan::Step& st : o.steps)
        if (st.kind == plan::StepKind::kComm && plan::isZen(st.op))
          (st.op == plan::CommOp::kZenBalanced ? bp : hc) += 1;
    }
    out += fmt::format(
        "sparse tensors: {} with a density; {} through Zen (zen.bp balanced parallelism: {}, "
        "zen.hc hierarchical centralization: {})\n",
        sparse, bp + hc, bp, hc);
  }
  if (c.fuse) {
    const FusionStats& f = run.fusion;
    out += fmt::format(
        "fused groups (Cupcake): {} groups of {} tensors, {:.2f}% faster than per tensor; "
        "search {:.2f} ms ({:.2f} ms CPU), {} group simulations, {} states kept, at most {} "
        "per position{}\n",
        f.groups, f.fusedTensors, 100.0 * (1.0 - iter(r.espresso) / iter(r.perTensor)), f.ms,
        f.cpuMs, f.groupSimulations, f.statesKept, f.maxFrontier,
        f.finishOnly ? " (exact: one state per position)" : "");
    if (f.oneOptionUs > 0)
      out += fmt::format(
          "one option in groups (margin {:.0f}%): {:.2f} ms against the mixed plan's {:.2f} ms; "
          "{}\n",
          100.0 * f.margin, f.oneOptionUs / 1e3, f.mixedUs / 1e3,
          f.oneOption >= 0 ? "kept, " + run.sim->options()[size_t(f.oneOption)].describe()
                           : std::string("the mixed plan kept"));
    for (size_t g = 0; g < r.espresso.groups.size(); ++g) {
      const auto [first, last] = r.espresso.groups[g];
      const auto& ts = run.sim->profile().tensors;
      double bytes = 0;
      for (int k = first; k <= last; ++k) bytes += ts[size_t(k)].bytes();
      out += fmt::format("  group {}: tensors {}..{} ({} tensors, {:.3f} MB) {} .. {}, option {}\n",
                         g, first, last, last - first + 1, bytes / 1e6, ts[size_t(first)].name,
                         ts[size_t(last)].name,
                         run.sim->options()[size_t(r.espresso.choice[size_t(first)])].describe());
    }
  }
  return out;
}

std::string tensorTable(const PlanRun& run) {
  // The group column: gN for the members of fused group N.
  const auto& groups = run.report.espresso.groups;
  std::vector<int> groupOf(size_t(run.sim->tensors()), -1);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int k = groups[g].first; k <= groups[g].second; ++k) groupOf[size_t(k)] = int(g);
  std::string out = fmt::format("{:>4}  {:<44} {:>11}  {:>9}  {:>9}  {:>5}  {}\n", "#", "tensor",
                                "elements", "ready ms", "done ms", "group", "option");
  const auto& ts = run.sim->profile().tensors;
  for (int j = 0; j < run.sim->tensors(); ++j) {
    out += fmt::format(
        "{:>4}  {:<44} {:>11}  {:>9.3f}  {:>9.3f}  {:>5}  {}\n", j, ts[j].name, ts[j].elements,
        run.timings[j].ready / 1000.0, run.timings[j].finish / 1000.0,
        groupOf[size_t(j)] < 0 ? std::string("-") : fmt::format("g{}", groupOf[size_t(j)]),
        run.sim->options()[run.report.espresso.choice[j]].describe() +
            (ts[j].sparse() ? fmt::format(" (density {:.3g}%)", 100 * ts[j].density) : ""));
  }
  return out;
}

std::string traceJson(PlanRun& run) {
  std::vector<TraceEvent> events;
  run.sim->simulateGroups(run.report.espresso.choice, run.report.espresso.groups, nullptr, &events);
  return chromeTrace(*run.sim, events);
}

}  // namespace cortado::planner
