// Fused groups (Cupcake): the simulator's group model against per-tensor
// simulations and a hand-computed timeline, and the fusion search against an
// exhaustive enumeration of every consecutive partition and option.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>

#include "core/common/error.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/fusion_search.h"
#include "scheduler/planner/report.h"
#include "tests/planner/hand_timeline.h"

namespace cortado::planner {
namespace {

using plan::CommOp;
using plan::Device;
using plan::Scope;
using plan::Step;
using plan::TensorOption;

const HardwareModel& hardware() {
  static const HardwareModel hw = HardwareModel::load(defaultDataDir() + "/costs/hardware.json");
  return hw;
}
const CodecModel& codecs() {
  static const CodecModel c = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  return c;
}

struct Instance {
  Cluster cluster;
  ResolvedCodec codec;
  ModelProfile profile;
};

// Random clusters, links and codecs from the default cost models, and models
// of [minTensors, maxTensors] tensors, mostly small (where fusion pays) with
// some large ones; each of the four timeline modes (overlapping lanes; one
// execution at a time with the codec pausing the backward or not, and
// without it with the encode pipeline).
Instance randomInstance(std::mt19937_64& rng, int minTensors, int maxTensors) {
  auto pick = [&](auto const& v) { return v[rng() % v.size()]; };
  Instance in;
  Cluster& c = in.cluster;
  c.machines = pick(std::vector<int>{2, 4, 8});
  c.gpusPerMachine = pick(std::vector<int>{1, 2, 8});
  c.intra = hardware().link(pick(std::vector<std::string>{"nvlink", "pcie"}));
  c.inter = hardware().link(pick(std::vector<std::string>{"10gbit", "25gbit", "100gbit"}));
  c.d2h = hardware().d2h;
  c.h2d = hardware().h2d;
  c.cpuCores = pick(std::vector<int>{1, 2, 4, 16});
  c.cpuSumGbps = hardware().cpuSumGbps;
  const int mode = int(rng() % 4);
  c.oneTensorAtATime = mode > 0;
  c.gpuCodecPausesCompute = mode == 1;
  c.pipeline = mode == 3;  // the encode pipeline (one execution ahead)
  in.codec = codecs().resolve(
      pick(std::vector<std::string>{"dgc:ratio=0.01", "efsignsgd", "fp16", "topk:ratio=0.01"}));
  const int n = minTensors + int(rng() % uint64_t(maxTensors - minTensors + 1));
  std::uniform_real_distribution<double> small(std::log(64.0), std::log(3e5)),
      large(std::log(3e5), std::log(1e7));
  in.profile.model = "random";
  for (int i = 0; i < n; ++i) {
    const auto elements = int64_t(std::exp(rng() % 4 == 0 ? large(rng) : small(rng)));
    const double backward =
        double(elements) * std::uniform_real_distribution<double>(0.2, 6.0)(rng) / 1000.0 +
        std::uniform_real_distribution<double>(0, 60)(rng);
    in.profile.tensors.push_back(TensorProfile{fmt::format("t{}", i), elements, 4, backward});
  }
  return in;
}

// `count` options of the tree by their short form: raw allreduce, compressed
// allgather on the GPU, then hierarchical and CPU variants.
std::vector<TensorOption> someOptions(const std::string& spec, size_t count) {
  TreeConfig cfg;
  cfg.parameterServer = true;
  cfg.codec = spec;
  const std::vector<std::string> order = {"F: ar", "F: E(g) ag* D(g)",
                                          "H: i.rs E(g) x.ag* D(g) i.ag", "F: E(c) ag* D(c)",
                                          "H: i.rs x.push x.pull i.ag"};
  const auto all = enumerateOptions(cfg);
  std::vector<TensorOption> out;
  for (size_t k = 0; k < count && k < order.size(); ++k)
    for (const auto& o : all)
      if (o.describe() == order[k]) out.push_back(o);
  EXPECT_EQ(out.size(), std::min(count, order.size()));
  return out;
}

// The group's members walked as the search walks them: ready times one by
// one (readyAfter), then the execution (placeGroup).
double walk(Simulator& sim, const std::vector<int>& choice,
            const std::vector<std::pair<int, int>>& groups) {
  SimState st = sim.initialState();
  size_t g = 0;
  for (int j = 0; j < sim.tensors();) {
    const int last = g < groups.size() && groups[g].first == j ? groups[g++].second : j;
    double ready = st.prevReady;
    for (int k = j; k <= last; ++k) ready = sim.readyAfter(st, ready, k);
    sim.placeGroup(st, j, last, choice[size_t(j)], ready);
    j = last + 1;
  }
  return st.maxFinish;
}

Cluster handCluster() {
  // 8 Gbit/s = 1000 bytes per microsecond, as simulator_test.cc.
  Cluster c;
  c.machines = 1;
  c.gpusPerMachine = 2;
  c.intra.base = AlphaBeta{2.5, 8};
  c.inter.base = AlphaBeta{2.5, 8};
  c.cpuCores = 4;
  // The executor's copies into and out of a group's buffer: 8000 bytes in
  // 0.1 us.
  c.cpuSumGbps = 640;
  return c;
}

using hand::kAllreduce;

TEST(FusedGroups, HandComputedTimeline) {
  // Flat allreduce over 2 GPUs of B bytes: 2 * 2.5 + 2 * 1/2 * B / 1000 us.
  // t0 (1000 floats) ready at 10, t1 (1000 floats) ready at 12.
  // Alone: t0 [10,19], t1 waits for the link: [19,28].
  // Grouped, in place on a flat gradient buffer: from 12, 8000 bytes:
  // [12,25] (one latency less, 2 us later start).
  Simulator sim(handCluster(), ResolvedCodec{}, hand::model({{1000, 10}, {1000, 2}}), {kAllreduce});
  EXPECT_DOUBLE_EQ(sim.simulate({0, 0}), 28.0);
  std::vector<TensorTiming> t;
  std::vector<TraceEvent> trace;
  EXPECT_DOUBLE_EQ(sim.simulateGroups({0, 0}, {{0, 1}}, &t, &trace), 25.0);
  EXPECT_DOUBLE_EQ(t[0].ready, 10.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 12.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 25.0);
  EXPECT_DOUBLE_EQ(t[1].finish, 25.0);
  auto count = [](const std::vector<TraceEvent>& events, const std::string& name) {
    return std::count_if(events.begin(), events.end(), [&](const TraceEvent& e) { return e.name == name; });
  };
  EXPECT_EQ(count(trace, "flat allreduce fused2:t0..t1"), 1);
  EXPECT_EQ(count(trace, "group copy fused2:t0..t1"), 0);
  // Gradients in buffers of their own: the group also pays the executor's
  // two copies of its buffer, 0.1 us each: [12,25.2].
  ModelProfile apart = hand::model({{1000, 10}, {1000, 2}});
  apart.contiguousGradients = false;
  Simulator copied(handCluster(), ResolvedCodec{}, apart, {kAllreduce});
  trace.clear();
  EXPECT_DOUBLE_EQ(copied.simulateGroups({0, 0}, {{0, 1}}, nullptr, &trace), 25.2);
  EXPECT_EQ(count(trace, "flat allreduce fused2:t0..t1"), 1);
  EXPECT_EQ(count(trace, "group copy fused2:t0..t1"), 2);
  // t1 ready at 40: grouping waits for it: [40,53] against t1 alone [40,49].
  Simulator late(handCluster(), ResolvedCodec{}, hand::model({{1000, 10}, {1000, 30}}), {kAllreduce});
  EXPECT_DOUBLE_EQ(late.simulate({0, 0}), 49.0);
  EXPECT_DOUBLE_EQ(late.simulateGroups({0, 0}, {{0, 1}}), 53.0);
  // The search takes the group only where it pays.
  FusionSearch pays(sim), not_(late);
  Strategy a = pays.search(Strategy{{0, 0}, 0});
  EXPECT_DOUBLE_EQ(a.iterUs, 25.0);
  EXPECT_EQ(a.groups, (std::vector<std::pair<int, int>>{{0, 1}}));
  Strategy b = not_.search(Strategy{{0, 0}, 0});
  EXPECT_DOUBLE_EQ(b.iterUs, 49.0);
  EXPECT_TRUE(b.groups.empty());
  // Malformed groups are refused with the group named.
  EXPECT_THROW(sim.simulateGroups({0, 0}, {{0, 0}}), Error);
  EXPECT_THROW(sim.simulateGroups({0, 0}, {{0, 2}}), Error);
  Simulator two(handCluster(), ResolvedCodec{}, hand::model({{1000, 10}, {1000, 2}}),
                {kAllreduce, kAllreduce});
  EXPECT_THROW(two.simulateGroups({0, 1}, {{0, 1}}), Error);
}

// A partition into singletons, walked group by group as the search does,
// is the per-tensor simulation.
TEST(FusedGroups, SingletonsAreThePerTensorSimulation) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Instance in = randomInstance(rng, 1, 40);
    Simulator sim(in.cluster, in.codec, in.profile, plannerOptions(in.cluster, in.codec.spec));
    std::vector<int> choice(size_t(sim.tensors()));
    for (int& c : choice) c = int(rng() % uint64_t(sim.optionCount()));
    std::vector<TensorTiming> a, b;
    const double full = sim.simulate(choice, &a);
    EXPECT_EQ(walk(sim, choice, {}), full) << "trial " << trial;
    EXPECT_EQ(sim.simulateGroups(choice, {}, &b), full) << "trial " << trial;
    // Explicit groups of one are step() too.
    SimState st = sim.initialState();
    for (int j = 0; j < sim.tensors(); ++j) sim.stepGroup(st, j, j, choice[size_t(j)]);
    EXPECT_EQ(st.maxFinish, full) << "trial " << trial;
  }
}

