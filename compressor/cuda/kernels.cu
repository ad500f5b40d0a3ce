// CUDA kernels of the GPU codecs. Every rule that decides payload bytes
// (rounding, summation order, random numbers, index selection) comes from
// format.h or mirrors the CPU code line for line, so CPU and GPU payloads of
// the deterministic codecs are byte-identical. Explicit __f*_rn intrinsics
// keep nvcc from contracting multiply-adds, which the CPU never does.
#include <cuda_fp16.h>
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "compressor/cuda/kernels.h"
#include "compressor/format.h"

namespace cortado::compressor::cuda::kern {

namespace fmt_ = ::cortado::compressor::format;

namespace {

constexpr int kThreads = 256;

unsigned blocksFor(size_t work) {
  return static_cast<unsigned>(std::max<size_t>(1, (work + kThreads - 1) / kThreads));
}

__device__ __forceinline__ uint32_t keyOf(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// ---- header and casts -------------------------------------------------------

__global__ void writeHeaderKernel(unsigned char* out, HeaderBytes h) {
  int i = threadIdx.x;
  if (i < 48) out[i] = h.b[i];
}

// fp16 with the bytes the CPU's F16C instruction produces: round to nearest
// even, overflow to inf, NaN quieted with its payload truncated.
__device__ __forceinline__ uint16_t toHalfBits(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>(((b >> 16) & 0x8000u) | 0x7e00u | ((b & 0x7fffffu) >> 13));
  return __half_as_ushort(__float2half_rn(f));
}

// bf16 exactly as cortado::floatToBf16.
__device__ __forceinline__ uint16_t toBf16Bits(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__global__ void castEncodeKernel(const float* x, size_t n, uint16_t* out, bool bf16) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = bf16 ? toBf16Bits(x[i]) : toHalfBits(x[i]);
}

__global__ void castDecodeKernel(const uint16_t* in, size_t n, float* out, float alpha, bool add,
                                 bool bf16) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float v = bf16 ? __uint_as_float(uint32_t(in[i]) << 16) : __half2float(__ushort_as_half(in[i]));
  v = __fmul_rn(alpha, v);
  out[i] = add ? __fadd_rn(out[i], v) : v;
}

// ---- deterministic sums -------------------------------------------------------

// One thread per (chunk, lane); the 8 lanes of a chunk sit in one warp and
// combine through shuffles in format::combineLanes' order.
__global__ void chunkSumsKernel(const float* x, size_t n, int kind, float* a, float* b,
                                unsigned long long* negCount) {
  size_t gid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  size_t chunk = gid / fmt_::kSumLanes;
  unsigned lane = gid % fmt_::kSumLanes;
  size_t begin = chunk * fmt_::kSumChunk;
  float accA = 0.0f, accB = 0.0f;
  unsigned long long neg = 0;
  if (begin < n) {
    size_t len = min(size_t(fmt_::kSumChunk), n - begin);
    for (size_t o = lane; o < len; o += fmt_::kSumLanes) {
      float v = x[begin + o];
      if (kind == 0) {
        accA = __fadd_rn(accA, fabsf(v));
      } else if (kind == 1) {
        accA = __fadd_rn(accA, __fmul_rn(v, v));
      } else {
        bool isNeg = v < 0.0f;
        accA = __fadd_rn(accA, isNeg ? v : 0.0f);
        accB = __fadd_rn(accB, isNeg ? 0.0f : v);
        neg += isNeg;
      }
    }
  }
  float la[8], lb[8];
  unsigned base = threadIdx.x & ~7u & 31u;
  for (int j = 0; j < 8; ++j) {
    la[j] = __shfl_sync(0xffffffffu, accA, base + j);
    lb[j] = __shfl_sync(0xffffffffu, accB, base + j);
  }
  if (kind == 2 && neg) atomicAdd(negCount, neg);
  if (lane == 0 && begin < n) {
    a[chunk] = fmt_::combineLanes(la);
    if (kind == 2) b[chunk] = fmt_::combineLanes(lb);
  }
}

// Group sums in double, one thread per group of 64 chunks.
__global__ void groupSumsKernel(const float* chunks, size_t nChunks, double* groups) {
  size_t g = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  size_t begin = g * fmt_::kSumGroup;
  if (begin >= nChunks) return;
  size_t end = min(nChunks, begin + fmt_::kSumGroup);
  double s = 0.0;
  for (size_t c = begin; c < end; ++c) s = __dadd_rn(s, double(chunks[c]));
  groups[g] = s;
}

__device__ double sumGroups(const double* groups, size_t nGroups) {
  double t = 0.0;
  for (size_t g = 0; g < nGroups; ++g) t = __dadd_rn(t, groups[g]);
  return t;
}

__global__ void finalizeKernel(const double* ga, const double* gb, size_t nGroups,
                               const unsigned long long* negCount, size_t n, int kind,
                               float* out) {
  if (kind == 0) {
    out[0] = n ? float(sumGroups(ga, nGroups) / double(n)) : 0.0f;
  } else if (kind == 1) {
    out[0] = float(sqrt(sumGroups(ga, nGroups)));
  } else {
    unsigned long long neg = *negCount, pos = n - neg;
    out[0] = neg ? float(sumGroups(ga, nGroups) / double(neg)) : 0.0f;
    out[1] = pos ? float(sumGroups(gb, nGroups) / double(pos)) : 0.0f;
  }
}

// ---- sign bits ------------------------------------------------------------------

__global__ void signBitsKernel(const float* x, size_t n, uint8_t* bits) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  bool neg = i < n && x[i] < 0.0f;
  unsigned word = __ballot_sync(0xffffffffu, neg);
  unsigned lane = threadIdx.x & 31u;
  if ((lane & 7u) == 0 && i < n) bits[i / 8] = static_cast<uint8_t>(word >> lane);
}

__global__ void expandBitsKernel(const uint8_t* bits, size_t n, const float* scales, int mode,
                                 float alpha, bool add, float* out) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float neg = -1.0f, pos = 1.0f;
  if (mode == 1) {
    pos = scales[0];
    neg = -pos;
  } else if (mode == 2) {
    neg = scales[0];
    pos = scales[1];
  }
  float v = __fmul_rn(alpha, ((bits[i / 8] >> (i % 8)) & 1) ? neg : pos);
  out[i] = add ? __fadd_rn(out[i], v) : v;
}

