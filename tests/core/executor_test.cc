// The plan executor without MPI (every worker its machine's only worker), in
// one process: a real scheduler, servers and workers as threads on the
// in-process transport (engine_test's Job). The MPI paths are checked under
// mpirun by tests/multiprocess/exec_check.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <map>
#include <numeric>
#include <thread>

#include "compressor/error_feedback.h"
#include "core/common/half.h"
#include "core/device/host/factory.h"
#include "core/executor/executor.h"
#include "engine_job.h"
#include "tests/common/topk_reference.h"

namespace cortado {
namespace {

using plan::CommOp;
using plan::Scope;
using plan::Step;

const Deadline soon() { return Deadline::after(Millis(20000)); }

// Small chunks, so shard keys have several chunks on several servers.
WorkerOptions smallChunks() {
  WorkerOptions o;
  o.partitionBytes = 64;
  return o;
}

// Hierarchical: an intra reduce-scatter, the encode on `where`, a compressed
// push with a raw pull, an intra allgather.
plan::TensorOption compressedPush(const std::string& codec, plan::Device where) {
  plan::TensorOption o;
  o.hierarchical = true;
  o.codec = codec;
  o.steps = {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false), Step::encode(where),
             Step::comm(Scope::kInter, CommOp::kPush, true),
             Step::comm(Scope::kInter, CommOp::kPull, false),
             Step::comm(Scope::kIntra, CommOp::kAllgather, false)};
  return o;
}

TEST(Executor, DefaultPlanSumsExactlyWithoutMpi) {
  test::Job job(3, 2, smallChunks());
  const uint64_t n = 101;
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    ex.declare("w", DType::kFloat32, n);
    ex.declare("b", DType::kFloat32, 1);
    for (int iter = 0; iter < 3; ++iter) {
      std::vector<float> in(n), out(n);
      for (uint64_t i = 0; i < n; ++i) in[i] = float((r + 1) * (i % 7) + iter);
      ex.run("w", in.data(), out.data(), n, ReduceOp::kSum, soon());
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], float(6 * (i % 7) + 3 * iter)) << i;
      float one = float(r), avg = 0;
      ex.run("b", &one, &avg, 1, ReduceOp::kAverage, soon());
      ASSERT_EQ(avg, 1.0f);
    }
    EXPECT_EQ(ex.currentPlan().tensors.at("w"), executor::defaultOption());
  });
}

// Each setPlan declares new shard keys; the old plan's are released after
// their last round, so the servers hold one plan's keys, not every plan's
// (before, four plans left four times the keys, and their sums, behind).
// Results stay exact across the switches.
TEST(Executor, ASwitchReleasesTheOldPlansKeysOnTheServers) {
  // Bytes, and same-host shared memory, whose regions the next plan's keys
  // reuse (shm::Arena::free): the sums must stay exact through that too.
  for (bool shm : {false, true}) {
    SCOPED_TRACE(shm ? "shared memory" : "bytes");
    test::Job job(3, 2, smallChunks(), /*async=*/false, shm);
    const uint64_t n = 101;
    plan::Plan p;
    p.tensors["w"] = executor::defaultOption();
    p.tensors["b"] = executor::defaultOption();
    const int plans = 4;
    job.onEveryWorker([&](int r) {
      executor::Executor ex(*job.workers[r], nullptr);
      ex.declare("w", DType::kFloat32, n);
      ex.declare("b", DType::kFloat32, 1);
      for (int k = 0; k < plans; ++k) {
        ex.setPlan(p, soon());
        for (int iter = 0; iter < 2; ++iter) {
          std::vector<float> in(n), out(n);
          for (uint64_t i = 0; i < n; ++i) in[i] = float((r + 1) * (i % 7) + iter + k);
          ex.run("w", in.data(), out.data(), n, ReduceOp::kSum, soon());
          for (uint64_t i = 0; i < n; ++i)
            ASSERT_EQ(out[i], float(6 * (i % 7) + 3 * (iter + k))) << "plan " << k << " i " << i;
          float one = float(r), sum = 0;
          ex.run("b", &one, &sum, 1, ReduceOp::kSum, soon());
          ASSERT_EQ(sum, 3.0f);
        }
      }
    });
    // One plan's keys: 101 floats in 64-byte chunks (7) and one for "b".
    const uint64_t perPlan = 7 + 1;
    server::ServerStats s =
        job.waitServers([&](const auto& x) { return x.keysReleased >= (plans - 1) * perPlan; });
    EXPECT_EQ(s.keysReleased, (plans - 1) * perPlan);
    EXPECT_EQ(s.keys, perPlan);
    EXPECT_EQ(s.errors, 0u);
  }
}