// A group's execution is a lone tensor of the summed size, ready when the
// last member is, plus the copies of its buffer where the gradients lie
// apart: with copies free (in place, or at an infinite rate), the same
// model with the members merged into one tensor (summed elements and
// backward time) gives the same time.
TEST(FusedGroups, GroupIsOneTensorOfTheSummedSize) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    Instance in = randomInstance(rng, 3, 16);
    in.cluster.cpuSumGbps = std::numeric_limits<double>::infinity();  // copies take 0 us
    const int N = int(in.profile.tensors.size());
    const auto options = plannerOptions(in.cluster, in.codec.spec);
    Simulator sim(in.cluster, in.codec, in.profile, options);
    // Random groups, each with one random option.
    std::vector<std::pair<int, int>> groups;
    std::vector<int> choice(static_cast<size_t>(N));
    ModelProfile merged = in.profile;
    merged.tensors.clear();
    std::vector<int> mergedChoice;
    for (int j = 0; j < N;) {
      const int last = std::min(N - 1, j + int(rng() % 4));
      const int o = int(rng() % options.size());
      if (last > j) groups.emplace_back(j, last);
      TensorProfile t{fmt::format("m{}", j), 0, 4, 0};
      for (int k = j; k <= last; ++k) {
        choice[size_t(k)] = o;
        t.elements += in.profile.tensors[size_t(k)].elements;
        t.backwardUs += in.profile.tensors[size_t(k)].backwardUs;
      }
      merged.tensors.push_back(t);
      mergedChoice.push_back(o);
      j = last + 1;
    }
    Simulator one(in.cluster, in.codec, merged, options);
    const double want = one.simulate(mergedChoice);
    const double got = sim.simulateGroups(choice, groups);
    EXPECT_NEAR(got, want, 1e-9 * want) << "trial " << trial;
    EXPECT_NEAR(walk(sim, choice, groups), got, 1e-9 * want) << "trial " << trial;
  }
}

