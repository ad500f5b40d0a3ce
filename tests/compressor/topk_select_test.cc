// selectTopK (compressor/cpu/topk_select.h) against a brute-force reference:
// a full sort of every index by (magnitude bits descending, index ascending),
// cut at k and put back in index order. The inputs are the ones that break
// sampled selections: ties everywhere, all zeros of both signs, a handful of
// non-zeros, denormals, NaN and infinities, k = 1 and k = n - 1, and tensors
// whose sampled places hold the largest (or the smallest) values, so that the
// sample's threshold overshoots (too few candidates: the scan is repeated)
// or undershoots (more than k elements pass the sure bar).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "compressor/cpu/topk_select.h"
#include "compressor/format.h"
#include "core/common/thread_pool.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

uint32_t bitsOf(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// Every index, best first: magnitude bits descending, then index ascending.
std::vector<uint32_t> fullOrder(const std::vector<float>& x) {
  std::vector<uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    uint32_t ka = bitsOf(x[a]) & 0x7fffffffu, kb = bitsOf(x[b]) & 0x7fffffffu;
    return ka != kb ? ka > kb : a < b;
  });
  return idx;
}

// The places the selection samples (whole 16-float lines at hashed places,
// as topk_select.cc does), to aim values at the sample.
std::vector<bool> sampledPlaces(size_t n, size_t sampleCount) {
  std::vector<bool> s(n, false);
  size_t runs = std::max<size_t>(1, sampleCount / 16), lines = n / 16;
  for (size_t r = 0; r < runs; ++r) {
    size_t start = (format::hash2(0x5eed70b, r) % lines) * 16;
    for (size_t j = 0; j < 16; ++j) s[start + j] = true;
  }
  return s;
}

enum Kind {
  kNormal,
  kFewDistinct,  // integers -3..3: ties at every magnitude
  kAllZeros,     // +0 and -0 only
  kAllEqual,     // one magnitude, both signs
  kFewNonZeros,  // five non-zeros among zeros of both signs
  kDenormals,    // denormals, zeros and a few normal values
  kSpecials,     // NaN, +-inf, max float among normal values
  kIncreasing,   // magnitudes grow with the index
  kSampleHigh,   // the sampled lines hold the largest values: overshoot
  kSampleLow,    // the sampled lines hold the smallest values: undershoot
  kNumKinds
};

std::vector<float> makeInput(Kind kind, size_t n, size_t sampleCount) {
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + kind));
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  switch (kind) {
    case kNormal:
      for (auto& v : x) v = normal(rng);
      break;
    case kFewDistinct:
      for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
      break;
    case kAllZeros:
      for (auto& v : x) v = rng() % 2 ? -0.0f : 0.0f;
      break;
    case kAllEqual:
      for (auto& v : x) v = rng() % 2 ? -0.25f : 0.25f;
      break;
    case kFewNonZeros:
      for (auto& v : x) v = rng() % 3 ? 0.0f : -0.0f;
      for (int j = 0; j < 5; ++j) x[rng() % n] = normal(rng);
      break;
    case kDenormals: {
      const float tiny = std::numeric_limits<float>::denorm_min();
      for (auto& v : x) {
        uint32_t r = rng() % 10;
        v = r < 3   ? 0.0f
            : r < 5 ? -0.0f
                    : (r % 2 ? -1.0f : 1.0f) * tiny * static_cast<float>(rng() % 50);
      }
      for (size_t j = 0; j < n / 100; ++j) x[rng() % n] = normal(rng);
      break;
    }
    case kSpecials:
      for (auto& v : x) v = normal(rng);
      for (size_t j = 0; j < std::max<size_t>(n / 50, 3); ++j) {
        uint32_t r = rng() % 4;
        x[rng() % n] = r == 0   ? std::numeric_limits<float>::quiet_NaN()
                       : r == 1 ? std::numeric_limits<float>::infinity()
                       : r == 2 ? -std::numeric_limits<float>::infinity()
                                : -std::numeric_limits<float>::max();
      }
      break;
    case kIncreasing:
      for (size_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i);
      break;
    case kSampleHigh:
    case kSampleLow: {
      auto s = n >= 16 ? sampledPlaces(n, sampleCount) : std::vector<bool>(n, false);
      for (size_t i = 0; i < n; ++i) {
        float v = normal(rng);
        x[i] = s[i] == (kind == kSampleHigh) ? 100.0f + v : 0.01f * v;
      }
      break;
    }
    default: break;
  }
  return x;
}

