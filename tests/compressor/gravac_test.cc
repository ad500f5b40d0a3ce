// GraVAC: the controller (gains, levels, scaling, saturation, parameter
// checks), multi-level compression against brute-force references, the
// error-feedback identity across ratio changes and dense fallbacks, and
// agreement of several workers that reduce their sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include <fmt/ranges.h>

#include "compressor/format.h"
#include "compressor/gravac.h"
#include "compressor/gravac_compressor.h"
#include "compressor/multi_level.h"
#include "compressor/payload.h"
#include "core/common/error.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using testing::cpuRegistry;
using testing::randomTensor;

// Brute force: the k largest |x| with ties to the lower index, ascending.
std::vector<uint32_t> bruteTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

struct Sparse {
  std::vector<uint32_t> idx;
  std::vector<float> val;
};
Sparse readSparse(const std::vector<std::byte>& p) {
  PayloadHeader h = parseHeader(p);
  Sparse s;
  s.idx.resize(h.count);
  s.val.resize(h.count);
  std::memcpy(s.idx.data(), p.data() + kHeaderBytes, 4 * h.count);
  std::memcpy(s.val.data(), p.data() + kHeaderBytes + 4 * h.count, 4 * h.count);
  return s;
}

std::vector<std::byte> encodeAt(const MultiLevelCodec& c, const std::vector<float>& x, double cf,
                                uint64_t seed = 0) {
  std::vector<std::byte> out(c.payloadBytes(x.size(), cf));
  EncodeContext ctx;
  ctx.seed = seed;
  out.resize(c.encode(x.data(), x.size(), cf, out, ctx));
  return out;
}

std::vector<std::byte> recompressAt(const MultiLevelCodec& c, const std::vector<std::byte>& first,
                                    size_t n, double cf) {
  std::vector<std::byte> out(c.payloadBytes(n, cf));
  out.resize(c.recompress(first, n, cf, out));
  return out;
}

double energyOf(const std::vector<float>& x) {
  double e = 0;
  for (float v : x) e += static_cast<double>(v) * v;
  return e;
}

// ---- parameters ------------------------------------------------------------

