// Body layouts and the arithmetic that CPU and CUDA implementations must
// share bit for bit: payload sizes, the counter-based random numbers, the
// random-k index rule and the deterministic summation order. Included by .cc
// and .cu files alike, so it is header-only and free of host-only types.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CORTADO_HD __host__ __device__ __forceinline__
#else
#define CORTADO_HD inline
#endif

namespace cortado::compressor::format {

// ---- sizes ---------------------------------------------------------------

CORTADO_HD uint64_t bitBytes(uint64_t n) { return (n + 7) / 8; }

// fp16, bf16: n x u16.
CORTADO_HD uint64_t castBody(uint64_t n) { return 2 * n; }
// onebit: f32 mean of negatives, f32 mean of non-negatives, sign bits (1 = negative).
CORTADO_HD uint64_t oneBitBody(uint64_t n) { return 8 + bitBytes(n); }
// signsgd: sign bits only.
CORTADO_HD uint64_t signBody(uint64_t n) { return bitBytes(n); }
// efsignsgd: f32 mean magnitude, sign bits.
CORTADO_HD uint64_t efSignBody(uint64_t n) { return 4 + bitBytes(n); }
// top-k, DGC: k x u32 indices (ascending), k x f32 values.
CORTADO_HD uint64_t sparseBody(uint64_t k) { return 8 * k; }
// random-k: k x f32 values; indices follow from the seed.
CORTADO_HD uint64_t randomKBody(uint64_t k) { return 4 * k; }
// QSGD: f32 norm, then one code per element in qsgdBits(levels) bits.
CORTADO_HD unsigned qsgdBits(unsigned levels) { return levels <= 1 ? 2 : levels <= 7 ? 4 : 8; }
CORTADO_HD uint64_t qsgdBody(uint64_t n, unsigned levels) {
  return 4 + (n * qsgdBits(levels) + 7) / 8;
}
// TernGrad: f32 scale, 2 bits per element (0: zero, 1: +scale, 2: -scale).
CORTADO_HD uint64_t ternBody(uint64_t n) { return 4 + (n + 3) / 4; }
// natural: one byte per element: bit 7 sign, bits 0-6 code (0 = zero,
// c = 2^(top + 1 - c)); `top` travels in the header's param.
CORTADO_HD uint64_t naturalBody(uint64_t n) { return n; }
// PowerSGD: P (rows x r) then Q (cols x r), f32 row-major; 1-D: n x f32.
CORTADO_HD uint64_t powerSgdBody(uint64_t rows, uint64_t cols, uint64_t rank) {
  return 4 * (rows + cols) * rank;
}

// k from a ratio, at least 1 for a non-empty tensor, never more than n.
CORTADO_HD uint64_t kFromRatio(uint64_t n, double ratio) {
  if (n == 0) return 0;
  auto k = static_cast<uint64_t>(static_cast<double>(n) * ratio);
  return k < 1 ? 1 : (k > n ? n : k);
}

// Indices travel as u32: tensors of 2^32 elements or more are chunked first
// (the partitioner's chunks are about 4 MB).
inline constexpr uint64_t kMaxSparseNumel = 0xffffffffull;

// ---- random numbers: a counter-based hash, identical on CPU and GPU ------

CORTADO_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
CORTADO_HD uint64_t hash2(uint64_t seed, uint64_t i) {
  return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ (i * 0xd6e8feb86659fd93ull + 1));
}
// Uniform in [0, 1) with 24 random bits: exactly representable as float.
CORTADO_HD float uniform01(uint64_t h) {
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// ---- random-k: stratified, one index per block ---------------------------
// Block b covers [b*n/k, (b+1)*n/k). Each element lands in exactly one block
// and is drawn with probability 1/|block|, so scaling by |block| is unbiased;
// computing an index needs only (seed, b), which is what makes the GPU and
// the CPU agree and lets the receiver rebuild the indices.

CORTADO_HD uint64_t randomKBlockStart(uint64_t b, uint64_t n, uint64_t k) { return b * n / k; }
CORTADO_HD uint64_t randomKIndex(uint64_t seed, uint64_t b, uint64_t n, uint64_t k,
                                 uint64_t* blockSize) {
  uint64_t start = randomKBlockStart(b, n, k);
  uint64_t size = randomKBlockStart(b + 1, n, k) - start;
  *blockSize = size;
  return start + (((hash2(seed, b) >> 32) * size) >> 32);
}
// randomKIndex for blocks b0, b0 + 1, ... in order, without a division per
// block: the block start steps by n / k and a remainder. Equal to
// randomKIndex bit for bit (tests/compressor/codec_test.cc checks).
struct RandomKWalk {
  CORTADO_HD RandomKWalk(uint64_t seed, uint64_t b0, uint64_t n, uint64_t k)
      : k_(k),
        qStep_(k ? n / k : 0),  // k = 0 (an empty tensor): no block to walk
        rStep_(k ? n % k : 0),
        q_(k ? b0 * n / k : 0),
        r_(k ? b0 * n % k : 0),
        b_(b0),
        s0_(mix64(seed + 0x9e3779b97f4a7c15ull)) {}
  // The next block's index; *blockSize gets the block's size.
  CORTADO_HD uint64_t next(uint64_t* blockSize) {
    uint64_t q = q_ + qStep_, r = r_ + rStep_;
    if (r >= k_) r -= k_, ++q;
    uint64_t size = q - q_;
    uint64_t h = mix64(s0_ ^ (b_ * 0xd6e8feb86659fd93ull + 1));  // hash2(seed, b)
    uint64_t i = q_ + (((h >> 32) * size) >> 32);
    q_ = q;
    r_ = r;
    ++b_;
    *blockSize = size;
    return i;
  }

 private:
  uint64_t k_, qStep_, rStep_, q_, r_, b_, s0_;
};
// The effective seed of one round: the codec's seed and the caller's round seed.
CORTADO_HD uint64_t randomKSeed(uint64_t codecSeed, uint64_t roundSeed) {
  return hash2(codecSeed, roundSeed);
}

// ---- deterministic sums --------------------------------------------------
// Sums that go into a payload (onebit means, EFSignSGD scale, QSGD norm) are
// computed in one fixed order so that the CPU and the GPU produce the same
// bits: chunks of 2048 elements; in a chunk, lane j (0..7) adds elements
// j, j+8, j+16, ... in float, left to right; the lanes combine as
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); chunk sums, in double, are added left
// to right in groups of 64 chunks, and the group sums left to right.
inline constexpr uint64_t kSumChunk = 2048;
inline constexpr uint64_t kSumLanes = 8;
inline constexpr uint64_t kSumGroup = 64;

CORTADO_HD float combineLanes(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Bit of element i in a sign-bit array: byte i / 8, bit i % 8 (LSB first).

}  // namespace cortado::compressor::format