void expectSelectionOnce(const std::vector<float>& x, const std::vector<uint32_t>& order, size_t k,
                         size_t sampleCount, ThreadPool* pool) {
  const size_t n = x.size();
  std::vector<uint32_t> want(order.begin(), order.begin() + k);
  std::sort(want.begin(), want.end());

  std::vector<uint32_t> got(k + 1, 0xdeadbeefu);
  cpu::selectTopK(x.data(), n, k, sampleCount, pool, got.data());
  ASSERT_EQ(got[k], 0xdeadbeefu) << "wrote past k";
  got.resize(k);
  ASSERT_EQ(got, want);

  // The byte form: input and outputs at unaligned addresses, values copied
  // bit for bit (NaN payloads and the sign of zero included).
  std::vector<std::byte> in(4 * n + 2), idx(4 * k + 3), val(4 * k + 5);
  if (n) std::memcpy(in.data() + 2, x.data(), 4 * n);
  cpu::selectTopK(in.data() + 2, n, k, sampleCount, pool, idx.data() + 3, val.data() + 1);
  for (size_t i = 0; i < k; ++i) {
    uint32_t j, v;
    std::memcpy(&j, idx.data() + 3 + 4 * i, 4);
    std::memcpy(&v, val.data() + 1 + 4 * i, 4);
    ASSERT_EQ(j, want[i]) << "position " << i;
    ASSERT_EQ(v, bitsOf(x[j])) << "position " << i;
  }
}

// Each vector code the CPU has (portable, AVX2) against the reference.
void expectSelection(const std::vector<float>& x, const std::vector<uint32_t>& order, size_t k,
                     size_t sampleCount, ThreadPool* pool) {
  struct Restore {
    cpu::SelectIsa isa;
    ~Restore() { cpu::setSelectTopKIsa(isa); }
  } restore{cpu::selectTopKIsa()};
  for (auto isa : {cpu::SelectIsa::kScalar, cpu::SelectIsa::kAvx2}) {
    if (cpu::setSelectTopKIsa(isa) != isa) continue;  // not on this CPU
    SCOPED_TRACE(::testing::Message() << "isa=" << static_cast<int>(isa));
    expectSelectionOnce(x, order, k, sampleCount, pool);
    if (::testing::Test::HasFatalFailure()) break;
  }
}

TEST(SelectTopK, MatchesAFullSortOnAdversarialInputs) {
  ThreadPool pool(2);
  for (size_t n : {1, 2, 17, 1000, 70000, 300000}) {
    for (size_t sampleCount : {1024, 65536}) {
      for (int kind = 0; kind < kNumKinds; ++kind) {
        auto x = makeInput(static_cast<Kind>(kind), n, sampleCount);
        auto order = fullOrder(x);
        std::vector<size_t> ks = {0, 1, 2, n / 1000, n / 100, n / 10, n / 2, n - 1, n};
        for (size_t k : ks) {
          if (k > n) continue;
          SCOPED_TRACE(::testing::Message()
                       << "n=" << n << " sample=" << sampleCount << " kind=" << kind << " k=" << k);
          expectSelection(x, order, k, sampleCount, nullptr);
          if (n >= 70000) expectSelection(x, order, k, sampleCount, &pool);
        }
      }
    }
  }
}