void expectRefused(GravacOptions o, const std::string& needle) {
  try {
    GravacController c(o, 4);
    FAIL() << "accepted options that should be refused (" << needle << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GravacOptions, DefaultsAreThePapers) {
  GravacOptions o;
  EXPECT_EQ(o.codec, "dgc");
  EXPECT_EQ(o.minRatio, 10.0);
  EXPECT_EQ(o.maxRatio, 1000.0);
  EXPECT_EQ(o.window, 500u);
  EXPECT_EQ(o.omega, 0.01);
  EXPECT_EQ(o.policy, GravacPolicy::kExponential);
  EXPECT_NO_THROW(o.validate());
  EXPECT_DOUBLE_EQ(o.smoothing(32), 0.32);  // alpha = N / 100
  EXPECT_DOUBLE_EQ(o.smoothing(1), 0.01);
}

TEST(GravacOptions, BadParametersAreRefusedWithTheirName) {
  GravacOptions o;
  o.minRatio = 100;
  o.maxRatio = 10;
  expectRefused(o, "out of order");
  o = {};
  o.maxRatio = o.minRatio;
  expectRefused(o, "out of order");
  o = {};
  o.epsilon = 0;
  expectRefused(o, "epsilon is 0");
  o.epsilon = 1.5;
  expectRefused(o, "epsilon is 1.5");
  o.epsilon = std::nan("");
  expectRefused(o, "epsilon");
  o = {};
  o.minRatio = 0.5;
  expectRefused(o, "min_ratio is 0.5");
  o = {};
  o.maxRatio = 1e7;
  expectRefused(o, "max_ratio");
  o = {};
  o.omega = 1.0;
  expectRefused(o, "omega");
  o = {};
  o.window = 0;
  expectRefused(o, "window");
  o = {};
  o.step = 1.0;
  expectRefused(o, "step");
  o = {};
  o.alpha = 2;
  expectRefused(o, "alpha");
  o = {};
  o.codec = "qsgd";
  expectRefused(o, "topk, dgc or randomk");
  EXPECT_THROW(parseGravacPolicy("linear"), Error);
  EXPECT_EQ(parseGravacPolicy("geometric"), GravacPolicy::kGeometric);
  EXPECT_THROW(GravacController(GravacOptions{}, 0), Error);
  GravacController c(GravacOptions{}, 2);
  EXPECT_THROW(c.step({1, -1, 0}, 0), Error);
  EXPECT_THROW(c.step({std::nan(""), 0, 0}, 0), Error);
}

// ---- gains -----------------------------------------------------------------

TEST(GravacGain, DenseStepHasGainOne) {
  // CF 1 keeps every element: the minimum level is the dense tensor.
  GravacOptions o;
  o.codec = "topk";
  o.minRatio = 1;
  o.maxRatio = 10;
  o.alpha = 1;
  GravacCompressor g(cpuRegistry(), o, 1);
  auto x = randomTensor(5000, 1);
  g.prepare(7, x.data(), x.size());
  GravacSums s = g.localSums();
  EXPECT_EQ(s.minimum, s.compensated);
  EXPECT_DOUBLE_EQ(s.compensated, energyOf(x));
  GravacStep step = g.decide(s, 0);
  EXPECT_EQ(step.gainMin, 1.0);
  EXPECT_LT(step.gainCandidate, 1.0);
  // A zero gradient loses nothing at any ratio.
  GravacController c(o, 1);
  GravacStep z = c.step({0, 0, 0}, 0);
  EXPECT_EQ(z.gainMin, 1.0);
  EXPECT_EQ(z.gainCandidate, 1.0);
  EXPECT_EQ(z.level, GravacLevel::kCandidate);
}

TEST(GravacGain, DoesNotGrowWithTheRatio) {
  auto x = randomTensor(20000, 2);
  double total = energyOf(x);
  const double cfs[] = {1, 1.5, 2, 5, 10, 20, 64, 100, 1000, 20000};
  for (const char* name : {"topk", "dgc"}) {
    MultiLevelCodec c(cpuRegistry(), name);
    double last = 1.0;
    for (double cf : cfs) {
      double gain = MultiLevelCodec::energy(encodeAt(c, x, cf)) / total;
      EXPECT_LE(gain, last) << name << " at CF " << cf;
      EXPECT_GT(gain, 0.0);
      last = gain;
    }
    EXPECT_DOUBLE_EQ(MultiLevelCodec::energy(encodeAt(c, x, 1)), total);
  }
  // Every codec: the second level keeps at most what the first kept, and less
  // the further it compresses.
  for (const char* name : {"topk", "dgc", "randomk"}) {
    MultiLevelCodec c(cpuRegistry(), name, 3);
    auto first = encodeAt(c, x, 10, 99);
    double last = MultiLevelCodec::energy(first);
    for (double cf : {10.0, 20.0, 40.0, 160.0, 1000.0}) {
      double e = MultiLevelCodec::energy(recompressAt(c, first, x.size(), cf));
      EXPECT_LE(e, last) << name << " at CF " << cf;
      last = e;
    }
  }
}

// ---- multi-level compression ---------------------------------------------

TEST(GravacMultiLevel, TopKOfTopKIsDirectTopKAtTheProduct) {
  struct Case {
    size_t n;
    double minCf, step;
    bool ties;
  };
  const Case cases[] = {{1000, 10, 2, false},   {1000, 10, 16, false}, {997, 7, 3, true},
                        {200003, 10, 4, false}, {200003, 8, 25, true}, {50, 1, 50, false},
                        {100000, 1.5, 1, true}};
  for (const char* name : {"topk", "dgc"}) {
    MultiLevelCodec c(cpuRegistry(), name);
    for (const auto& t : cases) {
      auto x = randomTensor(t.n, t.n + 17);
      if (t.ties)
        for (auto& v : x) v = std::round(v * 4) / 4;  // few magnitudes: many ties
      double cf = t.minCf * t.step;
      auto first = encodeAt(c, x, t.minCf);
      auto second = recompressAt(c, first, t.n, cf);
      auto direct = encodeAt(c, x, cf);
      SCOPED_TRACE(fmt::format("{} n={} {}x then {}x", name, t.n, t.minCf, t.step));
      EXPECT_EQ(second, direct);  // byte for byte, header included
      size_t k = MultiLevelCodec::keptAt(t.n, cf);
      Sparse s = readSparse(second);
      auto ref = bruteTopK(x, k);
      EXPECT_EQ(s.idx, ref);
      for (size_t i = 0; i < s.idx.size(); ++i) EXPECT_EQ(s.val[i], x[s.idx[i]]);
      // And the registry's codec decodes it.
      std::vector<float> out(t.n, 0.0f);
      c.at(cf)->decode(second, out.data(), t.n);
      for (size_t i = 0; i < k; ++i) EXPECT_EQ(out[ref[i]], x[ref[i]]);
    }
  }
}

TEST(GravacMultiLevel, RandomKSecondLevelIsASubsetAndSummable) {
  MultiLevelCodec c(cpuRegistry(), "randomk", 5);
  const size_t n = 30011;
  auto a = randomTensor(n, 11), b = randomTensor(n, 12);
  const uint64_t round = 42;
  auto fa = encodeAt(c, a, 10, round), fb = encodeAt(c, b, 10, round);
  auto sa = recompressAt(c, fa, n, 80), sb = recompressAt(c, fb, n, 80);
  EXPECT_EQ(sa.size(), c.payloadBytes(n, 80));
  PayloadHeader ha = parseHeader(sa), hb = parseHeader(sb);
  EXPECT_EQ(ha, hb);  // same seed, numel and k on both "workers"
  EXPECT_EQ(ha.count, MultiLevelCodec::keptAt(n, 80));

  // The second level's elements are among the first level's, with their values.
  std::vector<float> first(n, 0.0f), second(n, 0.0f);
  c.decompressAdd(fa, n, first.data());
  c.decompressAdd(sa, n, second.data());
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    if (second[i] != 0.0f) {
      ++nonzero;
      EXPECT_EQ(second[i], first[i]) << i;
      EXPECT_EQ(second[i], a[i]) << i;
    }
  }
  EXPECT_EQ(nonzero, ha.count);

  // Summable: adding the payloads (or their value bodies) is adding the tensors.
  auto sum = sa;
  c.at(1)->addPayload(sum, sb);
  std::vector<float> viaSum(n, 0.0f), reference(n, 0.0f);
  c.decompressAdd(sum, n, viaSum.data());
  c.decompressAdd(sa, n, reference.data());
  c.decompressAdd(sb, n, reference.data());
  EXPECT_EQ(viaSum, reference);
  // The first level is summable the same way.
  auto fsum = fa;
  c.at(10)->addPayload(fsum, fb);
  std::vector<float> f1(n, 0.0f), f2(n, 0.0f);
  c.decompressAdd(fsum, n, f1.data());
  c.decompressAdd(fa, n, f2.data());
  c.decompressAdd(fb, n, f2.data());
  EXPECT_EQ(f1, f2);
}

