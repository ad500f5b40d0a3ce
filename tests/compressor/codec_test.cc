// Codec correctness against independent references: plain loops, brute-force
// sorts, and statistics over many seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compressor/cpu/kernels.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "compressor/powersgd.h"
#include "compressor/sparse_sum.h"
#include "core/common/half.h"
#include "core/common/thread_pool.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using testing::cpuRegistry;
using testing::decodeToVector;
using testing::encodeToVector;
using testing::randomTensor;

const std::vector<std::string> kAllSpecs = {
    "fp16",         "bf16",           "onebit",        "signsgd",      "efsignsgd",
    "topk:ratio=0.1", "dgc:ratio=0.05", "randomk:ratio=0.2", "randomk:ratio=0.2,unbiased=0",
    "qsgd:levels=1", "qsgd:levels=7", "qsgd:levels=127", "terngrad",    "natural",
    "powersgd:rank=2"};

class EveryCodec : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryCodec, SizesHeaderAndDecompressAddAgreeWithDecode) {
  auto codec = cpuRegistry().create(GetParam());
  for (size_t n : {0, 1, 7, 8, 9, 33, 2047, 2048, 2049, 100003}) {
    SCOPED_TRACE(n);
    auto x = randomTensor(n, n + 1);
    EncodeContext ctx;
    ctx.seed = 42;
    ctx.dtype = DType::kBFloat16;
    auto payload = encodeToVector(*codec, x, ctx);
    ASSERT_EQ(payload.size(), codec->payloadBytes(n));
    PayloadHeader h = parseHeader(payload);
    EXPECT_EQ(h.codec, codec->id());
    EXPECT_EQ(h.numel, n);
    EXPECT_EQ(h.dtype, DType::kBFloat16);
    auto d = decodeToVector(*codec, payload, n);
    auto base = randomTensor(n, 7);
    auto sum = base;
    codec->decompressAdd(payload, sum.data(), n, 0.5f);
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(sum[i], base[i] + 0.5f * d[i], 1e-5f * (std::fabs(base[i]) + std::fabs(d[i]) + 1e-6f))
          << i;
  }
}

TEST_P(EveryCodec, ThreadPoolGivesTheSameBytes) {
  auto codec = cpuRegistry().create(GetParam());
  ThreadPool pool(3);
  size_t n = (1 << 20) + 13;
  auto x = randomTensor(n, 3);
  EncodeContext one, many;
  one.seed = many.seed = 9;
  many.pool = &pool;
  auto a = encodeToVector(*codec, x, one);
  auto b = encodeToVector(*codec, x, many);
  ASSERT_TRUE(a == b);
  std::vector<float> da(n), db(n);
  codec->decode(a, da.data(), n, one);
  codec->decode(a, db.data(), n, many);
  ASSERT_TRUE(da == db);
}

