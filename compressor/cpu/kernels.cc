#include "compressor/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "compressor/format.h"
#include "core/common/half.h"
#include "core/common/thread_pool.h"

namespace cortado::compressor::cpu {

using format::kSumChunk;

bool hasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

namespace {

// ---- portable versions: the reference order, also used for tails --------

void oneBitScanScalar(const float* x, size_t n, uint8_t* bits, float* negC, float* posC,
                      uint64_t* negCount) {
  uint64_t count = 0;
  for (size_t c0 = 0, ci = 0; c0 < n; c0 += kSumChunk, ++ci) {
    size_t len = std::min<size_t>(kSumChunk, n - c0);
    float neg[8] = {0}, pos[8] = {0};
    for (size_t o = 0; o < len; o += 8) {
      uint8_t byte = 0;
      for (size_t j = 0; j < 8 && o + j < len; ++j) {
        float v = x[c0 + o + j];
        bool isNeg = v < 0.0f;
        neg[j] += isNeg ? v : 0.0f;
        pos[j] += isNeg ? 0.0f : v;
        byte |= static_cast<uint8_t>(isNeg) << j;
      }
      bits[(c0 + o) / 8] = byte;
      count += std::popcount(byte);
    }
    negC[ci] = format::combineLanes(neg);
    posC[ci] = format::combineLanes(pos);
  }
  *negCount = count;
}

void absSumBitsScalar(const float* x, size_t n, uint8_t* bits, float* absC) {
  for (size_t c0 = 0, ci = 0; c0 < n; c0 += kSumChunk, ++ci) {
    size_t len = std::min<size_t>(kSumChunk, n - c0);
    float acc[8] = {0};
    for (size_t o = 0; o < len; o += 8) {
      uint8_t byte = 0;
      for (size_t j = 0; j < 8 && o + j < len; ++j) {
        float v = x[c0 + o + j];
        acc[j] += std::fabs(v);
        byte |= static_cast<uint8_t>(v < 0.0f) << j;
      }
      bits[(c0 + o) / 8] = byte;
    }
    absC[ci] = format::combineLanes(acc);
  }
}

void signBitsScalar(const float* x, size_t n, uint8_t* bits) {
  for (size_t o = 0; o < n; o += 8) {
    uint8_t byte = 0;
    for (size_t j = 0; j < 8 && o + j < n; ++j) byte |= static_cast<uint8_t>(x[o + j] < 0.0f) << j;
    bits[o / 8] = byte;
  }
}

void sqSumScalar(const float* x, size_t n, float* chunks) {
  for (size_t c0 = 0, ci = 0; c0 < n; c0 += kSumChunk, ++ci) {
    size_t len = std::min<size_t>(kSumChunk, n - c0);
    float acc[8] = {0};
    for (size_t o = 0; o < len; ++o) {
      float v = x[c0 + o];
      float sq = v * v;
      acc[o % 8] += sq;
    }
    chunks[ci] = format::combineLanes(acc);
  }
}

void expandBitsScalar(const uint8_t* bits, size_t n, float neg, float pos, float alpha, bool add,
                      float* out) {
  float a = alpha * neg, b = alpha * pos;
  for (size_t i = 0; i < n; ++i) {
    float v = (bits[i / 8] >> (i % 8)) & 1 ? a : b;
    out[i] = add ? out[i] + v : v;
  }
}

// ---- AVX2 -----------------------------------------------------------------

__attribute__((target("avx2"))) void oneBitScanAvx2(const float* x, size_t n, uint8_t* bits,
                                                    float* negC, float* posC,
                                                    uint64_t* negCount) {
  uint64_t count = 0;
  const __m256 zero = _mm256_setzero_ps();
  size_t full = n / kSumChunk * kSumChunk;
  for (size_t c0 = 0, ci = 0; c0 < full; c0 += kSumChunk, ++ci) {
    __m256 neg = zero, pos = zero;
    for (size_t o = 0; o < kSumChunk; o += 8) {
      __m256 v = _mm256_loadu_ps(x + c0 + o);
      __m256 m = _mm256_cmp_ps(v, zero, _CMP_LT_OQ);
      neg = _mm256_add_ps(neg, _mm256_and_ps(m, v));
      pos = _mm256_add_ps(pos, _mm256_andnot_ps(m, v));
      auto byte = static_cast<uint8_t>(_mm256_movemask_ps(m));
      bits[(c0 + o) / 8] = byte;
      count += std::popcount(byte);
    }
    alignas(32) float ln[8], lp[8];
    _mm256_store_ps(ln, neg);
    _mm256_store_ps(lp, pos);
    negC[ci] = format::combineLanes(ln);
    posC[ci] = format::combineLanes(lp);
  }
  uint64_t tail = 0;
  if (full < n) oneBitScanScalar(x + full, n - full, bits + full / 8, negC + full / kSumChunk,
                                 posC + full / kSumChunk, &tail);
  *negCount = count + tail;
}

__attribute__((target("avx2"))) void absSumBitsAvx2(const float* x, size_t n, uint8_t* bits,
                                                    float* absC) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  size_t full = n / kSumChunk * kSumChunk;
  for (size_t c0 = 0, ci = 0; c0 < full; c0 += kSumChunk, ++ci) {
    __m256 acc = zero;
    for (size_t o = 0; o < kSumChunk; o += 8) {
      __m256 v = _mm256_loadu_ps(x + c0 + o);
      acc = _mm256_add_ps(acc, _mm256_and_ps(v, absMask));
      bits[(c0 + o) / 8] =
          static_cast<uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ)));
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, acc);
    absC[ci] = format::combineLanes(l);
  }
  if (full < n) absSumBitsScalar(x + full, n - full, bits + full / 8, absC + full / kSumChunk);
}