TEST(GravacMultiLevel, RefusesABadSecondLevel) {
  MultiLevelCodec c(cpuRegistry(), "topk");
  auto x = randomTensor(1000, 3);
  auto first = encodeAt(c, x, 10);
  std::vector<std::byte> out(c.payloadBytes(1000, 5));
  EXPECT_THROW(c.recompress(first, 1000, 5, out), Error);  // keeps more than the first level
  EXPECT_THROW(c.recompress(first, 999, 20, out), Error);  // wrong n
  std::vector<std::byte> small(10);
  EXPECT_THROW(c.recompress(first, 1000, 20, small), Error);
  EXPECT_THROW(MultiLevelCodec(cpuRegistry(), "qsgd"), Error);
  EXPECT_THROW(c.at(0.5), Error);
  auto bad = first;
  bad[kHeaderBytes] = std::byte{0xff};  // index out of range
  bad[kHeaderBytes + 1] = std::byte{0xff};
  std::vector<float> sum(1000);
  EXPECT_THROW(c.decompressAdd(bad, 1000, sum.data()), Error);
}

// ---- the controller --------------------------------------------------------

std::vector<double> candidates(GravacOptions o, GravacSums sums, int steps) {
  GravacController c(o, 4);
  std::vector<double> seen{c.candidateRatio()};
  for (int i = 0; i < steps; ++i) {
    GravacStep s = c.step(sums, 0);
    if (s.nextCandidateRatio != seen.back()) seen.push_back(s.nextCandidateRatio);
  }
  return seen;
}