// The search in its exact mode (only provable pruning) over every option
// equals the enumeration of every consecutive partition x option per group;
// the default (heuristic) mode over the same space is never below it and is
// counted; the default candidates are never worse than the start.
TEST(FusionSearch, ExactEqualsExhaustiveOnRandomInstances) {
  std::mt19937_64 rng(20261201);
  int instances = 0, heuristicExact = 0, fusedOptimum = 0;
  double worstHeuristic = 0;
  for (int trial = 0; trial < 300; ++trial) {
    // 2 options up to 12 tensors (2 * 3^11 leaves), 3 up to 8, 4 up to 6.
    const size_t K = trial % 3 == 0 ? 2 : trial % 3 == 1 ? 3 : 4;
    const int maxN = K == 2 ? 12 : K == 3 ? 8 : 6;
    Instance in = randomInstance(rng, 2, maxN);
    const int N = int(in.profile.tensors.size());
    Simulator sim(in.cluster, in.codec, in.profile, someOptions(in.codec.spec, K));
    std::vector<int> start(static_cast<size_t>(N));
    for (int& c : start) c = int(rng() % K);
    FusionConfig exactCfg;
    exactCfg.exact = true;
    exactCfg.allOptions = true;
    exactCfg.maxGroupTensors = N;
    FusionSearch exact(sim, exactCfg);
    const Strategy oracle = exact.exhaustive();
    const Strategy got = exact.search(Strategy{start, 0});
    ++instances;
    ASSERT_NEAR(got.iterUs, oracle.iterUs, 1e-6 * oracle.iterUs)
        << "trial " << trial << ": " << N << " tensors, " << K << " options";
    ASSERT_NEAR(sim.simulateGroups(got.choice, got.groups), got.iterUs, 1e-6 * got.iterUs)
        << "trial " << trial;
    ASSERT_NEAR(sim.simulateGroups(oracle.choice, oracle.groups), oracle.iterUs,
                1e-6 * oracle.iterUs);
    fusedOptimum += !oracle.groups.empty();

    FusionConfig heuristicCfg;
    heuristicCfg.allOptions = true;
    heuristicCfg.maxGroupTensors = N;
    FusionSearch heuristic(sim, heuristicCfg);
    const Strategy h = heuristic.search(Strategy{start, 0});
    ASSERT_GE(h.iterUs, oracle.iterUs - 1e-6 * oracle.iterUs) << "trial " << trial;
    ASSERT_NEAR(sim.simulateGroups(h.choice, h.groups), h.iterUs, 1e-6 * h.iterUs)
        << "trial " << trial;
    heuristicExact += h.iterUs <= oracle.iterUs * (1 + 1e-9);
    worstHeuristic = std::max(worstHeuristic, h.iterUs / oracle.iterUs - 1);

    FusionSearch restricted(sim);
    const Strategy r = restricted.search(Strategy{start, 0});
    ASSERT_LE(r.iterUs, sim.simulate(start) + 1e-9) << "trial " << trial;
    ASSERT_NEAR(sim.simulateGroups(r.choice, r.groups), r.iterUs, 1e-6 * r.iterUs)
        << "trial " << trial;
  }
  std::printf(
      "fusion search vs exhaustive on %d instances (%d with fused groups in the optimum): exact "
      "mode "
      "equal on all; heuristic mode equal on %d, worst gap %.3f%%\n",
      instances, fusedOptimum, heuristicExact, 100 * worstHeuristic);
  EXPECT_GT(fusedOptimum, instances / 4);  // the instances exercise fusion
  EXPECT_GE(heuristicExact, instances * 9 / 10);
}

