#include "compressor/cpu/topk_select.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "compressor/cpu/kernels.h"
#include "compressor/format.h"
#include "core/common/thread_pool.h"

namespace cortado::compressor::cpu {
namespace {

inline uint32_t keyOf(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b & 0x7fffffffu;
}

void scanScalar(const float* x, size_t begin, size_t end, uint32_t thr,
                std::vector<uint32_t>& out) {
  for (size_t i = begin; i < end; ++i)
    if (keyOf(x[i]) >= thr) out.push_back(static_cast<uint32_t>(i));
}

__attribute__((target("avx2"))) void scanAvx2(const float* x, size_t begin, size_t end,
                                              uint32_t thr, std::vector<uint32_t>& out) {
  // Keys are < 2^31, so a signed compare against thr - 1 is key >= thr.
  const __m256i t = _mm256_set1_epi32(static_cast<int32_t>(thr) - 1);
  const __m256i absMask = _mm256_set1_epi32(0x7fffffff);
  size_t i = begin;
  for (; i + 32 <= end; i += 32) {
    uint32_t mask = 0;
    for (int q = 0; q < 4; ++q) {
      __m256i k = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8 * q)), absMask);
      mask |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, t))))
              << (8 * q);
    }
    while (mask) {  // rare: only a few per cent of elements pass
      out.push_back(static_cast<uint32_t>(i + __builtin_ctz(mask)));
      mask &= mask - 1;
    }
  }
  scanScalar(x, i, end, thr, out);
}

// Candidates with key >= thr, in index order, scanned in parallel.
std::vector<uint32_t> collect(const float* x, size_t n, uint32_t thr, size_t expected,
                              ThreadPool* pool) {
  std::vector<std::vector<uint32_t>> parts;
  std::mutex mu;
  size_t numParts = pool && n >= (1 << 19) ? pool->size() + 1 : 1;
  parts.resize(numParts);
  size_t per = (n + numParts - 1) / numParts;
  auto work = [&](size_t p) {
    size_t b = p * per, e = std::min(n, b + per);
    auto& v = parts[p];
    v.reserve(expected / numParts + expected / (4 * numParts) + 64);
    if (hasAvx2())
      scanAvx2(x, b, e, thr, v);
    else
      scanScalar(x, b, e, thr, v);
  };
  if (numParts == 1)
    work(0);
  else
    pool->parallelFor(numParts, 1, [&](size_t b, size_t e) {
      for (size_t p = b; p < e; ++p) work(p);
    });
  size_t total = 0;
  for (auto& v : parts) total += v.size();
  if (numParts == 1) return std::move(parts[0]);
  std::vector<uint32_t> all;
  all.reserve(total);
  for (auto& v : parts) all.insert(all.end(), v.begin(), v.end());
  return all;
}

}  // namespace

void selectTopK(const float* x, size_t n, size_t k, size_t sampleCount, ThreadPool* pool,
                uint32_t* indices) {
  if (k == 0) return;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) indices[i] = static_cast<uint32_t>(i);
    return;
  }
  // Sample whole cache lines (16 floats) at hashed places: cheaper than
  // scattered single elements, and hashing avoids aliasing with strides.
  constexpr size_t kRun = 16;
  std::vector<uint32_t> sample;
  bool sampled = n > 4 * std::max<size_t>(sampleCount, 1) && n >= 1 << 16;
  if (sampled) {
    size_t runs = std::max<size_t>(1, sampleCount / kRun);
    sample.reserve(runs * kRun);
    size_t lines = n / kRun;
    for (size_t r = 0; r < runs; ++r) {
      size_t start = (format::hash2(0x5eed70b, r) % lines) * kRun;
      for (size_t j = 0; j < kRun; ++j) sample.push_back(keyOf(x[start + j]));
    }
  }
  const size_t s = sample.size();
  // Rank in the sample whose key a bit more than k elements reach: mean plus
  // three standard deviations of the binomial count, plus slack.
  double expect = sampled ? static_cast<double>(k) * s / n : 0;
  double rank = expect + 3.0 * std::sqrt(expect) + 16.0;

  std::vector<uint32_t> cand;
  uint32_t thr = 0;
  for (;;) {
    thr = 0;
    if (sampled && rank < static_cast<double>(s)) {
      auto r = static_cast<size_t>(rank);
      std::nth_element(sample.begin(), sample.begin() + r, sample.end(), std::greater<>());
      thr = sample[r];
    }
    if (thr == 0) {
      // The k-th magnitude may be zero (a sparse sum re-encoded: a few per
      // cent non-zero). Collect the non-zeros only; if fewer than k, the rest
      // are the lowest-index zeros. (Collecting key >= 0 took every element,
      // and sorting them made the re-encode of a 4x smaller chunk cost 2-3x
      // the first encode of the whole tensor, docs/benchmarks.md.)
      cand = collect(x, n, 1, sampled ? static_cast<size_t>(rank * n / s) : n, pool);
      if (cand.size() < k) {
        size_t zeros = k - cand.size(), o = 0, c = 0;
        for (size_t i = 0; o < k; ++i) {
          if (c < cand.size() && cand[c] == i)
            indices[o++] = cand[c++];
          else if (zeros > 0)
            indices[o++] = static_cast<uint32_t>(i), --zeros;
        }
        return;
      }
      break;
    }
    cand = collect(x, n, thr, static_cast<size_t>(rank * n / s), pool);
    if (cand.size() >= k) break;
    rank *= 4;  // the sample overshot: rare, lower the bar and rescan
  }
  if (cand.size() == k) {
    std::copy(cand.begin(), cand.end(), indices);
    return;
  }
  // Every key >= thr is a candidate. With few distinct magnitudes many of
  // them tie at thr itself (integer or quantized values): if fewer than k are
  // above it, the k-th magnitude is thr, and the result is every key above
  // it and the lowest-index ties, in one pass instead of a selection among
  // all the ties.
  std::vector<uint32_t> keys(cand.size());
  size_t above = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    keys[i] = keyOf(x[cand[i]]);
    above += keys[i] > thr;
  }
  if (above < k) {
    size_t ties = k - above, o = 0;
    for (size_t i = 0; i < cand.size(); ++i)
      if (keys[i] > thr || (keys[i] == thr && ties > 0 && ties--)) indices[o++] = cand[i];
    return;
  }
  // Exact k-th largest key among the candidates.
  std::vector<uint32_t> work(keys);
  std::nth_element(work.begin(), work.begin() + (k - 1), work.end(), std::greater<>());
  uint32_t kth = work[k - 1];
  size_t greater = 0;
  for (uint32_t key : keys) greater += key > kth;
  size_t ties = k - greater;  // taken from the lowest indices with key == kth
  size_t o = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    if (keys[i] > kth || (keys[i] == kth && ties > 0 && ties--)) indices[o++] = cand[i];
  }
}

}  // namespace cortado::compressor::cpu
