#include "compressor/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
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

void applyUpdate(const FeedbackUpdate& up, size_t b, size_t e) {
  if (up.u) {
    for (size_t i = b; i < e; ++i) {
      up.u[i] = up.m * up.u[i] + up.g[i];
      up.e[i] += up.u[i];
    }
  } else {
    for (size_t i = b; i < e; ++i) up.e[i] += up.g[i];
  }
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

void zeroFloats(ThreadPool* pool, float* x, size_t n) {
  parallelAligned(pool, n, 16, [x](size_t b, size_t e) { std::fill(x + b, x + e, 0.0f); });
}

// ---- random-k gather -----------------------------------------------------

namespace {

bool hasAvx512Dq() {
  static const bool has =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has;
}
std::atomic<bool>& randomKAvx512() {
  static std::atomic<bool> use{hasAvx512Dq()};
  return use;
}

void randomKGatherWalk(const std::byte* in, uint64_t n, uint64_t k, uint64_t seed, uint64_t b0,
                       uint64_t b1, std::byte* out) {
  format::RandomKWalk walk(seed, b0, n, k);
  for (uint64_t b = b0; b < b1; ++b) {
    uint64_t size;
    std::memcpy(out + 4 * (b - b0), in + 4 * walk.next(&size), 4);
  }
}

// Lanes j = 0..7 hold blocks b + j: the block start q and remainder r of
// b·n/k, and those of the next block, stepped by 8n/k each round.
// A right shift of each 64-bit lane. The masked forms here and below: GCC 12
// warns about the undefined source that the plain ones pass.
__attribute__((target("avx512f"))) inline __m512i shr64(__m512i z, unsigned n) {
  return _mm512_maskz_srli_epi64(0xff, z, n);
}

__attribute__((target("avx512f,avx512dq"))) void randomKGatherAvx512(
    const std::byte* in, uint64_t n, uint64_t k, uint64_t seed, uint64_t b0, uint64_t b1,
    std::byte* out) {
  uint64_t b = b0;
  if (b1 - b0 >= 16) {
    alignas(64) uint64_t q[8], r[8], qn[8], rn[8], bs[8];
    for (int j = 0; j < 8; ++j) {
      uint64_t bj = b + j;
      bs[j] = bj;
      q[j] = bj * n / k;
      r[j] = bj * n % k;
      qn[j] = (bj + 1) * n / k;
      rn[j] = (bj + 1) * n % k;
    }
    __m512i Q = _mm512_load_si512(q), R = _mm512_load_si512(r);
    __m512i Qn = _mm512_load_si512(qn), Rn = _mm512_load_si512(rn);
    __m512i B = _mm512_load_si512(bs);
    const __m512i q8 = _mm512_set1_epi64(static_cast<int64_t>(8 * n / k));
    const __m512i r8 = _mm512_set1_epi64(static_cast<int64_t>(8 * n % k));
    const __m512i kk = _mm512_set1_epi64(static_cast<int64_t>(k));
    const __m512i one = _mm512_set1_epi64(1), eight = _mm512_set1_epi64(8);
    const __m512i s0 =
        _mm512_set1_epi64(static_cast<int64_t>(format::mix64(seed + 0x9e3779b97f4a7c15ull)));
    const __m512i m = _mm512_set1_epi64(static_cast<int64_t>(0xd6e8feb86659fd93ull));
    const __m512i c1 = _mm512_set1_epi64(static_cast<int64_t>(0xbf58476d1ce4e5b9ull));
    const __m512i c2 = _mm512_set1_epi64(static_cast<int64_t>(0x94d049bb133111ebull));
    for (; b + 8 <= b1; b += 8) {
      // hash2(seed, b) = mix64(mix64(seed + golden) ^ (b·m + 1))
      __m512i z = _mm512_xor_si512(s0, _mm512_add_epi64(_mm512_mullo_epi64(B, m), one));
      z = _mm512_mullo_epi64(_mm512_xor_si512(z, shr64(z, 30)), c1);
      z = _mm512_mullo_epi64(_mm512_xor_si512(z, shr64(z, 27)), c2);
      z = _mm512_xor_si512(z, shr64(z, 31));
      // start + ((h >> 32) · size) >> 32; both factors < 2^32
      __m512i size = _mm512_sub_epi64(Qn, Q);
      __m512i idx = _mm512_add_epi64(
          Q, shr64(_mm512_maskz_mul_epu32(0xff, shr64(z, 32), size), 32));
      // Plain loads: a gather instruction waits on its eight misses together.
      alignas(64) uint64_t at[8];
      _mm512_store_si512(at, idx);
      std::byte* o = out + 4 * (b - b0);
      for (int j = 0; j < 8; ++j) std::memcpy(o + 4 * j, in + 4 * at[j], 4);
      R = _mm512_add_epi64(R, r8);
      Q = _mm512_add_epi64(Q, q8);
      __mmask8 c = _mm512_cmpge_epu64_mask(R, kk);
      R = _mm512_mask_sub_epi64(R, c, R, kk);
      Q = _mm512_mask_add_epi64(Q, c, Q, one);
      Rn = _mm512_add_epi64(Rn, r8);
      Qn = _mm512_add_epi64(Qn, q8);
      c = _mm512_cmpge_epu64_mask(Rn, kk);
      Rn = _mm512_mask_sub_epi64(Rn, c, Rn, kk);
      Qn = _mm512_mask_add_epi64(Qn, c, Qn, one);
      B = _mm512_add_epi64(B, eight);
    }
  }
  randomKGatherWalk(in, n, k, seed, b, b1, out + 4 * (b - b0));
}

}  // namespace

void randomKGather(const std::byte* in, uint64_t n, uint64_t k, uint64_t seed, uint64_t b0,
                   uint64_t b1, std::byte* out) {
  if (randomKAvx512().load(std::memory_order_relaxed))
    randomKGatherAvx512(in, n, k, seed, b0, b1, out);
  else
    randomKGatherWalk(in, n, k, seed, b0, b1, out);
}

bool setRandomKAvx512(bool use) {
  bool v = use && hasAvx512Dq();
  randomKAvx512().store(v);
  return v;
}

}  // namespace cortado::compressor::cpu
