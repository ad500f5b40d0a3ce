// Zen in the planner (docs/zen.md, "In a plan"): the cost model of its two
// schemes against hand computations from the spec's equations (1) and (2),
// the profiles' density and overlap fields and their errors, the scheme and
// dense-or-sparse choices on synthetic profiles, the simulator's time for a
// Zen option against the cost model, and a decision that picks Zen for a
// sparse embedding only.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "core/common/error.h"
#include "tests/common/error_of.h"
#include "scheduler/planner/compile.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/profile.h"
#include "scheduler/planner/simulator.h"
#include "scheduler/planner/zen_cost.h"

namespace cortado::planner {
namespace {

using compressor::zen::Scheme;
using nlohmann::json;
using plan::CommOp;

using test::errorOf;

// n machines of one GPU on a link of 8 Gbit/s (1 ns per byte) and `alpha` us.
Cluster ring(int n, double alpha, double nsPerPair = 0) {
  Cluster c;
  c.machines = n;
  c.gpusPerMachine = 1;
  c.inter.base = AlphaBeta{alpha, 8};
  c.intra.base = AlphaBeta{alpha, 8};
  c.d2h = AlphaBeta{0, 8};
  c.h2d = AlphaBeta{0, 8};
  c.cpuSumGbps = 8;  // 1 ns per byte
  c.zenNsPerPair = nsPerPair;
  return c;
}

TEST(ZenCost, BalancedParallelismIsEquationOnePlusHeadersAndCounts) {
  // E = 10^6, d = 1%, n = 4, overlap 0.5: gamma(4) = (1 - 0.5^4) / 0.5 = 1.875.
  // Equation (1) in bytes: (n-1)/n (gamma + 1) * 8 E d = 0.75 * 2.875 * 80000.
  // The push is smaller than its 0.75 * 80000: delta-coded, a rank's pairs
  // to one owner lie 4 / 0.01 = 400 indices apart, so each costs its 4-byte
  // value and a 2-byte gap (0.75 * 10^4 * 6). The pull is smaller than its
  // 0.75 * 1.875 * 80000 pairs' bytes: a share's 4687.5 non-zeros (sum
  // density 1.875%) lie 4 / 0.01875 = 213.3 indices apart, so each costs its
  // 4-byte value and a 2-byte gap (28125 bytes), against a bitmap of
  // 10^6/32 bytes plus the values (50000).
  const double push = 0.75 * 10000 * 6, pull = 3 * 4687.5 * 6;
  // Beside them: the 48-byte headers of the 4 lists a rank pushes ((n-1)/n of
  // them leave), the int64 counts of the alltoall ((n-1)/n of 32 bytes) and
  // of the sizes' allgather (3 of 8), and the 3 answers' headers.
  const double overhead = 0.75 * 4 * 48 + 0.75 * 32 + 3 * 8 + 3 * 48;
  const Sparsity sp{0.01, 0.5};
  ZenCost z = zenCost(ring(4, 0), Scheme::kBalancedParallelism, 1000000, 4, sp);
  EXPECT_NEAR(z.commUs, (push + pull + overhead) / 1000.0, 1e-9);  // 1 ns per byte
  EXPECT_NEAR(z.pullBytes, 3 * (48 + 28125.0), 1e-6);
  // Latency: four collectives of n - 1 steps each.
  ZenCost za = zenCost(ring(4, 10), Scheme::kBalancedParallelism, 1000000, 4, sp);
  EXPECT_NEAR(za.commUs - z.commUs, 4 * 3 * 10.0, 1e-9);
  // CPU: a pass over the input and one over the output (4 MB at 1 ns per
  // byte each), 10^4 pairs placed, about as many summed, and the 18750
  // non-zeros of the sum decoded.
  ZenCost zc = zenCost(ring(4, 0, 20), Scheme::kBalancedParallelism, 1000000, 4, sp);
  EXPECT_NEAR(zc.scanUs, 4000 + 10000 * 0.020, 1e-9);
  EXPECT_NEAR(zc.sumUs, 4000 + (10000 + 18750) * 0.020, 1e-9);
  EXPECT_NEAR(zc.totalUs(), zc.scanUs + zc.commUs + zc.sumUs, 1e-12);
}

TEST(ZenCost, BalancedParallelismAnswersWithTheBitmapWhereSmaller) {
  // d = 50% uniform over 4 ranks: the sum holds 1 - 0.5^4 = 93.75%; a share's
  // answer is 10^6/32 bitmap bytes plus 4 per value, not a byte of gap per
  // value (the index list: 4 / 0.9375 - 1 = 3.3 apart).
  const Sparsity sp{0.5, 0};
  ZenCost z = zenCost(ring(4, 0), Scheme::kBalancedParallelism, 1000000, 4, sp);
  const double share = 0.9375 * 1e6 / 4;
  EXPECT_NEAR(z.pullBytes, 3 * (48 + 1e6 / 32 + 4 * share), 1e-6);
  // The crossing: 1 byte of gap per non-zero against 10^6/32 = 31250 bitmap
  // bytes, so a share of 31250 non-zeros (sum density 12.5%, 32 apart) costs
  // the same either way; below it the list, above it the bitmap.
  auto pull = [](double sumDensity) {
    const Sparsity s{sumDensity, 1.0};  // identical sets: the sum is as dense
    return zenCost(ring(4, 0), Scheme::kBalancedParallelism, 1000000, 4, s).pullBytes;
  };
  EXPECT_NEAR(pull(0.125), 3 * (48 + 31250 + 4 * 31250.0), 1e-6);
  EXPECT_NEAR(pull(0.1), 3 * (48 + 25000 + 4 * 25000.0), 1e-6);  // list, 1 B a gap
  EXPECT_NEAR(pull(0.2), 3 * (48 + 31250 + 4 * 50000.0), 1e-6);  // bitmap
  // The gap's varint length at the mean gap, ranks / density - 1.
  EXPECT_EQ(indexListGapBytes(4, 4.0 / 128), 1);    // 127 apart
  EXPECT_EQ(indexListGapBytes(4, 4.0 / 129), 2);    // 128
  EXPECT_EQ(indexListGapBytes(4, 4.0 / 16385), 3);  // 16384
  EXPECT_EQ(indexListGapBytes(1, 1e-7), 4);         // 10^7 - 1
  EXPECT_EQ(indexListGapBytes(1, 1e-9), 5);         // past 2^28
}

TEST(ZenCost, HierarchicalCentralizationIsEquationTwo) {
  // n = 4: stages send what 1 and 2 ranks summed: gamma(1) = 1 and
  // gamma(2) = (1 - 0.5^2) / 0.5 = 1.5 times one rank's 80000 bytes.
  const double eq2 = (1.0 + 1.5) * 80000;
  const Sparsity sp{0.01, 0.5};
  ZenCost z = zenCost(ring(4, 0), Scheme::kHierarchicalCentralization, 1000000, 4, sp);
  // Each of the 2 stages also exchanges the counts (an alltoall of 32 bytes).
  EXPECT_NEAR(z.commUs, (eq2 + 2 * 0.75 * 32) / 1000.0, 1e-9);
  ZenCost za = zenCost(ring(4, 10), Scheme::kHierarchicalCentralization, 1000000, 4, sp);
  EXPECT_NEAR(za.commUs - z.commUs, 2 * 10.0 + 2 * 3 * 10.0, 1e-9);  // 2 messages, 2 alltoalls
  // n = 6: the two ranks past 4 fold in (one rank's list) and out (the sum's,
  // gamma(6) = (1 - 0.5^6) / 0.5 = 1.96875), around the same two stages.
  ZenCost z6 = zenCost(ring(6, 0), Scheme::kHierarchicalCentralization, 1000000, 4, sp);
  const double counts6 = 4 * (5.0 / 6) * 48;  // 4 exchanges, alltoall of 6 int64 counts
  EXPECT_NEAR(z6.commUs, (80000 + eq2 + 1.96875 * 80000 + counts6) / 1000.0, 1e-9);
  // The equations' sum from compressor/zen: the same bytes without the counts.
  const auto prof = compressor::zen::profileFromOverlap(1000000, 4, 0.01, 0.5);
  // (The library counts a pair as 2 words at b words per second: x 4 bytes.)
  EXPECT_NEAR(compressor::zen::hierarchicalCentralizationSeconds(prof, 1e9) * 1e9 * 4, eq2, 1e-3);
}

TEST(ZenCost, OverlapProfileSpansIdenticalToDisjoint) {
  auto p = compressor::zen::profileFromOverlap(1000, 8, 0.01, 1.0);
  EXPECT_DOUBLE_EQ(p.gammaAt(8), 1.0);  // identical sets
  p = compressor::zen::profileFromOverlap(100000000, 8, 1e-6, 1e-6);
  EXPECT_NEAR(p.gammaAt(8), 8.0, 1e-4);  // disjoint in effect
  EXPECT_NEAR(p.gammaAt(4), 4.0, 1e-4);
  EXPECT_NE(errorOf([] { compressor::zen::profileFromOverlap(1000, 8, 0.1, 0.05); }), "");
  EXPECT_NE(errorOf([] { compressor::zen::profileFromOverlap(1000, 8, 0, 0.5); }), "");
  EXPECT_NE(errorOf([] {
              zenCost(ring(4, 0), Scheme::kBalancedParallelism, 10, 4, {1.5, 0});
            }),
            "");
}

ModelProfile profileFrom(const std::string& tensorsJson) {
  return ModelProfile::fromJson(json::parse(
      R"({"format": "cortado-profile", "model": "m", "tensors": )" + tensorsJson + "}"));
}

TEST(ZenProfile, DensityAndOverlapAreOptionalAndChecked) {
  ModelProfile p = profileFrom(
      R"([{"name": "emb", "elements": 1000, "backward_us": 1, "density": 0.01, "overlap": 0.5},
          {"name": "fc", "elements": 10, "backward_us": 1}])");
  EXPECT_DOUBLE_EQ(p.tensors[0].density, 0.01);
  EXPECT_DOUBLE_EQ(p.tensors[0].overlap, 0.5);
  EXPECT_FALSE(p.tensors[1].sparse());
  EXPECT_TRUE(p.hasSparse());
  const ModelProfile back = ModelProfile::fromJson(p.toJson());
  EXPECT_DOUBLE_EQ(back.tensors[0].density, 0.01);
  EXPECT_DOUBLE_EQ(back.tensors[0].overlap, 0.5);
  EXPECT_FALSE(back.tensors[1].sparse());
  auto bad = [](const std::string& fields) {
    return errorOf([&] {
      profileFrom(R"([{"name": "emb", "elements": 1000, "backward_us": 1, )" + fields + "}]");
    });
  };
  EXPECT_NE(bad(R"("density": 0)").find("density is 0, it must be in (0, 1]"), std::string::npos)
      << bad(R"("density": 0)");
  EXPECT_NE(bad(R"("density": 1.5)").find("'emb'"), std::string::npos);
  EXPECT_NE(bad(R"("density": "low")").find("\"density\""), std::string::npos);
  EXPECT_NE(bad(R"("overlap": 0.5)").find("overlap is given without a density"), std::string::npos);
  EXPECT_NE(bad(R"("density": 0.1, "overlap": 0.05)").find("[density, 1] = [0.1, 1]"),
            std::string::npos)
      << bad(R"("density": 0.1, "overlap": 0.05)");
  EXPECT_NE(bad(R"("density": 0.1, "overlap": 2)").find("overlap is 2"), std::string::npos);
}

// The path time of `option` for one tensor of `elements` at `sp`.
double pathUs(const Cluster& c, const plan::TensorOption& option, int64_t elements,
              const Sparsity& sp) {
  return compileOption(c, ResolvedCodec{}, elements, 4, option, sp).pathUs;
}

plan::TensorOption flatAllreduce() {
  plan::TensorOption o;
  o.steps.push_back(plan::Step::comm(plan::Scope::kFlat, CommOp::kAllreduce, false));
  return o;
}

HardwareModel hardware() { return HardwareModel::load(defaultDataDir() + "/costs/hardware.json"); }

Cluster bundled(int machines, const std::string& inter) {
  const HardwareModel hw = hardware();
  Cluster c;
  c.machines = machines;
  c.gpusPerMachine = 1;
  c.intra = hw.link("nvlink");
  c.inter = hw.link(inter);
  c.d2h = hw.d2h;
  c.h2d = hw.h2d;
  c.cpuSumGbps = hw.cpuSumGbps;
  c.zenNsPerPair = hw.zenNsPerPair;
  return c;
}

TEST(ZenChoice, EachSchemeWinsWhereItShould) {
  const auto bp = zenOption(CommOp::kZenBalanced), hc = zenOption(CommOp::kZenCentralized);
  // Identical index sets: the sum is no denser, BP sends (n-1)/n * 2 lists,
  // HC log2 n lists.
  Cluster c = bundled(8, "10gbit");
  const Sparsity same{0.01, 1.0};
  EXPECT_LT(pathUs(c, bp, 10000000, same), pathUs(c, hc, 10000000, same));
  // Disjoint index sets of 2 ranks on a slow link: HC sends its list once;
  // BP sends half of it and receives the partner's share of the sum as an
  // index list, 6 of a pair's 8 bytes per non-zero (2-byte gaps at 0.2%):
  // 0.5 + 0.75 lists. (With n = 8, BP's (n-1)/n + (n-1) * 0.75 = 6.1 lists
  // are fewer than HC's n - 1 = 7: the index-list answers move the
  // crossing that the spec's equations, counting 8-byte pairs, put there.)
  Cluster c2 = bundled(2, "10gbit");
  c2.inter.base = AlphaBeta{40, 0.1};
  const Sparsity disjoint{1e-3, 1e-3};
  EXPECT_LT(pathUs(c2, hc, 10000000, disjoint), pathUs(c2, bp, 10000000, disjoint));
  // The equations alone (no latency, no CPU) agree with the spec's choice
  // there.
  for (const auto& [sp, n] : {std::pair{same, 8}, std::pair{disjoint, 2}}) {
    const Cluster r = ring(n, 0);
    const auto prof = compressor::zen::profileFromOverlap(10000000, n, sp.density, sp.overlap);
    const auto choice = compressor::zen::chooseScheme(prof, 1e9);
    const bool bpFaster = zenCost(r, Scheme::kBalancedParallelism, 10000000, 4, sp).commUs <
                          zenCost(r, Scheme::kHierarchicalCentralization, 10000000, 4, sp).commUs;
    EXPECT_EQ(bpFaster, choice.scheme == Scheme::kBalancedParallelism) << choice.figures;
  }
}

TEST(ZenChoice, DenseAllreduceWinsAtHalfDensityAndLosesAtOnePercent) {
  const auto bp = zenOption(CommOp::kZenBalanced), hc = zenOption(CommOp::kZenCentralized);
  const Cluster c = bundled(4, "10gbit");
  const int64_t E = 4000000;
  const Sparsity half{0.5, 0}, onePercent{0.01, 0};
  const double dense = pathUs(c, flatAllreduce(), E, {});
  EXPECT_LT(dense, pathUs(c, bp, E, half));
  EXPECT_LT(dense, pathUs(c, hc, E, half));
  EXPECT_LT(pathUs(c, bp, E, onePercent), dense);
  // A tensor without a density is priced dense: Zen never wins there.
  EXPECT_LT(dense, pathUs(c, bp, E, {}));
  EXPECT_LT(dense, pathUs(c, hc, E, {}));
}

TEST(ZenSimulator, TheSimulatedTimeOfAZenTensorIsTheCostModels) {
  for (CommOp op : {CommOp::kZenBalanced, CommOp::kZenCentralized}) {
    for (int gpus : {1, 2}) {
      Cluster c = bundled(4, "10gbit");
      c.gpusPerMachine = gpus;
      ModelProfile p = profileFrom(
          R"([{"name": "emb", "elements": 3000000, "backward_us": 0, "density": 0.02, "overlap": 0.3}])");
      Simulator sim(c, ResolvedCodec{}, p, {zenOption(op)});
      const double t = sim.simulate({0});
      const ZenCost z = zenCost(c, zenScheme(op), 3000000, 4, {0.02, 0.3});
      const double copies = c.d2h.us(12e6) + c.h2d.us(12e6);  // to the host and back
      EXPECT_NEAR(t, copies + z.totalUs(), 1e-6 * t) << plan::toString(op) << " on " << gpus;
      EXPECT_GT(z.commUs, 0);
    }
  }
}

TEST(ZenSimulator, AHierarchicalZenTensorIsTheIntraStepsAndTheShardsZen) {
  // Two GPUs per machine: the intra reduce-scatter sums the pair, whose
  // shard (half the elements) holds the density of the sum of 2 and goes
  // over the 4 machines, both GPUs' traffic through the one NIC.
  const Sparsity sp{0.02, 0.3};
  const Sparsity two = sumOf(sp, 2);
  EXPECT_NEAR(two.overlap, 1 - 0.7 * 0.7, 1e-12);
  EXPECT_NEAR(two.density, 0.02 / 0.3 * (1 - 0.7 * 0.7), 1e-12);
  // The sum of all 8 GPUs is the same in one stage or two.
  const auto all = compressor::zen::profileFromOverlap(1000, 8, sp.density, sp.overlap);
  const auto machines = compressor::zen::profileFromOverlap(1000, 4, two.density, two.overlap);
  EXPECT_NEAR(sp.density * all.gammaAt(8), two.density * machines.gammaAt(4), 1e-12);
  for (CommOp op : {CommOp::kZenBalanced, CommOp::kZenCentralized}) {
    Cluster c = bundled(4, "10gbit");
    c.gpusPerMachine = 2;
    ModelProfile p = profileFrom(
        R"([{"name": "emb", "elements": 3000000, "backward_us": 0, "density": 0.02, "overlap": 0.3}])");
    Simulator sim(c, ResolvedCodec{}, p, {zenOption(op, true)});
    const double t = sim.simulate({0});
    const ZenPath path{4, &c.inter, 2};
    const ZenCost z = zenCost(c, zenScheme(op), 1500000, 4, two, &path);
    const double intra = commTimeUs(c.intra, CommOp::kReduceScatter, 2, 12e6) +
                         commTimeUs(c.intra, CommOp::kAllgather, 2, 6e6);
    const double copies = c.d2h.us(6e6) + c.h2d.us(6e6);
    EXPECT_NEAR(t, intra + copies + z.totalUs(), 1e-6 * t) << plan::toString(op);
  }
}

TEST(ZenDecision, EightGpuMachinesTakeTheHierarchicalZenOption) {
  Cluster c = bundled(4, "10gbit");
  c.gpusPerMachine = 8;
  c.inter.base = AlphaBeta{40, 1};
  const ResolvedCodec codec =
      CodecModel::load(defaultDataDir() + "/costs/codecs.json").resolve("fp16");
  ModelProfile p = profileFrom(R"([
      {"name": "fc.weight", "elements": 1000000, "backward_us": 2000},
      {"name": "emb", "elements": 10000000, "backward_us": 500, "density": 0.01}])");
  const auto options = plannerOptions(c, codec.spec, true);
  Simulator sim(c, codec, p, options);
  Planner planner(sim);
  const Strategy s = planner.decide();
  EXPECT_FALSE(options[size_t(s.choice[0])].zen()) << options[size_t(s.choice[0])].describe();
  const auto& emb = options[size_t(s.choice[1])];
  EXPECT_TRUE(emb.zen() && emb.hierarchical) << emb.describe();
}