// fp16 with error feedback at the encode before a compressed push, the
// servers answering the dense sum: each round's output must be the sum over
// workers of fp16(g + e), with e replayed here per worker by plain loops.
// The encode placed on "gpu" (the host device's codec on its memory) and on
// "cpu" (a copy to pinned memory first), with the host device's streams
// inline and queued on threads of their own (work after the call returns, as
// on a GPU): the same sums, each matching a replay with plain loops.
TEST(Executor, CompressedPushWithErrorFeedbackMatchesAReplayedReference) {
  const int W = 3;
  test::Job job(W, 2, smallChunks());
  const uint64_t n = 77;
  plan::TensorOption o;
  o.hierarchical = true;
  o.codec = "fp16";
  o.steps = {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
             Step::encode(plan::Device::kGpu),  // set per case below
             Step::comm(Scope::kInter, CommOp::kPush, true),
             Step::comm(Scope::kInter, CommOp::kPull, false),
             Step::comm(Scope::kIntra, CommOp::kAllgather, false)};
  struct Case {
    const char* name;
    plan::Device where;
    bool queued;
  };
  const Case cases[] = {{"gpu_inline", plan::Device::kGpu, false},
                        {"cpu_inline", plan::Device::kCpu, false},
                        {"gpu_queued", plan::Device::kGpu, true},
                        {"cpu_queued", plan::Device::kCpu, true}};
  plan::Plan p;
  for (const Case& c : cases) {
    o.steps[1] = Step::encode(c.where);
    p.tensors[c.name] = o;
  }
  // Inputs in [0.5, 8): fp16 values there sum exactly in fp32 in any order.
  auto input = [](int r, int iter, uint64_t i) {
    return 0.5f + 7.4f * float((r * 131 + iter * 17 + i * 29) % 1000) / 1000.0f + 1e-4f * float(i % 3);
  };
  std::vector<std::vector<float>> residual(W, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> expect(5, std::vector<float>(n, 0.0f));
  for (int iter = 0; iter < 5; ++iter)
    for (int r = 0; r < W; ++r)
      for (uint64_t i = 0; i < n; ++i) {
        float q = input(r, iter, i) + residual[r][i];
        float sent = halfToFloat(floatToHalf(q));
        residual[r][i] = q - sent;
        expect[iter][i] += sent;
      }
  job.onEveryWorker([&](int r) {
    for (const Case& c : cases) {
      device::host::Options d;
      d.queued = c.queued;
      executor::Executor ex(*job.workers[r], nullptr, nullptr, {}, device::host::create(d));
      ex.declare(c.name, DType::kFloat32, n);  // a tensor (and server key) per case
      plan::Plan mine;
      mine.tensors[c.name] = p.tensors.at(c.name);
      ex.setPlan(mine, soon());
      for (int iter = 0; iter < 5; ++iter) {
        std::vector<float> in(n), out(n);
        for (uint64_t i = 0; i < n; ++i) in[i] = input(r, iter, i);
        ex.run(c.name, in.data(), out.data(), n, ReduceOp::kSum, soon());
        for (uint64_t i = 0; i < n; ++i)
          ASSERT_EQ(out[i], expect[iter][i]) << c.name << " iter " << iter << " i " << i;
      }
    }
  });
}

// Top-k 25% with its residual kept in bf16 (WorkerOptions::errorFeedbackState)
// against a replay with plain loops that rounds each worker's residual to bf16
// after every round: the values sent carry the rounded residuals, so the sums
// tell a bf16 state from an fp32 one (by about 2^-9 of a residual, against
// fp32's 1e-6 of summation order).
TEST(Executor, TopKWithBf16ResidualsMatchesARoundedReplay) {
  const int W = 3;
  WorkerOptions wo;  // one chunk: top-k selects over the whole tensor
  wo.errorFeedbackState = compressor::StateDType::kBFloat16;
  test::Job job(W, 2, wo);
  const uint64_t n = 80, k = 20;
  plan::TensorOption o = compressedPush("topk:ratio=0.25", plan::Device::kCpu);
  plan::Plan p;
  p.tensors["t"] = o;
  auto input = [](int r, int iter, uint64_t i) {
    return 0.3f + 0.7310f * float((r * 37 + iter * 11 + i * 13) % 97) / 97.0f + 1e-3f * float(r);
  };
  const int iters = 6;
  std::vector<std::vector<float>> residual(W, std::vector<float>(n, 0.0f));
  std::vector<std::vector<double>> expect(iters, std::vector<double>(n, 0.0));
  for (int iter = 0; iter < iters; ++iter)
    for (int r = 0; r < W; ++r) {
      std::vector<float> q(n);
      for (uint64_t i = 0; i < n; ++i) q[i] = input(r, iter, i) + residual[r][i];
      const std::vector<float> sent = test::topk(q, k);  // zero where not sent
      for (uint64_t i = 0; i < n; ++i) {
        expect[iter][i] += sent[i];
        residual[r][i] = sent[i] != 0.0f ? 0.0f : bf16ToFloat(floatToBf16(q[i]));
      }
    }
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    ex.declare("t", DType::kFloat32, n);
    ex.setPlan(p, soon());
    for (int iter = 0; iter < iters; ++iter) {
      std::vector<float> in(n), out(n);
      for (uint64_t i = 0; i < n; ++i) in[i] = input(r, iter, i);
      ex.run("t", in.data(), out.data(), n, ReduceOp::kSum, soon());
      for (uint64_t i = 0; i < n; ++i)
        ASSERT_NEAR(out[i], expect[iter][i], 1e-5 * (1 + std::fabs(expect[iter][i])))
            << "iter " << iter << " i " << i;
    }
  });
}