INSTANTIATE_TEST_SUITE_P(Cpu, EveryCodec, ::testing::ValuesIn(kAllSpecs),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(Cast, Fp16AndBf16MatchScalarReference) {
  auto x = randomTensor(10007, 1, 100.0f);
  x[0] = 1e-8f;  // subnormal in fp16
  x[1] = 70000.0f;  // overflows fp16
  x[2] = -0.0f;
  x[3] = std::nanf("");
  x[4] = 65519.0f;
  for (auto [spec, toH, toF] :
       {std::tuple{"fp16", &floatToHalf, &halfToFloat}, std::tuple{"bf16", &floatToBf16, &bf16ToFloat}}) {
    auto codec = cpuRegistry().create(spec);
    auto p = encodeToVector(*codec, x);
    auto d = decodeToVector(*codec, p, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t want = toH(x[i]);
      ASSERT_EQ(loadLe<uint16_t>(p.data() + kHeaderBytes + 2 * i), want) << spec << " " << i;
      float wf = toF(want);
      if (std::isnan(wf))
        ASSERT_TRUE(std::isnan(d[i]));
      else
        ASSERT_EQ(d[i], wf);
    }
  }
}

TEST(Cast, SummableInCompressedForm) {
  auto codec = cpuRegistry().create("fp16");
  EXPECT_TRUE(codec->summable());
  auto a = randomTensor(1000, 1), b = randomTensor(1000, 2);
  auto pa = encodeToVector(*codec, a), pb = encodeToVector(*codec, b);
  auto da = decodeToVector(*codec, pa, 1000), db = decodeToVector(*codec, pb, 1000);
  codec->addPayload(pa, pb);
  auto s = decodeToVector(*codec, pa, 1000);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(s[i], halfToFloat(floatToHalf(da[i] + db[i])));
}

TEST(Sign, OneBitMeansAndBits) {
  for (size_t n : {5, 4096, 300001}) {
    auto x = randomTensor(n, n);
    x[0] = -0.0f;  // not negative: counts with the non-negatives
    auto codec = cpuRegistry().create("onebit");
    auto p = encodeToVector(*codec, x);
    double neg = 0, pos = 0;
    size_t nn = 0;
    for (float v : x) {
      if (v < 0) {
        neg += v;
        ++nn;
      } else {
        pos += v;
      }
    }
    float negMean = static_cast<float>(neg / nn), posMean = static_cast<float>(pos / (n - nn));
    EXPECT_NEAR(loadLe<float>(p.data() + kHeaderBytes), negMean, 1e-5 * std::fabs(negMean));
    EXPECT_NEAR(loadLe<float>(p.data() + kHeaderBytes + 4), posMean, 1e-5 * posMean);
    auto d = decodeToVector(*codec, p, n);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(d[i], x[i] < 0 ? loadLe<float>(p.data() + kHeaderBytes)
                               : loadLe<float>(p.data() + kHeaderBytes + 4));
  }
}

TEST(Sign, SignSgdAndEfSignSgd) {
  auto x = randomTensor(10001, 5);
  auto s = decodeToVector(*cpuRegistry().create("signsgd"), encodeToVector(*cpuRegistry().create("signsgd"), x), x.size());
  double absSum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(s[i], x[i] < 0 ? -1.0f : 1.0f);
    absSum += std::fabs(x[i]);
  }
  auto ef = cpuRegistry().create("efsignsgd");
  auto d = decodeToVector(*ef, encodeToVector(*ef, x), x.size());
  float scale = static_cast<float>(absSum / x.size());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(d[i], x[i] < 0 ? -scale : scale, 1e-6f * scale);
}

// Brute force: stable sort by magnitude, descending, so ties keep index order.
std::vector<uint32_t> referenceTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

void expectTopK(const std::string& spec, const std::vector<float>& x, size_t k, ThreadPool* pool) {
  auto codec = cpuRegistry().create(spec);
  EncodeContext ctx;
  ctx.pool = pool;
  auto p = encodeToVector(*codec, x, ctx);
  PayloadHeader h = parseHeader(p);
  ASSERT_EQ(h.count, k);
  auto want = referenceTopK(x, k);
  for (size_t i = 0; i < k; ++i) {
    uint32_t got = loadLe<uint32_t>(p.data() + kHeaderBytes + 4 * i);
    ASSERT_EQ(got, want[i]) << spec << " position " << i;
    ASSERT_EQ(loadLe<float>(p.data() + kHeaderBytes + 4 * k + 4 * i), x[got]);
  }
}

TEST(TopK, ExactlyTheLargestWithTiesToLowerIndex) {
  ThreadPool pool(2);
  for (size_t n : {1, 10, 1000, 70000, 1 << 20}) {
    for (int kind = 0; kind < 6; ++kind) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " kind=" << kind);
      std::vector<float> x;
      if (kind == 0) {
        x = randomTensor(n, n);
      } else if (kind == 1) {  // few distinct magnitudes: ties everywhere
        std::mt19937 rng(n);
        x.resize(n);
        for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
      } else if (kind == 2) {  // all equal
        x.assign(n, 0.5f);
      } else if (kind == 3) {  // increasing magnitudes: the sample sees few large ones
        x.resize(n);
        for (size_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i);
      } else {  // sparse (a re-encoded sparse sum): 0.5% or 5% non-zero, the rest +-0
        std::mt19937 rng(n + kind);
        const uint32_t every = kind == 4 ? 200 : 20;
        x.assign(n, 0.0f);
        for (size_t i = 0; i < n; ++i) {
          if (rng() % every == 0) x[i] = static_cast<float>(rng() % 1000) / 7.0f - 70.0f;
          else if (i % 3 == 0) x[i] = -0.0f;
        }
      }
      for (double ratio : {0.001, 0.01, 0.3}) {
        size_t k = std::clamp<size_t>(static_cast<size_t>(n * ratio), 1, n);
        auto r = std::to_string(ratio);
        expectTopK("topk:ratio=" + r, x, k, &pool);
        expectTopK("dgc:ratio=" + r, x, k, nullptr);
      }
    }
  }
}