TEST(ZenDecision, APlanPicksZenForASparseEmbeddingAndDenseOptionsElsewhere) {
  Cluster c = bundled(4, "10gbit");
  c.inter.base = AlphaBeta{40, 1};  // 1 Gbit/s, as the emulated hosts
  const ResolvedCodec codec =
      CodecModel::load(defaultDataDir() + "/costs/codecs.json").resolve("fp16");
  ModelProfile p = profileFrom(R"([
      {"name": "fc.bias", "elements": 1000, "backward_us": 50},
      {"name": "fc.weight", "elements": 1000000, "backward_us": 2000},
      {"name": "lstm", "elements": 4000000, "backward_us": 8000},
      {"name": "emb", "elements": 10000000, "backward_us": 500, "density": 0.01}])");
  const auto options = plannerOptions(c, codec.spec, p.hasSparse());
  ASSERT_EQ(options.size(), plannerOptions(c, codec.spec).size() + 4);  // 2 flat, 2 hierarchical
  ASSERT_TRUE(options[options.size() - 4].zen());
  ASSERT_TRUE(options.back().zen());
  EXPECT_FALSE(plannerOptions(c, codec.spec).back().zen());  // only with sparse tensors
  Simulator sim(c, codec, p, options);
  Planner planner(sim);
  const Strategy s = planner.decide();
  for (int j = 0; j < 3; ++j)
    EXPECT_FALSE(options[size_t(s.choice[size_t(j)])].zen())
        << p.tensors[size_t(j)].name << ": " << options[size_t(s.choice[size_t(j)])].describe();
  EXPECT_TRUE(options[size_t(s.choice[3])].zen()) << options[size_t(s.choice[3])].describe();
  // The same tensor without its density: no Zen.
  p.tensors[3].density = 0;
  Simulator dense(c, codec, p, options);
  Planner dp(dense);
  const Strategy d = dp.decide();
  for (int j = 0; j < 4; ++j) EXPECT_FALSE(options[size_t(d.choice[size_t(j)])].zen());
}