// What the executor holds (Executor::memory) against a count by hand: a
// compressed plan's encode points hold one fp32 residual per element they
// encoded (fp16 with error feedback, encoded on the device and on the CPU);
// a switch to an uncompressed plan turns them into carry, and the first run
// folds the carry into its input and gives its memory back, so only the
// bytes of the running plan stay. On the host device (inline) nothing else
// is kept: the codecs write and read the payload pieces themselves. Nothing
// is lost on the way: every input sent, summed over the iterations.
TEST(Executor, RetiredResidualsAreFreedOnceFolded) {
  // memory() counts the process's bf16 scratch, which a test before this
  // one in the same process may have left (fp32 state here: none of its own).
  compressor::ErrorFeedback::releaseIdleScratch();
  const int W = 2;
  test::Job job(W, 1, smallChunks());
  const std::map<std::string, uint64_t> sizes = {{"a", 300}, {"b", 100}};
  plan::TensorOption o;
  o.hierarchical = true;
  o.codec = "fp16";
  o.steps = {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
             Step::encode(plan::Device::kGpu),
             Step::comm(Scope::kInter, CommOp::kPush, true),
             Step::comm(Scope::kInter, CommOp::kPull, false),
             Step::comm(Scope::kIntra, CommOp::kAllgather, false)};
  plan::Plan compressed, raw;
  compressed.tensors["a"] = o;
  o.steps[1] = Step::encode(plan::Device::kCpu);
  compressed.tensors["b"] = o;
  for (const auto& [name, n] : sizes) raw.tensors[name] = executor::defaultOption();
  uint64_t elements = 0;
  for (const auto& [name, n] : sizes) elements += n;
  // Values that fp16 cannot hold: every element keeps a residual.
  auto input = [](int r, int iter, uint64_t i) {
    return 1.0f + 0.0123f * float(r + 1) + 0.00071f * float(i % 37) + 0.0031f * float(iter);
  };
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    for (const auto& [name, n] : sizes) ex.declare(name, DType::kFloat32, n);
    std::map<std::string, std::vector<double>> got, sent;
    for (const auto& [name, n] : sizes) got[name].assign(n, 0.0), sent[name].assign(n, 0.0);
    auto iteration = [&](int iter) {
      for (const auto& [name, n] : sizes) {
        std::vector<float> in(n), out(n);
        for (uint64_t i = 0; i < n; ++i) {
          in[i] = input(r, iter, i);
          for (int q = 0; q < W; ++q) sent[name][i] += input(q, iter, i);
        }
        ex.run(name, in.data(), out.data(), n, ReduceOp::kSum, soon());
        for (uint64_t i = 0; i < n; ++i) got[name][i] += out[i];
      }
    };
    ex.setPlan(compressed, soon());
    for (int iter = 0; iter < 3; ++iter) iteration(iter);
    executor::Executor::Memory m = ex.memory();
    EXPECT_EQ(m.residuals, elements * sizeof(float));
    EXPECT_EQ(m.carry, 0u);
    EXPECT_EQ(m.buffers, 0u);
    ex.setPlan(raw, soon());
    m = ex.memory();
    EXPECT_EQ(m.residuals, 0u);
    EXPECT_EQ(m.carry, elements * sizeof(float));
    iteration(3);
    m = ex.memory();
    EXPECT_EQ(m.residuals, 0u);
    EXPECT_EQ(m.carry, 0u);
    EXPECT_EQ(m.buffers, 0u);
    for (const auto& [name, n] : sizes)
      for (uint64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[name][i], sent[name][i], 1e-4) << name << " " << i;
  });
}

