// A worker program for the multi-process tests, started by `cortado launch`.
// Each worker draws its tensors from a seeded generator that every worker can
// replay, so each computes the reference sum of all workers' inputs by plain
// summation and compares its results bit for bit. Integer-valued inputs keep
// every sum exact in every dtype, whatever order the servers add in.
//
// Fault injection (for the failure tests): --die-rank R --die-at I makes
// worker R kill itself with SIGKILL at iteration I; --mismatch-rank R makes
// worker R declare the first tensor with one element more; --skip-rank R
// --skip-at I makes worker R leave out the last tensor's push_pull at
// iteration I and stop there (the others' rounds of it wait); --progress-file F
// is written by rank 0 after each iteration; --slow-ms M sleeps between
// iterations.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "core/backends.h"
#include "core/common/crash.h"
#include "core/common/half.h"
#include "core/common/logging.h"
#include "core/worker.h"

using namespace cortado;

namespace {

struct TensorSpec {
  std::string name;
  DType dtype;
  uint64_t n;
};

double valueOf(uint64_t seed, int rank, int tensor, int iter, uint64_t i) {
  // A cheap hash: independent of the order elements are generated in.
  uint64_t x = seed ^ (uint64_t(rank) << 48) ^ (uint64_t(tensor) << 32) ^ (uint64_t(iter) << 20) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return double(int64_t(x % 17) - 8);  // -8..8
}

void store(DType t, uint8_t* p, uint64_t i, double v) {
  switch (t) {
    case DType::kFloat32: reinterpret_cast<float*>(p)[i] = float(v); break;
    case DType::kFloat64: reinterpret_cast<double*>(p)[i] = v; break;
    case DType::kFloat16: reinterpret_cast<uint16_t*>(p)[i] = floatToHalf(float(v)); break;
    case DType::kBFloat16: reinterpret_cast<uint16_t*>(p)[i] = floatToBf16(float(v)); break;
    case DType::kInt32: reinterpret_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::kInt64: reinterpret_cast<int64_t*>(p)[i] = int64_t(v); break;
    case DType::kUInt8: reinterpret_cast<uint8_t*>(p)[i] = uint8_t(int(v) & 0xff); break;
    case DType::kInt8: reinterpret_cast<int8_t*>(p)[i] = int8_t(v); break;
  }
}

}  // namespace

