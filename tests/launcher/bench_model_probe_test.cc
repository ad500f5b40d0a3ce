// The model bench's codec probe smoothing (launcher/bench_model.h) against
// hand-worked cases: spikes of one size go, the genuine shapes stay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "tests/common/error_of.h"
#include "launcher/bench_model.h"
#include "launcher/bench_model_probe.h"
#include "launcher/bench_model_predict.h"
#include "scheduler/planner/compile.h"

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

TEST(CodecProbes, TheLargestTensorIsProbedAtItsOwnSize) {
  constexpr uint64_t Mi = 1u << 20;
  using V = std::vector<uint64_t>;
  // resnet101: the largest tensor (2.25 Mi) between the 4x steps, up to the
  // largest group (8 Mi here).
  EXPECT_EQ(replay::codecProbeSizes(64, 8 * Mi, {2359296}),
            (V{64, 256, 1024, 4096, 16384, 65536, 262144, Mi, 2359296, 4 * Mi, 8 * Mi}));
  // Groups beyond 16 Mi elements stop there...
  EXPECT_EQ(replay::codecProbeSizes(Mi, 40 * Mi, {2 * Mi}), (V{Mi, 2 * Mi, 4 * Mi, 16 * Mi}));
  // ...but a tensor beyond it (BERT's word embedding, 23 Mi elements) is its
  // last size, and the groups beyond it take the slope to it.
  const uint64_t emb = 30522u * 768u;
  EXPECT_EQ(replay::codecProbeSizes(Mi, 26 * Mi, {emb}), (V{Mi, 4 * Mi, 16 * Mi, emb}));
  EXPECT_EQ(replay::codecProbeSizes(Mi, emb, {emb}), (V{Mi, 4 * Mi, 16 * Mi, emb}));
  // A size of `also` above hi is not probed.
  EXPECT_EQ(replay::codecProbeSizes(Mi, 4 * Mi, {emb}), (V{Mi, 4 * Mi}));
}

TEST(SkewChains, SizesByTheEncodeUpTo1MiAndTheCodecProbesLargest) {
  constexpr uint64_t Mi = 1u << 20;
  using V = std::vector<uint64_t>;
  // 1 ns an element: 30 us at 30000 elements, so 32768; 120 us -> 131072;
  // 500 us -> 524288; 2 ms -> 2 Mi, held to 1 Mi.
  planner::MeasuredCurve ns;
  ns.add(1024, 1.024);
  ns.add(64 * Mi, 64 * Mi / 1000.0);
  EXPECT_EQ(replay::skewChainSizes(ns, {64, 16 * Mi}), (V{32768, 131072, 524288, Mi}));
  // A model whose largest probed size is 100000 elements: no chain beyond it.
  EXPECT_EQ(replay::skewChainSizes(ns, {64, 100000}), (V{32768, 100000}));
  // Smaller than the first chain's 1024 elements: one chain of 1024.
  EXPECT_EQ(replay::skewChainSizes(ns, {64, 500}), (V{1024}));
  // A slow codec (1 us an element): 1024 elements already take 1 ms, past
  // the first three targets (one chain for them), and 2 ms takes 2048.
  planner::MeasuredCurve us;
  us.add(1024, 1024);
  us.add(Mi, Mi);
  EXPECT_EQ(replay::skewChainSizes(us, {}), (V{1024, 2048}));
}

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