// A plan group runs in place when its outputs are consecutive in the
// group's order (one flat gradient buffer), whatever the batch's order, and
// is gathered into a buffer otherwise; the sums are the same either way, and
// an input apart from its output is left as it was.
TEST(Executor, AGroupRunsInPlaceOnConsecutiveOutputs) {
  const int W = 3;
  test::Job job(W, 2, smallChunks());
  const std::vector<std::string> names = {"a", "b", "c"};
  const std::vector<uint64_t> lens = {50, 31, 7};
  const uint64_t total = 88;
  plan::Plan p;
  for (const auto& name : names) p.tensors[name] = executor::defaultOption();
  p.groups = {names};
  auto input = [](int r, int iter, size_t k, uint64_t i) { return float((r + 1) * (i % 5) + 10 * k + iter); };
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    for (size_t k = 0; k < 3; ++k) ex.declare(names[k], DType::kFloat32, lens[k]);
    ex.setPlan(p, soon());
    struct Case {
      const char* what;
      bool reversed;      // the batch's order c, b, a
      bool swapped;       // b's output before a's in the flat buffer
      bool inputsApart;   // inputs in buffers of their own
      uint64_t inPlace;   // expected in-place executions
    };
    const Case cases[] = {{"flat, in place", false, false, false, 1},
                          {"flat, batch reversed", true, false, false, 1},
                          {"outputs out of the group's order", false, true, false, 0},
                          {"flat outputs, inputs apart", false, false, true, 1}};
    int iter = 0;
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      std::vector<float> flat(total, -1.0f);
      std::vector<std::vector<float>> apart(3);
      std::vector<uint64_t> off = {0, lens[0], lens[0] + lens[1]};
      if (c.swapped) off = {lens[1], 0, lens[0] + lens[1]};
      std::vector<executor::BatchItem> batch;
      for (size_t k = 0; k < 3; ++k) {
        float* out = flat.data() + off[k];
        apart[k].resize(lens[k]);
        for (uint64_t i = 0; i < lens[k]; ++i) apart[k][i] = input(r, iter, k, i);
        if (!c.inputsApart) std::copy(apart[k].begin(), apart[k].end(), out);
        batch.push_back({names[k], c.inputsApart ? apart[k].data() : out, out, lens[k]});
      }
      if (c.reversed) std::reverse(batch.begin(), batch.end());
      const uint64_t groups = ex.groupRuns(), inPlace = ex.inPlaceGroupRuns();
      ex.runBatch(batch, ReduceOp::kSum, soon());
      EXPECT_EQ(ex.groupRuns() - groups, 1u);
      EXPECT_EQ(ex.inPlaceGroupRuns() - inPlace, c.inPlace);
      for (size_t k = 0; k < 3; ++k)
        for (uint64_t i = 0; i < lens[k]; ++i) {
          float want = 0;
          for (int w = 0; w < W; ++w) want += input(w, iter, k, i);
          ASSERT_EQ(flat[off[k] + i], want) << names[k] << " element " << i;
          if (c.inputsApart) {
            ASSERT_EQ(apart[k][i], input(r, iter, k, i)) << names[k] << " input " << i;
          }
        }
      ++iter;
    }
  });
}

