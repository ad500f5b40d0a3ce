// The scheduler's re-planner against synthetic profiling windows whose
// timings come from the simulator's own formulas (planner::commTimeUs and
// the codec cost's linear form) with known rates plus noise: the fits must
// recover the rates, and the plans must follow the link.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <cstdlib>
#include <tuple>

#include "core/common/error.h"
#include "core/config.h"
#include "core/plan/plan.h"
#include "scheduler/planner/cost_model.h"
#include "scheduler/replan.h"

namespace cortado::scheduler {
namespace {

using plan::CommOp;
using plan::Scope;

struct Truth {
  double interAlphaUs = 40, interGbps = 10;
  double intraAlphaUs = 8, intraGbps = 50;
  double encFixedUs = 30, encNsPerElement = 2.5;  // dgc encode on the CPU
  double decFixedUs = 12, decNsPerElement = 0.8;
  double noise = 0.03;  // relative, uniform in [-noise, +noise]
};

constexpr const char* kCodec = "dgc:ratio=0.01";
constexpr int kTensors = 12;
constexpr uint64_t kElements = 1 << 20;  // 4 MiB float32 each

// One window of `machines` x `local` workers, as the executor reports it.
std::vector<plan::ProfileReport> window(const Truth& t, int machines, int local, uint64_t win,
                                        uint64_t seed, uint64_t planVersion = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-t.noise, t.noise);
  auto noisy = [&](double us) { return us * (1 + u(rng)); };
  planner::LinkCost inter, intra;
  inter.base = {t.interAlphaUs, t.interGbps};
  intra.base = {t.intraAlphaUs, t.intraGbps};
  std::vector<plan::ProfileReport> out;
  for (int rank = 0; rank < machines * local; ++rank) {
    plan::ProfileReport r;
    r.rank = rank;
    r.machines = machines;
    r.localSize = local;
    r.collectives = false;
    r.planVersion = planVersion;
    r.window = win;
    r.firstIteration = win * 20;
    r.endIteration = win * 20 + 20;
    for (int i = 0; i < kTensors; ++i)
      r.ready.push_back({"grad" + std::to_string(i), kElements, noisy(2000.0 * (i + 1))});
    for (uint64_t bytes = 4096; bytes <= (16u << 20); bytes *= 4) {
      const uint64_t calls = 10;
      // A push and its pull: one round trip, twice the one-way formula.
      r.comms.push_back({CommOp::kPush, Scope::kInter, false, machines, bytes, calls,
                         calls * noisy(2 * planner::commTimeUs(inter, CommOp::kPush, machines, double(bytes)))});
      if (local > 1)
        r.comms.push_back({CommOp::kAllreduce, Scope::kIntra, false, local, bytes, calls,
                           calls * noisy(planner::commTimeUs(intra, CommOp::kAllreduce, local, double(bytes)))});
    }
    for (uint64_t el = 1024; el <= (4u << 20); el *= 4) {
      r.codecs.push_back({"dgc:ratio=0.01", plan::Device::kCpu, true, el, 5,
                          5 * noisy(t.encFixedUs + t.encNsPerElement * double(el) / 1000)});
      r.codecs.push_back({"dgc:ratio=0.01", plan::Device::kCpu, false, el, 5,
                          5 * noisy(t.decFixedUs + t.decNsPerElement * double(el) / 1000)});
    }
    out.push_back(std::move(r));
  }
  return out;
}

ReplanOptions options() {
  ReplanOptions o;
  o.codec = kCodec;
  o.ahead = 5;
  o.threshold = 0.25;
  o.inter = "10gbit";
  o.intra = "pcie";
  o.cpuCores = 8;
  return o;
}

int compressedTensors(const control::PlanUpdate& u) {
  plan::Plan p = plan::planFromJsonString(u.planJson);
  int n = 0;
  for (const auto& [name, o] : p.tensors) n += o.compressed();
  return n;
}

// Stated tolerance: with +-3% noise, rates within 3% and alphas within 15%
// (alpha is a few percent of the largest times, so its error is larger).
TEST(ReplanFit, RecoversLinkRatesAndAlphas) {
  for (double gbps : {0.1, 1.0, 10.0, 40.0}) {
    Truth t;
    t.interGbps = gbps;
    auto reports = window(t, 2, 2, 0, 7 + uint64_t(gbps * 10));
    planner::LinkCost prior;
    prior.base = {1, 1};
    LinkFit inter = OnlineReplanner::fitLink(reports, false, prior);
    LinkFit intra = OnlineReplanner::fitLink(reports, true, prior);
    SCOPED_TRACE(gbps);
    EXPECT_GT(inter.points, 0);
    EXPECT_NEAR(inter.link.base.gbps, gbps, 0.03 * gbps);
    EXPECT_NEAR(inter.link.base.alphaUs, t.interAlphaUs, 0.15 * t.interAlphaUs);
    ASSERT_TRUE(inter.link.perOp.count(CommOp::kPush));
    ASSERT_TRUE(inter.link.perOp.count(CommOp::kPull));
    EXPECT_NEAR(inter.link.perOp.at(CommOp::kPull).gbps, gbps, 0.03 * gbps);
    EXPECT_NEAR(intra.link.base.gbps, t.intraGbps, 0.03 * t.intraGbps);
    EXPECT_NEAR(intra.link.base.alphaUs, t.intraAlphaUs, 0.15 * t.intraAlphaUs);
  }
}

TEST(ReplanFit, NoMeasurementKeepsThePrior) {
  Truth t;
  auto reports = window(t, 2, 1, 0, 3);  // one worker per machine: no intra steps
  planner::LinkCost prior;
  prior.name = "pcie";
  prior.base = {5, 100};
  LinkFit intra = OnlineReplanner::fitLink(reports, true, prior);
  EXPECT_EQ(intra.points, 0);
  EXPECT_EQ(intra.link.base.gbps, 100);
  EXPECT_EQ(intra.link.base.alphaUs, 5);
}

TEST(ReplanFit, RecoversCodecCosts) {
  Truth t;
  auto fits = OnlineReplanner::fitCodecs(window(t, 2, 1, 0, 11));
  ASSERT_EQ(fits.size(), 2u);
  for (const CodecFit& f : fits) {
    SCOPED_TRACE(f.encode ? "encode" : "decode");
    EXPECT_EQ(f.codec, "dgc:ratio=0.01");
    const double fixed = f.encode ? t.encFixedUs : t.decFixedUs;
    const double ns = f.encode ? t.encNsPerElement : t.decNsPerElement;
    EXPECT_NEAR(f.cost.nsPerElement, ns, 0.03 * ns);
    EXPECT_NEAR(f.cost.fixedUs, fixed, 0.15 * fixed);
  }
}

TEST(Replan, SlowLinkCompressesMoreThanFastLink) {
  Truth fast, slow;
  fast.interGbps = 40;
  slow.interGbps = 0.1;
  OnlineReplanner a(options()), b(options());
  auto ua = a.onWindow(window(fast, 2, 1, 0, 1));
  auto ub = b.onWindow(window(slow, 2, 1, 0, 1));
  ASSERT_TRUE(ua && ub);
  const int ca = compressedTensors(*ua), cb = compressedTensors(*ub);
  EXPECT_LT(ca, cb) << "fast link: " << ca << " compressed, slow link: " << cb;
  EXPECT_GE(cb, kTensors / 2);
  EXPECT_EQ(ua->version, 1u);
  EXPECT_EQ(ua->switchAt, 20u + 5u);
  plan::Plan p = plan::planFromJsonString(ub->planJson);
  EXPECT_EQ(p.version, 1u);
  EXPECT_EQ(p.tensors.size(), size_t(kTensors));
  plan::validate(p);
  // Workers without collectives get push/pull plans only.
  for (const auto& [name, o] : p.tensors)
    for (const auto& s : o.steps)
      if (s.kind == plan::StepKind::kComm) EXPECT_NE(s.scope, Scope::kFlat) << name;
}

TEST(Replan, ReplansOnlyWhenTheLinkMovesBeyondTheThreshold) {
  Truth t;
  t.interGbps = 10;
  OnlineReplanner r(options());
  auto u0 = r.onWindow(window(t, 2, 1, 0, 1));
  ASSERT_TRUE(u0);
  const int c0 = compressedTensors(*u0);
  EXPECT_NEAR(r.plannedInterGbps(), 10, 0.3);
  // Same rate, new noise: no new plan.
  EXPECT_FALSE(r.onWindow(window(t, 2, 1, 1, 2, 1)));
  t.interGbps = 9;  // 10%: under the 25% threshold
  EXPECT_FALSE(r.onWindow(window(t, 2, 1, 2, 3, 1)));
  // 10 Gbit/s -> 100 Mbit/s: a new version, switch after the window + ahead,
  // with more tensors compressed.
  t.interGbps = 0.1;
  auto u1 = r.onWindow(window(t, 2, 1, 3, 4, 1));
  ASSERT_TRUE(u1);
  EXPECT_EQ(u1->version, 2u);
  EXPECT_EQ(u1->switchAt, 4u * 20 + 5);
  EXPECT_GT(compressedTensors(*u1), c0);
  EXPECT_NE(r.lastReason().find("inter-machine"), std::string::npos) << r.lastReason();
  // One plan pending at a time: window 4 (iterations 80..99) began before
  // version 2 took effect at 85, so even a large change does not re-plan.
  EXPECT_FALSE(r.onWindow(window(Truth{}, 2, 1, 4, 5, 2)));
  EXPECT_NE(r.lastReason().find("began before plan version 2"), std::string::npos) << r.lastReason();
  // Version follows the workers' plan version when that is ahead.
  auto u2 = r.onWindow(window(Truth{}, 2, 1, 5, 6, 7));
  ASSERT_TRUE(u2);
  EXPECT_EQ(u2->version, 8u);
}

// A link that moves beyond the threshold re-plans, but the new plan is sent
// only when it beats the current one by CORTADO_REPLAN_MIN_GAIN under the
// same refitted costs; with a gain of 0 required, any other plan is sent.
TEST(Replan, SendsANewPlanOnlyForThePredictedGain) {
  Truth t;
  t.interGbps = 10;
  auto strict = options();
  strict.minGain = 0.5;  // 50%: a 10 -> 14 Gbit/s move cannot gain that much
  auto loose = options();
  loose.minGain = 0;
  OnlineReplanner a(strict), b(loose);
  ASSERT_TRUE(a.onWindow(window(t, 2, 1, 0, 1)));
  ASSERT_TRUE(b.onWindow(window(t, 2, 1, 0, 1)));
  t.interGbps = 14;  // 40%: beyond the 25% threshold
  // (Window 1 began before plan version 1 took effect at iteration 25.)
  EXPECT_FALSE(a.onWindow(window(t, 2, 1, 2, 2, 1)));
  EXPECT_NE(a.lastReason().find("the plan stays"), std::string::npos) << a.lastReason();
  // The kept plan counts as planned for the new rate: the same rate again
  // does not re-plan.
  EXPECT_NEAR(a.plannedInterGbps(), 14, 0.5);
  EXPECT_FALSE(a.onWindow(window(t, 2, 1, 3, 3, 1)));
  // The loose replanner sends any plan predicted faster at all, and keeps the
  // current one when the new one is no faster (the same plan, here).
  auto ub = b.onWindow(window(t, 2, 1, 2, 2, 1));
  if (!ub) EXPECT_NE(b.lastReason().find("the plan stays"), std::string::npos) << b.lastReason();
  // A large move beats any required gain: 10 -> 0.1 Gbit/s.
  t.interGbps = 0.1;
  auto ua = a.onWindow(window(t, 2, 1, 4, 4, 1));
  ASSERT_TRUE(ua) << a.lastReason();
  EXPECT_EQ(ua->version, 2u);
  auto bad = options();
  bad.minGain = 1.0;
  EXPECT_THROW(OnlineReplanner{bad}, Error);
}

TEST(Replan, BadWindowsAreRefusedWithTheReason) {
  OnlineReplanner r(options());
  try {
    r.onWindow({});
    FAIL() << "no reports accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  auto reports = window(Truth{}, 2, 1, 0, 1);
  for (auto& x : reports) x.ready.clear();
  try {
    r.onWindow(reports);
    FAIL() << "reports without tensors accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("name no tensor"), std::string::npos) << e.what();
  }
  reports = window(Truth{}, 2, 1, 0, 1);
  reports[1].machines = 3;
  try {
    r.onWindow(reports);
    FAIL() << "inconsistent reports accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 x 1"), std::string::npos) << e.what();
  }
  // After refused windows the first good one still plans (version 1).
  auto u = r.onWindow(window(Truth{}, 2, 1, 1, 1));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->version, 1u);
}

