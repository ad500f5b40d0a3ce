// GraVAC in the plan executor with row-sparse gradients (an embedding's:
// non-zero only in some rows, a different count on each worker) and with
// pauses between iterations. A real scheduler, servers and workers as
// threads on the in-process transport.
// - Each worker pushes its message's non-zeros only (min(k, non-zeros)
//   pairs, compact): the bytes it pushed are those of the compact payload
//   of its brute-force top-k, counted here by hand, and every output is
//   the plain sum of every worker's brute-force top-k of its compensated
//   gradient.
// - A pause marked by one worker (excludeGravacPause) is left out of the
//   controller's throughput on every worker; an unmarked one is counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "compressor/gravac.h"
#include "compressor/gravac_compressor.h"
#include "compressor/payload.h"
#include "core/executor/executor.h"
#include "engine_job.h"
#include "tests/common/topk_reference.h"

namespace cortado {
namespace {

using compressor::GravacLevel;
using compressor::GravacOptions;
using plan::CommOp;
using plan::Scope;
using plan::Step;

Deadline soon() { return Deadline::after(Millis(20000)); }

constexpr uint64_t kRows = 200, kCols = 8, kN = kRows * kCols;

// Worker r's gradient at iteration it: 2 + 3r rows (16, 40, 64 non-zeros
// for r = 0, 1, 2), moving with it, values multiples of 1/64 (never 0), so
// every sum here is exact in any order.
std::vector<float> sparseGrad(int r, int it) {
  std::vector<float> g(kN, 0.0f);
  std::set<uint64_t> rows;
  uint64_t h = uint64_t(r) * 7919 + uint64_t(it) * 104729 + 17;
  while (rows.size() < size_t(2 + 3 * r)) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    rows.insert((h >> 33) % kRows);
  }
  for (uint64_t row : rows)
    for (uint64_t c = 0; c < kCols; ++c) {
      const int64_t k = int64_t((row * 31 + c * 7 + uint64_t(it) * 5 + uint64_t(r)) % 41) - 20;
      g[row * kCols + c] = float(k == 0 ? 21 : k) / 64.0f;
    }
  return g;
}

using test::energy;
using test::kept;
using test::topk;
size_t nonzeros(const std::vector<float>& x) {
  return size_t(std::count_if(x.begin(), x.end(), [](float v) { return v != 0.0f; }));
}
// The compact payload of `msg`'s non-zeros, by hand: the header, then per
// entry 4 bytes of value and its LEB128 gap.
uint64_t compactBytesOf(const std::vector<float>& msg) {
  uint64_t bytes = compressor::kHeaderBytes, next = 0;
  for (uint64_t i = 0; i < msg.size(); ++i) {
    if (msg[i] == 0.0f) continue;
    const uint64_t gap = i - next;
    bytes += 4 + (gap < (1u << 7) ? 1 : gap < (1u << 14) ? 2 : 3);
    next = i + 1;
  }
  return bytes;
}

// The plan's top-k encode, a compressed push, a raw pull.
plan::Plan pushPullPlan() {
  plan::TensorOption o;
  o.hierarchical = true;
  o.codec = "topk:ratio=0.5";  // made the carrier at GraVAC's CF
  o.steps = {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
             Step::encode(plan::Device::kCpu), Step::comm(Scope::kInter, CommOp::kPush, true),
             Step::comm(Scope::kInter, CommOp::kPull, false),
             Step::comm(Scope::kIntra, CommOp::kAllgather, false)};
  plan::Plan p;
  p.tensors["emb"] = o;
  return p;
}

GravacOptions sparseOptions() {
  GravacOptions o;
  o.codec = "topk";
  o.minRatio = 4;  // k = 400: above every worker's non-zeros
  o.maxRatio = 64;  // k = 25: below them
  o.window = 2;
  o.epsilon = 0.3;
  o.omega = 0.0;
  o.alpha = 0.5;
  return o;
}

TEST(ExecutorGravacSparse, EachWorkerPushesItsNonzerosOnlyAndTheSumIsTheReference) {
  const int W = 3, iterations = 12;
  const GravacOptions o = sparseOptions();
  // The replay: every worker's error feedback and brute-force top-k, the
  // controller fed the summed energies, what each worker's push must hold.
  struct Want {
    GravacLevel level;
    double ratio;
    std::vector<float> out;
    std::vector<uint64_t> pushed;  // per worker
    std::vector<size_t> sentNonzeros, k;
  };
  std::vector<Want> want;
  {
    std::vector<std::vector<float>> residual(W, std::vector<float>(kN, 0.0f));
    compressor::GravacController c(o, W);
    for (int it = 0; it < iterations; ++it) {
      compressor::GravacSums s;
      std::vector<std::vector<float>> ef(W), lmin(W), lcand(W);
      for (int w = 0; w < W; ++w) {
        ef[w] = sparseGrad(w, it);
        for (uint64_t i = 0; i < kN; ++i) ef[w][i] += residual[w][i];
        lmin[w] = topk(ef[w], kept(kN, c.minRatio()));
        lcand[w] = topk(ef[w], kept(kN, c.candidateRatio()));
        s.compensated += energy(ef[w]);
        s.minimum += energy(lmin[w]);
        s.candidate += energy(lcand[w]);
      }
      const compressor::GravacStep step = c.step(s, 0.0);
      Want rec{step.level, step.ratio, std::vector<float>(kN, 0.0f), {}, {}, {}};
      for (int w = 0; w < W; ++w) {
        const auto& msg = step.level == GravacLevel::kCandidate ? lcand[w]
                          : step.level == GravacLevel::kMinimum ? lmin[w]
                                                                 : ef[w];
        for (uint64_t i = 0; i < kN; ++i) {
          rec.out[i] += msg[i];
          residual[w][i] = ef[w][i] - msg[i];
        }
        rec.pushed.push_back(step.level == GravacLevel::kDense ? kN * 4 : compactBytesOf(msg));
        rec.sentNonzeros.push_back(nonzeros(msg));
        rec.k.push_back(step.level == GravacLevel::kDense ? kN : kept(kN, step.ratio));
      }
      want.push_back(std::move(rec));
    }
  }
  // What this checks is there: sparse iterations with fewer non-zeros than
  // k on some workers and more on others, at several CFs.
  std::set<double> cfs;
  bool fewer = false, more = false;
  std::string seq;
  for (const Want& w : want) {
    seq += fmt::format("{}@{} ", compressor::gravacLevelName(w.level), w.ratio);
    if (w.level == GravacLevel::kDense) continue;
    cfs.insert(w.ratio);
    for (int r = 0; r < W; ++r) {
      fewer = fewer || w.sentNonzeros[r] < w.k[r];
      more = more || w.sentNonzeros[r] == w.k[r];
    }
  }
  ASSERT_GE(cfs.size(), 3u) << seq;
  ASSERT_TRUE(fewer && more) << seq;

  test::Job job(W, 2);
  const plan::Plan p = pushPullPlan();
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    ex.declare("emb", DType::kFloat32, kN);
    ex.setPlan(p, soon());
    ex.setGravac(o);
    for (int it = 0; it < iterations; ++it) {
      std::vector<float> in = sparseGrad(r, it), out(kN, -1.0f);
      std::vector<executor::BatchItem> batch{{"emb", in.data(), out.data(), kN}};
      ex.runBatch(batch, ReduceOp::kSum, soon());
      const Want& w = want[size_t(it)];
      ASSERT_EQ(ex.gravacHistory().back().ratio, w.ratio) << "iteration " << it << ": " << seq;
      ASSERT_EQ(out, w.out) << "worker " << r << " iteration " << it << ": " << seq;
      // The bytes pushed: the compact payload of min(k, non-zeros) pairs.
      ASSERT_EQ(ex.gravacBytes().back(), w.pushed[size_t(r)])
          << "worker " << r << " iteration " << it << " ("
          << compressor::gravacLevelName(w.level) << " at CF " << w.ratio << ", k "
          << w.k[size_t(r)] << ", " << w.sentNonzeros[size_t(r)] << " non-zeros sent): " << seq;
    }
  });
}