// DGC (momentum correction) while the group boundaries change: a plan group
// {a, b} that runs whole in some iterations and member by member in others,
// so each change retires the encode points that hold the residuals. The sums
// match a replay with plain loops of DGC's algebra (u = m u + g; v += u; the
// exact top-k of |v| sent, v and u zeroed there) in which a retired point's
// v + m u joins its tensors' next input and that run then restarts u at zero
// everywhere: the carried residual is counted once. (Folded into the input
// with the momentum left running, it entered u and was sent again, up to
// 1 / (1 - m) times, at every change.)
TEST(Executor, DgcAcrossChangingGroupBoundariesMatchesAReplay) {
  const int W = 2;  // two workers: the servers' sums are exact in any order
  test::Job job(W, 2);
  const float m = 0.9f;
  const std::vector<uint64_t> lens = {40, 24};
  plan::TensorOption o = compressedPush("dgc:ratio=0.25,momentum=0.9", plan::Device::kCpu);
  plan::Plan p;
  p.tensors["a"] = p.tensors["b"] = o;
  p.groups = {{"a", "b"}};
  // Per iteration: the group whole (true), or a then b alone (false).
  const std::vector<bool> whole = {true, true, false, false, true, false, true, true, false};
  const int iters = int(whole.size());
  auto grad = [](int r, int iter, size_t k, uint64_t i) {
    // Distinct magnitudes (no ties in the top-k), both signs.
    const uint64_t h = (uint64_t(r) * 7919 + uint64_t(iter) * 104729 + k * 1299709 + i * 15485863) % 100003;
    return (float(h) / 100003.0f - 0.45f) * (1.0f + 0.001f * float(i));
  };
  // The replay: per worker, an encode point's state (v, u) and the carry
  // each tensor owes.
  struct Point {
    std::vector<float> v, u;
  };
  auto step = [&](Point& pt, const std::vector<float>& x, bool restart, std::vector<float>& sent) {
    const size_t n = x.size(), k = std::max<size_t>(1, size_t(double(n) * 0.25));
    if (pt.v.empty()) pt.v.assign(n, 0.0f), pt.u.assign(n, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      pt.u[i] = m * pt.u[i] + x[i];
      pt.v[i] += pt.u[i];
    }
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return std::fabs(pt.v[a]) > std::fabs(pt.v[b]); });
    sent.assign(n, 0.0f);
    for (size_t j = 0; j < k; ++j) {
      sent[idx[j]] = pt.v[idx[j]];
      pt.v[idx[j]] = pt.u[idx[j]] = 0.0f;
    }
    if (restart) std::fill(pt.u.begin(), pt.u.end(), 0.0f);
  };
  auto retire = [&](Point& pt, std::vector<std::vector<float>*> carries) {
    size_t at = 0;
    for (auto* c : carries) {  // each sized to its tensor, in the point's order
      for (size_t i = 0; i < c->size(); ++i, ++at)
        if (!pt.v.empty()) (*c)[i] += pt.v[at] + m * pt.u[at];
    }
    pt = Point{};
  };
  // expect[iter][k]: the sum of what the workers sent for tensor k.
  std::vector<std::vector<std::vector<float>>> expect(
      size_t(iters), {std::vector<float>(lens[0], 0.0f), std::vector<float>(lens[1], 0.0f)});
  for (int r = 0; r < W; ++r) {
    Point G, A, B;
    std::vector<float> carryA, carryB;
    enum { kNone, kGroup, kAlone } layout = kNone;
    for (int iter = 0; iter < iters; ++iter) {
      std::vector<float> xa(lens[0]), xb(lens[1]);
      for (uint64_t i = 0; i < lens[0]; ++i) xa[i] = grad(r, iter, 0, i);
      for (uint64_t i = 0; i < lens[1]; ++i) xb[i] = grad(r, iter, 1, i);
      if (whole[size_t(iter)]) {
        if (layout == kAlone) {
          carryA.assign(lens[0], 0.0f), carryB.assign(lens[1], 0.0f);
          retire(A, {&carryA});
          retire(B, {&carryB});
        }
        const bool restart = !carryA.empty() || !carryB.empty();
        for (size_t i = 0; i < carryA.size(); ++i) xa[i] += carryA[i];
        for (size_t i = 0; i < carryB.size(); ++i) xb[i] += carryB[i];
        carryA.clear(), carryB.clear();
        std::vector<float> x(xa), sent;
        x.insert(x.end(), xb.begin(), xb.end());
        step(G, x, restart, sent);
        for (uint64_t i = 0; i < lens[0]; ++i) expect[size_t(iter)][0][i] += sent[i];
        for (uint64_t i = 0; i < lens[1]; ++i) expect[size_t(iter)][1][i] += sent[lens[0] + i];
        layout = kGroup;
      } else {
        if (layout == kGroup) {
          carryA.assign(lens[0], 0.0f), carryB.assign(lens[1], 0.0f);
          retire(G, {&carryA, &carryB});
        }
        const bool restartA = !carryA.empty(), restartB = !carryB.empty();
        for (size_t i = 0; i < carryA.size(); ++i) xa[i] += carryA[i];
        for (size_t i = 0; i < carryB.size(); ++i) xb[i] += carryB[i];
        carryA.clear(), carryB.clear();
        std::vector<float> sent;
        step(A, xa, restartA, sent);
        for (uint64_t i = 0; i < lens[0]; ++i) expect[size_t(iter)][0][i] += sent[i];
        step(B, xb, restartB, sent);
        for (uint64_t i = 0; i < lens[1]; ++i) expect[size_t(iter)][1][i] += sent[i];
        layout = kAlone;
      }
    }
  }
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    ex.declare("a", DType::kFloat32, lens[0]);
    ex.declare("b", DType::kFloat32, lens[1]);
    ex.setPlan(p, soon());
    for (int iter = 0; iter < iters; ++iter) {
      std::vector<float> flat(lens[0] + lens[1]);
      for (uint64_t i = 0; i < lens[0]; ++i) flat[i] = grad(r, iter, 0, i);
      for (uint64_t i = 0; i < lens[1]; ++i) flat[lens[0] + i] = grad(r, iter, 1, i);
      executor::BatchItem a{"a", flat.data(), flat.data(), lens[0]};
      executor::BatchItem b{"b", flat.data() + lens[0], flat.data() + lens[0], lens[1]};
      if (whole[size_t(iter)]) {
        std::vector<executor::BatchItem> both = {a, b};
        ex.runBatch(both, ReduceOp::kSum, soon());
      } else {
        ex.runBatch(std::span<const executor::BatchItem>(&a, 1), ReduceOp::kSum, soon());
        ex.runBatch(std::span<const executor::BatchItem>(&b, 1), ReduceOp::kSum, soon());
      }
      for (uint64_t i = 0; i < lens[0]; ++i)
        ASSERT_EQ(flat[i], expect[size_t(iter)][0][i]) << "iteration " << iter << ", a[" << i << "]";
      for (uint64_t i = 0; i < lens[1]; ++i)
        ASSERT_EQ(flat[lens[0] + i], expect[size_t(iter)][1][i])
            << "iteration " << iter << ", b[" << i << "]";
    }
  });
}