TEST(GravacController, ScalingPolicies) {
  GravacOptions o;
  o.window = 3;
  o.alpha = 1;
  // Gains 4% apart: the minimum stays; the candidate climbs by the policy.
  GravacSums apart{1.0, 0.99, 0.95};
  EXPECT_EQ(candidates(o, apart, 30), (std::vector<double>{20, 40, 160, 1000}));
  o.policy = GravacPolicy::kGeometric;
  o.maxRatio = 2000;
  EXPECT_EQ(candidates(o, apart, 60), (std::vector<double>{20, 40, 80, 160, 320, 640, 1280, 2000}));
  // Gains within omega: the candidate becomes the minimum at each window.
  o = {};
  o.window = 3;
  o.alpha = 1;
  GravacController c(o, 4);
  std::vector<std::pair<double, double>> seen;
  for (int i = 0; i < 12; ++i) {
    GravacStep s = c.step({1.0, 0.999, 0.995}, 0);
    EXPECT_EQ(s.level, GravacLevel::kCandidate);
    if (s.iteration % 3 == 0) seen.emplace_back(s.nextMinRatio, s.nextCandidateRatio);
  }
  // 10 x 2 -> min 20, step 4 -> min 80, step 16 capped at 1000 / 80 -> min 1000.
  EXPECT_EQ(seen, (std::vector<std::pair<double, double>>{
                      {20, 80}, {80, 1000}, {1000, 1000}, {1000, 1000}}));
}

// The paper's timing (Algorithm 1, specs/gravac.md section 2): the
// candidate goes out from the first iteration whose smoothed gain passes
// epsilon, with no window to wait for; the exploration moves up only at
// multiples of the window; and the EWMA starts at the first sample (not at
// 0, which would send dense until it climbed past epsilon).
TEST(GravacController, MovesUpOnlyAtWindowBoundariesAndSendsTheCandidateAtOnce) {
  GravacOptions o;  // the paper's: window 500, exponential, [10x, 1000x]
  o.epsilon = 0.7;
  GravacController c(o, 4);
  EXPECT_DOUBLE_EQ(c.alpha(), 0.04);  // 4 workers / 100
  const GravacSums apart{1.0, 0.9, 0.8};  // gains 11% apart: the minimum stays
  std::vector<std::pair<uint64_t, double>> moves;  // (iteration, next candidate)
  double candidate = c.candidateRatio();
  double seconds = 0;  // a step at twice the CF takes half as long: no saturation
  for (int i = 0; i < 1500; ++i) {
    GravacStep s = c.step(apart, seconds);
    seconds = 2.0 / s.ratio;
    if (s.iteration == 1) {
      EXPECT_EQ(s.level, GravacLevel::kCandidate);
      EXPECT_EQ(s.ratio, 20);
      EXPECT_DOUBLE_EQ(s.gainCandidate, 0.8);  // the first sample, unsmoothed
    }
    EXPECT_EQ(s.ratio, s.candidateRatio) << s.iteration;
    if (s.nextCandidateRatio != candidate) moves.emplace_back(s.iteration, s.nextCandidateRatio);
    candidate = s.nextCandidateRatio;
  }
  EXPECT_EQ(moves, (std::vector<std::pair<uint64_t, double>>{{500, 40}, {1000, 160}, {1500, 1000}}));
  // A candidate below epsilon early on: the minimum goes out, and the
  // candidate takes over at the iteration its smoothed gain reaches epsilon,
  // between windows: EWMA 0.6 -> 0.04 * 0.9 + 0.96 * g climbs past 0.7 at
  // iteration 1 + ceil(log(0.2 / 0.3) / log(0.96)) = 11.
  GravacController e(o, 4);
  e.step({1.0, 0.9, 0.6}, 0);
  uint64_t first = 0;
  for (int i = 0; i < 50 && !first; ++i) {
    GravacStep s = e.step({1.0, 0.9, 0.9}, 0.1);
    if (s.level == GravacLevel::kCandidate) first = s.iteration;
    else EXPECT_EQ(s.level, GravacLevel::kMinimum);
  }
  EXPECT_EQ(first, 1 + uint64_t(std::ceil(std::log(0.2 / 0.3) / std::log(0.96))));
}

