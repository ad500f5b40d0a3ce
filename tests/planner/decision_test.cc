// The decision algorithm against exhaustive search on random small instances,
// and the offload pass against an exhaustive search over the counts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "scheduler/planner/decision.h"

namespace cortado::planner {
namespace {


struct Instance {
  Cluster cluster;
  ResolvedCodec codec;
  ModelProfile profile;
};

const HardwareModel& hardware() {
  static const HardwareModel hw = HardwareModel::load(defaultDataDir() + "/costs/hardware.json");
  return hw;
}
const CodecModel& codecs() {
  static const CodecModel c = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  return c;
}

// Random clusters, links, codecs and models of up to `maxTensors` tensors,
// from the default cost models.
Instance randomInstance(std::mt19937_64& rng, int maxTensors, int minTensors = 2) {
  auto pick = [&](auto const& v) { return v[rng() % v.size()]; };
  Instance in;
  Cluster& c = in.cluster;
  c.machines = pick(std::vector<int>{2, 4, 8});
  c.gpusPerMachine = pick(std::vector<int>{2, 4, 8});
  c.intra = hardware().link(pick(std::vector<std::string>{"nvlink", "pcie"}));
  c.inter = hardware().link(pick(std::vector<std::string>{"10gbit", "25gbit", "100gbit"}));
  c.d2h = hardware().d2h;
  c.h2d = hardware().h2d;
  c.cpuCores = pick(std::vector<int>{1, 2, 4, 16});
  c.cpuSumGbps = hardware().cpuSumGbps;
  in.codec = codecs().resolve(
      pick(std::vector<std::string>{"dgc:ratio=0.01", "topk:ratio=0.001", "efsignsgd", "fp16", "qsgd"}));
  int n = minTensors + int(rng() % (maxTensors - minTensors + 1));
  std::uniform_real_distribution<double> logSize(std::log(1e3), std::log(3e7));
  in.profile.model = "random";
  for (int i = 0; i < n; ++i) {
    int64_t elements = int64_t(std::exp(logSize(rng)));
    // Equal sizes happen in real models; make them common here too.
    if (i > 0 && rng() % 3 == 0) elements = in.profile.tensors[rng() % i].elements;
    double backward = double(elements) * std::uniform_real_distribution<double>(0.2, 6.0)(rng) / 1000.0;
    in.profile.tensors.push_back(TensorProfile{"t" + std::to_string(i), elements, 4, backward});
  }
  return in;
}

// The reduced option set of the random instances: raw flat and hierarchical
// (collective and servers), and compressed gathers and server round trips on
// GPU and on CPU.
std::vector<plan::TensorOption> reducedOptions(const std::string& spec) {
  TreeConfig cfg;
  cfg.parameterServer = true;
  cfg.codec = spec;
  const std::set<std::string> keep = {
      "F: ar",
      "H: i.rs x.ar i.ag",
      "H: i.rs x.push x.pull i.ag",
      "F: E(g) ag* D(g)",
      "F: E(c) ag* D(c)",
      "H: i.rs E(g) x.ag* D(g) i.ag",
      "H: i.rs E(c) x.ag* D(c) i.ag",
      "H: i.rs E(g) x.push* x.pull* D(g) i.ag",
      "H: i.rs E(c) x.push* x.pull* D(c) i.ag",
  };
  std::vector<plan::TensorOption> out;
  for (auto& o : enumerateOptions(cfg))
    if (keep.count(o.describe())) out.push_back(o);
  EXPECT_EQ(out.size(), keep.size());
  return out;
}

TEST(Decision, NearExhaustiveOptimumOnRandomSmallInstances) {
  std::mt19937_64 rng(20261121);
  const int kInstances = 220;
  int within1 = 0, exact = 0, compressedSomewhere = 0;
  double worst = 0;
  for (int i = 0; i < kInstances; ++i) {
    Instance in = randomInstance(rng, 6);
    Simulator sim(in.cluster, in.codec, in.profile, reducedOptions(in.codec.spec));
    Planner planner(sim);
    Strategy none = planner.noCompression();
    Strategy got = planner.decide();
    Strategy best = planner.exhaustive();
    ASSERT_LE(got.iterUs, none.iterUs + 1e-9) << "instance " << i << ": worse than no compression";
    ASSERT_GE(got.iterUs, best.iterUs - 1e-6) << "instance " << i << ": better than the optimum?";
    ASSERT_NEAR(sim.simulate(got.choice), got.iterUs, 1e-6) << "instance " << i;
    const double gap = got.iterUs / best.iterUs - 1.0;
    if (gap > 0.01 && std::getenv("PLANNER_DEBUG")) {
      std::printf("instance %d gap %.2f%% %dx%d cores %d codec %s none %.1f got %.1f best %.1f\n", i, 100 * gap,
                  in.cluster.machines, in.cluster.gpusPerMachine, in.cluster.cpuCores, in.codec.spec.c_str(),
                  none.iterUs, got.iterUs, best.iterUs);
      for (int j = 0; j < sim.tensors(); ++j)
        std::printf("  %10lld bw %9.1f  got %-40s best %s\n", (long long)in.profile.tensors[j].elements,
                    in.profile.tensors[j].backwardUs, sim.options()[got.choice[j]].describe().c_str(),
                    sim.options()[best.choice[j]].describe().c_str());
    }
    worst = std::max(worst, gap);
    within1 += gap <= 0.01;
    exact += gap <= 1e-9;
    for (int o : best.choice) compressedSomewhere += planner.isCompressed(o);
  }
  std::printf("decision vs exhaustive on %d instances: %d within 1%%, %d exact, worst gap %.2f%%\n",
              kInstances, within1, exact, 100 * worst);
  EXPECT_GE(within1, kInstances * 95 / 100);
  EXPECT_GT(compressedSomewhere, 0);  // the instances are not all trivially uncompressed
}

TEST(Decision, OffloadPassIsOptimalOverCounts) {
  std::mt19937_64 rng(4242);
  int checked = 0, descentOptimal = 0, descentChecked = 0;
  for (int i = 0; i < 400 && checked < 60; ++i) {
    Instance in = randomInstance(rng, 8);
    in.cluster.cpuCores = 1 + int(rng() % 8);
    Simulator sim(in.cluster, in.codec, in.profile, plannerOptions(in.cluster, in.codec.spec));
    Planner planner(sim);
    // Offload the strategy that compresses everything on GPU: many groups.
    Strategy gpu = planner.compressAllGpu();
    Strategy oracle = planner.exhaustiveOffload(gpu);
    Strategy pass = planner.offloadPass(gpu, /*maxCombos=*/1 << 20);
    ASSERT_TRUE(planner.stats().offloadExhaustive);
    if (planner.stats().offloadGroups == 0) continue;
    ++checked;
    EXPECT_NEAR(pass.iterUs, oracle.iterUs, 1e-6) << "instance " << i;
    EXPECT_NEAR(sim.simulate(pass.choice), pass.iterUs, 1e-6);
    Strategy descent = planner.offloadPass(gpu, /*maxCombos=*/1);
    EXPECT_GE(descent.iterUs, oracle.iterUs - 1e-6);
    ++descentChecked;
    descentOptimal += descent.iterUs <= oracle.iterUs * (1 + 1e-9);
  }
  EXPECT_GE(checked, 30);
  std::printf("offload: exhaustive-over-counts pass optimal on %d/%d; coordinate descent optimal on %d/%d\n",
              checked, checked, descentOptimal, descentChecked);
}

// The exact search (Planner::setExact) with the simulator's shortcuts
// (incremental base updates, the early exits of evaluate() and screen())
// against the reference path, which re-simulates every candidate's whole
// iteration: the same choices and the same iteration times. Then the default
// estimated search against that exact search: never worse than no
// compression, its time what a full simulation says, and within
// kEstimatedGap of the exact search's predicted time. Returns the gap.
// The bounds are what was measured (docs/planner.md) with some room.
constexpr double kEstimatedGap = 0.015;       // bundled models, synthetic-300
constexpr double kEstimatedGapRandom = 0.08;  // any one random instance
constexpr double kEstimatedMeanGap = 0.01;    // mean over the random instances

double checkAgainstExact(const Cluster& cluster, const ResolvedCodec& codec, const ModelProfile& profile,
                         const std::vector<plan::TensorOption>& options, const std::string& what,
                         double bound = kEstimatedGap) {
  Simulator fast(cluster, codec, profile, options);
  Simulator ref(cluster, codec, profile, options);
  ref.setReference(true);
  Planner fastPlanner(fast), refPlanner(ref);
  fastPlanner.setExact(true);
  refPlanner.setExact(true);
  Strategy a = fastPlanner.decide(), b = refPlanner.decide();
  EXPECT_EQ(a.choice, b.choice) << what;
  EXPECT_NEAR(a.iterUs, b.iterUs, 1e-9 * b.iterUs) << what;
  EXPECT_NEAR(fast.simulate(a.choice), b.iterUs, 1e-9 * b.iterUs) << what;

  Simulator sim(cluster, codec, profile, options);
  Planner planner(sim);
  EXPECT_FALSE(planner.exact());
  Strategy e = planner.decide();
  EXPECT_NEAR(sim.simulate(e.choice), e.iterUs, 1e-9 * e.iterUs) << what;
  EXPECT_LE(e.iterUs, planner.noCompression().iterUs + 1e-9) << what;
  const double gap = e.iterUs / b.iterUs - 1.0;
  EXPECT_LE(gap, bound) << what << ": estimated search " << e.iterUs << " us, exact " << b.iterUs;
  return gap;
}

Cluster benchCluster(const std::string& intra) {
  Cluster c;
  c.machines = 8;
  c.gpusPerMachine = 8;
  c.intra = hardware().link(intra);
  c.inter = hardware().link("25gbit");
  c.d2h = hardware().d2h;
  c.h2d = hardware().h2d;
  c.cpuCores = 16;
  return c;
}

TEST(Decision, EstimatedSearchNearExactOnRandomInstances) {
  std::mt19937_64 rng(112026);
  double worst = 0, sum = 0;
  int estimated = 0;
  for (int i = 0; i < 150; ++i) {
    // Small instances with the reduced options, larger ones (searched with
    // estimates past 64 tensors) with the full tree.
    const bool large = i % 3 == 0;
    Instance in = large ? randomInstance(rng, 100, 65) : randomInstance(rng, 8);
    auto options = large ? plannerOptions(in.cluster, in.codec.spec) : reducedOptions(in.codec.spec);
    const double gap = checkAgainstExact(in.cluster, in.codec, in.profile, options, "instance " + std::to_string(i),
                                         large ? kEstimatedGapRandom : 1e-9);
    if (large) {
      ++estimated;
      worst = std::max(worst, gap);
      sum += gap;
    }
  }
  std::printf("estimated search vs exact on %d random instances of 65-100 tensors: mean gap %+.3f%%, worst %+.3f%%\n",
              estimated, 100 * sum / std::max(1, estimated), 100 * worst);
  EXPECT_LE(sum / std::max(1, estimated), kEstimatedMeanGap);
}

TEST(Decision, EstimatedSearchNearExactOnBundledModels) {
  double worst = 0;
  std::string worstWhat;
  for (const std::string intra : {"nvlink", "pcie"})
    for (const std::string spec : {"dgc:ratio=0.01", "efsignsgd", "topk:ratio=0.01", "fp16"}) {
      Cluster c = benchCluster(intra);
      auto codec = codecs().resolve(spec);
      std::vector<std::pair<std::string, ModelProfile>> models;
      for (const auto& m : bundledModels()) models.emplace_back(m, loadModel(m, defaultDataDir()));
      models.emplace_back("synthetic-300", syntheticModel(300, 42));
      for (const auto& [name, profile] : models) {
        const std::string what = name + " " + spec + " " + intra;
        const double gap = checkAgainstExact(c, codec, profile, plannerOptions(c, codec.spec), what);
        if (gap > worst) {
          worst = gap;
          worstWhat = what;
        }
      }
    }
  std::printf("estimated search vs exact on the bundled models: worst gap %+.3f%% (%s)\n", 100 * worst,
              worstWhat.c_str());
}

TEST(Decision, BundledModelsAreNeverWorseThanNoCompression) {
  for (const auto& m : bundledModels()) {
    Cluster c;
    c.machines = 8;
    c.gpusPerMachine = 8;
    c.intra = hardware().link("pcie");
    c.inter = hardware().link("25gbit");
    c.d2h = hardware().d2h;
    c.h2d = hardware().h2d;
    c.cpuCores = 16;
    auto codec = codecs().resolve("dgc:ratio=0.01");
    Simulator sim(c, codec, loadModel(m, defaultDataDir()), plannerOptions(c, codec.spec));
    Planner planner(sim);
    // How fast decide() runs is the plan benchmark's business, not a test's.
    Strategy s = planner.decide();
    Strategy none = planner.noCompression();
    EXPECT_LE(s.iterUs, none.iterUs + 1e-9) << m;
    EXPECT_NEAR(sim.simulate(s.choice), s.iterUs, 1e-6) << m;
  }
}

}  // namespace
}  // namespace cortado::planner