TEST(CodecProbes, TheZeroingPassIsSmoothedAsTheDecodes) {
  // One run's zeroing pass (resnet50's sizes, us): 1048576 elements at 2206
  // between 92 and 964; capped at the larger size.
  const std::vector<uint64_t> at = {64, 256, 1024, 4096, 16384, 65536, 262144, 1048576,
                                    2359296, 4194304, 6822912};
  std::vector<double> z = {2, 1, 2, 3, 8, 24, 92, 2206, 964, 1598, 2927};
  smoothPassProbes(at, z);
  EXPECT_EQ(z, (std::vector<double>{1, 1, 2, 3, 8, 24, 92, 368, 964, 1598, 2927}));
  // The same times through the decode's rules give the same.
  std::vector<double> dec = {2, 1, 2, 3, 8, 24, 92, 2206, 964, 1598, 2927};
  std::vector<double> enc(dec.size(), 1.0);
  smoothCodecProbes(at, enc, dec);
  EXPECT_EQ(dec, z);
  EXPECT_NE(test::errorOf([&] { smoothPassProbes(at, enc = {1, 2}); }).find("11 sizes but 2 times"),
            std::string::npos);
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

// meanLessStrays(calls) is `us` over `kept` calls, `strays` left out.
void expectMean(const std::vector<double>& calls, double us, int kept, int strays) {
  SCOPED_TRACE(::testing::PrintToString(calls));
  const ProbeMean m = meanLessStrays(calls);
  EXPECT_DOUBLE_EQ(m.us, us);
  EXPECT_EQ(m.calls, kept);
  EXPECT_EQ(m.strays, strays);
}

TEST(LinkProbes, AStrayCallIsLeftOutOfTheMean) {
  // One call of nine stalled 50 ms: the other eight's mean.
  expectMean({600, 620, 610, 50000, 640, 600, 590, 605, 615},
             (600 + 620 + 610 + 640 + 600 + 590 + 605 + 615) / 8.0, 8, 1);
  // Slow calls alike are the size's time, not strays.
  expectMean({6000, 6100, 5900}, 6000, 3, 0);
  // A wait of a few time slices (under 10 ms beyond the median) is kept: the
  // replay's steps meet those.
  expectMean({500, 500, 4500}, 5500 / 3.0, 3, 0);
  // At large sizes a stray is over 3x the median: 60 ms against 18 ms goes,
  // 50 ms stays.
  expectMean({17000, 18000, 60000}, 17500, 2, 1);
  expectMean({17000, 18000, 50000}, 85000 / 3.0, 3, 0);
  // Two calls: their median is their mean, and neither is over 3x it.
  expectMean({100, 20000}, 10050, 2, 0);
  EXPECT_THROW(meanLessStrays({}), Error);
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

// 4 emulated hosts of one GPU each with `cores` cores, summing for free, one
// tensor at a time, 4 MiB chunks and partitions.
planner::Cluster fourHosts(int cores) {
  planner::Cluster cl;
  cl.machines = 4;
  cl.gpusPerMachine = 1;
  cl.cpuCores = cores;
  cl.cpuSumGbps = 1e12;
  cl.oneTensorAtATime = true;
  cl.chunkBytes = 4 << 20;
  return cl;
}

// EFSignSGD (1 bit per element) on both devices with the encode curve
// `encode` (elements, us) and a decode of 10 us per payload at any size.
planner::ResolvedCodec efsignsgd(const std::vector<std::pair<double, double>>& encode) {
  planner::ResolvedCodec codec;
  codec.spec = "efsignsgd";
  codec.cost.bitsPerElement = 1;
  for (int d = 0; d < 2; ++d) {
    codec.encodeCurve[d].p = codec.decodeCurve[d].p = 1;
    for (const auto& [n, us] : encode) codec.encodeCurve[d].add(n, us);
    codec.decodeCurve[d].add(1, 10);
  }
  return codec;
}

// The compressed exchange probe's timings into the simulator's links: each
// round trip less the servers' work, halved, by a machine's bytes times the
// chunks' spread over the servers (1 chunk on 4 machines: 4x), for the
// compressed push and pull only. Worked by hand: EFSignSGD with a server's
// decode of every payload 10 us (4 tasks on 64 cores: one round), its sum
// free and its re-encode 20 us, so 30 us of each round trip are the servers'.
TEST(ExchangeProbe, CompressedPushAndPullCurvesAreTheRoundTripsLessTheServers) {
  planner::Cluster cl = fourHosts(64);
  planner::MeasuredCurve raw;  // the uncompressed probe's, left as it is
  raw.p = 4;
  raw.add(100, 7);
  raw.add(1e6, 70);
  cl.inter.curves[plan::CommOp::kPush] = raw;
  const planner::ResolvedCodec codec = efsignsgd({{1, 20}});
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

void expectPoints(const std::vector<std::pair<double, double>>& got,
                  const std::vector<std::pair<double, double>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i].first, want[i].first, 1e-3) << i;
    EXPECT_NEAR(got[i].second, want[i].second, 1e-3) << i;
  }
}