TEST(GravacController, FallsBackPerIteration) {
  GravacOptions o;
  o.alpha = 1;
  o.epsilon = 0.9;
  GravacController c(o, 4);
  EXPECT_EQ(c.step({1, 0.95, 0.92}, 0).level, GravacLevel::kCandidate);
  GravacStep m = c.step({1, 0.95, 0.5}, 0);
  EXPECT_EQ(m.level, GravacLevel::kMinimum);
  EXPECT_EQ(m.ratio, 10);
  GravacStep d = c.step({1, 0.5, 0.1}, 0);
  EXPECT_EQ(d.level, GravacLevel::kDense);
  EXPECT_EQ(d.ratio, 1);
  // Smoothing: with alpha 0.5 one bad sample does not drop a good history.
  o.alpha = 0.5;
  GravacController s(o, 4);
  s.step({1, 1, 1}, 0);
  GravacStep k = s.step({1, 0.9, 0.85}, 0);
  EXPECT_DOUBLE_EQ(k.gainCandidate, 0.925);
  EXPECT_EQ(k.level, GravacLevel::kCandidate);
}

TEST(GravacController, SaturationSettlesOnTheLowerRatio) {
  GravacOptions o;
  o.window = 2;
  o.alpha = 1;
  GravacSums apart{1.0, 0.99, 0.95};
  // Equal iteration times: 20x and 40x give the same throughput.
  GravacController c(o, 4, 128);
  for (int i = 0; i < 4; ++i) c.step(apart, 0.5);
  EXPECT_TRUE(c.saturated());
  EXPECT_EQ(c.candidateRatio(), 20);
  auto tc = c.throughputs();
  ASSERT_EQ(tc.size(), 2u);
  EXPECT_DOUBLE_EQ(tc[20], 128 / 0.5 * 0.95);
  for (int i = 0; i < 10; ++i) c.step(apart, 0.5);
  EXPECT_EQ(c.candidateRatio(), 20);  // the search has stopped
  // 40x twice as fast: no saturation, the search goes on.
  GravacController f(o, 4, 128);
  const double secs[] = {0, 1.0, 1.0, 0.5, 0.5};
  for (double t : secs) f.step(apart, t);
  EXPECT_FALSE(f.saturated());
  EXPECT_EQ(f.candidateRatio(), 160);
}

// ---- error feedback ---------------------------------------------------------

