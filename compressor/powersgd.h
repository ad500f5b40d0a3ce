// PowerSGD (Vogels et al., 2019): a rank-r approximation M ~ P Q^T of a
// gradient matrix, from one power-iteration step warm-started from the last
// step's Q. Its two reductions are what make it summable: with every worker
// holding the same Q, P = M Q is linear in M, so P can be summed across
// workers; after orthonormalizing the summed P, Q = M^T P is linear in M too.
//
// A runtime drives the steps for one tensor (state: the shared Q):
//   PowerSgd ps(rows, cols, rank, seed);           // same seed on every worker
//   ps.computeP(m, p);          -> allreduce-sum p (first reduction)
//   ps.computeQ(m, p, q);       -> allreduce-sum q, divide by workers (second)
//   ps.decompress(p, q, out);   // out = P Q^T, the averaged approximation
// With error feedback, m = grad + e before computeP and e = m - out after
// decompress (each worker keeps its own e).
//
// The "powersgd" codec (registered by registerCpuCodecs) is the same
// approximation as a single self-contained payload (P and Q^T, Q drawn from
// the seed): usable where no collective is at hand, but such payloads are not
// summable; 1-D tensors (EncodeContext::rows == 0) travel uncompressed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cortado {
class ThreadPool;
}

namespace cortado::compressor {

class PowerSgd {
 public:
  // Q starts as uniform values in [-1, 1) drawn from seed: equal on all workers.
  PowerSgd(size_t rows, size_t cols, unsigned rank, uint64_t seed);

  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }
  unsigned rank() const { return rank_; }
  size_t pSize() const { return rows_ * rank_; }  // floats of P (rows x r, row-major)
  size_t qSize() const { return cols_ * rank_; }  // floats of Q^T (r x cols, row-major)

  // p = M Q. m is rows x cols row-major.
  void computeP(const float* m, float* p, ThreadPool* pool = nullptr) const;
  // Orthonormalizes the (summed) p's columns in place, then q = (M^T p)^T.
  void computeQ(const float* m, float* p, float* q, ThreadPool* pool = nullptr) const;
  // out = p q (rows x cols); q becomes the warm start of the next step.
  void decompress(const float* p, const float* q, float* out, ThreadPool* pool = nullptr);

  const std::vector<float>& q() const { return q_; }

  // The kernels, shared with the codec.
  static void multiplyMQ(const float* m, const float* qt, size_t rows, size_t cols, unsigned r,
                         float* p, ThreadPool* pool);
  static void multiplyMtP(const float* m, const float* p, size_t rows, size_t cols, unsigned r,
                          float* qt, ThreadPool* pool);
  // out = alpha * p qt (+ out when add).
  static void multiplyPQt(const float* p, const float* qt, size_t rows, size_t cols, unsigned r,
                          float alpha, bool add, float* out, ThreadPool* pool);
  static void orthonormalize(float* p, size_t rows, unsigned r);
  static void randomQ(uint64_t seed, size_t cols, unsigned r, float* qt);

 private:
  size_t rows_, cols_;
  unsigned rank_;
  std::vector<float> q_;
};

}  // namespace cortado::compressor