// The skew chains' traced codec calls into the CPU curves: each traced
// chain's encode and decode over their price, by elements, multiply the
// curves' points (interpolated in the logarithm of the elements between
// the chains, the nearest chain's beyond them). Worked by hand: encode 20 us
// at 1000 elements, 80 at 4000; a decode of 10 us a payload (4 payloads)
// and a zeroing pass of 4 us at 1000 elements, 16 at 4000.
TEST(SkewChain, TracedCodecCallsStretchTheCpuCurves) {
  planner::Cluster cl = fourHosts(2);
  cl.cpuCodecByCall = true;
  cl.d2h = cl.h2d = planner::AlphaBeta{0, 1e9};
  cl.cpuFillCurve.add(1000, 4);
  cl.cpuFillCurve.add(4000, 16);
  cl.gpuFillCurve = cl.cpuFillCurve;
  planner::ResolvedCodec codec = efsignsgd({{1000, 20}, {4000, 80}});
  for (auto& curve : codec.decodeCurve) {
    curve.points.clear();
    curve.add(1000, 10);
    curve.add(4000, 10);
  }
  using Chain = replay::Measured::ChainPoint;
  auto traced = [](uint64_t elements, double encodeUs, double decodeUs) {
    Chain c{elements, 8, 1000};
    c.encodeUs = encodeUs, c.collectiveUs = 100, c.decodeUs = decodeUs;
    return c;
  };
  // 1000 elements: two chains, encodes 1.4x and 1.6x their 20 us (1.5x),
  // decodes 66 us against 40 + 4 (1.5x); 4000: encode 240 against 80 (3x),
  // decode 56 against 40 + 16 (1x). A chain without traced stages is left
  // out.
  const std::vector<Chain> chains = {traced(1000, 28, 66), traced(4000, 240, 56),
                                     traced(1000, 32, 66), Chain{2000, 8, 5000}};
  planner::Cluster a = cl;
  planner::ResolvedCodec ka = codec;
  const auto rows = replay::applyChainContention(chains, a, ka, false);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NEAR(rows[0][0], 1000, 1e-9);
  EXPECT_NEAR(rows[0][1], 1.5, 1e-9);
  EXPECT_NEAR(rows[0][2], 1.5, 1e-9);
  EXPECT_NEAR(rows[1][0], 4000, 1e-9);
  EXPECT_NEAR(rows[1][1], 3.0, 1e-9);
  EXPECT_NEAR(rows[1][2], 1.0, 1e-9);
  const int cpu = int(plan::Device::kCpu), gpu = int(plan::Device::kGpu);
  expectPoints(ka.encodeCurve[cpu].points, {{1000, 30}, {4000, 240}});
  expectPoints(ka.decodeCurve[cpu].points, {{1000, 15}, {4000, 10}});
  expectPoints(a.cpuFillCurve.points, {{1000, 6}, {4000, 16}});
  // The device has the codec: its curves and its zeroing pass stay.
  EXPECT_EQ(ka.encodeCurve[gpu].points, codec.encodeCurve[gpu].points);
  EXPECT_EQ(a.gpuFillCurve.points, cl.gpuFillCurve.points);
  // The chains' step now priced at its traced encode and decode.
  const plan::TensorOption f = replay::chainOption("efsignsgd");
  auto stages = [&](const planner::Cluster& x, const planner::ResolvedCodec& k, int64_t n) {
    std::pair<double, double> ed{0, 0};
    for (const planner::SimOp& op : planner::compileOption(x, k, n, 4, f).ops) {
      if (op.kind == planner::OpKind::kEncode) ed.first += planner::opDurationUs(x, op);
      if (op.kind == planner::OpKind::kDecode) ed.second += planner::opDurationUs(x, op);
    }
    return ed;
  };
  expectPoints({stages(a, ka, 1000), stages(a, ka, 4000)}, {{30, 66}, {240, 56}});
  // Between the chains, halfway in the logarithm (2000 elements: 2.25x), on
  // a curve point; below them, the smallest chain's (1.5x). Beyond the
  // largest chain (4000 elements, 80 us stretched to 240), the larger of
  // the point and 240 us grown in proportion to the size: 400 us at 8000
  // elements becomes 480, 2000 at 16000 stays (above 960).
  planner::ResolvedCodec mid = codec;
  mid.encodeCurve[cpu].points = {{500, 10}, {2000, 40}, {4000, 80}, {8000, 400}, {16000, 2000}};
  planner::Cluster b = cl;
  replay::applyChainContention(chains, b, mid, false);
  expectPoints(mid.encodeCurve[cpu].points,
               {{500, 15}, {2000, 90}, {4000, 240}, {8000, 480}, {16000, 2000}});
  // A "gpu" step that runs the CPU twin is stretched alike.
  planner::Cluster c = cl;
  planner::ResolvedCodec kc = codec;
  replay::applyChainContention(chains, c, kc, true);
  EXPECT_EQ(kc.encodeCurve[gpu].points, kc.encodeCurve[cpu].points);
  EXPECT_EQ(kc.decodeCurve[gpu].points, kc.decodeCurve[cpu].points);
  EXPECT_EQ(c.gpuFillCurve.points, c.cpuFillCurve.points);
  // The first payload's decode curve, where priced apart, is stretched as
  // the others (here at the same price as each further one: the same rows).
  planner::Cluster e = cl;
  planner::ResolvedCodec ke = codec;
  ke.decodeFirstCurve[cpu] = codec.decodeCurve[cpu];
  EXPECT_EQ(replay::applyChainContention(chains, e, ke, false), rows);
  expectPoints(ke.decodeFirstCurve[cpu].points, {{1000, 15}, {4000, 10}});
  // No traced chain: nothing changes.
  planner::Cluster d = cl;
  planner::ResolvedCodec kd = codec;
  EXPECT_TRUE(replay::applyChainContention({Chain{1000, 8, 400}}, d, kd, true).empty());
  EXPECT_EQ(kd.encodeCurve[cpu].points, codec.encodeCurve[cpu].points);
  EXPECT_EQ(d.cpuFillCurve.points, cl.cpuFillCurve.points);
}