// ---- QSGD -----------------------------------------------------------------------

// One thread per output byte; the code of element i exactly as the CPU's.
__global__ void qsgdEncodeKernel(const float* x, size_t n, const float* normPtr, unsigned levels,
                                 uint64_t seed, uint8_t* codes, size_t nBytes) {
  size_t byteIdx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (byteIdx >= nBytes) return;
  const unsigned bits = fmt_::qsgdBits(levels), perByte = 8 / bits;
  const float norm = *normPtr;
  const bool quantize = norm > 0.0f && isfinite(norm);
  const float s = float(levels);
  unsigned byte = 0;
  for (unsigned e = 0; e < perByte; ++e) {
    size_t i = byteIdx * perByte + e;
    if (i >= n) break;
    unsigned code = 0;
    if (quantize) {
      float r = __fmul_rn(__fdiv_rn(fabsf(x[i]), norm), s);
      float l = floorf(r);
      unsigned level = unsigned(l) + (fmt_::uniform01(fmt_::hash2(seed, i)) < __fsub_rn(r, l) ? 1u : 0u);
      level = level > levels ? levels : level;
      code = level | (unsigned(x[i] < 0.0f) << (bits - 1));
    }
    byte |= code << (e * bits);
  }
  codes[byteIdx] = static_cast<uint8_t>(byte);
}

__device__ __forceinline__ unsigned qsgdCode(const uint8_t* codes, size_t i, unsigned bits) {
  if (bits == 8) return codes[i];
  size_t bit = i * bits;
  return (codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
}

__global__ void qsgdValidateKernel(const uint8_t* codes, size_t n, unsigned levels, int* bad) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const unsigned bits = fmt_::qsgdBits(levels);
  if (i < n && (qsgdCode(codes, i, bits) & ((1u << (bits - 1)) - 1)) > levels) atomicExch(bad, 1);
  if (i == 0) {
    size_t used = n * bits;
    if (used % 8 && (codes[used / 8] >> (used % 8)) != 0) atomicExch(bad, 1);
  }
}

__global__ void qsgdDecodeKernel(const uint8_t* codes, size_t n, const float* normPtr,
                                 unsigned levels, float alpha, bool add, float* out) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const unsigned bits = fmt_::qsgdBits(levels), signBit = 1u << (bits - 1);
  unsigned c = qsgdCode(codes, i, bits);
  float mag = __fmul_rn(*normPtr, __fdiv_rn(float(c & (signBit - 1)), float(levels)));
  float v = __fmul_rn(alpha, (c & signBit) ? -mag : mag);
  out[i] = add ? __fadd_rn(out[i], v) : v;
}

// ---- sparse -------------------------------------------------------------------------

