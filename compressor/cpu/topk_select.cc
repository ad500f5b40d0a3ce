#include "compressor/cpu/topk_select.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "compressor/cpu/kernels.h"
#include "compressor/format.h"
#include "core/common/thread_pool.h"

namespace cortado::compressor::cpu {
namespace {

constexpr uint32_t kAbs = 0x7fffffffu;
constexpr uint32_t kNoBar = kAbs;  // no key is above it (keys are <= 2^31 - 1)

inline uint32_t load32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }

// A growable u32 array that is not zero-filled.
struct Buf {
  std::unique_ptr<uint32_t[]> p;
  size_t cap = 0;
  // Capacity for `want` elements, keeping the first `used`.
  void reserve(size_t want, size_t used) {
    if (want <= cap) return;
    size_t c = std::max(want, cap + cap / 2);
    std::unique_ptr<uint32_t[]> q(new uint32_t[c]);
    if (used) std::memcpy(q.get(), p.get(), 4 * used);
    p = std::move(q);
    cap = c;
  }
  void release() {
    p.reset();
    cap = 0;
  }
};

// Candidates of one slice of the tensor, in index order: index and raw
// bits; and the keys of those in the band (key <= hi) with the count of
// those above it (key > hi, kept for sure).
struct Part {
  Buf idx, val, band;
  size_t size = 0, bandSize = 0, sure = 0;
  void reserve(size_t want, size_t bandWant) {
    idx.reserve(want, size);
    val.reserve(want, size);
    band.reserve(bandWant, bandSize);
  }
};

// The calling thread keeps its arrays between calls (a fresh 10 MB
// allocation page-faults on every touch), up to kKeepElements in all.
constexpr size_t kKeepElements = size_t{16} << 20;  // 64 MiB

struct Scratch {
  std::vector<Part> parts;
  Buf band;
  void trim() {
    size_t kept = band.cap;
    for (auto& p : parts) kept += p.idx.cap + p.val.cap + p.band.cap;
    if (kept <= kKeepElements) return;
    for (auto& p : parts) {
      p.idx.release();
      p.val.release();
      p.band.release();
    }
    band.release();
  }
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

SelectIsa bestIsa() { return hasAvx2() ? SelectIsa::kAvx2 : SelectIsa::kScalar; }
std::atomic<SelectIsa>& isaSlot() {
  static std::atomic<SelectIsa> isa{bestIsa()};
  return isa;
}

// Slack that a scan may write past its count: a whole group of 32.
constexpr size_t kSlack = 32;

// The updated value of element i, nothing stored (the sample's).
uint32_t updatedBits(const FeedbackUpdate& up, size_t i) {
  float v = up.u ? up.e[i] + (up.m * up.u[i] + up.g[i]) : up.e[i] + up.g[i];
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

// `up` (when not null) is applied to each group of elements before the
// group is read: x is up.e.
void scanScalar(const std::byte* x, size_t begin, size_t end, uint32_t thr, uint32_t hi, Part& out,
                const FeedbackUpdate* up) {
  for (size_t i = begin; i < end; i += kSlack) {
    out.reserve(out.size + kSlack, out.bandSize + kSlack);
    size_t e = std::min(end, i + kSlack), s = out.size, nb = out.bandSize, sure = out.sure;
    if (up) applyUpdate(*up, i, e);
    for (size_t j = i; j < e; ++j) {
      uint32_t v = load32(x + 4 * j), key = v & kAbs;
      bool in = key >= thr, above = key > hi;
      out.idx.p[s] = static_cast<uint32_t>(j);
      out.val.p[s] = v;
      out.band.p[nb] = key;
      s += in;
      nb += in && !above;
      sure += above;
    }
    out.size = s;
    out.bandSize = nb;
    out.sure = sure;
  }
}

// For each 8-bit mask, the lanes whose bit is set, packed to the front (one
// byte each): the permutation that left-packs 8 lanes.
constexpr std::array<uint64_t, 256> makePackTable() {
  std::array<uint64_t, 256> t{};
  for (int m = 0; m < 256; ++m) {
    uint64_t v = 0;
    int o = 0;
    for (int lane = 0; lane < 8; ++lane)
      if (m & (1 << lane)) v |= static_cast<uint64_t>(lane) << (8 * o++);
    t[m] = v;
  }
  return t;
}
constexpr std::array<uint64_t, 256> kPack = makePackTable();

__attribute__((target("avx2,popcnt"))) inline __m256i packPerm(uint32_t mask) {
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kPack[mask])));
}