TEST(RandomK, UnbiasedOverSeeds) {
  // n = 64, k = 16: blocks of 4, each element drawn with probability 1/4 and
  // scaled by 4. Per element the estimate's std is |x| sqrt(3); the mean of S
  // draws is within 5 std/sqrt(S) (a 5-sigma bound, 64 elements).
  auto codec = cpuRegistry().create("randomk:ratio=0.25,seed=7");
  auto x = randomTensor(64, 11);
  const int S = 4000;
  std::vector<double> mean(64, 0.0);
  std::vector<float> d(64);
  for (int s = 0; s < S; ++s) {
    EncodeContext ctx;
    ctx.seed = s;
    codec->decode(encodeToVector(*codec, x, ctx), d.data(), 64);
    for (int i = 0; i < 64; ++i) mean[i] += d[i] / S;
  }
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(mean[i], x[i], 5 * std::fabs(x[i]) * std::sqrt(3.0 / S) + 1e-6) << i;
}

// The CPU walks blocks in order with a running remainder; the rule that the
// GPU and every receiver use is randomKIndex's division per block.
TEST(RandomK, WalkEqualsTheIndexRule) {
  const uint64_t big = format::kMaxSparseNumel;
  const std::pair<uint64_t, uint64_t> sizes[] = {
      {1, 1}, {7, 3}, {1000, 1}, {1000, 999}, {1000, 1000}, {25000000, 16666666},
      {25000000, 2500000}, {16666666, 2083333}, {big, 1}, {big, 3}, {big, big / 7}, {big, big - 1}};
  for (auto [n, k] : sizes) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
      for (uint64_t b0 : {uint64_t{0}, uint64_t{1}, k / 3, k > 5 ? k - 5 : 0}) {
        if (b0 >= k) continue;
        format::RandomKWalk walk(seed, b0, n, k);
        for (uint64_t b = b0; b < std::min(k, b0 + 2000); ++b) {
          uint64_t size = 0, wantSize = 0;
          uint64_t got = walk.next(&size);
          ASSERT_EQ(got, format::randomKIndex(seed, b, n, k, &wantSize))
              << "n=" << n << " k=" << k << " seed=" << seed << " b=" << b;
          ASSERT_EQ(size, wantSize);
        }
      }
    }
  }
}

// Encode (serial, and in parallel slices when k >= 2^18; the portable walk
// and, where the CPU has it, AVX-512) and decode against the index rule
// evaluated block by block.
TEST(RandomK, EncodeAndDecodeFollowTheIndexRule) {
  ThreadPool pool(2);
  const size_t n = (1 << 20) + 3;
  auto x = randomTensor(n, 5);
  const bool vector = cpu::setRandomKAvx512(true);
  struct Restore {
    bool v;
    ~Restore() { cpu::setRandomKAvx512(v); }
  } restore{vector};
  for (bool avx512 : {false, true}) {
    if (avx512 && !vector) continue;  // not on this CPU
    cpu::setRandomKAvx512(avx512);
    for (double ratio : {0.001, 0.3, 2.0 / 3.0}) {
      auto codec = cpuRegistry().create("randomk:ratio=" + std::to_string(ratio) + ",seed=7");
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        SCOPED_TRACE(::testing::Message() << "avx512=" << avx512 << " ratio=" << ratio);
        EncodeContext ctx;
        ctx.seed = 99;
        ctx.pool = p;
        auto payload = encodeToVector(*codec, x, ctx);
        PayloadHeader h = parseHeader(payload);
        const uint64_t seed = format::randomKSeed(7, 99);
        ASSERT_EQ(h.seed, seed);
        std::vector<float> want(n, 0.0f);
        for (uint64_t b = 0; b < h.count; ++b) {
          uint64_t size;
          uint64_t i = format::randomKIndex(seed, b, n, h.count, &size);
          ASSERT_EQ(loadLe<float>(payload.data() + kHeaderBytes + 4 * b), x[i]) << "block " << b;
          want[i] = x[i] * static_cast<float>(size);  // unbiased: scaled by the block's size
        }
        ASSERT_EQ(decodeToVector(*codec, payload, n), want);
      }
    }
  }
}

