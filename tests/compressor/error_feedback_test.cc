#include "compressor/error_feedback.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "compressor/payload.h"
#include "core/common/thread_pool.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using testing::cpuRegistry;
using testing::randomTensor;

// decode(payload) + e_new == g + e_old, element by element, up to the one
// rounding of e_new = p - decode (exact for sparse codecs).
TEST(ErrorFeedback, IdentityHoldsForEveryCodecFamily) {
  for (auto spec : {"topk:ratio=0.05", "efsignsgd", "onebit", "signsgd", "qsgd:levels=3", "fp16",
                    "randomk:ratio=0.1", "terngrad", "natural"}) {
    SCOPED_TRACE(spec);
    ErrorFeedback ef(cpuRegistry().create(spec));
    size_t n = 5000;
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
void checkDgcAgainstReplay(size_t n, size_t k, int steps, int restartAt) {
  const float m = 0.9f;
  ErrorFeedback ef(cpuRegistry().create(fmt::format("dgc:ratio={},momentum=0.9", double(k) / double(n))));
  EXPECT_EQ(ef.momentum(), m);
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    auto g = randomTensor(n, 100 + step);
    for (size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + g[i];
      v[i] += u[i];
    }
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

// The same v as a plain step, and u zero everywhere after the restart, not
// only where the payload sent something; the next steps start from u = 0.
TEST(ErrorFeedback, RestartMomentumZeroesAllOfU) { checkDgcAgainstReplay(500, 5, 4, 1); }

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
TEST(ErrorFeedback, FourWorkersConvergeToTheTrueRunningSum) {
  const size_t n = 4000, workers = 4;
  const int iters = 1500;
  auto codec = cpuRegistry().create("topk:ratio=0.01");
  std::vector<std::unique_ptr<ErrorFeedback>> ef;
  for (size_t w = 0; w < workers; ++w) ef.push_back(std::make_unique<ErrorFeedback>(codec));
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
  for (size_t i = 0; i < n; ++i) {
    double res = 0;
    for (size_t w = 0; w < workers; ++w) res += ef[w]->residual(0)[i];
    ASSERT_NEAR(trueSum[i] - pulledSum[i], res, 1e-3 * (1 + std::fabs(trueSum[i]))) << i;
  }
  double rel = relErr();
  EXPECT_LT(rel, 0.05);
  EXPECT_LT(rel, relAt300 / 3);
  RecordProperty("relative_error", std::to_string(rel));
}

}  // namespace
}  // namespace cortado::compressor
