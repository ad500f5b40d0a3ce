#include "compressor/zen/zen_scheme.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/common/error.h"

namespace cortado::compressor::zen {
namespace {

// 1, 2, 4, ... below n, then n.
std::vector<int> stageGroups(int n) {
  std::vector<int> g;
  for (int k = 1; k < n; k *= 2) g.push_back(k);
  g.push_back(n);
  return g;
}

std::string describe(const SparsityProfile& p) {
  std::string s = fmt::format("M={} n={} d={:.4g}% gamma{}:", p.numElements, p.workers,
                              100 * p.density, p.modelled ? " (modelled between 1 and n)" : "");
  for (size_t i = 0; i < p.groups.size(); ++i)
    s += fmt::format(" g({})={:.3f}", p.groups[i], p.gamma[i]);
  return s;
}

}  // namespace

const char* schemeName(Scheme s) {
  return s == Scheme::kBalancedParallelism ? "balanced parallelism" : "hierarchical centralization";
}

double SparsityProfile::gammaAt(int k) const {
  double g = gamma.empty() ? 1.0 : gamma.front();
  for (size_t i = 0; i < groups.size(); ++i)
    if (groups[i] <= k) g = gamma[i];
  return g;
}

SparsityProfile profileFromIndexSets(uint64_t numElements,
                                     const std::vector<std::vector<uint32_t>>& perWorker) {
  const int n = static_cast<int>(perWorker.size());
  CORTADO_ENFORCE(n >= 1 && numElements > 0, ErrorCode::kInvalidArgument,
                  "sparsity profile of {} workers over {} elements", n, numElements);
  SparsityProfile p;
  p.numElements = numElements;
  p.workers = n;
  double total = 0;
  for (const auto& s : perWorker) total += double(s.size());
  p.density = total / n / double(numElements);
  std::vector<uint64_t> bits((numElements + 63) / 64, 0);
  uint64_t unionSize = 0;
  int added = 0;
  for (int k : stageGroups(n)) {
    for (; added < k; ++added) {
      for (uint32_t i : perWorker[added]) {
        CORTADO_ENFORCE(i < numElements, ErrorCode::kInvalidArgument,
                        "sparsity profile: worker {} lists index {} of {} elements", added, i,
                        numElements);
        const uint64_t bit = uint64_t{1} << (i & 63);
        unionSize += (bits[i >> 6] & bit) == 0;
        bits[i >> 6] |= bit;
      }
    }
    p.groups.push_back(k);
    p.gamma.push_back(p.density > 0 ? double(unionSize) / double(numElements) / p.density : 1.0);
  }
  return p;
}

SparsityProfile profileFromUnion(uint64_t numElements, int workers, double density,
                                 double unionDensity) {
  CORTADO_ENFORCE(workers >= 1 && density >= 0 && unionDensity >= 0, ErrorCode::kInvalidArgument,
                  "sparsity profile of {} workers, density {}, union density {}", workers, density,
                  unionDensity);
  SparsityProfile p;
  p.numElements = numElements;
  p.workers = workers;
  p.density = density;
  p.modelled = true;
  // gamma(n) lies between 1 (all alike) and n (disjoint).
  const double gn = density > 0 ? std::clamp(unionDensity / density, 1.0, double(workers)) : 1.0;
  // Each worker holds a share f of the union: f = 1 / gn when each index of
  // the union sits on n f workers on average.
  const double f = 1.0 / gn;
  const double cover = [&] {
    double c = 1.0 - std::pow(1.0 - f, workers);
    return c > 0 ? c : 1.0;
  }();
  for (int k : stageGroups(workers)) {
    double g = k == 1 ? 1.0 : gn * (1.0 - std::pow(1.0 - f, k)) / cover;
    if (k == workers) g = gn;
    p.groups.push_back(k);
    p.gamma.push_back(std::clamp(g, 1.0, double(k)));
  }
  return p;
}

SparsityProfile profileFromOverlap(uint64_t numElements, int workers, double density,
                                   double overlap) {
  CORTADO_ENFORCE(workers >= 1 && density > 0 && density <= 1 && overlap >= density &&
                      overlap <= 1,
                  ErrorCode::kInvalidArgument,
                  "sparsity profile of {} workers, density {}, overlap {}: needs workers >= 1, "
                  "density in (0, 1] and overlap in [density, 1]",
                  workers, density, overlap);
  SparsityProfile p;
  p.numElements = numElements;
  p.workers = workers;
  p.density = density;
  p.modelled = true;
  for (int k : stageGroups(workers)) {
    // log1p/expm1: exact for small overlaps, where 1 - (1 - f)^k cancels.
    const double g = -std::expm1(double(k) * std::log1p(-overlap)) / overlap;
    p.groups.push_back(k);
    p.gamma.push_back(std::clamp(overlap >= 1 ? 1.0 : g, 1.0, double(k)));
  }
  return p;
}

double balancedParallelismSeconds(const SparsityProfile& p, double b) {
  const double n = p.workers;
  const double base = 2.0 * double(p.numElements) * p.density / b;
  return (n - 1) / n * (p.gammaAt(p.workers) + 1) * base;
}

double hierarchicalCentralizationSeconds(const SparsityProfile& p, double b) {
  const double base = 2.0 * double(p.numElements) * p.density / b;
  double t = 0;
  // ceil(log2 n) stages; stage i sends what 2^(i-1) workers summed.
  for (int k = 1; k < p.workers; k *= 2) t += p.gammaAt(k) * base;
  return t;
}

SchemeChoice chooseScheme(const SparsityProfile& p, double b) {
  CORTADO_ENFORCE(b > 0, ErrorCode::kInvalidArgument, "scheme choice at bandwidth {}", b);
  SchemeChoice c;
  c.bpSeconds = balancedParallelismSeconds(p, b);
  c.hcSeconds = hierarchicalCentralizationSeconds(p, b);
  c.scheme = c.hcSeconds < c.bpSeconds ? Scheme::kHierarchicalCentralization
                                       : Scheme::kBalancedParallelism;
  c.figures =
      fmt::format("{}; at {:.3g} GB/s: T_bp={:.4g} ms (eq. 1), T_hc={:.4g} ms (eq. 2): {}",
                  describe(p), b / 1e9, 1e3 * c.bpSeconds, 1e3 * c.hcSeconds, schemeName(c.scheme));
  return c;
}

CooList mergeSum(const CooList& a, const CooList& b) {
  CooList out;
  out.index.reserve(a.index.size() + b.index.size());
  out.value.reserve(a.index.size() + b.index.size());
  size_t i = 0, j = 0;
  auto emit = [&](uint32_t idx, float v) {
    if (v == 0.0f) return;
    out.index.push_back(idx);
    out.value.push_back(v);
  };
  while (i < a.index.size() || j < b.index.size()) {
    if (j == b.index.size() || (i < a.index.size() && a.index[i] < b.index[j])) {
      emit(a.index[i], a.value[i]);
      ++i;
    } else if (i == a.index.size() || b.index[j] < a.index[i]) {
      emit(b.index[j], b.value[j]);
      ++j;
    } else {
      emit(a.index[i], a.value[i] + b.value[j]);
      ++i, ++j;
    }
  }
  return out;
}

CooList hierarchicalCentralization(int rank, int size, CooList mine, const PairExchange& exchange,
                                   const HcOptions& options) {
  CORTADO_ENFORCE(size >= 1 && rank >= 0 && rank < size && mine.index.size() == mine.value.size(),
                  ErrorCode::kInvalidArgument,
                  "hierarchical centralization: rank {} of {} with {} indices and {} values", rank,
                  size, mine.index.size(), mine.value.size());
  // Ascending, duplicates summed: what mergeSum needs.
  {
    std::vector<size_t> order(mine.index.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return mine.index[x] < mine.index[y]; });
    CooList sorted;
    for (size_t k : order) {
      if (!sorted.index.empty() && sorted.index.back() == mine.index[k]) {
        sorted.value.back() += mine.value[k];
      } else {
        sorted.index.push_back(mine.index[k]);
        sorted.value.push_back(mine.value[k]);
      }
    }
    mine = CooList{};
    for (size_t k = 0; k < sorted.index.size(); ++k)
      if (sorted.value[k] != 0.0f) {
        mine.index.push_back(sorted.index[k]);
        mine.value.push_back(sorted.value[k]);
      }
  }
  int p = 1;
  while (p * 2 <= size) p *= 2;
  const bool folds = size > p;
  auto idle = [&] {
    if (options.everyStage) exchange(-1, CooList{});
  };
  if (options.stageSizes) *options.stageSizes = {mine.index.size()};
  if (rank >= p) {
    // Fold in: give the list to rank - p, take the result from it at the end.
    exchange(rank - p, mine);
    for (int mask = 1; mask < p; mask *= 2) idle();
    return exchange(rank - p, CooList{});
  }
  if (rank + p < size)
    mine = mergeSum(mine, exchange(rank + p, CooList{}));
  else if (folds)
    idle();
  for (int mask = 1; mask < p; mask *= 2) {
    mine = mergeSum(mine, exchange(rank ^ mask, mine));
    if (options.stageSizes) options.stageSizes->push_back(mine.index.size());
  }
  if (rank + p < size)
    exchange(rank + p, mine);
  else if (folds)
    idle();
  return mine;
}

