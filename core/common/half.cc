#include "core/common/half.h"

#include <immintrin.h>

namespace cortado {
namespace {

bool cpuHasF16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

__attribute__((target("avx,f16c"))) void halfToFloatF16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = halfToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void floatToHalfF16c(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = floatToHalf(in[i]);
}

}  // namespace

void halfToFloatN(const uint16_t* in, float* out, size_t n) {
  if (cpuHasF16c()) return halfToFloatF16c(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = halfToFloat(in[i]);
}

void floatToHalfN(const float* in, uint16_t* out, size_t n) {
  if (cpuHasF16c()) return floatToHalfF16c(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = floatToHalf(in[i]);
}

void bf16ToFloatN(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16ToFloat(in[i]);  // auto-vectorized shift
}

void floatToBf16N(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = floatToBf16(in[i]);
}

}  // namespace cortado
