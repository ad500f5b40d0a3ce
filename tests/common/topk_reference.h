// Brute-force references for the tests of top-k and GraVAC in the plan
// executor (tests/core/executor_gravac_test.cc,
// tests/core/executor_gravac_sparse_test.cc): a sort, not the codec's
// selection, so that the tests compare the codec against something
// independent of it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace cortado::test {

// The k largest magnitudes of x, ties to the lower index; zeros elsewhere.
inline std::vector<float> topk(const std::vector<float>& x, size_t k) {
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  std::vector<float> out(x.size(), 0.0f);
  for (size_t j = 0; j < k && j < idx.size(); ++j) out[idx[j]] = x[idx[j]];
  return out;
}

// Elements that a compression ratio cf keeps of n: at least one.
inline size_t kept(size_t n, double cf) { return std::max<size_t>(1, size_t(double(n) / cf)); }

// Sum of squares, in double.
inline double energy(const std::vector<float>& x) {
  double e = 0;
  for (float v : x) e += double(v) * v;
  return e;
}

}  // namespace cortado::test
