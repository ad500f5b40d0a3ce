#include "compressor/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "compressor/cpu/codec_base.h"
#include "compressor/cpu/cpu_codecs.h"
#include "compressor/cpu/kernels.h"
#include "compressor/format.h"
#include "core/common/error.h"
#include "core/common/thread_pool.h"

namespace cortado::compressor {

namespace {

// Rows (or columns) per task: enough work to pay for a hand-off.
void parallelRows(ThreadPool* pool, size_t count, size_t workPerItem,
                  const std::function<void(size_t, size_t)>& fn) {
  size_t minChunk = std::max<size_t>(1, (1 << 16) / std::max<size_t>(1, workPerItem));
  if (!pool || count < 2 * minChunk) return fn(0, count);
  pool->parallelFor(count, minChunk, fn);
}

}  // namespace

PowerSgd::PowerSgd(size_t rows, size_t cols, unsigned rank, uint64_t seed)
    : rows_(rows), cols_(cols), rank_(rank), q_(cols * rank) {
  CORTADO_ENFORCE(rows >= 1 && cols >= 1 && rank >= 1 && rank <= std::min(rows, cols),
                  ErrorCode::kInvalidArgument,
                  "powersgd: rank {} must be in [1, min(rows {}, cols {})]", rank, rows, cols);
  randomQ(seed, cols, rank, q_.data());
}

void PowerSgd::computeP(const float* m, float* p, ThreadPool* pool) const {
  multiplyMQ(m, q_.data(), rows_, cols_, rank_, p, pool);
}

void PowerSgd::computeQ(const float* m, float* p, float* q, ThreadPool* pool) const {
  orthonormalize(p, rows_, rank_);
  multiplyMtP(m, p, rows_, cols_, rank_, q, pool);
}

void PowerSgd::decompress(const float* p, const float* q, float* out, ThreadPool* pool) {
  multiplyPQt(p, q, rows_, cols_, rank_, 1.0f, false, out, pool);
  std::copy(q, q + qSize(), q_.begin());
}

void PowerSgd::randomQ(uint64_t seed, size_t cols, unsigned r, float* qt) {
  for (size_t i = 0; i < cols * r; ++i)
    qt[i] = 2.0f * format::uniform01(format::hash2(seed, i)) - 1.0f;
}

void PowerSgd::multiplyMQ(const float* m, const float* qt, size_t rows, size_t cols, unsigned r,
                          float* p, ThreadPool* pool) {
  // p[i][t] = dot(m row i, qt row t): both contiguous, so the dot vectorizes.
  parallelRows(pool, rows, cols * r, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      for (unsigned t = 0; t < r; ++t) {
        const float* a = m + i * cols;
        const float* q = qt + t * cols;
        float acc[8] = {0};
        size_t j = 0;
        for (; j + 8 <= cols; j += 8)
          for (int l = 0; l < 8; ++l) acc[l] += a[j + l] * q[j + l];
        float s = format::combineLanes(acc);
        for (; j < cols; ++j) s += a[j] * q[j];
        p[i * r + t] = s;
      }
  });
}

void PowerSgd::multiplyMtP(const float* m, const float* p, size_t rows, size_t cols, unsigned r,
                           float* qt, ThreadPool* pool) {
  // qt[t][j] = sum_i m[i][j] p[i][t]: axpy over contiguous rows of m; threads
  // split the columns so that no two write the same qt element.
  parallelRows(pool, cols, rows * r, [&](size_t b, size_t e) {
    for (unsigned t = 0; t < r; ++t) std::fill(qt + t * cols + b, qt + t * cols + e, 0.0f);
    for (size_t i = 0; i < rows; ++i)
      for (unsigned t = 0; t < r; ++t) {
        float w = p[i * r + t];
        const float* a = m + i * cols;
        float* q = qt + t * cols;
        for (size_t j = b; j < e; ++j) q[j] += w * a[j];
      }
  });
}

void PowerSgd::multiplyPQt(const float* p, const float* qt, size_t rows, size_t cols, unsigned r,
                           float alpha, bool add, float* out, ThreadPool* pool) {
  parallelRows(pool, rows, cols * r, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      float* o = out + i * cols;
      if (!add) std::fill(o, o + cols, 0.0f);
      for (unsigned t = 0; t < r; ++t) {
        float w = alpha * p[i * r + t];
        const float* q = qt + t * cols;
        for (size_t j = 0; j < cols; ++j) o[j] += w * q[j];
      }
    }
  });
}

void PowerSgd::orthonormalize(float* p, size_t rows, unsigned r) {
  // Modified Gram-Schmidt on the columns, accumulating in double; r is small
  // (1-8). Each column is orthogonalized twice ("twice is enough"): once
  // loses orthogonality when a column is nearly dependent on the earlier ones.
  // A column that collapses (M has lower rank than r) becomes zero rather than
  // normalized rounding noise, which would break P P^T M = M.
  auto norm2 = [&](unsigned t) {
    double s = 0;
    for (size_t i = 0; i < rows; ++i) s += double(p[i * r + t]) * p[i * r + t];
    return std::sqrt(s);
  };
  for (unsigned t = 0; t < r; ++t) {
    double before = norm2(t);
    for (int pass = 0; pass < 2; ++pass)
      for (unsigned u = 0; u < t; ++u) {
        double dot = 0;
        for (size_t i = 0; i < rows; ++i) dot += double(p[i * r + t]) * p[i * r + u];
        for (size_t i = 0; i < rows; ++i) p[i * r + t] -= static_cast<float>(dot) * p[i * r + u];
      }
    double norm = norm2(t);
    float inv = norm > 1e-30 && norm > 1e-5 * before ? static_cast<float>(1.0 / norm) : 0.0f;
    for (size_t i = 0; i < rows; ++i) p[i * r + t] *= inv;
  }
}