// applyUpdate over the 32 elements from i: the same products and sums,
// rounded the same way (no fused multiply-add), eight lanes at a time.
__attribute__((target("avx2,popcnt"))) inline void updateAvx2(const FeedbackUpdate& up, size_t i) {
  const __m256 m = _mm256_set1_ps(up.m);
  for (size_t j = i; j < i + 32; j += 8) {
    __m256 add = _mm256_loadu_ps(up.g + j);
    if (up.u) {
      add = _mm256_add_ps(_mm256_mul_ps(m, _mm256_loadu_ps(up.u + j)), add);
      _mm256_storeu_ps(up.u + j, add);
    }
    _mm256_storeu_ps(up.e + j, _mm256_add_ps(_mm256_loadu_ps(up.e + j), add));
  }
}

__attribute__((target("avx2,popcnt"))) void scanAvx2(const std::byte* x, size_t begin, size_t end,
                                                     uint32_t thr, uint32_t hi, Part& out,
                                                     const FeedbackUpdate* up) {
  // Keys are < 2^31, so a signed compare against thr - 1 is key >= thr.
  const __m256i t = _mm256_set1_epi32(static_cast<int32_t>(thr) - 1);
  const __m256i h = _mm256_set1_epi32(static_cast<int32_t>(hi));
  const __m256i absMask = _mm256_set1_epi32(static_cast<int32_t>(kAbs));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  size_t i = begin;
  for (; i + 32 <= end; i += 32) {
    if (up) updateAvx2(*up, i);  // the group is in L1 for the test below
    // Masks only here (keeping the vectors across the test spilled them to
    // the stack); the packing below reloads the group from L1.
    uint32_t m[4], any = 0;
    for (int q = 0; q < 4; ++q) {
      __m256i key = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 4 * (i + 8 * q))), absMask);
      m[q] = static_cast<uint32_t>(
          _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, t))));
      any |= m[q];
    }
    if (!any) continue;  // sparse selections skip most groups here
    out.reserve(out.size + kSlack, out.bandSize + kSlack);
    uint32_t* idx = out.idx.p.get();
    uint32_t* val = out.val.p.get();
    uint32_t* band = out.band.p.get();
    size_t s = out.size, nb = out.bandSize, sure = out.sure;
    for (int q = 0; q < 4; ++q) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 4 * (i + 8 * q)));
      __m256i key = _mm256_and_si256(v, absMask);
      uint32_t above = static_cast<uint32_t>(
          _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, h))));
      uint32_t inBand = m[q] & ~above;
      __m256i perm = packPerm(m[q]);
      __m256i ids = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(i + 8 * q)), lanes);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + s),
                          _mm256_permutevar8x32_epi32(ids, perm));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(val + s),
                          _mm256_permutevar8x32_epi32(v, perm));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(band + nb),
                          _mm256_permutevar8x32_epi32(key, packPerm(inBand)));
      s += static_cast<size_t>(__builtin_popcount(m[q]));
      nb += static_cast<size_t>(__builtin_popcount(inBand));
      sure += static_cast<size_t>(__builtin_popcount(above));
    }
    out.size = s;
    out.bandSize = nb;
    out.sure = sure;
  }
  scanScalar(x, i, end, thr, hi, out, up);
}

// Candidates with key >= thr into scratch().parts[0..numParts), each in index
// order, the parts in tensor order, with their band (key <= hi); scanned in
// parallel, each part applying `up` (if not null) to its range first.
// Returns numParts.
size_t collect(const std::byte* x, size_t n, uint32_t thr, uint32_t hi, size_t expected,
               ThreadPool* pool, const FeedbackUpdate* up) {
  auto& parts = scratch().parts;
  size_t numParts = pool && n >= (1 << 19) ? pool->size() + 1 : 1;
  if (parts.size() < numParts) parts.resize(numParts);
  size_t per = (n + numParts - 1) / numParts;
  size_t want = std::min(expected / numParts + expected / (4 * numParts), per) + 64 + kSlack;
  const SelectIsa isa = isaSlot().load(std::memory_order_relaxed);
  auto work = [&](size_t p) {
    size_t b = std::min(n, p * per), e = std::min(n, b + per);
    Part& part = parts[p];
    part.size = part.bandSize = part.sure = 0;
    part.reserve(want, want / 8 + kSlack);
    if (isa == SelectIsa::kAvx2)
      scanAvx2(x, b, e, thr, hi, part, up);
    else
      scanScalar(x, b, e, thr, hi, part, up);
  };
  if (numParts == 1)
    work(0);
  else
    pool->parallelFor(numParts, 1, [&](size_t b, size_t e) {
      for (size_t p = b; p < e; ++p) work(p);
    });
  return numParts;
}