// The skew chains into the simulator's curve: each chain's time per step
// less the step's price (F: E(c) ag* D(c), one after the other), by the
// encode before the allgather, non-decreasing and concave through (0, 0).
// Worked by hand: 4 machines, EFSignSGD whose encode is 20 us at 1000
// elements and 80 at 4000 (one task: the partitions are 4 MiB), a
// compressed flat allgather of 100 us at any size, a decode of 10 us per
// payload (4 payloads: 40 us). A step is 160 us at 1000 elements, 220 at
// 4000.
TEST(SkewChain, TheCurveIsEachChainsTimeLessItsPriceByTheEncode) {
  planner::Cluster cl = fourHosts(2);
  planner::MeasuredCurve ag;
  ag.p = 4;
  ag.add(1, 100);
  cl.inter.curvesCompressed[plan::CommOp::kAllgather] = ag;
  cl.intra = cl.inter;
  cl.d2h = cl.h2d = planner::AlphaBeta{0, 1e9};  // host memory: no copies
  const planner::ResolvedCodec codec = efsignsgd({{1000, 20}, {4000, 80}});
  const plan::TensorOption f = replay::chainOption("efsignsgd");
  ASSERT_NEAR(planner::compileOption(cl, codec, 1000, 4, f).pathUs, 160, 1e-3);
  ASSERT_NEAR(planner::compileOption(cl, codec, 4000, 4, f).pathUs, 220, 1e-3);
  cl.syncSkew.us = 7;  // replaced by the chains' curve
  using Chain = replay::Measured::ChainPoint;
  // 1000 elements: two chains of equal work, 400 and 360 us per step
  // (excess 240 and 200: 220); 4000: 820 us per step (excess 600).
  planner::Cluster a = cl;
  auto pts = replay::applyChainSkew({{1000, 24, 400}, {1000, 12, 360}, {4000, 4, 820}}, a, codec);
  expectPoints(pts, {{20, 220}, {80, 600}});
  EXPECT_EQ(a.syncSkew.curve.points, pts);
  EXPECT_DOUBLE_EQ(a.syncSkew.us, 0);
  EXPECT_NEAR(a.syncSkew.after(10), 110, 1e-3);   // below the first point: towards (0, 0)
  EXPECT_NEAR(a.syncSkew.after(50), 410, 1e-3);   // between the points
  EXPECT_NEAR(a.syncSkew.after(500), 600, 1e-3);  // beyond the last point: its wait
  // The timeline now prices a chain's step as measured.
  EXPECT_NEAR(planner::compileOption(a, codec, 4000, 4, f).pathUs, 820, 1e-3);
  // A wait that grows faster than the work is raised to the line from
  // (0, 0) to the point above it (concave): 20 us of work at 80 us of
  // excess, under the line to (80, 800), takes 200.
  planner::Cluster b = cl;
  pts = replay::applyChainSkew({{1000, 8, 240}, {4000, 8, 1020}}, b, codec);
  expectPoints(pts, {{20, 200}, {80, 800}});
  // Faster than priced: no wait; a larger work with a smaller excess is
  // pooled with the one below it (non-decreasing): (240 + 0) / 2.
  planner::Cluster e = cl;
  pts = replay::applyChainSkew({{1000, 8, 400}, {4000, 8, 200}}, e, codec);
  expectPoints(pts, {{20, 120}, {80, 120}});
  // The breakdown: a traced chain's stages beside their prices (encode 20,
  // allgather 100, decode 4 x 10 at 1000 elements), the rest being the step
  // less its traced stages; a chain whose stages were not traced is left out.
  planner::Cluster g = cl;
  std::string breakdown;
  Chain traced{1000, 8, 400};
  traced.encodeUs = 30;
  traced.collectiveUs = 110;
  traced.decodeUs = 45;
  pts = replay::applyChainSkew({traced, {4000, 4, 820}}, g, codec, &breakdown);
  expectPoints(pts, {{20, 240}, {80, 600}});  // the curve as without it
  EXPECT_EQ(breakdown, "8x1000: 400 (160): E 30 (20), ag* 110 (100), D 45 (40), the rest 215");
  // No chains: no skew at all (--sync-skew's values are not kept either).
  planner::Cluster c = cl;
  EXPECT_TRUE(replay::applyChainSkew({}, c, codec).empty());
  EXPECT_FALSE(c.syncSkew.any());
  // A malformed chain is refused, naming it.
  for (const Chain& bad : {Chain{0, 4, 100}, Chain{1000, 0, 100},
                           Chain{1000, 4, std::numeric_limits<double>::quiet_NaN()},
                           Chain{1000, 4, -1}}) {
    planner::Cluster d = cl;
    try {
      replay::applyChainSkew({bad}, d, codec);
      ADD_FAILURE() << "a chain of " << bad.steps << " x " << bad.elements << " at "
                    << bad.stepUs << " us was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("skew chain:"), std::string::npos) << e.what();
    }
  }
}