namespace cpu {
namespace {

inline constexpr uint8_t kPassThrough = 1;

class PowerSgdCodec final : public OnePassCodec<PowerSgdCodec> {
 public:
  PowerSgdCodec(std::string spec, unsigned rank, uint64_t seed)
      : OnePassCodec(CodecId::kPowerSgd, std::move(spec)), rank_(rank), seed_(seed) {}

  size_t payloadBytes(size_t n) const override { return kHeaderBytes + 4 * n; }
  size_t payloadBytes(size_t n, size_t rows) const override {
    Shape s = shape(n, rows);
    return kHeaderBytes + (s.rank ? format::powerSgdBody(s.rows, s.cols, s.rank) : 4 * n);
  }

  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    Shape s = shape(n, ctx.rows);
    size_t total = payloadBytes(n, ctx.rows);
    if (!s.rank) {
      std::byte* body = beginPayload(out, n, total, ctx, kPassThrough);
      std::memcpy(body, in, 4 * n);
      return total;
    }
    std::byte* body = beginPayload(out, n, total, ctx, 0, ctx.seed, s.rank,
                                   static_cast<uint32_t>(s.rows));
    std::vector<float> p(s.rows * s.rank), qt(s.cols * s.rank);
    PowerSgd::randomQ(format::hash2(seed_, ctx.seed), s.cols, s.rank, qt.data());
    PowerSgd::multiplyMQ(in, qt.data(), s.rows, s.cols, s.rank, p.data(), ctx.pool);
    PowerSgd::orthonormalize(p.data(), s.rows, s.rank);
    PowerSgd::multiplyMtP(in, p.data(), s.rows, s.cols, s.rank, qt.data(), ctx.pool);
    std::memcpy(body, p.data(), 4 * p.size());
    std::memcpy(body + 4 * p.size(), qt.data(), 4 * qt.size());
    return total;
  }

 private:
  friend class OnePassCodec<PowerSgdCodec>;

  struct Shape {
    size_t rows = 0, cols = 0;
    unsigned rank = 0;  // 0: pass through
  };
  Shape shape(size_t n, size_t rows) const {
    if (rows <= 1 || rows >= n) return {};
    CORTADO_ENFORCE(n % rows == 0 && rows <= 0xffffffffu, ErrorCode::kInvalidArgument,
                    "powersgd: {} elements are not a matrix with {} rows", n, rows);
    Shape s{rows, n / rows, 0};
    s.rank = static_cast<unsigned>(std::min<size_t>(rank_, std::min(s.rows, s.cols)));
    // No gain when the factors are as big as the matrix: send it as is.
    if ((s.rows + s.cols) * s.rank >= n) s.rank = 0;
    return s;
  }

  // The header, with a body the size that its shape (or pass-through) says.
  PayloadHeader check(std::span<const std::byte> payload, size_t n) const {
    return checkPayload(
        payload, n,
        [](const PayloadHeader& h) -> uint64_t {
          if (h.flags & kPassThrough) return h.count == 0 && h.param == 0 ? 4 * h.numel : ~0ull;
          uint64_t rows = h.param;
          if (rows < 2 || h.numel % rows || h.count < 1) return ~0ull;
          uint64_t cols = h.numel / rows;
          if (h.count > std::min(rows, cols)) return ~0ull;
          return format::powerSgdBody(rows, cols, h.count);
        },
        kPassThrough);
  }

  void apply(std::span<const std::byte> payload, float* out, size_t n, float alpha, bool add,
             const EncodeContext& ctx) const {
    PayloadHeader h = check(payload, n);
    const std::byte* b = body(payload);
    if (h.flags & kPassThrough) {
      for (size_t i = 0; i < n; ++i) {
        float v = alpha * loadLe<float>(b + 4 * i);
        out[i] = add ? out[i] + v : v;
      }
      return;
    }
    size_t rows = h.param, cols = n / rows;
    auto r = static_cast<unsigned>(h.count);
    std::vector<float> p(rows * r), qt(cols * r);
    std::memcpy(p.data(), b, 4 * p.size());
    std::memcpy(qt.data(), b + 4 * p.size(), 4 * qt.size());
    PowerSgd::multiplyPQt(p.data(), qt.data(), rows, cols, r, alpha, add, out, ctx.pool);
  }

  unsigned rank_;
  uint64_t seed_;
};

}  // namespace

void registerPowerSgd(Registry& r) {
  r.add(Device::kCpu,
        {"powersgd",
         "rank-r factors P (rows x r) and Q^T (r x cols) of the gradient matrix; 1-D passes as fp32",
         {{"rank", 4, 1, 64, true, "rank r of the approximation"},
          {"seed", 0, 0, 4294967295.0, true, "seed of the random Q"}}},
        [](const Params& p) {
          return std::make_unique<PowerSgdCodec>(p.canonical(),
                                                 static_cast<unsigned>(p.getInt("rank")),
                                                 static_cast<uint64_t>(p.getInt("seed")));
        });
}

}  // namespace cpu
}  // namespace cortado::compressor