__global__ void keysKernel(const float* x, size_t n, uint32_t* keys, uint32_t* idx) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  keys[i] = keyOf(x[i]);
  idx[i] = static_cast<uint32_t>(i);
}

__global__ void gatherKeysKernel(const float* x, const uint32_t* idx, size_t m, uint32_t* keys) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < m) keys[i] = keyOf(x[idx[i]]);
}

__global__ void sampleKeysKernel(const float* x, size_t n, size_t s, uint32_t* keys) {
  size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (j < s) keys[j] = keyOf(x[j * n / s]);
}

__global__ void gatherValuesKernel(const float* x, const uint32_t* idx, size_t k, float* val) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < k) val[i] = x[idx[i]];
}

// Candidates: keys at or above the sampled threshold, and never zeros (a
// zero threshold, on sparse input, would make every element a candidate).
struct AtLeast {
  const float* x;
  const uint32_t* thr;
  __device__ bool operator()(uint32_t i) const { return keyOf(x[i]) >= max(*thr, 1u); }
};
struct IsZero {
  const float* x;
  __device__ bool operator()(uint32_t i) const { return keyOf(x[i]) == 0; }
};

// Indices i < n whose element satisfies `pred`, in index order, into out;
// returns how many (synchronizes the stream).
template <typename Pred>
size_t selectIndices(size_t n, Pred pred, uint32_t* out, cudaStream_t s);

__global__ void validateKernel(const uint32_t* idx, size_t k, size_t n, int* bad) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < k && idx[i] >= n) atomicExch(bad, 1);
}

__global__ void scatterKernel(const uint32_t* idx, const float* val, size_t k, float alpha,
                              bool zero, float* out) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= k) return;
  if (zero)
    out[idx[i]] = 0.0f;
  else
    atomicAdd(out + idx[i], __fmul_rn(alpha, val[i]));
}

__global__ void randomkEncodeKernel(const float* x, size_t n, size_t k, uint64_t seed,
                                    float* val) {
  size_t b = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (b >= k) return;
  uint64_t size;
  val[b] = x[fmt_::randomKIndex(seed, b, n, k, &size)];
}

__global__ void randomkScatterKernel(const float* val, size_t n, size_t k, uint64_t seed,
                                     bool unbiased, float alpha, bool zero, float* out) {
  size_t b = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (b >= k) return;
  uint64_t size;
  uint64_t i = fmt_::randomKIndex(seed, b, n, k, &size);
  if (zero) {
    out[i] = 0.0f;
    return;
  }
  // Indices are distinct (one per block): no atomics needed.
  float scale = unbiased ? float(size) : 1.0f;
  out[i] = __fadd_rn(out[i], __fmul_rn(__fmul_rn(alpha, scale), val[b]));
}

// ---- element-wise --------------------------------------------------------------------

__global__ void fillKernel(float* out, size_t n, float v) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = v;
}
__global__ void addKernel(float* e, const float* g, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) e[i] = __fadd_rn(e[i], g[i]);
}
__global__ void momentumKernel(float* u, float* v, const float* g, float m, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float ui = __fadd_rn(__fmul_rn(m, u[i]), g[i]);
  u[i] = ui;
  v[i] = __fadd_rn(v[i], ui);
}

// Stream-ordered scratch memory, freed when it goes out of scope.
template <typename T>
struct Scratch {
  T* p = nullptr;
  cudaStream_t s;
  Scratch(size_t n, cudaStream_t stream) : s(stream) {
    if (n) cudaMallocAsync(reinterpret_cast<void**>(&p), n * sizeof(T), s);
  }
  ~Scratch() {
    if (p) cudaFreeAsync(p, s);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

template <typename Pred>
size_t selectIndices(size_t n, Pred pred, uint32_t* out, cudaStream_t s) {
  Scratch<int64_t> count(1, s);
  thrust::counting_iterator<uint32_t> first(0);
  size_t bytes = 0;
  cub::DeviceSelect::If(nullptr, bytes, first, out, count.p, static_cast<int64_t>(n), pred, s);
  Scratch<unsigned char> tmp(bytes, s);
  cub::DeviceSelect::If(tmp.p, bytes, first, out, count.p, static_cast<int64_t>(n), pred, s);
  int64_t m = 0;
  cudaMemcpyAsync(&m, count.p, sizeof(m), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  return static_cast<size_t>(m);
}

// Sorts (keys, idx) by key descending, stably: equal keys keep index order.
void sortDescending(uint32_t* keysIn, uint32_t* idxIn, uint32_t* keysOut, uint32_t* idxOut,
                    size_t m, cudaStream_t s) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, keysIn, keysOut, idxIn, idxOut,
                                            static_cast<int64_t>(m), 0, 31, s);
  Scratch<unsigned char> tmp(bytes, s);
  cub::DeviceRadixSort::SortPairsDescending(tmp.p, bytes, keysIn, keysOut, idxIn, idxOut,
                                            static_cast<int64_t>(m), 0, 31, s);
}

// The first k of a descending (key, idx) order, re-sorted by index, gathered.
void finishTopK(const float* x, const uint32_t* idxDesc, size_t k, uint32_t* idx, float* val,
                cudaStream_t s) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortKeys(nullptr, bytes, idxDesc, idx, static_cast<int64_t>(k), 0, 32, s);
  Scratch<unsigned char> tmp(bytes, s);
  cub::DeviceRadixSort::SortKeys(tmp.p, bytes, idxDesc, idx, static_cast<int64_t>(k), 0, 32, s);
  gatherValuesKernel<<<blocksFor(k), kThreads, 0, s>>>(x, idx, k, val);
}

}  // namespace