// The chains through the servers give the skew before a push
// (Cluster::pushSkew) by the same arithmetic, and leave the collectives'
// (syncSkew) as it was: a compressed push and pull of 100 us each, the
// servers' decode (10 us a payload) and re-encode (the encode curve).
TEST(SkewChain, TheChainsThroughTheServersGiveTheSkewBeforeAPush) {
  planner::Cluster cl = fourHosts(64);
  planner::MeasuredCurve rt;
  rt.p = 4;
  rt.add(1, 100);
  cl.inter.curvesCompressed[plan::CommOp::kPush] = rt;
  cl.inter.curvesCompressed[plan::CommOp::kPull] = rt;
  cl.intra = cl.inter;
  cl.d2h = cl.h2d = planner::AlphaBeta{0, 1e9};
  const planner::ResolvedCodec codec = efsignsgd({{1000, 20}, {4000, 80}});
  const plan::TensorOption h = replay::chainOption("efsignsgd", /*servers=*/true);
  // Worker: encode, push 100, pull 100, decode 10; the servers' decode of
  // 4 payloads (one round on 64 cores) 10 and re-encode 20 or 80 between.
  ASSERT_NEAR(planner::compileOption(cl, codec, 1000, 4, h).pathUs, 20 + 100 + 10 + 20 + 100 + 10,
              1e-3);
  ASSERT_NEAR(planner::compileOption(cl, codec, 4000, 4, h).pathUs, 80 + 100 + 10 + 80 + 100 + 10,
              1e-3);
  cl.syncSkew.us = 7;  // the collectives': kept
  planner::Cluster a = cl;
  std::string breakdown;
  replay::Measured::ChainPoint traced{1000, 8, 560};
  traced.encodeUs = 25;
  traced.collectiveUs = 400;
  traced.decodeUs = 12;
  const auto pts =
      replay::applyChainSkew({traced, {4000, 4, 980}}, a, codec, &breakdown, /*servers=*/true);
  expectPoints(pts, {{20, 300}, {80, 600}});
  EXPECT_EQ(a.pushSkew.curve.points, pts);
  EXPECT_DOUBLE_EQ(a.syncSkew.us, 7);
  EXPECT_TRUE(a.syncSkew.curve.points.empty());
  EXPECT_EQ(breakdown,
            "8x1000: 560 (260): E 25 (20), x.push*+pull* 400 (200), D 12 (10), the rest 123");
  // The timeline prices a step through the servers as the chain measured
  // it, and a flat step as before (the collectives' 7 us).
  EXPECT_NEAR(planner::compileOption(a, codec, 4000, 4, h).pathUs, 980, 1e-3);
  const plan::TensorOption f = replay::chainOption("efsignsgd");
  EXPECT_NEAR(planner::compileOption(a, codec, 4000, 4, f).pathUs,
              planner::compileOption(cl, codec, 4000, 4, f).pathUs, 1e-9);
  // No chains through the servers: no skew before a push.
  planner::Cluster b = cl;
  EXPECT_TRUE(replay::applyChainSkew({}, b, codec, nullptr, true).empty());
  EXPECT_FALSE(b.pushSkew.any());
}