int main(int argc, char** argv) try {
  installCrashReport("pushpull_check worker");
  CLI::App app{"cortado multi-process push-pull checker"};
  int tensors = 8, iters = 4, dieRank = -1, dieAt = -1, mismatchRank = -1, slowMs = 0;
  int skipRank = -1, skipAt = -1;
  uint64_t seed = 1, maxElements = 1 << 16, bigElements = 0;
  bool average = false;
  std::string dtypes = "float32,float64,float16,bfloat16,int32,int64", progressFile;
  app.add_option("--tensors", tensors);
  app.add_option("--iters", iters);
  app.add_option("--seed", seed);
  app.add_option("--max-elements", maxElements);
  app.add_option("--big-elements", bigElements, "one extra float32 tensor of this many elements");
  app.add_option("--dtypes", dtypes);
  app.add_flag("--average", average);
  app.add_option("--die-rank", dieRank);
  app.add_option("--die-at", dieAt);
  app.add_option("--mismatch-rank", mismatchRank);
  app.add_option("--skip-rank", skipRank);
  app.add_option("--skip-at", skipAt);
  app.add_option("--progress-file", progressFile);
  app.add_option("--slow-ms", slowMs);
  CLI11_PARSE(app, argc, argv);

  JobConfig job = readJobConfig(true);
  setupLogging(fmt::format("worker {}", job.rank), job.logLevel);
  WorkerOptions wo = workerOptions(job);
  control::ClientOptions co = controlOptions(job, Role::kWorker);
  auto transport = makeTransport(job, NodeId{Role::kWorker, job.rank});
  const std::string transportName = transport->name();
  auto w = Worker::start(wo, co, std::move(transport), Deadline::after(job.connectTimeout));
  const int W = w->size(), rank = w->rank();

  std::vector<DType> types;
  for (size_t b = 0; b <= dtypes.size();) {
    size_t e = dtypes.find(',', b);
    if (e == std::string::npos) e = dtypes.size();
    types.push_back(parseDType(dtypes.substr(b, e - b)));
    b = e + 1;
  }
  // The same shapes on every worker: drawn from the shared seed.
  std::mt19937_64 shapes(seed);
  std::vector<TensorSpec> specs;
  for (int t = 0; t < tensors; ++t) {
    // Log-uniform sizes from 1 element to maxElements.
    double lg = std::uniform_real_distribution<double>(0, std::log2(double(maxElements)))(shapes);
    specs.push_back({fmt::format("t{}", t), types[t % types.size()], uint64_t(std::exp2(lg))});
  }
  if (bigElements) specs.push_back({"big", DType::kFloat32, bigElements});
  for (size_t t = 0; t < specs.size(); ++t) {
    uint64_t n = specs[t].n + (t == 0 && rank == mismatchRank ? 1 : 0);
    w->declare(specs[t].name, specs[t].dtype, n, Deadline::after(job.opTimeout));
  }

  uint64_t checked = 0;
  int done = 0;
  for (int it = 0; it < iters; ++it, ++done) {
    if (rank == dieRank && it == dieAt) {
      fmt::print(stderr, "worker {}: dying on purpose at iteration {}\n", rank, it);
      std::fflush(stderr);
      raise(SIGKILL);
    }
    std::vector<std::vector<uint8_t>> in(specs.size()), out(specs.size());
    std::vector<Handle> handles;
    const bool skip = rank == skipRank && it == skipAt;
    if (skip)
      fmt::print(stderr, "worker {}: leaving out tensor {} at iteration {} on purpose\n", rank,
                 specs.back().name, it);
    for (size_t t = 0; t < specs.size() - (skip ? 1 : 0); ++t) {
      const auto& s = specs[t];
      const size_t esz = dtypeSize(s.dtype);
      in[t].resize(s.n * esz);
      out[t].assign(s.n * esz, 0xcd);
      for (uint64_t i = 0; i < s.n; ++i) store(s.dtype, in[t].data(), i, valueOf(seed, rank, t, it, i));
      // Priority by position, as a binding does for layers.
      handles.push_back(w->pushPull(s.name, s.dtype, s.n, in[t].data(), out[t].data(),
                                    average ? ReduceOp::kAverage : ReduceOp::kSum, -int(t)));
    }
    for (auto& h : handles) h.wait(Deadline::after(job.opTimeout)).check();
    if (skip) break;
    for (size_t t = 0; t < specs.size(); ++t) {
      const auto& s = specs[t];
      const size_t esz = dtypeSize(s.dtype);
      std::vector<uint8_t> ref(s.n * esz);
      for (uint64_t i = 0; i < s.n; ++i) {
        double sum = 0;
        for (int r = 0; r < W; ++r) sum += valueOf(seed, r, t, it, i);
        // The engine averages as sum * (1/W) in the element's precision
        // (fp32 for fp16/bf16), and truncates for integers.
        double v = sum;
        if (average && s.dtype == DType::kFloat64) v = sum * (1.0 / W);
        else if (average && isFloating(s.dtype)) v = double(float(sum) * (1.0f / float(W)));
        // NOLINTNEXTLINE(bugprone-integer-division): truncates, as the engine does
        else if (average) v = double(int64_t(sum) / W);
        store(s.dtype, ref.data(), i, v);
      }
      if (ref != out[t]) {
        uint64_t bad = 0;
        while (bad < s.n && std::memcmp(&ref[bad * esz], &out[t][bad * esz], esz) == 0) ++bad;
        fmt::print(stderr, "worker {}: WRONG result for tensor {} ({} x {}) at iteration {}, first at element {}\n",
                   rank, s.name, s.n, dtypeName(s.dtype), it, bad);
        return 1;
      }
      checked += s.n;
    }
    if (rank == 0 && !progressFile.empty()) {
      // Written aside and renamed: a reader never sees the file empty
      // between the truncation and the write (launch_hosts_linkdown once
      // read it in that instant and failed with "no progress").
      const std::string tmp = progressFile + ".tmp";
      std::ofstream(tmp) << it + 1 << "\n";
      std::rename(tmp.c_str(), progressFile.c_str());
    }
    if (slowMs) std::this_thread::sleep_for(std::chrono::milliseconds(slowMs));
  }
  w->shutdown(Deadline::after(job.opTimeout));
  fmt::print(
      "worker {}: {} iterations of {} tensors correct ({} elements checked, "
      "transport {}, shm {}, chunks of {} bytes)\n",
      rank, done, specs.size(), checked, transportName, job.sharedMemory ? "on" : "off",
      job.partitionBytes);
  return 0;
} catch (const std::exception& e) {  // whatever the steps above throw, setup included
  fmt::print(stderr, "worker: error: {}\n", e.what());
  return 2;
}