TEST(Executor, RefusalsNameTheTensorAndWhatToDo) {
  test::Job job(2, 1);
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    ex.declare("a", DType::kFloat32, 8);
    plan::TensorOption flat;
    flat.steps = {Step::comm(Scope::kFlat, CommOp::kAllreduce, false)};
    plan::Plan p;
    p.tensors["a"] = flat;
    try {
      ex.setPlan(p, soon());
      ADD_FAILURE() << "a flat step without MPI was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mpirun"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
    }
    EXPECT_THROW(ex.declare("a", DType::kFloat32, 9), Error);
    EXPECT_THROW(ex.declare("h", DType::kFloat16, 9), Error);
  });
}

// Workers that declare a tensor with different sizes: the shard keys'
// declarations disagree and every worker's setPlan fails naming the tensor.
// A push/pull that times out (worker 1 never runs the tensor) ends worker
// 0's operations: run() throws kTimeout naming the key, the worker records
// the failure, and the answer that comes once worker 1 does push is dropped
// instead of landing in the output that run() already handed back (which is
// freed here before it could arrive). Compressed answers are held by the
// operation itself, so they never point into freed memory either.
TEST(Executor, TimedOutPushPullEndsTheWorkerAndWritesNothingLater) {
  const uint64_t n = 64;
  for (bool compressed : {false, true}) {
    SCOPED_TRACE(compressed ? "compressed pull" : "raw pull");
    test::Job job(2, 1, smallChunks());
    const std::string name = compressed ? "c" : "r";
    plan::Plan p;
    plan::TensorOption o = executor::defaultOption();
    if (compressed) {
      o.codec = "fp16";
      o.steps = {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false), Step::encode(plan::Device::kCpu),
                 Step::comm(Scope::kInter, CommOp::kPush, true), Step::comm(Scope::kInter, CommOp::kPull, true),
                 Step::decode(plan::Device::kCpu), Step::comm(Scope::kIntra, CommOp::kAllgather, false)};
    }
    p.tensors[name] = o;
    std::vector<std::unique_ptr<executor::Executor>> ex(2);
    job.onEveryWorker([&](int r) {
      ex[r] = std::make_unique<executor::Executor>(*job.workers[r], nullptr);
      ex[r]->declare(name, DType::kFloat32, n);
      ex[r]->setPlan(p, soon());
    });
    {
      auto out = std::make_unique<std::vector<float>>(n, -1.0f);
      std::vector<float> in(n, 1.0f);
      try {
        ex[0]->run(name, in.data(), out->data(), n, ReduceOp::kSum, Deadline::after(Millis(300)));
        FAIL() << "run() returned without worker 1's push";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("push/pull of key"), std::string::npos) << e.what();
      }
      EXPECT_EQ(job.workers[0]->failure().code(), ErrorCode::kTimeout);
    }  // the output is freed here
    // Worker 1 pushes now; the servers answer both. Worker 0 must drop its
    // answer (its operation ended), and worker 1 gets its sum.
    std::vector<float> in1(n, 2.0f), out1(n);
    ex[1]->run(name, in1.data(), out1.data(), n, ReduceOp::kSum, soon());
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out1[i], 3.0f) << i;
    // Later calls on worker 0 fail at once with the recorded cause.
    std::vector<float> again(n);
    try {
      ex[0]->run(name, in1.data(), again.data(), n, ReduceOp::kSum, soon());
      FAIL() << "worker 0 ran after it was aborted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    }
  }
}