// Feeds chosen "agreed" sums to force candidate, minimum and dense levels while
// the ratios change every iteration, and checks
//   decode(sent) + residual_new == grad + residual_old   (momentum 0)
//   decode(sent) + v_new == v_old + u_new, u_new = m u_old + grad, u = 0 where sent.
void errorFeedbackIdentity(const char* codec) {
  GravacOptions o;
  o.codec = codec;
  o.window = 1;
  o.alpha = 1;
  o.minRatio = 4;
  o.maxRatio = 5000;
  GravacCompressor g(cpuRegistry(), o, 1);
  const float m = g.momentum();
  const size_t n = 4099;
  const uint64_t key = 3;
  const GravacSums forced[] = {{1, 1, 1},     {1, 1, 0.5}, {1, 0.1, 0.1}, {1, 0.99, 0.95},
                               {1, 0.1, 0.1}, {1, 1, 0.5}, {1, 1, 1},     {1, 0.995, 0.99}};
  const GravacLevel expected[] = {GravacLevel::kCandidate, GravacLevel::kMinimum,
                                  GravacLevel::kDense,     GravacLevel::kCandidate,
                                  GravacLevel::kDense,     GravacLevel::kMinimum,
                                  GravacLevel::kCandidate, GravacLevel::kCandidate};
  std::vector<float> residual(n, 0.0f), velocity(n, 0.0f);
  std::set<double> ratios;
  for (size_t it = 0; it < std::size(forced); ++it) {
    auto grad = randomTensor(n, 100 + it);
    std::vector<float> v(n), u(n);
    for (size_t i = 0; i < n; ++i) {
      u[i] = m > 0 ? m * velocity[i] + grad[i] : 0.0f;
      v[i] = residual[i] + (m > 0 ? u[i] : grad[i]);
    }
    EncodeContext ctx;
    ctx.seed = it;
    g.prepare(key, grad.data(), n, ctx);
    GravacStep s = g.decide(forced[it], 0);
    SCOPED_TRACE(fmt::format("{} iteration {} ({} at {}x)", codec, it + 1, gravacLevelName(s.level),
                             s.ratio));
    ASSERT_EQ(s.level, expected[it]);
    ratios.insert(s.ratio);
    std::vector<float> sent(n, 0.0f);
    g.decompressAdd(key, g.message(key), sent.data());
    auto r = g.residual(key);
    size_t sentCount = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(sent[i] + r[i], v[i]) << i;
      if (s.level == GravacLevel::kDense) {
        ASSERT_EQ(r[i], 0.0f) << i;
      }
      if (sent[i] != 0.0f) ++sentCount;
    }
    if (s.level != GravacLevel::kDense) {
      EXPECT_LE(sentCount, MultiLevelCodec::keptAt(n, s.ratio));
    }
    if (m > 0) {
      auto vel = g.velocity(key);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(vel[i], sent[i] != 0.0f || s.level == GravacLevel::kDense ? 0.0f : u[i]) << i;
      }
      velocity.assign(vel.begin(), vel.end());
    }
    residual.assign(r.begin(), r.end());
  }
  EXPECT_GE(ratios.size(), 3u);  // dense, and minimum and candidate at changing CFs
}

TEST(GravacErrorFeedback, IdentityAcrossRatioChangesAndDenseTopK) { errorFeedbackIdentity("topk"); }
TEST(GravacErrorFeedback, IdentityAcrossRatioChangesAndDenseDgc) { errorFeedbackIdentity("dgc"); }
TEST(GravacErrorFeedback, IdentityAcrossRatioChangesAndDenseRandomK) {
  errorFeedbackIdentity("randomk");
}

TEST(GravacErrorFeedback, MisuseIsRefused) {
  GravacOptions o;
  o.codec = "topk";
  GravacCompressor g(cpuRegistry(), o, 1);
  auto x = randomTensor(100, 1);
  EXPECT_THROW(g.message(1), Error);  // never prepared
  g.prepare(1, x.data(), 100);
  EXPECT_THROW(g.prepare(1, x.data(), 100), Error);  // twice in one iteration
  EXPECT_THROW(g.message(1), Error);                 // not decided yet
  g.decide(g.localSums(), 0);
  EXPECT_NO_THROW(g.message(1));
  EXPECT_THROW(g.prepare(1, x.data(), 99), Error);  // n changed
}

