// fp16/bf16 conversions against an independent reference: exhaustive over all
// 65536 half values, and against the F16C hardware instruction where present.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/common/half.h"

namespace cortado {
namespace {

// Reference decode by the definition of the format.
double halfValue(uint16_t h) {
  int sign = (h >> 15) ? -1 : 1;
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

TEST(Half, DecodeEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    double ref = halfValue(static_cast<uint16_t>(h));
    float got = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), ref) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Half, RoundTripEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(floatToHalf(f), h) << std::hex << h;
  }
}

__attribute__((target("f16c"))) uint16_t hwHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(Half, EncodeMatchesHardwareRounding) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C instruction";
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(floatToHalf(f), hwHalf(f)) << "float bits 0x" << std::hex << b;
  }
}

TEST(Half, BulkMatchesScalarOnOddLengths) {
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 1023u}) {
    std::vector<float> in(n), back(n);
    std::vector<uint16_t> h(n), hb(n);
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i) * 0.37f - 100.0f;
    floatToHalfN(in.data(), h.data(), n);
    floatToBf16N(in.data(), hb.data(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(h[i], floatToHalf(in[i]));
      EXPECT_EQ(hb[i], floatToBf16(in[i]));
    }
    halfToFloatN(h.data(), back.data(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], halfToFloat(h[i]));
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even.
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(NAN))));
}

}  // namespace
}  // namespace cortado