// FusionConfig::oneOptionMargin against enumeration: where the timeline is
// one execution at a time with the codec off the computation, the search is
// exact (FusionStats::finishOnly), so the result is the mixed optimum unless
// the best grouping of one of its options, found by trying every consecutive
// partition, is within the margin of it and no slower than the start; then
// it is that grouping.
TEST(FusionSearch, OneOptionWithinTheMarginReplacesAMixedPlan) {
  std::mt19937_64 rng(20261202);
  constexpr double kMargin = 0.05;
  int replaced = 0, kept = 0;
  for (int trial = 0; trial < 200; ++trial) {
    Instance in = randomInstance(rng, 3, 10);
    in.cluster.oneTensorAtATime = true;
    in.cluster.gpuCodecPausesCompute = false;
    in.cluster.pipeline = false;
    const int N = int(in.profile.tensors.size());
    Simulator sim(in.cluster, in.codec, in.profile, someOptions(in.codec.spec, 3));
    std::vector<int> start(static_cast<size_t>(N));
    for (int& c : start) c = int(rng() % 3);
    FusionConfig cfg;
    cfg.maxGroupTensors = N;
    cfg.oneOptionMargin = 0;
    FusionSearch plain(sim, cfg);
    const Strategy mixed = plain.search(Strategy{start, 0});
    ASSERT_TRUE(plain.stats().finishOnly);
    EXPECT_EQ(plain.stats().oneOption, -1);
    cfg.oneOptionMargin = kMargin;
    FusionSearch search(sim, cfg);
    const Strategy got = search.search(Strategy{start, 0});
    ASSERT_NEAR(sim.simulateGroups(got.choice, got.groups), got.iterUs, 1e-6 * got.iterUs);

    // The reference: every consecutive partition (a bit per gap: cut or not)
    // of each option of the mixed plan, as a uniform choice.
    std::set<int> options(mixed.choice.begin(), mixed.choice.end());
    double one = std::numeric_limits<double>::infinity();
    for (int o : options) {
      if (options.size() < 2) break;
      const std::vector<int> choice(size_t(N), o);
      for (uint32_t cuts = 0; cuts < (1u << (N - 1)); ++cuts) {
        std::vector<std::pair<int, int>> groups;
        for (int first = 0, j = 0; j < N; ++j)
          if (j == N - 1 || (cuts >> j & 1u)) {
            if (j > first) groups.emplace_back(first, j);
            first = j + 1;
          }
        one = std::min(one, sim.simulateGroups(choice, groups));
      }
    }
    const double limit = std::min(mixed.iterUs * (1 + kMargin), sim.simulate(start));
    if (std::abs(one - limit) < 1e-6 * limit) continue;  // on the edge: float noise decides
    if (one < limit) {
      ++replaced;
      EXPECT_NEAR(got.iterUs, one, 1e-6 * one) << "trial " << trial;
      EXPECT_EQ(std::set<int>(got.choice.begin(), got.choice.end()).size(), 1u)
          << "trial " << trial;
      EXPECT_EQ(search.stats().oneOption, got.choice.front()) << "trial " << trial;
      EXPECT_NEAR(search.stats().oneOptionUs, one, 1e-6 * one) << "trial " << trial;
    } else {
      ++kept;
      EXPECT_EQ(got.choice, mixed.choice) << "trial " << trial;
      EXPECT_EQ(got.groups, mixed.groups) << "trial " << trial;
      EXPECT_EQ(search.stats().oneOption, -1) << "trial " << trial;
    }
    EXPECT_NEAR(search.stats().mixedUs, mixed.iterUs, 1e-9 * mixed.iterUs) << "trial " << trial;
    EXPECT_EQ(search.stats().margin, kMargin);
  }
  std::printf(
      "one option within %.0f%% of the mixed plan: replaced it in %d instances, kept it in %d\n",
      100 * kMargin, replaced, kept);
  EXPECT_GT(replaced, 10);
  EXPECT_GT(kept, 10);
}