namespace cortado::planner {
namespace {

// With tensor fusion (one tensor at a time, Cluster::fusionBytes) the
// exhaustive search prunes on the settled finish; it must still find the
// optimum of every choice enumerated, and the decision must be a real,
// correctly timed strategy no better than it.
TEST(Decision, FusionExhaustiveIsTheBruteForceOptimum) {
  std::mt19937_64 rng(20261122);
  int fusedSomewhere = 0;
  for (int i = 0; i < 12; ++i) {
    Instance in = randomInstance(rng, 5, 4);
    in.cluster.oneTensorAtATime = true;
    in.cluster.fusionBytes = uint64_t(4) << (16 + rng() % 10);
    // Small tensors that fuse, most ready at once.
    for (auto& t : in.profile.tensors) {
      t.elements = 1000 + int64_t(rng() % 200000);
      t.backwardUs = rng() % 2 ? 0.0 : double(rng() % 500);
    }
    std::vector<plan::TensorOption> opts = reducedOptions(in.codec.spec);
    opts.resize(6);  // 6^N choices: enumerable
    Simulator sim(in.cluster, in.codec, in.profile, opts);
    Planner planner(sim);
    const int N = sim.tensors(), K = sim.optionCount();
    std::vector<int> choice(N, 0);
    double best = Simulator::kInf;
    for (;;) {
      best = std::min(best, sim.simulate(choice));
      int j = 0;
      while (j < N && ++choice[j] == K) choice[j++] = 0;
      if (j == N) break;
    }
    const Strategy ex = planner.exhaustive();
    EXPECT_NEAR(ex.iterUs, best, 1e-6) << "instance " << i;
    EXPECT_NEAR(sim.simulate(ex.choice), ex.iterUs, 1e-6) << "instance " << i;
    const Strategy got = planner.decide();
    EXPECT_GE(got.iterUs, best - 1e-6) << "instance " << i;
    EXPECT_NEAR(sim.simulate(got.choice), got.iterUs, 1e-6) << "instance " << i;
    // Fusion is in the optimum's time: the same choice without it is slower.
    Cluster off = in.cluster;
    off.fusionBytes = 0;
    Simulator plain(off, in.codec, in.profile, opts);
    fusedSomewhere += plain.simulate(ex.choice) > ex.iterUs + 1e-6;
  }
  EXPECT_GT(fusedSomewhere, 0);
}

}  // namespace
}  // namespace cortado::planner

