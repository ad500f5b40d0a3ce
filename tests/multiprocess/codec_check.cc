// A worker program for the compressed multi-process tests, started by
// `cortado launch`. Every worker can replay every worker's gradients (seeded
// hashes), so each checks its pulled results against references it computes
// itself, without the codec library:
//
//   --mode topk      top-k with error feedback (--ratio). A brute-force
//                    reference (sort by magnitude, ties to the lower index)
//                    replays all W workers' residuals, so every round's result
//                    is checked element by element; and the running sum of
//                    pulled results is checked against the running sum of the
//                    true gradients with the bound derived below.
//   --mode fp16      fp16 without error feedback: each result must equal
//                    fp16(sum of fp16(x_w)) bit for bit.
//   --mismatch-rank R: worker R declares the first tensor with another codec
//                    (the job must fail on every worker).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "core/backends.h"
#include "core/common/crash.h"
#include "core/common/half.h"
#include "core/common/logging.h"
#include "core/worker.h"

using namespace cortado;

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
// Uniform in [0, 1).
double unit(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t x = mix(seed ^ mix(a + 1) ^ mix((b + 1) << 16) ^ mix((c + 1) << 32) ^ mix(d * 0x9e37 + 7));
  return double(x >> 11) * (1.0 / 9007199254740992.0);
}

// Top-k mode gradients: a fixed per-element mean in [-1, 1] (the direction a
// real gradient keeps) plus noise in [-0.5, 0.5].
float gradient(uint64_t seed, int rank, int tensor, int iter, uint64_t i) {
  double mean = 2 * unit(seed, 0, tensor, 0, i) - 1;
  double noise = unit(seed, rank + 1, tensor, iter + 1, i) - 0.5;
  return float(mean + noise);
}

// fp16 mode inputs: magnitudes in [0.5, 8), random signs. Their fp16 values
// span exponents -1..2 with 11-bit mantissas, so any sum of W <= 64 of them is
// exact in fp32, whatever order the server adds in: the reference is exact.
float fp16Input(uint64_t seed, int rank, int tensor, int iter, uint64_t i) {
  double m = 0.5 + 7.5 * unit(seed, rank + 1, tensor, iter + 1, i);
  return float(unit(seed, rank + 101, tensor, iter + 1, i) < 0.5 ? -m : m);
}

// Reference top-k of p[0..n): the k largest |p|, ties to the lower index.
std::vector<uint32_t> topkRef(const float* p, uint64_t n, uint64_t k) {
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](uint32_t a, uint32_t b) {
    float x = std::fabs(p[a]), y = std::fabs(p[b]);
    return x != y ? x > y : a < b;
  });
  idx.resize(k);
  return idx;
}

uint64_t kOf(uint64_t n, double ratio) {  // compressor/format.h kFromRatio, restated
  if (n == 0) return 0;
  auto k = uint64_t(double(n) * ratio);
  return std::clamp<uint64_t>(k, 1, n);
}

}  // namespace

