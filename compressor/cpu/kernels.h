// Vectorized building blocks of the CPU codecs. Each has an AVX2 version
// (chosen at run time) and a portable one; both follow the summation order of
// format.h, so their results are bit-identical to each other and to CUDA.
// Ranges passed here start on a multiple of format::kSumChunk (sums) or of 8
// (bit arrays): the callers split work across threads on those boundaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "compressor/codec.h"

namespace cortado {
class ThreadPool;
}

namespace cortado::compressor::cpu {

bool hasAvx2();

// onebit: bits (1 = x < 0) for x[0..n), the per-chunk float sums of the
// negatives and of the non-negatives, and the count of negatives.
void oneBitScan(const float* x, size_t n, uint8_t* bits, float* negChunks, float* posChunks,
                uint64_t* negCount);
// Sign bits (1 = x < 0) and per-chunk sums of |x|.
void absSumBits(const float* x, size_t n, uint8_t* bits, float* absChunks);
// Sign bits only.
void signBits(const float* x, size_t n, uint8_t* bits);
// Per-chunk sums of x*x (product rounded, then added: no fused multiply-add).
void sqSumChunks(const float* x, size_t n, float* chunks);
// Per-chunk sums of |x| and the maximum |x| (TernGrad).
float maxAbs(const float* x, size_t n);

// Combines chunk sums in the fixed order of format.h.
double combineChunks(const float* chunks, size_t nChunks);

// out[i] = alpha * (bit(i) ? neg : pos), or out[i] += that when add.
void expandBits(const uint8_t* bits, size_t n, float neg, float pos, float alpha, bool add,
                float* out);

// fp32 -> bf16 with round-to-nearest-even, NaN kept quiet.
void floatToBf16(const float* in, uint16_t* out, size_t n);

// Random-k's gather for blocks [b0, b1): the f32 at randomKIndex(seed, b, n,
// k) of `in` (n little-endian f32) goes to out + 4 (b - b0); both at any
// address. AVX-512 (64-bit multiplies) hashes eight blocks at a time and
// gathers them; otherwise format::RandomKWalk one block at a time. Equal to
// randomKIndex bit for bit either way.
void randomKGather(const std::byte* in, uint64_t n, uint64_t k, uint64_t seed, uint64_t b0,
                   uint64_t b1, std::byte* out);
// Whether randomKGather uses AVX-512 (set false to test the portable walk;
// process-wide). Returns what is used.
bool setRandomKAvx512(bool use);

// Error feedback's update of elements [b, e) (codec.h, FeedbackUpdate):
// u[i] = m u[i] + g[i], e[i] += u[i]; without u, e[i] += g[i]. Each product
// and sum rounded on its own (no fused multiply-add), as every fused pass
// that applies it must round them.
void applyUpdate(const FeedbackUpdate& up, size_t b, size_t e);

// Runs fn(begin, end) over [0, n) in pieces whose starts are multiples of
// `align`, on the pool when there is one and the work is big enough.
void parallelAligned(ThreadPool* pool, size_t n, size_t align,
                     const std::function<void(size_t, size_t)>& fn);

// x[0, n) = 0, split over the pool as parallelAligned splits work: the
// executor's decode zeroes its region so before it adds the payloads, and
// `cortado bench model`'s codec probe times the same pass.
void zeroFloats(ThreadPool* pool, float* x, size_t n);

}  // namespace cortado::compressor::cpu