namespace cortado::planner {
namespace {

// With fusion, leaving the small tensors uncompressed pays only when they go
// together (one fused collective); a sweep that moves one tensor at a time
// from compress-everything cannot get there. decide() must reach the best of
// the whole family "below a size, one fusible option; the rest
// compress-everything", enumerated here over every distinct size and every
// fusible option, on ResNet101 over 4 machines with a latency-bound link as
// on the emulated hosts (cortado bench model).
TEST(Decision, FusionSmallTensorsLeftUncompressedTogether) {
  Cluster c;
  c.machines = 4;
  c.gpusPerMachine = 1;
  c.intra = hardware().link("pcie");
  c.inter.name = "emulated 1 Gbit/s";
  c.inter.base = AlphaBeta{500.0, 1.0};
  c.d2h = c.h2d = AlphaBeta{0, 1e9};
  c.cpuCores = 1;
  c.cpuSumGbps = hardware().cpuSumGbps;
  c.oneTensorAtATime = true;
  c.fusionBytes = uint64_t(64) << 20;
  auto codec = codecs().resolve("dgc:ratio=0.01");
  const ModelProfile prof = loadModel("resnet101", defaultDataDir());
  Simulator sim(c, codec, prof, plannerOptions(c, codec.spec));
  Planner planner(sim);
  const Strategy all = planner.compressAllGpu();
  std::vector<double> sizes;
  for (const auto& t : prof.tensors) sizes.push_back(double(t.bytes()));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  sizes.push_back(sizes.back() + 1);
  double family = Simulator::kInf;
  int fusible = 0;
  for (int o = 0; o < sim.optionCount(); ++o) {
    const auto& opt = sim.options()[size_t(o)];
    if (opt.compressed() || !opt.fusible()) continue;
    ++fusible;
    for (double th : sizes) {
      std::vector<int> choice = all.choice;
      for (size_t j = 0; j < prof.tensors.size(); ++j)
        if (double(prof.tensors[j].bytes()) < th) choice[j] = o;
      family = std::min(family, sim.simulate(choice));
    }
  }
  ASSERT_GT(fusible, 0);
  const Strategy got = planner.decide();
  EXPECT_NEAR(sim.simulate(got.choice), got.iterUs, 1e-6);
  // The family's best beats compress-everything here: the case is real.
  EXPECT_LT(family, all.iterUs * 0.9) << "family " << family << " us, compress-everything " << all.iterUs;
  EXPECT_LE(got.iterUs, family * 1.01) << "decide " << got.iterUs << " us, family " << family;
  std::printf("resnet101/DGC, 4 x 1 at 1 Gbit/s + 500 us, fusion: compress-everything %.0f us, "
              "best of the family %.0f us, decide() %.0f us\n", all.iterUs, family, got.iterUs);
}

}  // namespace
}  // namespace cortado::planner