TEST(RandomK, SameRoundSeedIsSummable) {
  auto codec = cpuRegistry().create("randomk:ratio=0.1,seed=3");
  EXPECT_TRUE(codec->summable());
  auto a = randomTensor(1000, 1), b = randomTensor(1000, 2);
  EncodeContext ctx;
  ctx.seed = 17;  // the round: equal on every worker
  auto pa = encodeToVector(*codec, a, ctx), pb = encodeToVector(*codec, b, ctx);
  auto da = decodeToVector(*codec, pa, 1000), db = decodeToVector(*codec, pb, 1000);
  codec->addPayload(pa, pb);
  auto s = decodeToVector(*codec, pa, 1000);
  size_t nonzero = 0;
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_NEAR(s[i], da[i] + db[i], 1e-5f * (std::fabs(da[i]) + std::fabs(db[i])));
    nonzero += s[i] != 0;
  }
  EXPECT_EQ(nonzero, 100u);
  ctx.seed = 18;  // another round: not addable
  auto pc = encodeToVector(*codec, b, ctx);
  EXPECT_THROW(codec->addPayload(pa, pc), Error);
}

// Mean of S decodes with different seeds is within 5 sigma of x, sigma being
// the per-element bound on the estimator's std divided by sqrt(S).
void expectUnbiased(const std::string& spec, const std::vector<float>& x,
                    const std::function<double(size_t)>& stdBound) {
  auto codec = cpuRegistry().create(spec);
  const int S = 4000;
  std::vector<double> mean(x.size(), 0.0);
  std::vector<float> d(x.size());
  for (int s = 0; s < S; ++s) {
    EncodeContext ctx;
    ctx.seed = 1000 + s;
    codec->decode(encodeToVector(*codec, x, ctx), d.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) mean[i] += d[i] / S;
  }
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(mean[i], x[i], 5 * stdBound(i) / std::sqrt(S) + 1e-6) << spec << " " << i;
}

TEST(Quantizers, QsgdTernGradNaturalAreUnbiased) {
  auto x = randomTensor(64, 21);
  x[5] = 0.0f;
  double norm = 0, mx = 0;
  for (float v : x) {
    norm += double(v) * v;
    mx = std::max(mx, double(std::fabs(v)));
  }
  norm = std::sqrt(norm);
  // QSGD: rounding between levels norm/s apart: std <= norm / (2 s).
  expectUnbiased("qsgd:levels=7", x, [&](size_t) { return norm / 14; });
  expectUnbiased("qsgd:levels=1", x, [&](size_t) { return norm / 2; });
  // TernGrad: Bernoulli(|x|/max) times max: std <= max / 2.
  expectUnbiased("terngrad", x, [&](size_t) { return mx / 2; });
  // natural: between 2^e and 2^(e+1) with 2^e <= |x|: std <= |x| / 2.
  expectUnbiased("natural", x, [&](size_t i) { return std::fabs(x[i]) / 2; });
}

TEST(Quantizers, NaturalSendsPowersOfTwo) {
  auto x = randomTensor(1000, 4);
  auto codec = cpuRegistry().create("natural");
  auto d = decodeToVector(*codec, encodeToVector(*codec, x), 1000);
  for (size_t i = 0; i < 1000; ++i) {
    if (d[i] == 0) continue;
    int e;
    EXPECT_EQ(std::frexp(std::fabs(d[i]), &e), 0.5f);
    EXPECT_EQ(d[i] < 0, x[i] < 0);
    EXPECT_LE(std::fabs(d[i]), 2 * std::fabs(x[i]));
    EXPECT_GE(std::fabs(d[i]), std::fabs(x[i]) / 2);
  }
}

TEST(Quantizers, QsgdPayloadBits) {
  EXPECT_EQ(cpuRegistry().create("qsgd:levels=1")->payloadBytes(1001), kHeaderBytes + 4 + 251);
  EXPECT_EQ(cpuRegistry().create("qsgd:levels=7")->payloadBytes(1001), kHeaderBytes + 4 + 501);
  EXPECT_EQ(cpuRegistry().create("qsgd:levels=8")->payloadBytes(1001), kHeaderBytes + 4 + 1001);
}

std::vector<float> lowRank(size_t rows, size_t cols, int rank, uint64_t seed) {
  auto a = randomTensor(rows * rank, seed), b = randomTensor(cols * rank, seed + 1);
  std::vector<float> m(rows * cols, 0.0f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j)
      for (int t = 0; t < rank; ++t) m[i * cols + j] += a[i * rank + t] * b[j * rank + t];
  return m;
}

TEST(PowerSgd, RecoversALowRankMatrix) {
  size_t rows = 64, cols = 48;
  auto m = lowRank(rows, cols, 2, 5);
  auto codec = cpuRegistry().create("powersgd:rank=3");
  EncodeContext ctx;
  ctx.rows = rows;
  auto p = encodeToVector(*codec, m, ctx);
  EXPECT_EQ(p.size(), kHeaderBytes + 4 * (rows + cols) * 3);
  auto d = decodeToVector(*codec, p, m.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    err += std::pow(d[i] - m[i], 2);
    ref += std::pow(m[i], 2);
  }
  EXPECT_LT(std::sqrt(err / ref), 1e-4);
}

