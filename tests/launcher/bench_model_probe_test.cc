// The model bench's codec probe smoothing (launcher/bench_model.h) against
// hand-worked cases: spikes of one size go, the genuine shapes stay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "launcher/bench_model.h"
#include "launcher/bench_model_predict.h"

namespace cortado::launcher {
namespace {

// The probe's sizes: from lo elements in steps of 4, then `last`.
std::vector<uint64_t> sizes(uint64_t lo, size_t count, uint64_t last = 0) {
  std::vector<uint64_t> v;
  for (uint64_t s = lo; v.size() < count; s *= 4) v.push_back(s);
  if (last) v.back() = last;
  return v;
}
// DGC's sizes in the model bench's runs on resnet101 and bert-base.
const std::vector<uint64_t> kDgc = sizes(64, 9, 2359296);

TEST(CodecProbes, AnEncodeSpikeIsTakenAtItsLargerNeighbour) {
  // Measured in one run (DGC, us, sizes 64 .. 2359296): 65536 elements at
  // 2637 between 197 and 551.
  std::vector<double> enc = {11, 13, 21, 51, 197, 2637, 551, 1813, 3534};
  std::vector<double> dec(enc.size(), 1.0);
  smoothCodecProbes(kDgc, enc, dec);
  EXPECT_EQ(enc, (std::vector<double>{11, 13, 21, 51, 197, 551, 551, 1813, 3534}));
  // The drop where the selection starts sampling (16384: 204 us, 65536: 141
  // us) is real and stays, and so does a rise of up to 3x the larger
  // neighbour; the first size has one neighbour and stays, and so does a
  // last one within 3x of the size below it scaled by the elements.
  enc = {900, 13, 20, 47, 204, 141, 435, 1305, 7276, 87000};
  dec.assign(enc.size(), 1.0);
  const std::vector<double> want = enc;
  smoothCodecProbes(sizes(16, 10), enc, dec);
  EXPECT_EQ(enc, want);
}

TEST(CodecProbes, ADecodeDearerThanALargerSizeIsCappedAtIt) {
  // One run: 1048576 elements at 2373 us between 497 and 406 (and 262144
  // at 497 where other runs measured 17-37). The scaled rule takes 262144 at
  // 4x 12 and 1048576 at 4x that; the cap leaves them below 406.
  std::vector<double> dec = {2, 2, 3, 3, 5, 12, 497, 2373, 406};
  std::vector<double> enc(dec.size(), 1.0);
  smoothCodecProbes(kDgc, enc, dec);
  EXPECT_EQ(dec, (std::vector<double>{2, 2, 3, 3, 5, 12, 48, 192, 406}));
  // The cap alone: a size dearer than a larger one, within 3x scaled.
  dec = {2, 2, 3, 3, 5, 12, 40, 150, 120};
  smoothCodecProbes(kDgc, enc, dec);
  EXPECT_EQ(dec, (std::vector<double>{2, 2, 3, 3, 5, 12, 40, 120, 120}));
  EXPECT_EQ(enc, std::vector<double>(dec.size(), 1.0));  // a flat encode stays
  // A non-decreasing curve is left as it is; short ones too.
  dec = {1, 2, 2, 8, 30};
  enc.assign(dec.size(), 1.0);
  smoothCodecProbes(sizes(64, 5), enc, dec);
  EXPECT_EQ(dec, (std::vector<double>{1, 2, 2, 8, 30}));
  std::vector<double> none, one = {5}, two = {9, 3};
  std::vector<double> e0, e1 = {5}, e2 = {9, 3};
  smoothCodecProbes({}, e0, none);
  smoothCodecProbes({64}, e1, one);
  smoothCodecProbes({64, 256}, e2, two);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(one, std::vector<double>{5});
  EXPECT_EQ(two, (std::vector<double>{3, 3}));
  EXPECT_EQ(e2, (std::vector<double>{9, 3}));
}

TEST(CodecProbes, ASizeOver3xTheSizeBelowScaledIsTakenAtTheScaledTime) {
  // One run (DGC, 2026-11-25): the decode of 2359296 elements at 2251 us,
  // 1048576 at 101 (196-261 us in three other runs).
  std::vector<double> enc = {6, 9, 15, 42, 263, 1773, 2165, 3088, 6587};
  std::vector<double> dec = {1, 1, 1, 1, 2, 5, 17, 101, 2251};
  smoothCodecProbes(kDgc, enc, dec);
  EXPECT_EQ(dec, (std::vector<double>{1, 1, 1, 1, 2, 5, 17, 101, 101 * 2359296.0 / 1048576}));
  // The encode's largest size (2.1x for 2.25x the elements) stays. Its
  // 65536 and 262144, both slow in that run, are not caught: each is within
  // 3x of a neighbour.
  EXPECT_EQ(enc, (std::vector<double>{6, 9, 15, 42, 263, 1773, 2165, 3088, 6587}));
  // Another run: the encode of 262144 at 2914 us between 160 and 3247
  // (433-618 in four other runs), within 3x of 3247, is taken at 4x 160.
  enc = {8, 12, 17, 46, 218, 160, 2914, 3247, 7569};
  dec.assign(enc.size(), 1.0);
  smoothCodecProbes(kDgc, enc, dec);
  EXPECT_EQ(enc, (std::vector<double>{8, 12, 17, 46, 218, 160, 640, 3247, 7569}));
  // The largest size's encode.
  enc = {6, 9, 15, 42, 263, 128, 618, 3088, 30000};
  dec.assign(enc.size(), 1.0);
  smoothCodecProbes(kDgc, enc, dec);
  EXPECT_DOUBLE_EQ(enc.back(), 3088 * 2359296.0 / 1048576);
}

TEST(CodecProbes, MismatchedLengthsAreRefused) {
  std::vector<double> enc = {1, 2}, dec = {1};
  EXPECT_THROW(smoothCodecProbes({64, 256}, enc, dec), Error);
}

// The skew probe's calls from finish times on one clock: every worker starts
// at 0 and finishes at f[i]; the barrier after the work releases everybody
// `barrierUs` after the last one, so worker i waits max(f) + barrierUs - f[i].
SkewCall callOf(const std::vector<double>& f, double barrierUs) {
  SkewCall c;
  double last = 0;
  for (double x : f) last = std::max(last, x);
  for (double x : f) c.workUs.push_back(x), c.waitUs.push_back(last + barrierUs - x);
  return c;
}

TEST(SkewProbe, TheFitOfSyntheticFinishTimes) {
  // Work d: the workers finish at d * (0.7, 0.9, 1.1, 1.3), the last 0.3 d
  // after the mean (d). The idle calls' waits are the barrier's 100 us.
  const std::vector<SkewCall> idle = {callOf({0, 0, 0, 0}, 100), callOf({0, 0, 0, 0}, 100)};
  std::vector<std::vector<SkewCall>> bySize;
  for (double d : {1000.0, 4000.0, 16000.0})
    bySize.push_back({callOf({0.7 * d, 0.9 * d, 1.1 * d, 1.3 * d}, 100)});
  SkewFit fit = fitSyncSkew(idle, bySize);
  EXPECT_NEAR(fit.skew.us, 0, 1e-9);
  EXPECT_NEAR(fit.skew.fraction, 0.3, 1e-12);
  ASSERT_EQ(fit.points.size(), 3u);
  EXPECT_NEAR(fit.points[1].first, 4000, 1e-9);
  EXPECT_NEAR(fit.points[1].second, 1200, 1e-9);
  // One worker 800 us later still: mean finish d + 200, last 1.3 d + 800,
  // skew 0.3 d + 600 = 0.3 (work - 200) + 600 = 540 + 0.3 work. Two calls
  // per size whose skews average to it (+-50 us). The fit is a fraction
  // (through the origin): sum(work * skew) / sum(work^2).
  bySize.clear();
  for (double d : {1000.0, 4000.0, 16000.0})
    bySize.push_back({callOf({0.7 * d, 0.9 * d, 1.1 * d, 1.3 * d + 850}, 100),
                      callOf({0.7 * d, 0.9 * d, 1.1 * d, 1.3 * d + 750}, 100)});
  fit = fitSyncSkew(idle, bySize);
  double sxy = 0, sxx = 0;
  for (double d : {1000.0, 4000.0, 16000.0}) {
    const double x = d + 200;
    sxy += x * (540 + 0.3 * x), sxx += x * x;
  }
  EXPECT_EQ(fit.skew.us, 0);
  EXPECT_NEAR(fit.skew.fraction, sxy / sxx, 1e-12);
  EXPECT_NEAR(fit.points[2].second, 540 + 0.3 * 16200, 1e-6);
  // Every worker alike (a dedicated machine): no skew.
  bySize.clear();
  for (double d : {1000.0, 4000.0}) bySize.push_back({callOf({d, d, d, d}, 100)});
  fit = fitSyncSkew(idle, bySize);
  EXPECT_EQ(fit.skew.us, 0);
  EXPECT_EQ(fit.skew.fraction, 0);
}

TEST(SkewProbe, TheFitIsAFractionThatTheLargestWorksDecide) {
  // Skews 0 at work 1000 (a wait below the idle calls': clamped to 0) and
  // 1500 at 4000: b = 4000 * 1500 / (1000^2 + 4000^2) = 6/17.
  const std::vector<SkewCall> idle = {callOf({0, 0}, 200)};
  const std::vector<std::vector<SkewCall>> bySize = {{callOf({1000, 1000}, 100)},
                                                     {callOf({2500, 5500}, 200)}};
  const SkewFit fit = fitSyncSkew(idle, bySize);
  EXPECT_EQ(fit.points[0].second, 0);
  EXPECT_NEAR(fit.points[1].second, 1500, 1e-9);
  EXPECT_EQ(fit.skew.us, 0);
  EXPECT_NEAR(fit.skew.fraction, 6.0 / 17, 1e-12);
  // Less skew after more work (1000 after 2000 us, 200 after 4200): still
  // a fraction, (2000 * 1000 + 4200 * 200) / (2000^2 + 4200^2).
  const SkewFit flat =
      fitSyncSkew(idle, {{callOf({1000, 3000}, 200)}, {callOf({4000, 4400}, 200)}});
  EXPECT_EQ(flat.skew.us, 0);
  EXPECT_NEAR(flat.skew.fraction, 2.84e6 / 21.64e6, 1e-12);
  // A loaded run's points (docs/model_bench.md), where a line had 3.9 ms +
  // 0.145 x: the small works' noisy skews hardly move the fraction.
  // Four workers: three at work - skew / 3, one at work + skew.
  const std::vector<SkewCall> idle4 = {callOf({0, 0, 0, 0}, 200)};
  std::vector<std::vector<SkewCall>> run;
  for (const auto& [work, skew] : std::vector<std::pair<double, double>>{
           {237, 0}, {579, 0}, {2454, 2956}, {10859, 15104}, {193401, 31407}})
    run.push_back({callOf({work - skew / 3, work - skew / 3, work - skew / 3, work + skew}, 200)});
  const SkewFit r = fitSyncSkew(idle4, run);
  EXPECT_EQ(r.skew.us, 0);
  const double want =
      (2454.0 * 2956 + 10859.0 * 15104 + 193401.0 * 31407) /
      (237.0 * 237 + 579.0 * 579 + 2454.0 * 2454 + 10859.0 * 10859 + 193401.0 * 193401);
  EXPECT_NEAR(r.skew.fraction, want, 1e-12);
}

TEST(SkewProbe, BadSamplesAreRefused) {
  const std::vector<SkewCall> idle = {callOf({0, 0}, 100)};
  const std::vector<std::vector<SkewCall>> ok = {{callOf({10, 20}, 100)}};
  EXPECT_NO_THROW(fitSyncSkew(idle, ok));
  EXPECT_THROW(fitSyncSkew({}, ok), Error);
  EXPECT_THROW(fitSyncSkew(idle, {}), Error);
  EXPECT_THROW(fitSyncSkew(idle, {{}}), Error);
  EXPECT_THROW(fitSyncSkew(idle, {{callOf({10, 20, 30}, 100)}}), Error);  // 3 workers, not 2
  SkewCall bad = callOf({10, 20}, 100);
  bad.waitUs[1] = -5;
  EXPECT_THROW(fitSyncSkew(idle, {{bad}}), Error);
  bad = callOf({10, 20}, 100);
  bad.workUs[0] = std::numeric_limits<double>::quiet_NaN();
  try {
    fitSyncSkew(idle, {{bad}});
    ADD_FAILURE() << "a NaN work time was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker 0"), std::string::npos) << e.what();
  }
}