namespace cortado::planner {
namespace {

// When tensors run one at a time, the decision is never predicted slower
// than one option for every tensor, whichever: no compression, compressed
// on the GPU, or compressed on the CPU (each found here by simulating every
// such option alone). On 4 emulated hosts of a 16-core machine (30 us links,
// bert-base, EFSignSGD) the sweeps from compress-everything-on-the-GPU ended
// at 634 ms where compress-everything-on-the-CPU was predicted at 569 ms.
TEST(Decision, OneTensorAtATimeNeverSlowerThanAnyUniformOption) {
  const double alphaUs = 30;  // every case below failed before the CPU start
  int cpuBeatsGpu = 0;
  for (const char* model : {"bert-base", "resnet101"}) {
    for (const char* spec : {"efsignsgd", "dgc:ratio=0.01"}) {
      Cluster c;
      c.machines = 4;
      c.gpusPerMachine = 1;
      c.intra = hardware().link("pcie");
      c.inter.name = "emulated 1 Gbit/s";
      c.inter.base = AlphaBeta{alphaUs, 1.4};
      c.d2h = c.h2d = AlphaBeta{0, 1e9};
      c.cpuCores = 4;
      c.cpuSumGbps = hardware().cpuSumGbps;
      c.parameterServer = true;
      c.oneTensorAtATime = true;
      c.fusionBytes = uint64_t(64) << 20;
      auto codec = codecs().resolve(spec);
      // As in the replay: both devices run the CPU twin (cortado bench model).
      const int gpuDev = int(plan::Device::kGpu), cpuDev = int(plan::Device::kCpu);
      codec.cost.encode[gpuDev] = codec.cost.encode[cpuDev];
      codec.cost.decode[gpuDev] = codec.cost.decode[cpuDev];
      const ModelProfile prof = loadModel(model, defaultDataDir());
      Simulator sim(c, codec, prof, plannerOptions(c, codec.spec));
      const std::string at = fmt::format("{}, {}, {} us", model, spec, alphaUs);
      double none = Simulator::kInf, gpu = Simulator::kInf, cpu = Simulator::kInf;
      for (int o = 0; o < sim.optionCount(); ++o) {
        const auto& opt = sim.options()[size_t(o)];
        bool onCpu = true, onGpu = true;
        for (const auto& st : opt.steps) {
          if (st.kind == plan::StepKind::kComm) continue;
          onCpu &= st.device == plan::Device::kCpu;
          onGpu &= st.device == plan::Device::kGpu;
        }
        const double t = sim.simulate(std::vector<int>(size_t(sim.tensors()), o));
        if (!opt.compressed()) none = std::min(none, t);
        else if (onCpu) cpu = std::min(cpu, t);
        else if (onGpu) gpu = std::min(gpu, t);
      }
      Planner planner(sim);
      EXPECT_NEAR(planner.compressAllCpu().iterUs, cpu, 1e-6) << at;
      const Strategy got = planner.decide();
      EXPECT_NEAR(sim.simulate(got.choice), got.iterUs, 1e-6) << at;
      EXPECT_LE(got.iterUs, std::min({none, gpu, cpu}) + 1e-6)
          << at << ": decide " << got.iterUs << " us, none " << none << ", gpu " << gpu << ", cpu " << cpu;
      cpuBeatsGpu += cpu < gpu;
      std::printf("%s: none %.0f, gpu %.0f, cpu %.0f, decide %.0f us\n", at.c_str(), none, gpu, cpu, got.iterUs);
    }
  }
  EXPECT_GT(cpuBeatsGpu, 0);  // the CPU start matters somewhere
}

// MergeComp's alternatives in the model bench: the best compress-everything
// option of each codec device and path, against every option simulated on
// every tensor and sorted into the kinds by hand. With one GPU per machine
// the hierarchical collectives are left out: the simulator times them as the
// flat ones. With a price of its own (the bench's: in groups), each kind's
// pick is the option of least price.
TEST(Planner, CompressAllByPathIsTheBestOfEachDeviceAndPath) {
  int pricedOtherwise = 0;  // cases where the halves' price picked another option
  for (const int gpus : {2, 1}) {
    Cluster c;
    c.machines = 4;
    c.gpusPerMachine = gpus;
    c.intra = hardware().link("pcie");
    c.inter.name = "emulated 1 Gbit/s";
    c.inter.base = AlphaBeta{30, 1.0};
    c.cpuCores = 4;
    c.cpuSumGbps = hardware().cpuSumGbps;
    c.parameterServer = true;
    c.oneTensorAtATime = true;
    for (const char* spec : {"efsignsgd", "dgc:ratio=0.01"}) {
      const std::string at = fmt::format("{} GPUs per machine, {}", gpus, spec);
      auto codec = codecs().resolve(spec);
      const ModelProfile prof = loadModel("resnet50", defaultDataDir());
      Simulator sim(c, codec, prof, plannerOptions(c, codec.spec));
      // (codec on the CPU, path: 0 flat, 1 hierarchical collectives, 2 the
      // servers) -> the least time.
      using Kind = std::pair<bool, int>;
      auto kindOf = [](const plan::TensorOption& opt) -> std::optional<Kind> {
        bool onCpu = true, onGpu = true, push = false;
        for (const auto& st : opt.steps) {
          if (st.kind == plan::StepKind::kComm) {
            push |= st.op == plan::CommOp::kPush;
            continue;
          }
          onCpu &= st.device == plan::Device::kCpu;
          onGpu &= st.device == plan::Device::kGpu;
        }
        if (onCpu == onGpu) return std::nullopt;
        return Kind{onCpu, push ? 2 : opt.hierarchical ? 1 : 0};
      };
      std::map<Kind, double> best;
      for (int o = 0; o < sim.optionCount(); ++o) {
        const auto& opt = sim.options()[size_t(o)];
        const auto kind = kindOf(opt);
        if (!opt.compressed() || !kind) continue;
        const double t = sim.simulate(std::vector<int>(size_t(sim.tensors()), o));
        auto [it, fresh] = best.try_emplace(*kind, t);
        if (!fresh) it->second = std::min(it->second, t);
      }
      ASSERT_EQ(best.size(), 6u) << at << ": the tree has every device and path";
      if (gpus == 1) {
        for (const bool cpu : {false, true}) {
          EXPECT_NEAR(best.at({cpu, 1}), best.at({cpu, 0}), 1e-6 * best.at({cpu, 0}))
              << at << ": hierarchical collectives are the flat ones";
        }
      }
      Planner planner(sim);
      const std::vector<Strategy> got = planner.compressAllByPath();
      ASSERT_EQ(got.size(), gpus == 1 ? 4u : 6u) << at;
      std::set<Kind> kinds;
      for (size_t k = 0; k < got.size(); ++k) {
        ASSERT_EQ(got[k].choice.size(), size_t(sim.tensors())) << at;
        const int o = got[k].choice.front();
        for (int x : got[k].choice) ASSERT_EQ(x, o) << at << ": one option for every tensor";
        const auto& opt = sim.options()[size_t(o)];
        const Kind kind = kindOf(opt).value();
        EXPECT_TRUE(kinds.insert(kind).second) << at << ": " << opt.describe() << " twice a kind";
        EXPECT_FALSE(gpus == 1 && kind.second == 1) << at << ": " << opt.describe();
        EXPECT_NEAR(got[k].iterUs, best.at(kind), 1e-6) << at << ": " << opt.describe();
        EXPECT_NEAR(sim.simulate(got[k].choice), got[k].iterUs, 1e-6) << at;
        if (k > 0) {
          EXPECT_LE(got[k - 1].iterUs, got[k].iterUs) << at << ": fastest first";
        }
      }
      // The fastest of them is compress-everything's best, GPU or CPU.
      EXPECT_NEAR(got.front().iterUs,
                  std::min(planner.compressAllGpu().iterUs, planner.compressAllCpu().iterUs), 1e-6)
          << at;
      // Priced otherwise (here: in two fused halves, as MergeComp's search
      // would run them), each kind's pick is the option of least price,
      // found by trying every option by hand, and its iterUs that price.
      const int T = sim.tensors();
      const std::vector<std::pair<int, int>> halves{{0, T / 2 - 1}, {T / 2, T - 1}};
      auto halvesPrice = [&](const std::vector<int>& choice) {
        return sim.simulateGroups(choice, halves);
      };
      std::map<Kind, std::pair<double, int>> cheapest;  // kind -> (price, option)
      for (int o = 0; o < sim.optionCount(); ++o) {
        const auto& opt = sim.options()[size_t(o)];
        const auto kind = kindOf(opt);
        if (!opt.compressed() || !kind || (gpus == 1 && kind->second == 1)) continue;
        const double t = halvesPrice(std::vector<int>(size_t(T), o));
        auto [it, fresh] = cheapest.try_emplace(*kind, t, o);
        if (!fresh && t < it->second.first - 1e-9) it->second = {t, o};
      }
      Planner priced(sim);
      const std::vector<Strategy> inHalves = priced.compressAllByPath(halvesPrice);
      ASSERT_EQ(inHalves.size(), cheapest.size()) << at;
      bool differs = false;
      for (const Strategy& s : inHalves) {
        const Kind kind = kindOf(sim.options()[size_t(s.choice.front())]).value();
        EXPECT_NEAR(s.iterUs, cheapest.at(kind).first, 1e-6) << at;
        EXPECT_NEAR(s.iterUs, halvesPrice(s.choice), 1e-6) << at;
        for (const Strategy& d : got)
          if (kindOf(sim.options()[size_t(d.choice.front())]) == kind)
            differs |= d.choice.front() != s.choice.front();
      }
      for (size_t k = 1; k < inHalves.size(); ++k)
        EXPECT_LE(inHalves[k - 1].iterUs, inHalves[k].iterUs) << at << ": cheapest first";
      if (differs) ++pricedOtherwise;
    }
  }
  // Without a case where the price changes a pick, the checks above would
  // pass with the price ignored.
  EXPECT_GT(pricedOtherwise, 0) << "the halves' price picked layer-wise's options everywhere";
}

}  // namespace
}  // namespace cortado::planner