void writeHeader(unsigned char* out, HeaderBytes h, cudaStream_t s) {
  writeHeaderKernel<<<1, 64, 0, s>>>(out, h);
}

void castEncode(const float* x, size_t n, uint16_t* out, bool bf16, cudaStream_t s) {
  if (n) castEncodeKernel<<<blocksFor(n), kThreads, 0, s>>>(x, n, out, bf16);
}

void castDecode(const uint16_t* in, size_t n, float* out, float alpha, bool add, bool bf16,
                cudaStream_t s) {
  if (n) castDecodeKernel<<<blocksFor(n), kThreads, 0, s>>>(in, n, out, alpha, add, bf16);
}

void chunkSums(const float* x, size_t n, int kind, float* a, float* b,
               unsigned long long* negCount, cudaStream_t s) {
  size_t chunks = (n + fmt_::kSumChunk - 1) / fmt_::kSumChunk;
  if (chunks) chunkSumsKernel<<<blocksFor(chunks * 8), kThreads, 0, s>>>(x, n, kind, a, b, negCount);
}

void signBits(const float* x, size_t n, uint8_t* bits, cudaStream_t s) {
  if (n) signBitsKernel<<<blocksFor(n), kThreads, 0, s>>>(x, n, bits);
}

void finalizeScalars(const float* a, const float* b, size_t nChunks,
                     const unsigned long long* negCount, size_t n, int kind, float* out,
                     cudaStream_t s) {
  size_t groups = (nChunks + fmt_::kSumGroup - 1) / fmt_::kSumGroup;
  Scratch<double> ga(groups, s), gb(kind == 2 ? groups : 0, s);
  if (groups) {
    groupSumsKernel<<<blocksFor(groups), kThreads, 0, s>>>(a, nChunks, ga.p);
    if (kind == 2) groupSumsKernel<<<blocksFor(groups), kThreads, 0, s>>>(b, nChunks, gb.p);
  }
  finalizeKernel<<<1, 1, 0, s>>>(ga.p, gb.p, groups, negCount, n, kind, out);
}

void expandBits(const uint8_t* bits, size_t n, const float* scales, int mode, float alpha,
                bool add, float* out, cudaStream_t s) {
  if (n) expandBitsKernel<<<blocksFor(n), kThreads, 0, s>>>(bits, n, scales, mode, alpha, add, out);
}

void qsgdEncode(const float* x, size_t n, const float* norm, unsigned levels, uint64_t seed,
                uint8_t* codes, cudaStream_t s) {
  size_t bytes = (n * fmt_::qsgdBits(levels) + 7) / 8;
  if (bytes)
    qsgdEncodeKernel<<<blocksFor(bytes), kThreads, 0, s>>>(x, n, norm, levels, seed, codes, bytes);
}

void qsgdValidate(const uint8_t* codes, size_t n, unsigned levels, int* bad, cudaStream_t s) {
  if (n) qsgdValidateKernel<<<blocksFor(n), kThreads, 0, s>>>(codes, n, levels, bad);
}

void qsgdDecode(const uint8_t* codes, size_t n, const float* norm, unsigned levels, float alpha,
                bool add, float* out, cudaStream_t s) {
  if (n) qsgdDecodeKernel<<<blocksFor(n), kThreads, 0, s>>>(codes, n, norm, levels, alpha, add, out);
}