TEST(Replan, BadOptionsAreRefused) {
  auto o = options();
  o.codec = "nosuchcodec";
  EXPECT_THROW(OnlineReplanner{o}, Error);
  o = options();
  o.inter = "carrier-pigeon";
  EXPECT_THROW(OnlineReplanner{o}, Error);
  o = options();
  o.threshold = 0;
  EXPECT_THROW(OnlineReplanner{o}, Error);
}

// The settings: read, handed to children, and refused with the name.
TEST(ReplanSettings, ReadCheckedAndPassedOn) {
  ::setenv("CORTADO_PROFILE_WINDOW", "7", 1);
  ::setenv("CORTADO_REPLAN_CODEC", "efsignsgd", 1);
  ::setenv("CORTADO_REPLAN_AHEAD", "3", 1);
  ::setenv("CORTADO_REPLAN_THRESHOLD", "0.5", 1);
  ::setenv("CORTADO_REPLAN_MIN_GAIN", "0.1", 1);
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.replanMinGain, 0.1);
  EXPECT_EQ(c.profileWindow, 7u);
  EXPECT_EQ(c.replanCodec, "efsignsgd");
  EXPECT_EQ(c.replanAhead, 3u);
  EXPECT_EQ(c.replanThreshold, 0.5);
  int seen = 0;
  for (const auto& [k, v] : c.toEnv()) {
    if (k == "CORTADO_PROFILE_WINDOW") {
      EXPECT_EQ(v, "7");
      ++seen;
    }
    if (k == "CORTADO_REPLAN_CODEC") {
      EXPECT_EQ(v, "efsignsgd");
      ++seen;
    }
    if (k == "CORTADO_REPLAN_AHEAD") {
      EXPECT_EQ(v, "3");
      ++seen;
    }
    if (k == "CORTADO_REPLAN_THRESHOLD") {
      EXPECT_EQ(v, "0.5");
      ++seen;
    }
    if (k == "CORTADO_REPLAN_MIN_GAIN") {
      EXPECT_EQ(v, "0.1");
      ++seen;
    }
  }
  EXPECT_EQ(seen, 5);
  for (auto [name, value, needle] :
       {std::tuple{"CORTADO_REPLAN_THRESHOLD", "abc", "not a number"},
        std::tuple{"CORTADO_REPLAN_MIN_GAIN", "x", "not a number"},
        std::tuple{"CORTADO_REPLAN_AHEAD", "0", "at least 1"},
        std::tuple{"CORTADO_PROFILE_WINDOW", "-2", "0 (off)"}}) {
    ::setenv(name, value, 1);
    try {
      readJobConfig(false);
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    ::unsetenv(name);
  }
  ::setenv("CORTADO_REPLAN_THRESHOLD", "0", 1);
  c = readJobConfig(false);
  EXPECT_THROW(c.validate(), Error);
  ::setenv("CORTADO_REPLAN_THRESHOLD", "0.25", 1);
  ::setenv("CORTADO_REPLAN_MIN_GAIN", "1", 1);
  c = readJobConfig(false);
  c.numWorkers = c.numServers = 1;
  try {
    c.validate();
    ADD_FAILURE() << "CORTADO_REPLAN_MIN_GAIN=1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CORTADO_REPLAN_MIN_GAIN"), std::string::npos) << e.what();
  }
  for (const char* n : {"CORTADO_PROFILE_WINDOW", "CORTADO_REPLAN_CODEC", "CORTADO_REPLAN_AHEAD",
                        "CORTADO_REPLAN_THRESHOLD", "CORTADO_REPLAN_MIN_GAIN"})
    ::unsetenv(n);
}

}  // namespace
}  // namespace cortado::scheduler