void writeOut(std::byte* idxOut, std::byte* valOut, size_t o, uint32_t i, uint32_t v) {
  store32(idxOut + 4 * o, i);
  if (valOut) store32(valOut + 4 * o, v);
}

// Writes candidates c.. of a part with key > kth, and the first `ties` with
// key == kth, at out position o on, until k are written. Returns o.
size_t emitScalar(const Part& part, size_t c, uint32_t kth, size_t& ties, size_t o, size_t k,
                  std::byte* idxOut, std::byte* valOut) {
  const uint32_t* ids = part.idx.p.get();
  const uint32_t* v = part.val.p.get();
  for (size_t e = part.size; c < e && o < k; ++c) {
    uint32_t key = v[c] & kAbs;
    if (key > kth || (key == kth && ties > 0 && ties--))
      writeOut(idxOut, valOut, o++, ids[c], v[c]);
  }
  return o;
}

// The same, eight candidates at a time, left-packed straight into the
// output while eight more fit; groups holding a tie at kth go one by one.
__attribute__((target("avx2,popcnt"))) size_t emitAvx2(const Part& part, uint32_t kth, size_t& ties,
                                                       size_t o, size_t k, std::byte* idxOut,
                                                       std::byte* valOut) {
  const uint32_t* ids = part.idx.p.get();
  const uint32_t* val = part.val.p.get();
  const __m256i kv = _mm256_set1_epi32(static_cast<int32_t>(kth));
  const __m256i absMask = _mm256_set1_epi32(static_cast<int32_t>(kAbs));
  size_t c = 0;
  const size_t e = part.size;
  while (c + 8 <= e && o + 8 <= k) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(val + c));
    __m256i key = _mm256_and_si256(v, absMask);
    if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(key, kv)))) {
      size_t stop = c + 8;
      for (; c < stop && o < k; ++c) {
        uint32_t kc = val[c] & kAbs;
        if (kc > kth || (kc == kth && ties > 0 && ties--))
          writeOut(idxOut, valOut, o++, ids[c], val[c]);
      }
      continue;
    }
    // Keys and kth are < 2^31: the signed compare orders them.
    uint32_t gt =
        static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, kv))));
    __m256i perm = packPerm(gt);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idxOut + 4 * o),
                        _mm256_permutevar8x32_epi32(
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ids + c)), perm));
    if (valOut)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(valOut + 4 * o),
                          _mm256_permutevar8x32_epi32(v, perm));
    o += static_cast<size_t>(__builtin_popcount(gt));
    c += 8;
  }
  return emitScalar(part, c, kth, ties, o, k, idxOut, valOut);
}

// The r-th largest (r >= 1) of a[0..n), whose values lie in [lo, hi]; adds
// to *above how many of them are larger. A histogram of 2048 buckets over
// the value range finds the bucket that holds rank r; the bucket's values
// are moved to the front and the search narrows to them (three rounds at
// most for 31-bit keys), with nth_element once few are left. Overwrites a.
uint32_t selectRank(uint32_t* a, size_t n, size_t r, uint32_t lo, uint32_t hi, size_t* above) {
  constexpr int kBits = 11;
  std::array<uint32_t, size_t{1} << kBits> counts;
  for (;;) {
    if (n <= 4096) {
      std::nth_element(a, a + (r - 1), a + n, std::greater<>());
      uint32_t v = a[r - 1];
      for (size_t i = 0; i < n; ++i) *above += a[i] > v;
      return v;
    }
    uint32_t range = hi - lo;
    int width = range ? 32 - __builtin_clz(range) : 0;
    int shift = width > kBits ? width - kBits : 0;
    uint32_t top = range >> shift;
    std::fill_n(counts.begin(), top + 1, 0u);
    for (size_t i = 0; i < n; ++i) ++counts[(a[i] - lo) >> shift];
    uint32_t b = top;
    size_t acc = 0;
    while (acc + counts[b] < r) acc += counts[b--];
    *above += acc;
    r -= acc;
    uint32_t base = lo + (b << shift);
    if (shift == 0) return base;  // the bucket holds one value
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      a[m] = a[i];
      m += ((a[i] - lo) >> shift) == b;
    }
    n = m;
    lo = base;
    hi = std::min(hi, base + ((uint32_t{1} << shift) - 1));
  }
}