// Large enough for the parallel scan (n >= 2^19) to split the tensor.
TEST(SelectTopK, ParallelScanMatchesAFullSort) {
  ThreadPool pool(2);
  const size_t n = (1 << 20) + 13;
  for (int kind : {kNormal, kFewDistinct, kFewNonZeros, kSampleHigh, kSampleLow}) {
    auto x = makeInput(static_cast<Kind>(kind), n, 65536);
    auto order = fullOrder(x);
    for (size_t k : {size_t{1}, n / 100, n / 10, n - 1}) {
      SCOPED_TRACE(::testing::Message() << "kind=" << kind << " k=" << k);
      expectSelection(x, order, k, 65536, &pool);
      expectSelection(x, order, k, 10000, nullptr);
    }
  }
}

// selectTopKUpdating: error feedback's update applied by the selection's
// first scan. The state after it is the update's plain loops (reference
// below), bit for bit, and the selection is that of the updated residual, on
// every input kind as the residual with a zero gradient (the kinds keep
// their shape: overshooting and undershooting samples, ties, zeros), and
// with normal gradients with and without momentum; both vector codes, the
// scan alone and split over a pool, tensors too small for a sample.
TEST(SelectTopK, UpdatingScanEqualsThePlainUpdateThenAFullSort) {
  struct Restore {
    cpu::SelectIsa isa;
    ~Restore() { cpu::setSelectTopKIsa(isa); }
  } restore{cpu::selectTopKIsa()};
  ThreadPool pool(2);
  const float m = 0.9f;
  for (size_t n : {size_t{1000}, size_t{70000}, (size_t{1} << 20) + 13}) {
    for (int kind = 0; kind < kNumKinds; ++kind) {
      for (int variant = 0; variant < 3; ++variant) {  // g = 0; g; g and momentum
        SCOPED_TRACE(::testing::Message()
                     << "n=" << n << " kind=" << kind << " variant=" << variant);
        const bool momentum = variant == 2;
        const auto e0 = makeInput(static_cast<Kind>(kind), n, 65536);
        std::mt19937 rng(static_cast<uint32_t>(n + kind));
        std::normal_distribution<float> normal;
        std::vector<float> g(n, 0.0f), u0(momentum ? n : 0);
        if (variant > 0)
          for (auto& v : g) v = normal(rng);
        for (auto& v : u0) v = normal(rng);
        std::vector<float> e = e0, u = u0;
        testing::referenceUpdate(e, u, g, m, momentum);
        const auto order = fullOrder(e);
        for (size_t k : {size_t{1}, n / 100, n - 1}) {
          std::vector<uint32_t> want(order.begin(), order.begin() + k);
          std::sort(want.begin(), want.end());
          for (auto isa : {cpu::SelectIsa::kScalar, cpu::SelectIsa::kAvx2}) {
            if (cpu::setSelectTopKIsa(isa) != isa) continue;  // not on this CPU
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
              SCOPED_TRACE(::testing::Message() << "k=" << k << " isa=" << static_cast<int>(isa)
                                                << " pool=" << (p != nullptr));
              std::vector<float> ge = e0, gu = u0;
              FeedbackUpdate up{ge.data(), momentum ? gu.data() : nullptr, g.data(), m};
              std::vector<std::byte> idx(4 * k), val(4 * k);
              cpu::selectTopKUpdating(up, n, k, 65536, p, idx.data(), val.data());
              ASSERT_EQ(std::memcmp(ge.data(), e.data(), 4 * n), 0) << "the residual";
              if (momentum) ASSERT_EQ(std::memcmp(gu.data(), u.data(), 4 * n), 0) << "u";
              for (size_t i = 0; i < k; ++i) {
                uint32_t j, v;
                std::memcpy(&j, idx.data() + 4 * i, 4);
                std::memcpy(&v, val.data() + 4 * i, 4);
                ASSERT_EQ(j, want[i]) << "position " << i;
                ASSERT_EQ(v, bitsOf(e[j])) << "position " << i;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cortado::compressor
