// The scheduler's re-planner against synthetic profiling windows whose
// timings come from the simulator's own formulas (planner::commTimeUs and
// the codec cost's linear form) with known rates plus noise: the fits must
// recover the rates, and the plans must follow the link. The tests on a
// "true" tbf-shaped world (and the measured check) are in replan_truth_test.cc.
#include <gtest/gtest.h>

#include <random>
#include <cstdlib>
#include <tuple>

#include "core/common/error.h"
#include "core/config.h"
#include "core/plan/plan.h"
#include "core/plan/profile_report.h"
#include "scheduler/planner/cost_model.h"
#include "scheduler/replan.h"
#include "tests/scheduler/replan_test_util.h"

namespace cortado::scheduler {
namespace {

using plan::CommOp;
using plan::Scope;
using test::options;

struct Truth {
  double interAlphaUs = 40, interGbps = 10;
  double intraAlphaUs = 8, intraGbps = 50;
  double encFixedUs = 30, encNsPerElement = 2.5;  // dgc encode on the CPU
  double decFixedUs = 12, decNsPerElement = 0.8;
  double noise = 0.03;  // relative, uniform in [-noise, +noise]
};

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
      r.comms.push_back({CommOp::kPush, Scope::kInter, false, machines, bytes, 0, 0, false, calls,
                         calls * noisy(2 * planner::commTimeUs(inter, CommOp::kPush, machines, double(bytes)))});
      if (local > 1)
        r.comms.push_back({CommOp::kAllreduce, Scope::kIntra, false, local, bytes, 0, 0, false, calls,
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

// The link rule's measure: a window's communication against a reference
// window's at the same sizes, here noise-free, against a plain sum of the
// formula's times; sizes outside the reference's and kinds it lacks are not
// compared, and count in the coverage's denominator only.
TEST(ReplanFit, DriftComparesTheSameMessagesAtTheSameSizes) {
  Truth t;
  t.noise = 0;
  t.interGbps = 20;
  const auto ref = window(t, 2, 2, 0, 1);
  Truth slow = t;
  slow.interGbps = 5;
  auto now = window(slow, 2, 2, 1, 2);
  const CommCurves curves = OnlineReplanner::commCurves(ref);
  // Plain sum: every push round trip of `now`, over the same at 20 Gbit/s.
  planner::LinkCost fast, slowLink;
  fast.base = {t.interAlphaUs, t.interGbps};
  slowLink.base = {slow.interAlphaUs, slow.interGbps};
  double num = 0, den = 0;
  for (uint64_t bytes = 4096; bytes <= (16u << 20); bytes *= 4) {
    num += 2 * planner::commTimeUs(slowLink, CommOp::kPush, 2, double(bytes));
    den += 2 * planner::commTimeUs(fast, CommOp::kPush, 2, double(bytes));
  }
  LinkDrift inter = OnlineReplanner::drift(curves, now, false);
  EXPECT_NEAR(inter.ratio, num / den, 1e-6 * num / den);
  EXPECT_GT(inter.ratio, 3.5);  // mostly the 16 MiB messages: near the 4x of the rate
  EXPECT_NEAR(inter.coverage, 1.0, 1e-12);
  LinkDrift intra = OnlineReplanner::drift(curves, now, true);
  EXPECT_NEAR(intra.ratio, 1.0, 1e-9);
  EXPECT_NEAR(intra.coverage, 1.0, 1e-12);
  // A size beyond the reference's largest and a kind it lacks: not compared.
  double total = 0;
  for (auto& r : now)
    for (const auto& c : r.comms)
      if (c.scope == Scope::kInter) total += c.totalUs;
  const double extra = total / double(now.size());  // per report: a third of the whole
  for (auto& r : now) {
    r.comms.push_back({CommOp::kPush, Scope::kInter, false, 2, 64u << 20, 0, 0, false, 1, extra / 2});
    r.comms.push_back({CommOp::kPush, Scope::kInter, true, 2, 4096, 0, 0, true, 1, extra / 2});
  }
  inter = OnlineReplanner::drift(curves, now, false);
  EXPECT_NEAR(inter.ratio, num / den, 1e-6 * num / den);
  EXPECT_NEAR(inter.coverage, 0.5, 1e-9);
  // Nothing in common: no ratio, coverage 0.
  inter = OnlineReplanner::drift(CommCurves{}, now, false);
  EXPECT_EQ(inter.coverage, 0);
  EXPECT_EQ(inter.ratio, 1);
}

// One plan, one link, and only small, latency-bound messages with noise:
// the alpha-beta fit of the link swings beyond the threshold between two
// windows (the bench's 0.9 -> 14.6 -> 1.9 -> 71 Gbit/s on one 1 Gbit/s
// link), but the same messages took the same time, so nothing re-plans.
TEST(Replan, FittedRatesThatSwingOnSmallMessagesDoNotReplan) {
  Truth t;
  t.noise = 0.25;
  auto small = [&](uint64_t win, uint64_t seed, uint64_t version) {
    auto reports = window(t, 2, 1, win, seed, version);
    for (auto& r : reports)
      std::erase_if(r.comms, [](const plan::CommTiming& c) { return c.bytes > 16384; });
    return reports;
  };
  planner::LinkCost prior;
  prior.base = {1, 1};
  // Two seeds whose fitted rates are more than 50% apart.
  uint64_t a = 0, b = 0;
  for (uint64_t s1 = 1; s1 < 40 && !b; ++s1)
    for (uint64_t s2 = s1 + 1; s2 < 40 && !b; ++s2) {
      const double r1 = OnlineReplanner::fitLink(small(0, s1, 0), false, prior).link.base.gbps;
      const double r2 = OnlineReplanner::fitLink(small(2, s2, 1), false, prior).link.base.gbps;
      if (std::max(r1, r2) > 1.5 * std::min(r1, r2)) a = s1, b = s2;
    }
  ASSERT_NE(b, 0u) << "no two windows whose fits swing: the test exercises nothing";
  OnlineReplanner r(options());
  auto first = r.onWindow(small(0, a, 0));
  EXPECT_NE(r.lastReason().find("first complete profile"), std::string::npos) << r.lastReason();
  const uint64_t v = first ? first->version : 0;
  EXPECT_FALSE(r.onWindow(small(2, b, v)));
  EXPECT_EQ(r.lastReason().find("link rate"), std::string::npos) << r.lastReason();
  EXPECT_NE(r.lastReason().find("first complete profile"), std::string::npos) << r.lastReason();
  // The same small messages 3x slower: a moved link.
  t.interAlphaUs *= 3;
  t.interGbps /= 3;
  t.noise = 0.03;
  r.onWindow(small(3, b, v));
  EXPECT_NE(r.lastReason().find("inter-machine link rate"), std::string::npos) << r.lastReason();
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
      if (s.kind == plan::StepKind::kComm) {
        EXPECT_NE(s.scope, Scope::kFlat) << name;
      }
}

TEST(Replan, ReplansOnlyWhenTheLinkMovesBeyondTheThreshold) {
  Truth t;
  t.interGbps = 20;
  OnlineReplanner r(options());
  auto u0 = r.onWindow(window(t, 2, 1, 0, 1));
  ASSERT_TRUE(u0);
  const int c0 = compressedTensors(*u0);
  EXPECT_NEAR(r.plannedInterGbps(), 20, 0.6);
  // Same rate, new noise: no new plan.
  EXPECT_FALSE(r.onWindow(window(t, 2, 1, 1, 2, 1)));
  t.interGbps = 18;  // 10%: under the 25% threshold
  EXPECT_FALSE(r.onWindow(window(t, 2, 1, 2, 3, 1)));
  // 20 Gbit/s -> 100 Mbit/s: a new version, switch after the window + ahead,
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
  Truth fast;
  fast.interGbps = 20;  // back to nothing compressed
  auto u2 = r.onWindow(window(fast, 2, 1, 5, 6, 7));
  ASSERT_TRUE(u2);
  EXPECT_EQ(u2->version, 8u);
}

// By default a link must move beyond the threshold in two consecutive
// windows: one window beyond it (noise) followed by one within re-plans
// nothing; two in a row re-plan, at the second; confirmWindows < 1 is
// refused.
TEST(Replan, AMovedLinkIsConfirmedByASecondWindowBeforeReplanning) {
  Truth t;
  t.interGbps = 20;
  auto opts = options();
  opts.confirmWindows = ReplanOptions{}.confirmWindows;
  ASSERT_EQ(opts.confirmWindows, 2);
  OnlineReplanner r(opts);
  ASSERT_TRUE(r.onWindow(window(t, 2, 1, 0, 1)));
  // (Window 1 began before plan version 1 took effect at iteration 25.)
  EXPECT_FALSE(r.onWindow(window(t, 2, 1, 1, 2, 1)));
  Truth slow = t;
  slow.interGbps = 0.1;
  EXPECT_FALSE(r.onWindow(window(slow, 2, 1, 2, 3, 1)));  // one window at 0.1 Gbit/s
  EXPECT_NE(r.lastReason().find("waiting for 1 more window"), std::string::npos) << r.lastReason();
  EXPECT_FALSE(r.onWindow(window(t, 2, 1, 3, 4, 1)));  // back: nothing moved
  EXPECT_FALSE(r.onWindow(window(slow, 2, 1, 4, 5, 1)));  // a new first window beyond it
  EXPECT_NE(r.lastReason().find("waiting for 1 more window"), std::string::npos) << r.lastReason();
  auto u = r.onWindow(window(slow, 2, 1, 5, 6, 1));  // the second in a row
  ASSERT_TRUE(u) << r.lastReason();
  EXPECT_EQ(u->version, 2u);
  EXPECT_NE(r.lastReason().find("inter-machine link rate"), std::string::npos) << r.lastReason();
  auto bad = options();
  bad.confirmWindows = 0;
  EXPECT_THROW(OnlineReplanner{bad}, Error);
}

// A link that moves beyond the threshold re-plans, but the new plan is sent
// only when it beats the current one by CORTADO_REPLAN_MIN_GAIN under the
// same refitted costs; with a gain of 0 required, any other plan is sent.
TEST(Replan, SendsANewPlanOnlyForThePredictedGain) {
  Truth t;
  t.interGbps = 20;  // nothing compressed (at 10 Gbit/s every tensor is)
  auto strict = options();
  strict.minGain = 0.5;  // 50%: a 20 -> 28 Gbit/s move cannot gain that much
  auto loose = options();
  loose.minGain = 0;
  OnlineReplanner a(strict), b(loose);
  ASSERT_TRUE(a.onWindow(window(t, 2, 1, 0, 1)));
  ASSERT_TRUE(b.onWindow(window(t, 2, 1, 0, 1)));
  t.interGbps = 28;  // 40%: beyond the 25% threshold
  // (Window 1 began before plan version 1 took effect at iteration 25.)
  EXPECT_FALSE(a.onWindow(window(t, 2, 1, 2, 2, 1)));
  EXPECT_NE(a.lastReason().find("the plan stays"), std::string::npos) << a.lastReason();
  // The kept plan counts as planned for the new rate: the same rate again
  // does not re-plan.
  EXPECT_NEAR(a.plannedInterGbps(), 28, 1.0);
  EXPECT_FALSE(a.onWindow(window(t, 2, 1, 3, 3, 1)));
  // The loose replanner sends any plan predicted faster at all, and keeps the
  // current one when the new one is no faster (the same plan, here).
  auto ub = b.onWindow(window(t, 2, 1, 2, 2, 1));
  if (!ub) {
    EXPECT_NE(b.lastReason().find("the plan stays"), std::string::npos) << b.lastReason();
  }
  // A large move beats any required gain: 28 -> 0.1 Gbit/s.
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

TEST(ReplanFit, CodecCostsIgnoreOneSlowCallAndOneSlowWorker) {
  Truth t;
  t.noise = 0;
  auto reports = window(t, 4, 1, 0, 3);
  for (auto& r : reports)
    for (auto& c : r.codecs) c.maxUs = c.totalUs / double(c.calls);
  for (auto& c : reports[1].codecs) {  // one call of each size 50x slower
    const double one = c.totalUs / double(c.calls);
    c.totalUs += 49 * one;
    c.maxUs = 50 * one;
  }
  for (auto& c : reports[2].codecs) c.totalUs *= 3, c.maxUs *= 3;  // slow throughout
  auto fits = OnlineReplanner::fitCodecs(reports);
  ASSERT_EQ(fits.size(), 2u);
  for (const CodecFit& f : fits) {
    SCOPED_TRACE(f.encode ? "encode" : "decode");
    for (uint64_t el = 1024; el <= (4u << 20); el *= 4) {
      const double want = f.encode ? t.encFixedUs + t.encNsPerElement * double(el) / 1000
                                   : t.decFixedUs + t.decNsPerElement * double(el) / 1000;
      EXPECT_NEAR(f.curve.us(double(el)), want, 1e-6 * want) << el;
    }
    const double ns = f.encode ? t.encNsPerElement : t.decNsPerElement;
    EXPECT_NEAR(f.cost.nsPerElement, ns, 1e-3 * ns);
  }
}

// The settings: read, handed to children, and refused with the name.
TEST(ReplanSettings, ReadCheckedAndPassedOn) {
  ::setenv("CORTADO_PROFILE_WINDOW", "7", 1);
  ::setenv("CORTADO_REPLAN_CODEC", "efsignsgd", 1);
  ::setenv("CORTADO_REPLAN_AHEAD", "3", 1);
  ::setenv("CORTADO_REPLAN_THRESHOLD", "0.5", 1);
  ::setenv("CORTADO_REPLAN_MIN_GAIN", "0.1", 1);
  EXPECT_EQ(readJobConfig(false).replanConfirm, 2);  // the default
  ::setenv("CORTADO_REPLAN_CONFIRM", "3", 1);
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.replanMinGain, 0.1);
  EXPECT_EQ(c.replanConfirm, 3);
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
    if (k == "CORTADO_REPLAN_CONFIRM") {
      EXPECT_EQ(v, "3");
      ++seen;
    }
  }
  EXPECT_EQ(seen, 6);
  for (auto [name, value, needle] :
       {std::tuple{"CORTADO_REPLAN_THRESHOLD", "abc", "not a number"},
        std::tuple{"CORTADO_REPLAN_MIN_GAIN", "x", "not a number"},
        std::tuple{"CORTADO_REPLAN_AHEAD", "0", "at least 1"},
        std::tuple{"CORTADO_REPLAN_CONFIRM", "0", "at least 1 (windows in a row)"},
        std::tuple{"CORTADO_REPLAN_CONFIRM", "two", "CORTADO_REPLAN_CONFIRM"},
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
                        "CORTADO_REPLAN_THRESHOLD", "CORTADO_REPLAN_MIN_GAIN",
                        "CORTADO_REPLAN_CONFIRM"})
    ::unsetenv(n);
}

}  // namespace
}  // namespace cortado::scheduler
