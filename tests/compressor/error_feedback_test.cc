#include "compressor/error_feedback.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "compressor/payload.h"
#include "core/common/thread_pool.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using testing::cpuRegistry;
using testing::randomTensor;

// fp32 rounded to bf16's 8 significant bits, to nearest even, as a float
// (finite inputs): the reference for the bf16 state, by bit arithmetic.
float roundBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}

bool isBf16(float x) { return roundBf16(x) == x; }

// decode(payload) + e_new == g + e_old, element by element, up to the one
// rounding of e_new = p - decode (exact for sparse codecs).
TEST(ErrorFeedback, IdentityHoldsForEveryCodecFamily) {
  for (auto spec : {"topk:ratio=0.05", "efsignsgd", "onebit", "signsgd", "qsgd:levels=3", "fp16",
                    "randomk:ratio=0.1", "terngrad", "natural"}) {
    // 100000: large enough for top-k's sampled selection, whose scan applies
    // the update (Codec::encodeUpdated).
    for (size_t n : {size_t{5000}, size_t{100000}}) {
      SCOPED_TRACE(fmt::format("{} n={}", spec, n));
      ErrorFeedback ef(cpuRegistry().create(spec));
      for (int step = 0; step < 4; ++step) {
        auto g = randomTensor(n, step);
        auto old = ef.residual(1);
        std::vector<float> before(old.begin(), old.end());
        if (before.empty()) before.assign(n, 0.0f);
        std::vector<std::byte> out(ef.payloadBytes(n));
        EncodeContext ctx;
        ctx.seed = step;
        size_t bytes = ef.encode(1, g.data(), n, out, ctx);
        ASSERT_EQ(bytes, out.size());
        std::vector<float> sent(n);
        ef.codec().decode(out, sent.data(), n);
        auto e = ef.residual(1);
        for (size_t i = 0; i < n; ++i) {
          float p = g[i] + before[i];
          ASSERT_NEAR(sent[i] + e[i], p, 2e-7f * (std::fabs(p) + std::fabs(sent[i]))) << i;
        }
      }
    }
  }
}

// Codec::encodeUpdated, for every CPU codec: either it declines (returns 0,
// state untouched), or the state and the payload are bit for bit those of
// the update's plain loops followed by encode(). Sizes below and above a
// top-k sample, one that ends inside a sum chunk, one split over a pool;
// momentum with the sparse codecs.
TEST(ErrorFeedback, EncodeUpdatedIsThePlainUpdateThenTheEncode) {
  ThreadPool pool(2);
  size_t fused = 0;
  for (auto spec : {"topk:ratio=0.01", "dgc:ratio=0.01", "randomk:ratio=0.1", "efsignsgd", "onebit",
                    "signsgd", "qsgd:levels=3", "terngrad", "fp16", "bf16", "natural"}) {
    auto codec = cpuRegistry().create(spec);
    for (size_t n : {size_t{1000}, size_t{2048 * 3 + 5}, size_t{100000}, size_t{1200007}}) {
      for (bool momentum : {false, true}) {
        if (momentum && !codec->sparse()) continue;
        SCOPED_TRACE(fmt::format("{} n={} momentum={}", spec, n, momentum));
        const float m = momentum ? 0.9f : 0.0f;
        const auto g = randomTensor(n, 1), e0 = randomTensor(n, 2, 3.0f);
        const auto u0 = momentum ? randomTensor(n, 3) : std::vector<float>{};
        std::vector<float> e = e0, u = u0;
        testing::referenceUpdate(e, u, g, m, momentum);
        EncodeContext ctx;
        ctx.seed = 5;
        ctx.pool = n > 1000000 ? &pool : nullptr;
        std::vector<std::byte> want(codec->payloadBytes(n)), got(want.size());
        ASSERT_EQ(codec->encode(e.data(), n, want, ctx), want.size());
        std::vector<float> ge = e0, gu = u0;
        size_t bytes = codec->encodeUpdated(
            {ge.data(), momentum ? gu.data() : nullptr, g.data(), m}, n, got, ctx);
        if (bytes == 0) {
          ASSERT_EQ(ge, e0);
          ASSERT_EQ(gu, u0);
          continue;
        }
        ++fused;
        ASSERT_EQ(bytes, want.size());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << "the payload";
        ASSERT_EQ(std::memcmp(ge.data(), e.data(), 4 * n), 0) << "the residual";
        if (momentum) ASSERT_EQ(std::memcmp(gu.data(), u.data(), 4 * n), 0) << "u";
      }
    }
  }
  EXPECT_GE(fused, 5u * 4u);  // top-k, DGC (both with and without momentum), the sign codecs
}