// MergeComp's alternatives are priced in the byte-balanced groupings its
// search times: the least of every tensor on its own and 1, 2, 4, ... groups
// up to the search's cap (a quarter of the tensors, at least 2), cut where
// the dtype changes. Eight tensors, the last two fp16 (cap 2), 64000 bytes:
// one group is [0, 5] and [6, 7] (the dtype's cut); two groups cut where the
// running sum reaches 32000, after tensor 3: [0, 3], [4, 5], [6, 7].
TEST(MergeCompPrice, TheLeastOverTheGroupingsTheSearchTimes) {
  planner::Cluster cl = fourHosts(2);
  cl.d2h = cl.h2d = planner::AlphaBeta{0, 1e9};
  planner::ResolvedCodec codec = efsignsgd({{1000, 20}, {100000, 400}});
  planner::ModelProfile prof;
  prof.model = "eight";
  const std::vector<std::pair<int64_t, int>> shapes = {{1000, 4}, {3000, 4}, {1000, 4}, {3000, 4},
                                                       {2000, 4}, {2000, 4}, {4000, 2}, {4000, 2}};
  for (size_t j = 0; j < shapes.size(); ++j) {
    planner::TensorProfile t;
    t.name = "t" + std::to_string(j);
    t.elements = shapes[j].first;
    t.dtypeBytes = shapes[j].second;
    t.backwardUs = 50;
    prof.tensors.push_back(t);
  }
  planner::Simulator sim(cl, codec, prof, planner::plannerOptions(cl, codec.spec));
  const auto price = replay::mergecompPrice(sim);
  const std::vector<std::pair<int, int>> one = {{0, 5}, {6, 7}}, two = {{0, 3}, {4, 5}, {6, 7}};
  int grouped = 0;  // options whose price is a grouping's, below layer-wise
  for (int o = 0; o < sim.optionCount(); ++o) {
    if (!sim.options()[size_t(o)].compressed()) continue;
    const std::vector<int> choice(prof.tensors.size(), o);
    const double layerWise = sim.simulate(choice);
    const double want =
        std::min({layerWise, sim.simulateGroups(choice, one), sim.simulateGroups(choice, two)});
    EXPECT_NEAR(price(choice), want, 1e-6) << sim.options()[size_t(o)].describe();
    grouped += want < layerWise - 1e-6;
  }
  EXPECT_GT(grouped, 0) << "no option is priced below layer-wise: the groups were not priced";
}

}  // namespace
}  // namespace cortado::launcher