// A margin that is not a fraction >= 0 is refused, naming the setting.
TEST(FusionSearch, RefusesANegativeOneOptionMargin) {
  std::mt19937_64 rng(7);
  Instance in = randomInstance(rng, 3, 5);
  Simulator sim(in.cluster, in.codec, in.profile, someOptions(in.codec.spec, 2));
  FusionConfig cfg;
  cfg.oneOptionMargin = -0.1;
  FusionSearch search(sim, cfg);
  try {
    search.search(Strategy{std::vector<int>(in.profile.tensors.size(), 0), 0});
    FAIL() << "a negative margin was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("oneOptionMargin"), std::string::npos) << e.what();
  }
}

// The planner's plan carries the groups (runPlanner, Plan::groups), valid and
// consistent with the strategy; off, it carries none.
TEST(FusionSearch, PlanCarriesGroups) {
  // On 10 Gbit/s the network is busy through the backward pass: fewer
  // messages pay (about 9% predicted, 2026-11-28).
  PlanConfig cfg;
  cfg.model = "resnet50";
  cfg.codec = "fp16";
  cfg.inter = "10gbit";
  cfg.upperBound = false;
  const PlanRun run = runPlanner(cfg);
  const Strategy& s = run.report.espresso;
  ASSERT_FALSE(s.groups.empty()) << "resnet50/fp16 at 8x8 on 10 Gbit/s is expected to fuse";
  EXPECT_LT(s.iterUs, run.report.perTensor.iterUs * 0.97);
  EXPECT_NEAR(run.sim->simulateGroups(s.choice, s.groups), s.iterUs, 1e-6 * s.iterUs);
  ASSERT_EQ(run.plan.groups.size(), s.groups.size());
  const auto& t = run.sim->profile().tensors;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const auto [a, b] = s.groups[g];
    ASSERT_EQ(run.plan.groups[g].size(), size_t(b - a + 1));
    for (int k = a; k <= b; ++k) EXPECT_EQ(run.plan.groups[g][size_t(k - a)], t[size_t(k)].name);
  }
  plan::validate(run.plan);
  EXPECT_NO_THROW(plan::planFromJsonString(plan::toJsonString(run.plan)));
  cfg.fuse = false;
  const PlanRun off = runPlanner(cfg);
  EXPECT_TRUE(off.plan.groups.empty());
  EXPECT_TRUE(off.report.espresso.groups.empty());
}

}  // namespace
}  // namespace cortado::planner