int main(int argc, char** argv) try {
  installCrashReport("codec_check worker");
  CLI::App app{"cortado multi-process compressed push-pull checker"};
  std::string mode = "topk";
  int tensors = 3, iters = 200, mismatchRank = -1;
  uint64_t seed = 1, maxElements = 20000;
  double ratio = 0.05;
  bool average = false;
  app.add_option("--mode", mode)->check(CLI::IsMember({"topk", "fp16"}));
  app.add_option("--tensors", tensors);
  app.add_option("--iters", iters);
  app.add_option("--seed", seed);
  app.add_option("--max-elements", maxElements);
  app.add_option("--ratio", ratio);
  app.add_flag("--average", average);
  app.add_option("--mismatch-rank", mismatchRank);
  CLI11_PARSE(app, argc, argv);

  JobConfig job = readJobConfig(true);
  setupLogging(fmt::format("worker {}", job.rank), job.logLevel);
  auto w = startWorker(job, Deadline::after(job.connectTimeout));
  const int W = w->size(), rank = w->rank();
  const bool topk = mode == "topk";
  TensorOptions topts;
  topts.codec = topk ? fmt::format("topk:ratio={}", ratio) : "fp16";
  topts.errorFeedback = topk;

  // Sizes from the shared seed: the same on every worker.
  std::vector<uint64_t> sizes;
  for (int t = 0; t < tensors; ++t)
    sizes.push_back(1 + uint64_t(unit(seed, 999, t, 0, 0) * double(maxElements)));
  std::vector<std::vector<ChunkSpan>> chunks;
  for (int t = 0; t < tensors; ++t) {
    TensorOptions o = topts;
    if (t == 0 && rank == mismatchRank) o.codec = fmt::format("topk:ratio={}", ratio * 2);
    w->declare(fmt::format("g{}", t), DType::kFloat32, sizes[t], o,
               Deadline::after(job.opTimeout));
    // The chunks top-k selects in: the worker's (the partition size counts
    // the codec's payload, core/partition.h; its tests check the cut).
    chunks.push_back(w->chunks(fmt::format("g{}", t)));
  }

  // Top-k state: every worker's residual (replayed), the running sums.
  std::vector<std::vector<std::vector<float>>> residual(tensors);  // [t][w][i]
  std::vector<std::vector<double>> sumTrue(tensors), sumPulled(tensors);
  std::vector<double> bound(tensors, 0.0);  // of || sumTrue - sumPulled ||_1
  for (int t = 0; t < tensors; ++t) {
    residual[t].assign(W, std::vector<float>(sizes[t], 0.0f));
    sumTrue[t].assign(sizes[t], 0.0);
    sumPulled[t].assign(sizes[t], 0.0);
  }
  double worstRel = 0;
  uint64_t checked = 0;
  for (int it = 0; it < iters; ++it) {
    std::vector<std::vector<float>> in(tensors), out(tensors);
    std::vector<Handle> handles;
    for (int t = 0; t < tensors; ++t) {
      in[t].resize(sizes[t]);
      out[t].assign(sizes[t], std::nanf(""));
      for (uint64_t i = 0; i < sizes[t]; ++i)
        in[t][i] = topk ? gradient(seed, rank, t, it, i) : fp16Input(seed, rank, t, it, i);
      handles.push_back(w->pushPull(fmt::format("g{}", t), DType::kFloat32, sizes[t],
                                    in[t].data(), out[t].data(),
                                    average ? ReduceOp::kAverage : ReduceOp::kSum, -t));
    }
    for (auto& h : handles) h.wait(Deadline::after(job.opTimeout)).check();

    for (int t = 0; t < tensors; ++t) {
      const uint64_t n = sizes[t];
      std::vector<double> expect(n, 0.0), scale(n, 0.0);
      if (!topk) {
        for (uint64_t i = 0; i < n; ++i) {
          float s = 0;
          for (int r = 0; r < W; ++r) s += halfToFloat(floatToHalf(fp16Input(seed, r, t, it, i)));
          float e = halfToFloat(floatToHalf(s));
          if (average) e *= 1.0f / float(W);
          // Bit for bit (NaN and -0 included), on purpose.
          // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison)
          if (std::memcmp(&e, &out[t][i], 4) != 0) {
            fmt::print(stderr, "worker {}: WRONG fp16 result for g{} at iteration {} element {}: "
                               "{} != reference {}\n", rank, t, it, i, out[t][i], e);
            return 1;
          }
        }
        checked += n;
        continue;
      }
      // Replay every worker's error feedback per chunk: p = g + e; send the
      // top-k of p; e = p elsewhere, 0 where sent.
      for (int r = 0; r < W; ++r) {
        std::vector<float>& e = residual[t][r];
        for (const ChunkSpan& c : chunks[t]) {
          std::vector<float> p(c.numElements);
          for (uint64_t j = 0; j < c.numElements; ++j) {
            float g = gradient(seed, r, t, it, c.offset + j);
            sumTrue[t][c.offset + j] += g;
            p[j] = g + e[c.offset + j];
          }
          const uint64_t k = kOf(c.numElements, ratio);
          for (uint32_t j : topkRef(p.data(), c.numElements, k)) {
            expect[c.offset + j] += p[j];
            scale[c.offset + j] += std::fabs(p[j]);
            p[j] = 0;
          }
          std::copy(p.begin(), p.end(), e.begin() + c.offset);
        }
      }
      // The bound on || sumTrue - sumPulled ||_1. Per worker and chunk, top-k
      // removes at least k/n of ||p||_1, so ||e_t||_1 <= (1 - k/n)(||e_{t-1}||_1
      // + G), and by induction ||e_t||_1 <= (n/k - 1) G for all t, G the
      // largest ||g||_1 of a round. It does not depend on t.
      {
        double b = 0;
        for (const ChunkSpan& c : chunks[t]) {
          const uint64_t k = kOf(c.numElements, ratio);
          // |g| <= 1.5 element-wise by construction: G <= 1.5 n.
          b += (double(c.numElements) / double(k) - 1) * 1.5 * double(c.numElements);
        }
        bound[t] = W * b;
      }
      for (uint64_t i = 0; i < n; ++i) {
        double e = average ? expect[i] * (1.0 / W) : expect[i];
        double got = out[t][i];
        // The server adds W floats in arrival order: at most W roundings of
        // a value no larger than the sum of magnitudes.
        double tol = 4.0 * W * 1.2e-7 * (average ? scale[i] / W : scale[i]) + 1e-30;
        if (!(std::fabs(got - e) <= tol)) {
          fmt::print(stderr, "worker {}: WRONG top-k result for g{} at iteration {} element {}: "
                             "{} != reference {} (tolerance {})\n",
                     rank, t, it, i, got, e, tol);
          return 1;
        }
        sumPulled[t][i] += average ? got * W : got;
      }
      checked += n;
      // Running sums: by the error-feedback identity, sumTrue - sumPulled
      // == the sum of the workers' current residuals (up to float rounding),
      // which the bound above holds for every round: it must not grow with
      // the number of rounds, unlike sumTrue.
      double diffL1 = 0, trueL1 = 0, resL1 = 0;
      for (uint64_t i = 0; i < n; ++i) {
        diffL1 += std::fabs(sumTrue[t][i] - sumPulled[t][i]);
        trueL1 += std::fabs(sumTrue[t][i]);
        double r = 0;
        for (int q = 0; q < W; ++q) r += residual[t][q][i];
        resL1 += std::fabs(sumTrue[t][i] - sumPulled[t][i] - r);
      }
      // Float slack: each round's result rounds at most W times per element.
      const double slack = 1e-5 * trueL1 + 1e-3 * n;
      if (diffL1 > bound[t] + slack || resL1 > slack) {
        fmt::print(stderr, "worker {}: running sum of g{} drifted at iteration {}: "
                           "||true - pulled||_1 = {} (bound {}), || that - residuals ||_1 = {} "
                           "(slack {})\n", rank, t, it, diffL1, bound[t], resL1, slack);
        return 1;
      }
      if (it == iters - 1) worstRel = std::max(worstRel, diffL1 / std::max(trueL1, 1e-30));
    }
  }
  w->shutdown(Deadline::after(job.opTimeout));
  if (topk)
    fmt::print("worker {}: {} iterations of {} top-k tensors match the reference ({} elements "
               "checked); running-sum relative L1 error {:.4f}\n",
               rank, iters, tensors, checked, worstRel);
  else
    fmt::print("worker {}: {} iterations of {} fp16 tensors match the reference ({} elements "
               "checked)\n", rank, iters, tensors, checked);
  // Convergence: the residuals stay bounded while the true sum grows with
  // the rounds. In steady state an element is sent when its residual
  // reaches about tau = E|mean| / ratio (k elements leave per round, each
  // gathering |mean| per round), so || true - pulled ||_1 is about
  // W n tau / 2 against || true ||_1 = W n T E|mean|: a relative error of
  // about 1 / (2 ratio T), 0.033 at ratio 0.05 and T = 300. 0.1 leaves a
  // factor 3; a server that dropped what it did not re-send, or a worker
  // that lost its residuals, grows the error with T instead.
  if (topk && iters >= 100 && worstRel > 3.0 / (2.0 * ratio * iters)) {
    fmt::print(stderr, "worker {}: running sums did not converge: relative L1 error {}\n", rank,
               worstRel);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {  // whatever the steps above throw, setup included
  fmt::print(stderr, "worker: error: {}\n", e.what());
  return 2;
}