std::vector<std::byte> encodeStageList(const CooList& list) {
  std::vector<std::byte> b(8 * list.index.size());
  if (!b.empty()) {
    std::memcpy(b.data(), list.index.data(), 4 * list.index.size());
    std::memcpy(b.data() + 4 * list.index.size(), list.value.data(), 4 * list.value.size());
  }
  return b;
}

CooList parseStageList(std::span<const std::byte> bytes, uint64_t numElements) {
  CORTADO_ENFORCE(bytes.size() % 8 == 0, ErrorCode::kProtocol,
                  "a list of {} bytes is not a whole number of (u32 index, f32 value) pairs: "
                  "truncated",
                  bytes.size());
  const size_t count = bytes.size() / 8;
  CooList l;
  l.index.resize(count);
  l.value.resize(count);
  if (count) {
    std::memcpy(l.index.data(), bytes.data(), count * 4);
    std::memcpy(l.value.data(), bytes.data() + count * 4, count * 4);
  }
  for (size_t i = 0; i < count; ++i) {
    CORTADO_ENFORCE(l.index[i] < numElements, ErrorCode::kProtocol,
                    "index {} at position {} is past the tensor's {} elements", l.index[i], i,
                    numElements);
    CORTADO_ENFORCE(i == 0 || l.index[i - 1] < l.index[i], ErrorCode::kProtocol,
                    "index {} at position {} after {}: not strictly ascending (a duplicate or "
                    "out of order)",
                    l.index[i], i, l.index[i - 1]);
  }
  return l;
}

int hierarchicalCentralizationStages(int size) {
  int p = 1, stages = 0;
  while (p * 2 <= size) p *= 2, ++stages;
  return stages + (size > p ? 2 : 0);
}

}  // namespace cortado::compressor::zen