TEST(ErrorFeedback, TopKLeavesZeroResidualWhereSent) {
  ErrorFeedback ef(cpuRegistry().create("topk:ratio=0.01"));
  auto g = randomTensor(10000, 1);
  std::vector<std::byte> out(ef.payloadBytes(g.size()));
  ef.encode(7, g.data(), g.size(), out);
  auto e = ef.residual(7);
  size_t k = parseHeader(out).count;
  for (size_t i = 0; i < k; ++i) EXPECT_EQ(e[loadLe<uint32_t>(out.data() + kHeaderBytes + 4 * i)], 0.0f);
  EXPECT_EQ(std::count(e.begin(), e.end(), 0.0f), static_cast<long>(k));
  EXPECT_THROW(ef.encode(7, g.data(), g.size() - 1, out), Error);  // size changed
  ef.reset(7);
  EXPECT_TRUE(ef.residual(7).empty());
}

// DGC's error feedback against a replay with plain loops: u = m u + g;
// v += u; the k largest |v| sent (ties to the lower index), v and u zeroed
// there; at step `restartAt` (EncodeContext::restartMomentum, an input that
// carries folded residuals) u zeroed everywhere instead.
// With bf16 state, u and v are rounded to bf16 (nearest even) after each step.
void checkDgcAgainstReplay(size_t n, size_t k, int steps, int restartAt,
                           StateDType state = StateDType::kFloat32) {
  const float m = 0.9f;
  ErrorFeedback ef(cpuRegistry().create(fmt::format("dgc:ratio={},momentum=0.9", double(k) / double(n))),
                   -1.0f, state);
  EXPECT_EQ(ef.momentum(), m);
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    auto g = randomTensor(n, 100 + step);
    testing::referenceUpdate(v, u, g, m, true);
    // Reference selection: stable sort by |v|.
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](uint32_t a, uint32_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    std::vector<std::byte> out(ef.payloadBytes(n));
    EncodeContext ctx;
    ctx.restartMomentum = step == restartAt;
    ef.encode(3, g.data(), n, out, ctx);
    for (size_t i = 0; i < k; ++i) {
      ASSERT_EQ(loadLe<uint32_t>(out.data() + kHeaderBytes + 4 * i), idx[i]);
      ASSERT_EQ(loadLe<float>(out.data() + kHeaderBytes + 4 * k + 4 * i), v[idx[i]]);
    }
    for (uint32_t i : idx) u[i] = v[i] = 0.0f;
    if (step == restartAt) std::fill(u.begin(), u.end(), 0.0f);
    if (state == StateDType::kBFloat16) {
      for (size_t i = 0; i < n; ++i) u[i] = roundBf16(u[i]), v[i] = roundBf16(v[i]);
    }
    auto ev = ef.residual(3), eu = ef.velocity(3);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(ev[i], v[i]) << i;
      ASSERT_EQ(eu[i], u[i]) << i;
    }
    if (step == restartAt) {
      EXPECT_EQ(std::count(eu.begin(), eu.end(), 0.0f), static_cast<long>(n));
    }
  }
}

TEST(ErrorFeedback, DgcMomentumCorrectionMatchesReference) { checkDgcAgainstReplay(2000, 20, 6, -1); }

// Sampled (n > 4 x DGC's 1% sample): the update runs in the selection's scan.
TEST(ErrorFeedback, DgcMatchesReferenceWithTheUpdateInTheScan) {
  checkDgcAgainstReplay(100000, 1000, 4, 2);
}

// The same v as a plain step, and u zero everywhere after the restart, not
// only where the payload sent something; the next steps start from u = 0.
TEST(ErrorFeedback, RestartMomentumZeroesAllOfU) { checkDgcAgainstReplay(500, 5, 4, 1); }