TEST(PowerSgd, OneDimensionalPassesThrough) {
  auto x = randomTensor(100, 1);
  auto codec = cpuRegistry().create("powersgd");
  auto d = decodeToVector(*codec, encodeToVector(*codec, x), 100);
  EXPECT_EQ(d, x);
}

TEST(PowerSgd, TwoReductionsAreLinearAcrossWorkers) {
  // Two workers with the same seed: reducing P and Q gives what one worker
  // holding the summed matrix would get.
  size_t rows = 40, cols = 30;
  unsigned r = 3;
  auto m1 = randomTensor(rows * cols, 1), m2 = randomTensor(rows * cols, 2);
  std::vector<float> msum(rows * cols);
  for (size_t i = 0; i < msum.size(); ++i) msum[i] = m1[i] + m2[i];
  PowerSgd w1(rows, cols, r, 9), w2(rows, cols, r, 9), one(rows, cols, r, 9);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> p1(w1.pSize()), p2(w1.pSize()), pr(w1.pSize());
    w1.computeP(m1.data(), p1.data());
    w2.computeP(m2.data(), p2.data());
    one.computeP(msum.data(), pr.data());
    for (size_t i = 0; i < p1.size(); ++i) p1[i] = p2[i] = p1[i] + p2[i];  // allreduce
    std::vector<float> q1(w1.qSize()), q2(w1.qSize()), qr(w1.qSize());
    w1.computeQ(m1.data(), p1.data(), q1.data());
    w2.computeQ(m2.data(), p2.data(), q2.data());
    one.computeQ(msum.data(), pr.data(), qr.data());
    for (size_t i = 0; i < q1.size(); ++i) q1[i] = q2[i] = q1[i] + q2[i];  // allreduce
    std::vector<float> o1(rows * cols), o2(rows * cols), or_(rows * cols);
    w1.decompress(p1.data(), q1.data(), o1.data());
    w2.decompress(p2.data(), q2.data(), o2.data());
    one.decompress(pr.data(), qr.data(), or_.data());
    for (size_t i = 0; i < o1.size(); ++i) {
      ASSERT_EQ(o1[i], o2[i]);
      ASSERT_NEAR(o1[i], or_[i], 1e-4f * (1 + std::fabs(or_[i])));
    }
  }
}

