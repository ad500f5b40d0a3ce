// Summation kernels against a scalar reference, for every dtype and for odd
// lengths (the vector loops' tails).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/common/half.h"
#include "core/common/error.h"
#include "core/common/reduce.h"

namespace cortado {
namespace {

const size_t kLengths[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 255, 1000, 4097};

template <typename T>
std::vector<T> randomInts(size_t n, std::mt19937& rng, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(rng));
  return v;
}

template <typename T>
void checkPlain(DType t) {
  std::mt19937 rng(42);
  for (size_t n : kLengths) {
    auto a = randomInts<T>(n, rng, -50, 50);
    auto b = randomInts<T>(n, rng, -50, 50);
    auto c = randomInts<T>(n, rng, -50, 50);
    std::vector<T> acc(n);
    loadAccumulator(t, acc.data(), a.data(), n);
    accumulate(t, acc.data(), b.data(), n);
    accumulate(t, acc.data(), c.data(), n);
    std::vector<T> out(n);
    storeAccumulator(t, out.data(), acc.data(), n);
    for (size_t i = 0; i < n; ++i) {
      T ref = static_cast<T>(a[i] + b[i] + c[i]);
      ASSERT_EQ(out[i], ref) << dtypeName(t) << " n=" << n << " i=" << i;
    }
  }
}

TEST(Reduce, Float32) { checkPlain<float>(DType::kFloat32); }
TEST(Reduce, Float64) { checkPlain<double>(DType::kFloat64); }
TEST(Reduce, Int32) { checkPlain<int32_t>(DType::kInt32); }
TEST(Reduce, Int64) { checkPlain<int64_t>(DType::kInt64); }
TEST(Reduce, Int8Wraps) { checkPlain<int8_t>(DType::kInt8); }

TEST(Reduce, Float32ArbitraryValuesMatchSequentialSum) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  for (size_t n : kLengths) {
    std::vector<float> a(n), b(n);
    for (auto& x : a) x = d(rng);
    for (auto& x : b) x = d(rng);
    std::vector<float> acc = a;
    accumulate(DType::kFloat32, acc.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], a[i] + b[i]);
  }
}

// fp16 and bf16 accumulate in fp32: the sum of many halves is exact in fp32
// where a half accumulator would round at every step.
void checkHalfType(DType t) {
  const bool isHalf = t == DType::kFloat16;
  auto enc = [&](float f) { return isHalf ? floatToHalf(f) : floatToBf16(f); };
  auto dec = [&](uint16_t h) { return isHalf ? halfToFloat(h) : bf16ToFloat(h); };
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-4, 4);
  const int kPushes = 16;
  for (size_t n : kLengths) {
    std::vector<std::vector<uint16_t>> pushes(kPushes, std::vector<uint16_t>(n));
    for (auto& p : pushes)
      for (auto& x : p) x = enc(d(rng));
    EXPECT_EQ(accumulatorDType(t), DType::kFloat32);
    std::vector<float> acc(n);
    loadAccumulator(t, acc.data(), pushes[0].data(), n);
    for (int k = 1; k < kPushes; ++k) accumulate(t, acc.data(), pushes[k].data(), n);
    std::vector<uint16_t> out(n);
    storeAccumulator(t, out.data(), acc.data(), n);
    for (size_t i = 0; i < n; ++i) {
      float ref = 0;
      for (int k = 0; k < kPushes; ++k) ref += dec(pushes[k][i]);
      ASSERT_EQ(acc[i], ref) << dtypeName(t) << " n=" << n << " i=" << i;
      ASSERT_EQ(out[i], enc(ref));
    }
  }
}

TEST(Reduce, Float16AccumulatesInFloat32) { checkHalfType(DType::kFloat16); }
TEST(Reduce, BFloat16AccumulatesInFloat32) { checkHalfType(DType::kBFloat16); }

TEST(Reduce, DivideAverages) {
  std::vector<float> f = {4, 8, -12, 1};
  divideInto(DType::kFloat32, f.data(), f.data(), f.size(), 4);
  EXPECT_EQ(f, (std::vector<float>{1, 2, -3, 0.25f}));
  std::vector<int32_t> i = {7, -7, 8};
  divideInto(DType::kInt32, i.data(), i.data(), i.size(), 2);
  EXPECT_EQ(i, (std::vector<int32_t>{3, -3, 4}));
  std::vector<uint16_t> h = {floatToHalf(6.0f)};
  divideInto(DType::kFloat16, h.data(), h.data(), 1, 3);
  EXPECT_EQ(halfToFloat(h[0]), 2.0f);
  EXPECT_THROW(divideInto(DType::kFloat32, f.data(), f.data(), 1, 0), Error);
}

}  // namespace
}  // namespace cortado