void topkSelect(const float* x, size_t n, size_t k, size_t sampleCount, uint32_t* idx,
                float* val, cudaStream_t s) {
  if (k == 0) return;
  if (sampleCount > 0 && n > 4 * sampleCount && n >= (1u << 16)) {
    // A threshold from a strided sample, then the non-zero candidates above
    // it in index order, and an exact selection among them.
    size_t smp = sampleCount;
    double expect = double(k) * smp / n;
    auto rank = static_cast<size_t>(expect + 3.0 * std::sqrt(expect) + 16.0);
    if (rank < smp) {
      Scratch<uint32_t> sk(smp, s), skSorted(smp, s);
      sampleKeysKernel<<<blocksFor(smp), kThreads, 0, s>>>(x, n, smp, sk.p);
      size_t bytes = 0;
      cub::DeviceRadixSort::SortKeysDescending(nullptr, bytes, sk.p, skSorted.p,
                                               static_cast<int64_t>(smp), 0, 31, s);
      Scratch<unsigned char> tmp(bytes, s);
      cub::DeviceRadixSort::SortKeysDescending(tmp.p, bytes, sk.p, skSorted.p,
                                               static_cast<int64_t>(smp), 0, 31, s);
      const uint32_t* thr = skSorted.p + rank;
      Scratch<uint32_t> cand(n, s);
      size_t m = selectIndices(n, AtLeast{x, thr}, cand.p, s);
      if (m < k) {
        // The sample overshot, or fewer than k elements are non-zero (a
        // sparse sum re-encoded): every non-zero is a candidate.
        uint32_t one = 1;
        Scratch<uint32_t> bar(1, s);
        cudaMemcpyAsync(bar.p, &one, sizeof one, cudaMemcpyHostToDevice, s);
        m = selectIndices(n, AtLeast{x, bar.p}, cand.p, s);
        if (m < k) {
          // Every non-zero, then the lowest-index zeros (ties go to the
          // lower index), as the CPU codec does.
          Scratch<uint32_t> zeros(n, s);
          selectIndices(n, IsZero{x}, zeros.p, s);
          cudaMemcpyAsync(cand.p + m, zeros.p, (k - m) * sizeof(uint32_t), cudaMemcpyDeviceToDevice, s);
          finishTopK(x, cand.p, k, idx, val, s);
          return;
        }
      }
      Scratch<uint32_t> keys(m, s), keysOut(m, s), idxOut(m, s);
      gatherKeysKernel<<<blocksFor(m), kThreads, 0, s>>>(x, cand.p, m, keys.p);
      sortDescending(keys.p, cand.p, keysOut.p, idxOut.p, m, s);
      finishTopK(x, idxOut.p, k, idx, val, s);
      return;
    }
  }
  Scratch<uint32_t> keys(n, s), ids(n, s), keysOut(n, s), idsOut(n, s);
  keysKernel<<<blocksFor(n), kThreads, 0, s>>>(x, n, keys.p, ids.p);
  sortDescending(keys.p, ids.p, keysOut.p, idsOut.p, n, s);
  finishTopK(x, idsOut.p, k, idx, val, s);
}

void sparseValidate(const uint32_t* idx, size_t k, size_t n, int* bad, cudaStream_t s) {
  if (k) validateKernel<<<blocksFor(k), kThreads, 0, s>>>(idx, k, n, bad);
}

void sparseScatter(const uint32_t* idx, const float* val, size_t k, float alpha, bool zero,
                   float* out, cudaStream_t s) {
  if (k) scatterKernel<<<blocksFor(k), kThreads, 0, s>>>(idx, val, k, alpha, zero, out);
}

void randomkEncode(const float* x, size_t n, size_t k, uint64_t seed, float* val, cudaStream_t s) {
  if (k) randomkEncodeKernel<<<blocksFor(k), kThreads, 0, s>>>(x, n, k, seed, val);
}

void randomkScatter(const float* val, size_t n, size_t k, uint64_t seed, bool unbiased,
                    float alpha, bool zero, float* out, cudaStream_t s) {
  if (k)
    randomkScatterKernel<<<blocksFor(k), kThreads, 0, s>>>(val, n, k, seed, unbiased, alpha, zero,
                                                           out);
}

void scaleFill(float* out, size_t n, float v, cudaStream_t s) {
  if (n) fillKernel<<<blocksFor(n), kThreads, 0, s>>>(out, n, v);
}

void addInto(float* e, const float* g, size_t n, cudaStream_t s) {
  if (n) addKernel<<<blocksFor(n), kThreads, 0, s>>>(e, g, n);
}

void momentumStep(float* u, float* v, const float* g, float m, size_t n, cudaStream_t s) {
  if (n) momentumKernel<<<blocksFor(n), kThreads, 0, s>>>(u, v, g, m, n);
}

}  // namespace cortado::compressor::cuda::kern