TEST(ErrorFeedback, DgcWithBf16StateMatchesTheRoundedReference) {
  checkDgcAgainstReplay(2000, 20, 6, -1, StateDType::kBFloat16);
  checkDgcAgainstReplay(500, 5, 4, 1, StateDType::kBFloat16);
}

TEST(ErrorFeedback, RejectsMomentumOnDenseCodecs) {
  EXPECT_THROW(ErrorFeedback(cpuRegistry().create("fp16"), 0.9f), Error);
}

// Four workers (threads) push top-k 1% payloads with error feedback; a server
// decompress-adds every push into an fp32 sum and the workers pull that sum.
// With error feedback the pulled running sum differs from the true running
// sum by exactly the workers' residuals, which stay bounded while the true
// sum grows linearly (the gradients have a fixed mean): the relative error
// falls like 1/T. We check the identity to float accuracy and that the
// relative error at T = 1500 is under 5% and under a third of that at T = 300.
// With bf16 state the identity loses one rounding of each residual per
// step, so only the convergence is checked.
void checkFourWorkers(StateDType state) {
  const size_t n = 4000, workers = 4;
  const int iters = 1500;
  auto codec = cpuRegistry().create("topk:ratio=0.01");
  std::vector<std::unique_ptr<ErrorFeedback>> ef;
  for (size_t w = 0; w < workers; ++w)
    ef.push_back(std::make_unique<ErrorFeedback>(codec, -1.0f, state));
  auto mean = randomTensor(n, 99, 0.1f);
  std::vector<double> trueSum(n, 0.0), pulledSum(n, 0.0);
  std::vector<std::vector<std::byte>> pushes(workers, std::vector<std::byte>(codec->payloadBytes(n)));
  double relAt300 = 0;
  auto relErr = [&] {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
      num += std::pow(pulledSum[i] - trueSum[i], 2);
      den += std::pow(trueSum[i], 2);
    }
    return std::sqrt(num / den);
  };
  for (int t = 1; t <= iters; ++t) {
    std::vector<std::vector<float>> grads(workers);
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w) {
      grads[w] = randomTensor(n, t * 16 + w, 0.3f);
      for (size_t i = 0; i < n; ++i) grads[w][i] += mean[i];
      threads.emplace_back([&, w] { ef[w]->encode(0, grads[w].data(), n, pushes[w]); });
    }
    for (auto& th : threads) th.join();
    std::vector<float> serverSum(n, 0.0f);
    for (size_t w = 0; w < workers; ++w) codec->decompressAdd(pushes[w], serverSum.data(), n);
    for (size_t i = 0; i < n; ++i) {
      pulledSum[i] += serverSum[i];
      for (size_t w = 0; w < workers; ++w) trueSum[i] += grads[w][i];
    }
    if (t == 300) relAt300 = relErr();
  }
  // Identity: true - pulled == sum of residuals.
  if (state == StateDType::kFloat32) {
    std::vector<ErrorFeedback::Floats> res;
    for (size_t w = 0; w < workers; ++w) res.push_back(ef[w]->residual(0));
    for (size_t i = 0; i < n; ++i) {
      double sum = 0;
      for (size_t w = 0; w < workers; ++w) sum += res[w][i];
      ASSERT_NEAR(trueSum[i] - pulledSum[i], sum, 1e-3 * (1 + std::fabs(trueSum[i]))) << i;
    }
  }
  double rel = relErr();
  EXPECT_LT(rel, 0.05);
  EXPECT_LT(rel, relAt300 / 3);
  ::testing::Test::RecordProperty(fmt::format("relative_error_{}", toString(state)),
                                  std::to_string(rel));
}

TEST(ErrorFeedback, FourWorkersConvergeToTheTrueRunningSum) {
  checkFourWorkers(StateDType::kFloat32);
}

TEST(ErrorFeedback, FourWorkersConvergeWithBf16State) { checkFourWorkers(StateDType::kBFloat16); }