TEST(Codec, NotSummableCodecsRefuseAddPayload) {
  for (auto spec : {"topk", "onebit", "qsgd", "powersgd"}) {
    auto c = cpuRegistry().create(spec);
    EXPECT_FALSE(c->summable());
    auto p = encodeToVector(*c, randomTensor(100, 1));
    try {
      c->addPayload(p, p);
      ADD_FAILURE() << spec;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(Codec, EncodeChecksOutputCapacity) {
  auto c = cpuRegistry().create("fp16");
  std::vector<float> x(100);
  std::vector<std::byte> out(c->payloadBytes(100) - 1);
  EXPECT_THROW(c->encode(x.data(), 100, out, {}), Error);
}

// A server's sum of W top-k or DGC payloads, built from the indices the
// payloads carried (mergeIndices) instead of a scan of every element: the
// same payload byte for byte as the scan, which a plain loop checks too.
TEST(SparseSum, FromThePayloadsIndicesIsTheScanByteForByte) {
  for (const std::string spec : {"topk:ratio=0.01", "dgc:ratio=0.03"}) {
    auto codec = cpuRegistry().create(spec);
    for (size_t n : {1, 100, 4099, 300000}) {
      SCOPED_TRACE(::testing::Message() << spec << " n=" << n);
      std::vector<float> sum(n, 0.0f);
      IndexUnion u;
      u.reset(n);
      for (int w = 0; w < 5; ++w) {
        auto x = randomTensor(n, 11 * n + w);
        if (w == 4)  // cancels worker 0 where both send: those sums are exactly 0
          x = randomTensor(n, 11 * n), std::transform(x.begin(), x.end(), x.begin(), std::negate<>());
        auto payload = encodeToVector(*codec, x, {});
        codec->decompressAdd(payload, sum.data(), n);
        u.add(payload);
      }
      ASSERT_EQ(u.added(), 5 * parseHeader(encodeToVector(*codec, sum, {})).count);
      std::span<const uint32_t> touched = u.merged();
      ASSERT_TRUE(std::is_sorted(touched.begin(), touched.end()));
      ASSERT_EQ(std::adjacent_find(touched.begin(), touched.end()), touched.end());
      // Plain loop: the nonzeros, ascending.
      std::vector<uint32_t> nz;
      for (size_t i = 0; i < n; ++i)
        if (sum[i] != 0.0f) nz.push_back(uint32_t(i));
      ASSERT_EQ(countNonzeros(sum.data(), touched), nz.size());
      if (n > 1) {
        ASSERT_LT(nz.size(), touched.size()) << "worker 4 cancelled some";
      }
      std::vector<std::byte> scan(sparseSumBytes(nz.size())), indexed(scan.size());
      encodeSparseSum(sum.data(), n, nz.size(), scan);
      encodeSparseSum(sum.data(), n, touched, nz.size(), indexed);
      // A wrong count is refused, not written past.
      if (!nz.empty()) {
        std::vector<std::byte> small(sparseSumBytes(nz.size() - 1));
        EXPECT_THROW(encodeSparseSum(sum.data(), n, nz.size() - 1, small), Error);
        std::vector<std::byte> big(sparseSumBytes(nz.size() + 1));
        EXPECT_THROW(encodeSparseSum(sum.data(), n, touched, nz.size() + 1, big), Error);
      }
      ASSERT_TRUE(scan == indexed);
      PayloadHeader h = parseHeader(indexed);
      ASSERT_EQ(h.count, nz.size());
      for (size_t j = 0; j < nz.size(); ++j) {
        ASSERT_EQ(loadLe<uint32_t>(indexed.data() + kHeaderBytes + 4 * j), nz[j]);
        ASSERT_EQ(loadLe<float>(indexed.data() + kHeaderBytes + 4 * (nz.size() + j)), sum[nz[j]]);
      }
    }
  }
  // Indices in any order (not ours, but valid) merge the same.
  auto topk = cpuRegistry().create("topk:ratio=0.5");
  std::vector<float> x = {0, 5, 0, -7, 0, 9, 0, 1};
  auto payload = encodeToVector(*topk, x, {});
  std::byte* idx = payload.data() + kHeaderBytes;
  std::byte* val = idx + 4 * 4;
  for (int i = 0; i < 2; ++i) {  // reverse the 4 (index, value) pairs
    for (int b = 0; b < 4; ++b) std::swap(idx[4 * i + b], idx[4 * (3 - i) + b]);
    for (int b = 0; b < 4; ++b) std::swap(val[4 * i + b], val[4 * (3 - i) + b]);
  }
  IndexUnion u;
  u.reset(8);
  std::vector<float> y = {3, 0, 0, 8, 0, 0, 0, 0};  // a sorted run: indices 0 and 3
  u.add(encodeToVector(*cpuRegistry().create("topk:ratio=0.25"), y, {}));
  u.add(payload);
  u.add(payload);  // the same indices twice: once in the union
  std::span<const uint32_t> m = u.merged();
  EXPECT_EQ(std::vector<uint32_t>(m.begin(), m.end()), (std::vector<uint32_t>{0, 1, 3, 5, 7}));
  m = u.merged();  // again: the same
  EXPECT_EQ(std::vector<uint32_t>(m.begin(), m.end()), (std::vector<uint32_t>{0, 1, 3, 5, 7}));
  u.reset(8);
  EXPECT_TRUE(u.merged().empty());
  EXPECT_EQ(u.added(), 0u);
  // A payload without indices, and an index out of range, are refused.
  auto fp16 = cpuRegistry().create("fp16");
  EXPECT_THROW(u.add(encodeToVector(*fp16, x, {})), Error);
  u.reset(7);  // a payload of another size
  EXPECT_THROW(u.add(payload), Error);
  u.reset(8);  // an index out of range: nothing added
  auto bad = payload;
  storeLe<uint32_t>(bad.data() + kHeaderBytes, 8);
  EXPECT_THROW(u.add(bad), Error);
  EXPECT_EQ(u.added(), 0u);
  EXPECT_TRUE(u.merged().empty());
  std::vector<float> s8(8, 0.0f);
  std::vector<std::byte> out(sparseSumBytes(0));
  EXPECT_THROW(encodeSparseSum(s8.data(), 4, std::vector<uint32_t>{1, 6}, 0, out), Error);
}

}  // namespace
}  // namespace cortado::compressor