TEST(Executor, MismatchedSizesFailEveryWorker) {
  test::Job job(2, 1);
  job.onEveryWorker([&](int r) {
    executor::Executor ex(*job.workers[r], nullptr);
    ex.declare("m", DType::kFloat32, r == 0 ? 10 : 11);
    try {
      ex.setDefaultPlan(soon());
      ADD_FAILURE() << "worker " << r << ": mismatched sizes were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'m/plan1/shard0'"), std::string::npos) << e.what();
    }
  });
}

// A size setting: units, 0, the default when unset; anything else refused
// naming the variable and saying what to give (`hint`); passed on to
// launched roles.
void expectSizeSetting(const char* var, uint64_t JobConfig::*field, uint64_t def, const char* hint) {
  unsetenv(var);
  EXPECT_EQ(readJobConfig(false).*field, def);
  setenv(var, "1M", 1);
  EXPECT_EQ(readJobConfig(false).*field, 1u << 20);
  setenv(var, "2MiB", 1);
  EXPECT_EQ(readJobConfig(false).*field, 2u << 20);
  setenv(var, "0", 1);
  EXPECT_EQ(readJobConfig(false).*field, 0u);
  for (const char* bad : {"-1", "lots", "4X"}) {
    setenv(var, bad, 1);
    try {
      readJobConfig(false);
      ADD_FAILURE() << var << "=" << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(hint), std::string::npos) << e.what();
    }
  }
  unsetenv(var);
  JobConfig c;
  c.*field = 12345;
  bool found = false;
  for (const auto& [k, v] : c.toEnv()) found |= k == var && v == "12345";
  EXPECT_TRUE(found) << var;
}

