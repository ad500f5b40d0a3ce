// The sparse pairs the Zen benchmarks push: `cortado bench sparse`
// (launcher/bench_sparse.cc) and bench/zen/zen_round_cpu. Header-only, so
// that the CPU tool needs nothing of the launcher's libraries.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace cortado::launcher {

struct Pairs {
  std::vector<uint32_t> index;
  std::vector<float> value;
};

// Worker r's non-zeros: index i with probability min(1, c / (i + 1)), c set
// for the density, so most fall among the first indices (Zipf-like: the
// head is shared by every worker, the tail mostly not). Values are small
// integers, so every sum is exact in any order.
inline Pairs skewedPairs(uint64_t n, double density, int rank, uint64_t seed) {
  const uint64_t step = std::max<uint64_t>(1, n / 20000);
  auto expected = [&](double c) {
    double s = 0;
    for (uint64_t i = 0; i < n; i += step) s += double(step) * std::min(1.0, c / double(i + 1));
    return s;
  };
  double lo = 0, hi = double(n);
  for (int it = 0; it < 60; ++it) {
    const double mid = (lo + hi) / 2;
    (expected(mid) < density * double(n) ? lo : hi) = mid;
  }
  std::mt19937_64 rng(seed * 7919 + uint64_t(rank));
  std::uniform_real_distribution<double> u(0, 1);
  Pairs p;
  for (uint64_t i = 0; i < n; ++i) {
    if (u(rng) < hi / double(i + 1)) {
      p.index.push_back(uint32_t(i));
      p.value.push_back(float(int(rng() % 7) + 1));
    }
  }
  return p;
}

}  // namespace cortado::launcher