__attribute__((target("avx2"))) void signBitsAvx2(const float* x, size_t n, uint8_t* bits) {
  const __m256 zero = _mm256_setzero_ps();
  size_t full = n / 32 * 32;
  for (size_t o = 0; o < full; o += 32) {
    uint32_t w = 0;
    for (int q = 0; q < 4; ++q) {
      __m256 v = _mm256_loadu_ps(x + o + 8 * q);
      w |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ)))
           << (8 * q);
    }
    std::memcpy(bits + o / 8, &w, 4);
  }
  if (full < n) signBitsScalar(x + full, n - full, bits + full / 8);
}

__attribute__((target("avx2"))) void sqSumAvx2(const float* x, size_t n, float* chunks) {
  size_t full = n / kSumChunk * kSumChunk;
  for (size_t c0 = 0, ci = 0; c0 < full; c0 += kSumChunk, ++ci) {
    __m256 acc = _mm256_setzero_ps();
    for (size_t o = 0; o < kSumChunk; o += 8) {
      __m256 v = _mm256_loadu_ps(x + c0 + o);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, acc);
    chunks[ci] = format::combineLanes(l);
  }
  if (full < n) sqSumScalar(x + full, n - full, chunks + full / kSumChunk);
}

__attribute__((target("avx2"))) void expandBitsAvx2(const uint8_t* bits, size_t n, float neg,
                                                    float pos, float alpha, bool add, float* out) {
  const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 a = _mm256_set1_ps(alpha * neg), b = _mm256_set1_ps(alpha * pos);
  size_t full = n / 8 * 8;
  for (size_t o = 0; o < full; o += 8) {
    __m256i byte = _mm256_set1_epi32(bits[o / 8]);
    __m256 m = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(byte, sel), sel));
    __m256 v = _mm256_blendv_ps(b, a, m);
    if (add) v = _mm256_add_ps(_mm256_loadu_ps(out + o), v);
    _mm256_storeu_ps(out + o, v);
  }
  for (size_t i = full; i < n; ++i) {
    float v = (bits[i / 8] >> (i % 8)) & 1 ? alpha * neg : alpha * pos;
    out[i] = add ? out[i] + v : v;
  }
}

__attribute__((target("avx2"))) void floatToBf16Avx2(const float* in, uint16_t* out, size_t n) {
  const __m256i lsb = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i absMask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x400000);
  size_t full = n / 16 * 16;
  for (size_t i = 0; i < full; i += 16) {
    __m256i r[2];
    for (int h = 0; h < 2; ++h) {
      __m256i b = _mm256_castps_si256(_mm256_loadu_ps(in + i + 8 * h));
      __m256i rounded = _mm256_add_epi32(
          b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), lsb)));
      __m256i isNan = _mm256_cmpgt_epi32(_mm256_and_si256(b, absMask), inf);
      __m256i nanBits = _mm256_or_si256(b, quiet);
      r[h] = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, nanBits, isNan), 16);
    }
    // packus works within 128-bit lanes: fix the order with a permute.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  for (size_t i = full; i < n; ++i) out[i] = cortado::floatToBf16(in[i]);
}

}  // namespace

void oneBitScan(const float* x, size_t n, uint8_t* bits, float* negC, float* posC,
                uint64_t* negCount) {
  if (hasAvx2()) return oneBitScanAvx2(x, n, bits, negC, posC, negCount);
  oneBitScanScalar(x, n, bits, negC, posC, negCount);
}

void absSumBits(const float* x, size_t n, uint8_t* bits, float* absC) {
  if (hasAvx2()) return absSumBitsAvx2(x, n, bits, absC);
  absSumBitsScalar(x, n, bits, absC);
}

void signBits(const float* x, size_t n, uint8_t* bits) {
  if (hasAvx2()) return signBitsAvx2(x, n, bits);
  signBitsScalar(x, n, bits);
}

void sqSumChunks(const float* x, size_t n, float* chunks) {
  if (hasAvx2()) return sqSumAvx2(x, n, chunks);
  sqSumScalar(x, n, chunks);
}

float maxAbs(const float* x, size_t n) {
  // max is order-independent (NaN aside), so a plain loop that GCC vectorizes.
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    m = a > m ? a : m;
  }
  return m;
}

double combineChunks(const float* chunks, size_t nChunks) {
  double total = 0.0;
  for (size_t g = 0; g < nChunks; g += format::kSumGroup) {
    double group = 0.0;
    size_t end = std::min<size_t>(nChunks, g + format::kSumGroup);
    for (size_t c = g; c < end; ++c) group += static_cast<double>(chunks[c]);
    total += group;
  }
  return total;
}

void expandBits(const uint8_t* bits, size_t n, float neg, float pos, float alpha, bool add,
                float* out) {
  if (hasAvx2()) return expandBitsAvx2(bits, n, neg, pos, alpha, add, out);
  expandBitsScalar(bits, n, neg, pos, alpha, add, out);
}

void floatToBf16(const float* in, uint16_t* out, size_t n) {
  if (hasAvx2()) return floatToBf16Avx2(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = cortado::floatToBf16(in[i]);
}

void parallelAligned(ThreadPool* pool, size_t n, size_t align,
                     const std::function<void(size_t, size_t)>& fn) {
  // Below ~256K elements a thread hand-off costs more than it saves.
  constexpr size_t kMinPerThread = 1 << 18;
  if (!pool || pool->size() == 0 || n < 2 * kMinPerThread) {
    fn(0, n);
    return;
  }
  size_t units = (n + align - 1) / align;
  pool->parallelFor(units, std::max<size_t>(1, kMinPerThread / align),
                    [&](size_t b, size_t e) { fn(b * align, std::min(n, e * align)); });
}

}  // namespace cortado::compressor::cpu