// ---- agreement --------------------------------------------------------------

// Three workers with different gradients reduce their sums (and their
// iteration times, averaged) and take the same decisions; the average of
// what they send is the average of their decoded messages.
TEST(GravacAgreement, WorkersWithDifferentGradientsTakeOneRatioSequence) {
  for (const char* codec : {"topk", "dgc", "randomk"}) {
    GravacOptions o;
    o.codec = codec;
    o.window = 4;
    // Random-k keeps about 1 / CF of the energy: a lower minimum and epsilon.
    const bool random = std::string(codec) == "randomk";
    o.epsilon = random ? 0.45 : 0.5;
    o.minRatio = random ? 2 : 5;
    const int workers = 3;
    std::vector<std::unique_ptr<GravacCompressor>> w;
    for (int r = 0; r < workers; ++r)
      w.push_back(std::make_unique<GravacCompressor>(cpuRegistry(), o, workers));
    const size_t sizes[] = {3000, 17, 1200};
    std::set<double> ratios;
    for (int it = 0; it < 40; ++it) {
      GravacSums total;
      double seconds = 0;
      for (int r = 0; r < workers; ++r) {
        for (size_t t = 0; t < std::size(sizes); ++t) {
          // Worker r's gradients differ in scale and values; for the first
          // 20 iterations 1% of the elements carry most of the energy, so
          // high ratios keep it, and then none does.
          auto g = randomTensor(sizes[t], 1000 * it + 10 * r + t, 1.0f + r);
          if (it < 20)
            for (size_t i = (it + r) % 100; i < g.size(); i += 100) g[i] *= 40;
          EncodeContext ctx;
          ctx.seed = static_cast<uint64_t>(it);
          w[r]->prepare(t, g.data(), g.size(), ctx);
        }
        GravacSums s = w[r]->localSums();
        total.compensated += s.compensated;
        total.minimum += s.minimum;
        total.candidate += s.candidate;
        seconds += 0.01 * (1 + r);  // each worker measured its own time
      }
      std::vector<GravacStep> steps;
      for (int r = 0; r < workers; ++r)
        steps.push_back(w[r]->decide(total, it ? seconds / workers : 0));
      for (int r = 1; r < workers; ++r) {
        EXPECT_EQ(steps[r].level, steps[0].level);
        EXPECT_EQ(steps[r].ratio, steps[0].ratio);
        EXPECT_EQ(steps[r].nextCandidateRatio, steps[0].nextCandidateRatio);
      }
      ratios.insert(steps[0].ratio);
      for (size_t t = 0; t < std::size(sizes); ++t) {
        // Every worker's message has the same size; summable ones add up.
        std::vector<float> avg(sizes[t], 0.0f), reference(sizes[t], 0.0f);
        for (int r = 0; r < workers; ++r) {
          auto msg = w[r]->message(t);
          EXPECT_EQ(msg.size(), w[0]->message(t).size());
          std::vector<float> one(sizes[t], 0.0f);
          w[r]->decompressAdd(t, msg, one.data());
          for (size_t i = 0; i < sizes[t]; ++i) reference[i] += one[i] / workers;
          w[0]->decompressAdd(t, msg, avg.data(), 1.0f / workers);
        }
        // The same terms, rounded in another order: a few ulps apart.
        for (size_t i = 0; i < sizes[t]; ++i)
          ASSERT_NEAR(avg[i], reference[i], 1e-5f * (1.0f + std::fabs(reference[i])));
      }
    }
    EXPECT_GE(ratios.size(), 2u) << codec << " " << fmt::format("{}", fmt::join(ratios, ","));
  }
}

}  // namespace
}  // namespace cortado::compressor