TEST(SkewProbe, TheSyncSkewOption) {
  EXPECT_FALSE(parseSyncSkew("auto").has_value());
  const auto off = parseSyncSkew("off");
  ASSERT_TRUE(off.has_value());
  EXPECT_FALSE(off->any());
  const auto set = parseSyncSkew("500,0.6");
  ASSERT_TRUE(set.has_value());
  EXPECT_DOUBLE_EQ(set->us, 500);
  EXPECT_DOUBLE_EQ(set->fraction, 0.6);
  for (const char* bad :
       {"", "0.6", "a,b", "1,0.5x", "-1,0.5", "0,-0.5", "0,11", "nan,0", "0,inf"}) {
    try {
      parseSyncSkew(bad);
      ADD_FAILURE() << "--sync-skew '" << bad << "' was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--sync-skew"), std::string::npos) << e.what();
    }
  }
}

// The compressed exchange probe's timings into the simulator's links: each
// round trip less the servers' work, halved, by a machine's bytes times the
// chunks' spread over the servers (1 chunk on 4 machines: 4x), for the
// compressed push and pull only. Worked by hand: EFSignSGD with a server's
// decode of every payload 10 us (4 tasks on 64 cores: one round), its sum
// free and its re-encode 20 us, so 30 us of each round trip are the servers'.
TEST(ExchangeProbe, CompressedPushAndPullCurvesAreTheRoundTripsLessTheServers) {
  planner::Cluster cl;
  cl.machines = 4;
  cl.gpusPerMachine = 1;
  cl.cpuCores = 64;
  cl.cpuSumGbps = 1e12;
  cl.oneTensorAtATime = true;
  cl.chunkBytes = 4 << 20;
  planner::MeasuredCurve raw;  // the uncompressed probe's, left as it is
  raw.p = 4;
  raw.add(100, 7);
  raw.add(1e6, 70);
  cl.inter.curves[plan::CommOp::kPush] = raw;
  planner::ResolvedCodec codec;
  codec.spec = "efsignsgd";
  codec.cost.bitsPerElement = 1;
  for (int d = 0; d < 2; ++d) {
    codec.encodeCurve[d].p = codec.decodeCurve[d].p = 1;
    codec.encodeCurve[d].add(1, 20);
    codec.decodeCurve[d].add(1, 10);
  }
  auto entry = [](uint64_t bytes, uint64_t elements, double rtUs) {
    plan::CommTiming c;
    c.op = plan::CommOp::kPush;
    c.scope = plan::Scope::kInter;
    c.compressed = c.pullCompressed = true;
    c.groupSize = 4;
    c.bytes = bytes;
    c.chunks = 1;
    c.elements = elements;
    c.calls = 5;
    c.totalUs = 5 * rtUs;
    return c;
  };
  plan::ProfileReport r;
  r.machines = 4;
  r.comms = {entry(1000, 8000, 1000), entry(4000, 32000, 2000)};
  plan::ProfileReport other = r;  // a second worker's, the same
  planner::Cluster before = cl;
  EXPECT_EQ(replay::applyExchangeCurves({r, other}, cl, codec), 2);
  for (const plan::CommOp op : {plan::CommOp::kPush, plan::CommOp::kPull}) {
    EXPECT_NEAR(planner::commTimeUs(cl.inter, op, 4, 4000, true), (1000 - 30) / 2.0, 1e-6);
    EXPECT_NEAR(planner::commTimeUs(cl.inter, op, 4, 16000, true), (2000 - 30) / 2.0, 1e-6);
    EXPECT_NEAR(planner::commTimeUs(cl.inter, op, 4, 10000, true), (485 + 985) / 2.0, 1e-6);
  }
  EXPECT_DOUBLE_EQ(planner::commTimeUs(cl.inter, plan::CommOp::kPush, 4, 1e6, false), 70);

  // Nothing from reports of another number of machines, or none.
  planner::Cluster two = before;
  r.machines = 2;
  EXPECT_EQ(replay::applyExchangeCurves({r}, two, codec), 0);
  EXPECT_EQ(replay::applyExchangeCurves({}, two, codec), 0);
  EXPECT_TRUE(two.inter.curvesCompressed.empty());
  EXPECT_NEAR(planner::commTimeUs(two.inter, plan::CommOp::kPush, 4, 1e6, true), 70, 1e-6);
}

}  // namespace
}  // namespace cortado::launcher