// bf16 state: every round is the fp32 algebra on the widened state, stored
// back rounded once: the same payload bytes as a plain replay with the codec
// on fp32 vectors, and the residual the replay's rounded to bf16 exactly;
// decode(payload) + e_new == g + e_old within e_new's rounding.
TEST(ErrorFeedback, Bf16StateIsTheFp32AlgebraRoundedOnce) {
  for (auto spec : {"topk:ratio=0.05", "efsignsgd", "onebit", "signsgd", "qsgd:levels=3", "fp16",
                    "randomk:ratio=0.1", "terngrad", "natural"}) {
    SCOPED_TRACE(spec);
    auto codec = cpuRegistry().create(spec);
    ErrorFeedback ef(codec, -1.0f, StateDType::kBFloat16);
    EXPECT_EQ(ef.stateDType(), StateDType::kBFloat16);
    const size_t n = 5000;
    std::vector<float> e(n, 0.0f);  // the replay's state, bf16 values
    for (int step = 0; step < 4; ++step) {
      auto g = randomTensor(n, step);
      EncodeContext ctx;
      ctx.seed = step;
      std::vector<float> p(n);
      for (size_t i = 0; i < n; ++i) p[i] = e[i] + g[i];
      const std::vector<float> pBefore = p;
      std::vector<std::byte> want(codec->payloadBytes(n)), got(ef.payloadBytes(n));
      ASSERT_EQ(codec->encode(p.data(), n, want, ctx), want.size());
      codec->decompressAdd(want, p.data(), n, -1.0f);
      ASSERT_EQ(ef.encode(1, g.data(), n, got, ctx), got.size());
      ASSERT_EQ(got, want) << "step " << step;
      std::vector<float> sent(n);
      codec->decode(want, sent.data(), n);
      auto r = ef.residual(1);
      ASSERT_EQ(r.size(), n);
      for (size_t i = 0; i < n; ++i) {
        e[i] = roundBf16(p[i]);
        ASSERT_EQ(r[i], e[i]) << "step " << step << ", element " << i;
        ASSERT_TRUE(isBf16(r[i]));
        ASSERT_NEAR(sent[i] + r[i], pBefore[i],
                    std::fabs(r[i]) / 256 + 2e-7f * (std::fabs(pBefore[i]) + std::fabs(sent[i])))
            << i;
      }
    }
  }
}

// Half the bytes of fp32 state; the fp32 scratch is the process's, one
// per encode at once, as large as the largest key.
TEST(ErrorFeedback, Bf16StateHoldsHalfTheBytes) {
  auto codec = cpuRegistry().create("dgc:ratio=0.01");
  ErrorFeedback f32(codec, -1.0f, StateDType::kFloat32), b16(codec, -1.0f, StateDType::kBFloat16);
  auto g = randomTensor(10000, 3);
  std::vector<std::byte> out(codec->payloadBytes(g.size()));
  for (uint64_t key = 0; key < 3; ++key) {
    f32.encode(key, g.data(), g.size(), out);
    b16.encode(key, g.data(), g.size(), out);
  }
  EXPECT_EQ(f32.heldBytes(), 3 * 2 * 10000 * sizeof(float));  // v and u per key
  EXPECT_EQ(b16.heldBytes(), f32.heldBytes() / 2);
  EXPECT_GE(ErrorFeedback::scratchBytes(), 2 * 10000 * sizeof(float));
  EXPECT_LT(ErrorFeedback::scratchBytes(), 3 * 2 * 10000 * sizeof(float));
  ErrorFeedback::releaseIdleScratch();
  EXPECT_EQ(ErrorFeedback::scratchBytes(), 0u);
  b16.encode(0, g.data(), g.size(), out);  // makes its own again
  EXPECT_GE(ErrorFeedback::scratchBytes(), 2 * 10000 * sizeof(float));
}

TEST(ErrorFeedback, StateDTypeNames) {
  EXPECT_EQ(stateDTypeFromString("fp32", "x"), StateDType::kFloat32);
  EXPECT_EQ(stateDTypeFromString("bfloat16", "x"), StateDType::kBFloat16);
  EXPECT_STREQ(toString(StateDType::kBFloat16), "bf16");
  try {
    stateDTypeFromString("fp8", "CORTADO_EF_DTYPE");
    FAIL() << "fp8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CORTADO_EF_DTYPE='fp8'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cortado::compressor
