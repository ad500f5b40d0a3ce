// Kernel launchers of the CUDA codecs. Plain C++17 types only, so the .cc
// side (compiled by the host compiler, with fmt and cortado::Error) can call
// them; every pointer is device memory unless named `host`. All launches are
// asynchronous on `stream`; the caller checks cudaGetLastError().
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cortado::compressor::cuda::kern {

struct HeaderBytes {
  unsigned char b[48];
};
void writeHeader(unsigned char* out, HeaderBytes h, cudaStream_t s);

// fp16 / bf16.
void castEncode(const float* x, size_t n, uint16_t* out, bool bf16, cudaStream_t s);
void castDecode(const uint16_t* in, size_t n, float* out, float alpha, bool add, bool bf16,
                cudaStream_t s);

// Deterministic sums in format.h's order. kind: 0 = |x|, 1 = x*x, 2 = onebit
// (a: negatives, b: non-negatives, negCount: count of negatives, atomically).
void chunkSums(const float* x, size_t n, int kind, float* a, float* b,
               unsigned long long* negCount, cudaStream_t s);
// Sign bits (1 = x < 0), LSB first; writes bitBytes(n) bytes.
void signBits(const float* x, size_t n, uint8_t* bits, cudaStream_t s);
// Writes the payload scalars from chunk sums: kind 0: mean |x| (n), kind 1:
// sqrt(sum), kind 2: negMean, posMean.
void finalizeScalars(const float* a, const float* b, size_t nChunks,
                     const unsigned long long* negCount, size_t n, int kind, float* out,
                     cudaStream_t s);
// out = alpha * (bit ? neg : pos) (+ out). mode 0: +-1; 1: scales[0] is the
// magnitude; 2: scales = {negMean, posMean}.
void expandBits(const uint8_t* bits, size_t n, const float* scales, int mode, float alpha,
                bool add, float* out, cudaStream_t s);

// QSGD.
void qsgdEncode(const float* x, size_t n, const float* norm, unsigned levels, uint64_t seed,
                uint8_t* codes, cudaStream_t s);
// Sets *bad = 1 when a code's level exceeds levels or padding bits are set.
void qsgdValidate(const uint8_t* codes, size_t n, unsigned levels, int* bad, cudaStream_t s);
void qsgdDecode(const uint8_t* codes, size_t n, const float* norm, unsigned levels, float alpha,
                bool add, float* out, cudaStream_t s);

// top-k / DGC: exactly the k largest |x|, ties to the lower index, indices
// ascending, written to idx and the values to val. sampleCount 0 (or a small
// n) sorts all keys; otherwise a sampled threshold first bounds the
// candidates, which are never zeros: when fewer than k pass it, every non-zero
// is a candidate, and when fewer than k are non-zero (a re-encoded sparse sum)
// the rest are the lowest-index zeros, as on the CPU. Synchronizes the stream
// (the candidate counts).
void topkSelect(const float* x, size_t n, size_t k, size_t sampleCount, uint32_t* idx,
                float* val, cudaStream_t s);
// Sets *bad = 1 when an index is >= n.
void sparseValidate(const uint32_t* idx, size_t k, size_t n, int* bad, cudaStream_t s);
// out[idx] += alpha * val (atomic: duplicates add up); zero: out[idx] = 0.
void sparseScatter(const uint32_t* idx, const float* val, size_t k, float alpha, bool zero,
                   float* out, cudaStream_t s);

// random-k with format.h's stratified indices.
void randomkEncode(const float* x, size_t n, size_t k, uint64_t seed, float* val, cudaStream_t s);
void randomkScatter(const float* val, size_t n, size_t k, uint64_t seed, bool unbiased,
                    float alpha, bool zero, float* out, cudaStream_t s);

// Element-wise helpers for error feedback.
void scaleFill(float* out, size_t n, float v, cudaStream_t s);
void addInto(float* e, const float* g, size_t n, cudaStream_t s);
void momentumStep(float* u, float* v, const float* g, float m, size_t n, cudaStream_t s);

}  // namespace cortado::compressor::cuda::kern