// x is up->e when up is not null: the first scan applies the update.
void select(const std::byte* x, size_t n, size_t k, size_t sampleCount, ThreadPool* pool,
            std::byte* idxOut, std::byte* valOut, const FeedbackUpdate* up) {
  constexpr size_t kRun = 16;
  const bool sampled = n > 4 * std::max<size_t>(sampleCount, 1) && n >= 1 << 16;
  if (up && (k == 0 || k >= n || !sampled)) {
    // No sample to take the bars from before the scan: update on its own.
    parallelAligned(pool, n, 64, [up](size_t b, size_t e) { applyUpdate(*up, b, e); });
    up = nullptr;
  }
  if (k == 0) return;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) store32(idxOut + 4 * i, static_cast<uint32_t>(i));
    if (valOut) std::memcpy(valOut, x, 4 * n);
    return;
  }
  // Sample whole cache lines (16 floats) at hashed places: cheaper than
  // scattered single elements, and hashing avoids aliasing with strides.
  std::vector<uint32_t> sample;
  if (sampled) {
    size_t runs = std::max<size_t>(1, sampleCount / kRun);
    sample.reserve(runs * kRun);
    size_t lines = n / kRun;
    // The lines miss the cache: ask for them a few runs ahead.
    constexpr size_t kAhead = 8;
    auto startOf = [&](size_t r) { return (format::hash2(0x5eed70b, r) % lines) * kRun; };
    auto fetch = [&](size_t at) {
      __builtin_prefetch(x + 4 * at);
      if (up) {
        __builtin_prefetch(up->g + at);
        if (up->u) __builtin_prefetch(up->u + at);
      }
    };
    for (size_t r = 0; r < std::min(runs, kAhead); ++r) fetch(startOf(r));
    for (size_t r = 0; r < runs; ++r) {
      if (r + kAhead < runs) {
        size_t ahead = startOf(r + kAhead);
        fetch(ahead);
        fetch(ahead + kRun - 1);
      }
      size_t start = startOf(r);
      for (size_t j = 0; j < kRun; ++j)
        sample.push_back((up ? updatedBits(*up, start + j) : load32(x + 4 * (start + j))) & kAbs);
    }
  }
  const size_t s = sample.size();
  // Two bars from the sample: `thr`, which a bit more than k elements reach
  // (mean plus three standard deviations of the binomial count, plus slack),
  // and `hi`, which a bit fewer than k exceed (mean minus as much). Every
  // key >= thr is a candidate; those above hi are surely kept, and only the
  // band between the bars needs a selection.
  double expect = sampled ? static_cast<double>(k) * s / n : 0;
  double spread = 3.0 * std::sqrt(expect) + 16.0;
  double rank = expect + spread;
  double hiRank = expect - spread;

  Scratch& sc = scratch();
  size_t numParts = 0, total = 0;
  uint32_t thr = 0, hi = kNoBar;
  for (bool first = true;; first = false) {
    thr = 0;
    hi = kNoBar;
    if (sampled && rank < static_cast<double>(s)) {
      auto r = static_cast<size_t>(rank);
      std::nth_element(sample.begin(), sample.begin() + r, sample.end(), std::greater<>());
      thr = sample[r];
      if (first && hiRank >= 0) {
        auto r2 = static_cast<size_t>(hiRank);
        std::nth_element(sample.begin(), sample.begin() + r2, sample.begin() + r, std::greater<>());
        hi = sample[r2];
      }
    }
    size_t expected = sampled ? static_cast<size_t>(rank * n / s) : n;
    if (thr == 0) {
      // The k-th magnitude may be zero (a sparse sum re-encoded: a few per
      // cent non-zero). Collect the non-zeros only; if fewer than k, the rest
      // are the lowest-index zeros.
      thr = 1;
      numParts = collect(x, n, thr, hi, expected, pool, up);
      up = nullptr;  // applied by that scan
      total = 0;
      for (size_t p = 0; p < numParts; ++p) total += sc.parts[p].size;
      if (total < k) {
        size_t zeros = k - total, o = 0;
        size_t p = 0, c = 0;
        for (size_t i = 0; o < k; ++i) {
          while (p < numParts && c == sc.parts[p].size) ++p, c = 0;
          if (p < numParts && sc.parts[p].idx.p[c] == i) {
            writeOut(idxOut, valOut, o++, static_cast<uint32_t>(i), sc.parts[p].val.p[c]);
            ++c;
          } else if (zeros > 0) {
            writeOut(idxOut, valOut, o++, static_cast<uint32_t>(i), load32(x + 4 * i));
            --zeros;
          }
        }
        sc.trim();
        return;
      }
      break;
    }
    numParts = collect(x, n, thr, hi, expected, pool, up);
    up = nullptr;  // applied by that scan; a rescan reads the updated values
    total = 0;
    for (size_t p = 0; p < numParts; ++p) total += sc.parts[p].size;
    if (total >= k) break;
    rank *= 4;  // the sample overshot: rare, lower the bar and rescan
  }

  // Every candidate's key is >= thr. `greater` of them are above the k-th
  // largest key `kth`; the other k - greater are the lowest-index ties at it.
  uint32_t kth = 0;  // exactly k candidates, all non-zero: keep every one
  size_t greater = k;
  if (total > k) {
    size_t sure = 0, nb = 0;
    for (size_t p = 0; p < numParts; ++p) sure += sc.parts[p].sure, nb += sc.parts[p].bandSize;
    uint32_t* band = sc.parts[0].band.p.get();
    if (numParts > 1) {
      sc.band.reserve(nb, 0);
      band = sc.band.p.get();
      for (size_t p = 0, o = 0; p < numParts; o += sc.parts[p].bandSize, ++p)
        std::copy_n(sc.parts[p].band.p.get(), sc.parts[p].bandSize, band + o);
    }
    size_t above = sure;
    for (size_t c = 0; c < nb; ++c) above += band[c] > thr;
    if (above < k) {
      // Few distinct magnitudes: fewer than k are above thr, so the k-th
      // magnitude is thr itself, and the ties at it fill the rest.
      kth = thr;
      greater = above;
    } else {
      uint32_t bandTop = hi;  // band keys lie in [thr, bandTop]
      if (sure >= k) {
        // The sample undershot at the top: select among every candidate.
        sc.band.reserve(total, 0);
        band = sc.band.p.get();
        nb = 0;
        for (size_t p = 0; p < numParts; ++p) {
          const uint32_t* v = sc.parts[p].val.p.get();
          for (size_t c = 0, e = sc.parts[p].size; c < e; ++c) band[nb++] = v[c] & kAbs;
        }
        sure = 0;
        bandTop = kAbs;
      }
      // The k-th largest key is the band's (k - sure)-th.
      greater = sure;
      kth = selectRank(band, nb, k - sure, thr, bandTop, &greater);
    }
  }
  size_t ties = k - greater, o = 0;
  const bool avx2 = isaSlot().load(std::memory_order_relaxed) == SelectIsa::kAvx2;
  for (size_t p = 0; p < numParts && o < k; ++p)
    o = avx2 ? emitAvx2(sc.parts[p], kth, ties, o, k, idxOut, valOut)
             : emitScalar(sc.parts[p], 0, kth, ties, o, k, idxOut, valOut);
  sc.trim();
}

}  // namespace

SelectIsa selectTopKIsa() { return isaSlot().load(); }

SelectIsa setSelectTopKIsa(SelectIsa isa) {
  SelectIsa use = std::min(isa, bestIsa());
  isaSlot().store(use);
  return use;
}

void selectTopK(const float* x, size_t n, size_t k, size_t sampleCount, ThreadPool* pool,
                uint32_t* indices) {
  select(reinterpret_cast<const std::byte*>(x), n, k, sampleCount, pool,
         reinterpret_cast<std::byte*>(indices), nullptr, nullptr);
}

void selectTopK(const std::byte* x, size_t n, size_t k, size_t sampleCount, ThreadPool* pool,
                std::byte* indices, std::byte* values) {
  select(x, n, k, sampleCount, pool, indices, values, nullptr);
}

void selectTopKUpdating(const FeedbackUpdate& up, size_t n, size_t k, size_t sampleCount,
                        ThreadPool* pool, std::byte* indices, std::byte* values) {
  select(reinterpret_cast<const std::byte*>(up.e), n, k, sampleCount, pool, indices, values, &up);
}

}  // namespace cortado::compressor::cpu