TEST(ZenPlan, ZenStepsAreFlatAloneAndNeverGrouped) {
  const auto bp = zenOption(CommOp::kZenBalanced);
  EXPECT_EQ(bp.describe(), "F: zen.bp");
  EXPECT_FALSE(bp.fusible());
  EXPECT_FALSE(bp.compressed());
  plan::Plan p;
  p.tensors["emb"] = bp;
  p.tensors["emb2"] = zenOption(CommOp::kZenCentralized);
  EXPECT_EQ(plan::planFromJsonString(plan::toJsonString(p)).tensors.at("emb2"),
            zenOption(CommOp::kZenCentralized));
  // Hierarchical: the spec's data path, dense within a machine.
  const auto h = zenOption(CommOp::kZenCentralized, true);
  EXPECT_EQ(h.describe(), "H: i.rs x.zen.hc i.ag");
  EXPECT_EQ(errorOf([&] { plan::validate(h, "emb"); }), "");
  plan::TensorOption inter;
  inter.steps = {plan::Step::comm(plan::Scope::kInter, CommOp::kZenBalanced, false)};
  EXPECT_NE(errorOf([&] { plan::validate(inter, "emb"); }).find("not through the CPU servers"),
            std::string::npos);
  plan::TensorOption reduce = h;
  reduce.steps[0] = plan::Step::comm(plan::Scope::kIntra, CommOp::kReduce, false);
  reduce.steps[2] = plan::Step::comm(plan::Scope::kIntra, CommOp::kBroadcast, false);
  EXPECT_NE(errorOf([&] { plan::validate(reduce, "emb"); }).find("exactly 'intra reduce_scatter"),
            std::string::npos);
  plan::TensorOption two = bp;
  two.steps.push_back(plan::Step::comm(plan::Scope::kFlat, CommOp::kAllreduce, false));
  EXPECT_NE(errorOf([&] { plan::validate(two, "emb"); }).find("exactly one step"),
            std::string::npos);
  plan::TensorOption coded = bp;
  coded.codec = "fp16";
  EXPECT_NE(errorOf([&] { plan::validate(coded, "emb"); }).find("compresses nothing"),
            std::string::npos);
  p.tensors["emb2"] = bp;
  p.groups = {{"emb", "emb2"}};
  EXPECT_NE(errorOf([&] { plan::validate(p); }).find("Zen option"), std::string::npos);
}

}  // namespace
}  // namespace cortado::planner