// The controller's throughputs (CF -> mean of samples / seconds x gain sent)
// rebuilt from the executor's record: each iteration's agreed seconds time
// the previous iteration's CF, 0 seconds (the first, a pause) record nothing.
std::map<double, double> throughputsFrom(const std::vector<compressor::GravacStep>& steps,
                                         const std::vector<double>& seconds, uint64_t window) {
  std::map<double, std::deque<double>> records;
  for (size_t i = 1; i < steps.size(); ++i) {
    if (seconds[i] <= 0) continue;
    const auto& prev = steps[i - 1];
    const double gain = prev.level == GravacLevel::kCandidate ? prev.gainCandidate
                        : prev.level == GravacLevel::kMinimum ? prev.gainMin
                                                               : 1.0;
    auto& r = records[prev.ratio];
    r.push_back(1.0 / seconds[i] * gain);
    while (r.size() > window) r.pop_front();
  }
  std::map<double, double> out;
  for (const auto& [cf, r] : records)
    out[cf] = std::accumulate(r.begin(), r.end(), 0.0) / double(r.size());
  return out;
}

TEST(ExecutorGravacSparse, APauseMarkedByOneWorkerIsLeftOutOnEveryWorker) {
  const int W = 3, iterations = 9;
  const int marked = 4, unmarked = 7;  // worker 1 sleeps before both
  const auto pause = std::chrono::milliseconds(240);
  GravacOptions o = sparseOptions();
  o.window = 50;  // every record stays in the means
  test::Job job(W, 2);
  const plan::Plan p = pushPullPlan();
  std::vector<std::vector<compressor::GravacStep>> histories(W);
  std::vector<std::vector<double>> seconds(W);
  std::vector<std::map<double, double>> throughputs(W);
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    ex.declare("emb", DType::kFloat32, kN);
    ex.setPlan(p, soon());
    ex.setGravac(o);
    for (int it = 0; it < iterations; ++it) {
      if (r == 1 && (it == marked || it == unmarked)) {
        if (it == marked) ex.excludeGravacPause();  // one worker marks; the others do not
        std::this_thread::sleep_for(pause);
      }
      std::vector<float> in = sparseGrad(r, it), out(kN);
      std::vector<executor::BatchItem> batch{{"emb", in.data(), out.data(), kN}};
      ex.runBatch(batch, ReduceOp::kSum, soon());
    }
    histories[r] = ex.gravacHistory();
    seconds[r] = ex.gravacSeconds();
    throughputs[r] = ex.gravac()->controller().throughputs();
  });
  // The marked pause: no time on any worker; the unmarked one: worker 1's
  // 240 ms in the workers' mean (the others measured their wait for it
  // inside the iteration, not before it).
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(seconds[r].size(), size_t(iterations));
    EXPECT_EQ(seconds[r][0], 0.0) << r;  // the first: nothing before it
    EXPECT_EQ(seconds[r][marked], 0.0) << "worker " << r;
    EXPECT_GE(seconds[r][unmarked], 0.24 / W) << "worker " << r;
    for (int it = 1; it < iterations; ++it) {
      if (it != marked) {
        EXPECT_GT(seconds[r][it], 0.0) << "worker " << r << " iteration " << it;
      }
    }
    // Every worker: the same seconds, decisions and throughputs.
    EXPECT_EQ(seconds[r], seconds[0]) << r;
    ASSERT_EQ(histories[r].size(), histories[0].size());
    for (size_t k = 0; k < histories[0].size(); ++k) {
      EXPECT_EQ(histories[r][k].ratio, histories[0][k].ratio) << "worker " << r << " step " << k;
      EXPECT_EQ(histories[r][k].level, histories[0][k].level) << "worker " << r << " step " << k;
    }
    EXPECT_EQ(throughputs[r], throughputs[0]) << r;
  }
  // The controller's throughputs are the timed iterations' only.
  const auto rebuilt = throughputsFrom(histories[0], seconds[0], o.window);
  ASSERT_EQ(rebuilt.size(), throughputs[0].size());
  for (const auto& [cf, t] : rebuilt) {
    ASSERT_TRUE(throughputs[0].count(cf)) << cf;
    EXPECT_NEAR(throughputs[0].at(cf), t, 1e-9 * t) << "CF " << cf;
  }
  // Had the marked pause been timed, the CF sent before it would show it.
  auto withPause = seconds[0];
  withPause[marked] = 0.24 / W;
  const auto skewed = throughputsFrom(histories[0], withPause, o.window);
  const double cf = histories[0][marked - 1].ratio;
  if (throughputs[0].count(cf)) {
    EXPECT_LT(skewed.at(cf), 0.99 * throughputs[0].at(cf)) << "CF " << cf;
  } else {
    EXPECT_TRUE(skewed.count(cf)) << "CF " << cf;  // its only record was the pause
  }
}

}  // namespace
}  // namespace cortado