// CORTADO_FUSION_BYTES and CORTADO_PHASE_BYTES, each 64 MiB by default.
TEST(Executor, FusionThresholdFromTheJobConfig) {
  expectSizeSetting("CORTADO_FUSION_BYTES", &JobConfig::fusionBytes, executor::kDefaultFusionBytes,
                    "0 switches tensor fusion off");
}

TEST(Executor, PhaseBytesFromTheJobConfig) {
  expectSizeSetting("CORTADO_PHASE_BYTES", &JobConfig::phaseBytes, executor::kDefaultPhaseBytes,
                    "0 runs a batch's tensors one after the other");
}

// CORTADO_PIPELINE: off by default, 1/0 (and the other boolean spellings),
// anything else refused naming the variable; passed on to launched roles.
TEST(Executor, PipelineFromTheJobConfig) {
  unsetenv("CORTADO_PIPELINE");
  EXPECT_FALSE(readJobConfig(false).pipeline);
  setenv("CORTADO_PIPELINE", "1", 1);
  EXPECT_TRUE(readJobConfig(false).pipeline);
  setenv("CORTADO_PIPELINE", "0", 1);
  EXPECT_FALSE(readJobConfig(false).pipeline);
  setenv("CORTADO_PIPELINE", "sometimes", 1);
  try {
    readJobConfig(false);
    ADD_FAILURE() << "'sometimes' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CORTADO_PIPELINE"), std::string::npos) << e.what();
  }
  unsetenv("CORTADO_PIPELINE");
  JobConfig c;
  c.pipeline = true;
  bool found = false;
  for (const auto& [k, v] : c.toEnv()) found |= k == "CORTADO_PIPELINE" && v == "1";
  EXPECT_TRUE(found);
}

TEST(Executor, CodecThreadsFromTheJobConfig) {
  unsetenv("CORTADO_CODEC_THREADS");
  JobConfig c = readJobConfig(false);
  EXPECT_EQ(c.codecThreads, 0);
  // Auto: the machine's cores over twice its workers, at least 1.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(executor::codecThreadsFor(c, 1), std::max(1, cores / 2));
  EXPECT_EQ(executor::codecThreadsFor(c, 4), std::max(1, cores / 8));
  EXPECT_EQ(executor::codecThreadsFor(c, 100000), 1);
  setenv("CORTADO_CODEC_THREADS", "3", 1);
  c = readJobConfig(false);
  EXPECT_EQ(c.codecThreads, 3);
  EXPECT_EQ(executor::codecThreadsFor(c, 8), 3);
  bool found = false;
  for (const auto& [k, v] : c.toEnv()) found |= k == "CORTADO_CODEC_THREADS" && v == "3";
  EXPECT_TRUE(found);
  for (const char* bad : {"-1", "257", "many"}) {
    setenv("CORTADO_CODEC_THREADS", bad, 1);
    try {
      readJobConfig(false);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CORTADO_CODEC_THREADS"), std::string::npos) << e.what();
    }
  }
  unsetenv("CORTADO_CODEC_THREADS");
}

}  // namespace
}  // namespace cortado
