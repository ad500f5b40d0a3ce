#include "launcher/bench_pushpull.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "core/backends.h"
#include "core/common/env.h"
#include "core/common/half.h"
#include "core/common/logging.h"
#include "core/common/memory.h"
#include "core/shm/shm_segment.h"
#include "core/worker.h"
#include "launcher/launch.h"
#include "cortado/config.h"
#if CORTADO_MPI
#include "core/collective/mpi/factory.h"
#include "core/executor/executor.h"
#endif

namespace cortado::launcher {
namespace {

// Integer-valued inputs keep every sum exact in every dtype, so results are
// checked bit for bit: worker r sends (r + 1) * (i % 13 + 1).
double inputValue(int rank, uint64_t i) { return double(rank + 1) * double(i % 13 + 1); }
double expectedSum(int workers, uint64_t i) {
  return double(workers) * (workers + 1) / 2.0 * double(i % 13 + 1);
}

void fill(DType t, void* p, uint64_t n, int rank) {
  for (uint64_t i = 0; i < n; ++i) {
    double v = inputValue(rank, i);
    switch (t) {
      case DType::kFloat32: static_cast<float*>(p)[i] = float(v); break;
      case DType::kFloat64: static_cast<double*>(p)[i] = v; break;
      case DType::kFloat16: static_cast<uint16_t*>(p)[i] = floatToHalf(float(v)); break;
      case DType::kBFloat16: static_cast<uint16_t*>(p)[i] = floatToBf16(float(v)); break;
      case DType::kInt32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
      case DType::kInt64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
      case DType::kUInt8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
      case DType::kInt8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
    }
  }
}

uint64_t countWrong(DType t, const void* p, uint64_t n, int workers) {
  std::vector<uint8_t> expect(n * dtypeSize(t));
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < n; ++i) {
    double e = expectedSum(workers, i);
    double got = 0;
    switch (t) {
      case DType::kFloat32: got = static_cast<const float*>(p)[i]; break;
      case DType::kFloat64: got = static_cast<const double*>(p)[i]; break;
      case DType::kFloat16: got = halfToFloat(static_cast<const uint16_t*>(p)[i]); break;
      case DType::kBFloat16: got = bf16ToFloat(static_cast<const uint16_t*>(p)[i]); break;
      case DType::kInt32: got = static_cast<const int32_t*>(p)[i]; break;
      case DType::kInt64: got = double(static_cast<const int64_t*>(p)[i]); break;
      case DType::kUInt8: got = static_cast<const uint8_t*>(p)[i]; e = double(uint8_t(e)); break;
      case DType::kInt8: got = static_cast<const int8_t*>(p)[i]; e = double(int8_t(e)); break;
    }
    if (t == DType::kBFloat16) e = bf16ToFloat(floatToBf16(float(e)));
    wrong += got != e;
  }
  return wrong;
}

int itersFor(uint64_t bytes, int requested) {
  if (requested > 0) return requested;
  // About 1 GiB of traffic per size, between 5 and 200 iterations.
  uint64_t it = (1ull << 30) / std::max<uint64_t>(bytes, 1);
  return static_cast<int>(std::clamp<uint64_t>(it, 5, 200));
}

int relaunch(const PushPullBenchOptions& o) {
  LaunchOptions lo;
  lo.job = readJobConfig(false);
  lo.job.numWorkers = o.workers;
  lo.job.numServers = o.servers;
  if (!o.transport.empty()) lo.job.transport = o.transport;
  if (!getEnv({"CORTADO_LOG_LEVEL"})) lo.job.logLevel = "warn";
  if (!getEnv({"CORTADO_REPORT_MEMORY"})) lo.job.reportMemory = true;
  lo.command = {selfExecutable(), "bench", "pushpull",
                "--min-bytes", std::to_string(o.minBytes),
                "--max-bytes", std::to_string(o.maxBytes),
                "--iters", std::to_string(o.iters),
                "--warmup", std::to_string(o.warmup),
                "--dtype", o.dtype};
  if (o.json) lo.command.push_back("--json");
  if (o.executor) {
    lo.hosts.mpi = true;
    lo.command.push_back("--executor");
  }
  if (!o.codec.empty()) {
    lo.command.push_back("--codec");
    lo.command.push_back(o.codec);
  }
  return runLaunch(lo);
}

}  // namespace

int runPushPullBench(const PushPullBenchOptions& o) {
  if (!getEnv({"CORTADO_ROLE", "DMLC_ROLE"})) return relaunch(o);
  CORTADO_ENFORCE(o.minBytes > 0 && o.minBytes <= o.maxBytes, ErrorCode::kInvalidArgument,
                  "--min-bytes {} must be positive and at most --max-bytes {}", o.minBytes,
                  o.maxBytes);
  const DType dtype = parseDType(o.dtype);
  JobConfig job = readJobConfig(true);
  CORTADO_ENFORCE(job.role == Role::kWorker, ErrorCode::kInvalidArgument,
                  "cortado bench pushpull runs as a worker, but CORTADO_ROLE is {}",
                  roleName(job.role));
  setupLogging(fmt::format("worker {}", job.rank), job.logLevel);
#if CORTADO_MPI
  std::unique_ptr<collective::mpi::Runtime> mpi;
  collective::Groups groups;
  if (o.executor) {
    CORTADO_ENFORCE(dtype == DType::kFloat32 && o.codec.empty(), ErrorCode::kInvalidArgument,
                    "--executor runs float32 tensors uncompressed (the default plan); drop "
                    "--dtype/--codec");
    mpi = std::make_unique<collective::mpi::Runtime>();
    groups = collective::mpi::createGroups(*mpi, collective::mpi::Options::fromEnv(),
                                           Deadline::after(job.connectTimeout));
  }
#else
  CORTADO_ENFORCE(!o.executor, ErrorCode::kUnavailable,
                  "--executor needs MPI, and this build has none (install OpenMPI with "
                  "scripts/install_deps.sh and reconfigure)");
#endif
  const MemoryUse base = currentMemory();  // before the engine starts
  auto worker = startWorker(job, Deadline::after(job.connectTimeout));
  const int W = worker->size(), rank = worker->rank();
  const bool lead = rank == 0;
  const size_t esz = dtypeSize(dtype);
  const double busFactor = W > 1 ? 2.0 * (W - 1) / W : 1.0;
#if CORTADO_MPI
  std::unique_ptr<executor::Executor> ex;
  if (o.executor) {
    ex = std::make_unique<executor::Executor>(*worker, &groups);
    for (uint64_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= 2)
      ex->declare(fmt::format("bench.{}.executor", bytes), DType::kFloat32,
                  std::max<uint64_t>(1, bytes / esz));
    ex->setDefaultPlan(Deadline::after(job.opTimeout));
  }
#endif
  if (lead && !o.json) {
    fmt::print("# cortado bench pushpull: {} workers, {} servers, dtype {}, transport {}, codec {}\n",
               W, worker->numServers(), dtypeName(dtype), job.transport,
               o.codec.empty() ? "none" : o.codec);
#if CORTADO_MPI
    if (o.executor)
      fmt::print("# executor: default plan on {} machines (time(us) and algbw: push_pull)\n",
                 groups.topology.numMachines);
#endif
    fmt::print("# {:>12} {:>12} {:>10} {:>12} {:>12} {:>12} {:>6}{}\n", "size(B)", "count", "iters",
               "time(us)", "algbw(GB/s)", "busbw(GB/s)", "check",
               o.executor ? fmt::format(" {:>12} {:>12}", "exec(us)", "exec/pp") : "");
  }
  int failures = 0;
  uint64_t declaredBytes = 0;
  int32_t okFlag = 0, okSum = 0;
  worker->declare("bench.check", DType::kInt32, 1, Deadline::after(job.opTimeout));
  for (uint64_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= 2) {
    const uint64_t n = std::max<uint64_t>(1, bytes / esz);
    const std::string name = fmt::format("bench.{}", bytes);
    worker->declare(name, dtype, n, TensorOptions{.codec = o.codec},
                    Deadline::after(job.opTimeout));
    std::vector<uint8_t> in(n * esz), out(n * esz);
    fill(dtype, in.data(), n, rank);
    auto once = [&] {
      worker->pushPull(name, dtype, n, in.data(), out.data(), ReduceOp::kSum, 0)
          .wait(Deadline::after(job.opTimeout))
          .check();
    };
    for (int i = 0; i < o.warmup; ++i) once();
    const int iters = itersFor(bytes, o.iters);
    worker->barrier(Deadline::after(job.opTimeout));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) once();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    double execSecs = 0;
    bool execWrong = false;
#if CORTADO_MPI
    if (ex) {
      // The same size through the plan executor, right after push_pull.
      const std::string xname = fmt::format("bench.{}.executor", bytes);
      std::vector<float> xout(n);
      auto run = [&] {
        ex->run(xname, reinterpret_cast<const float*>(in.data()), xout.data(), n, ReduceOp::kSum,
                Deadline::after(job.opTimeout));
      };
      for (int i = 0; i < o.warmup; ++i) run();
      worker->barrier(Deadline::after(job.opTimeout));
      auto x0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run();
      execSecs = std::chrono::duration<double>(std::chrono::steady_clock::now() - x0).count() / iters;
      execWrong = countWrong(DType::kFloat32, xout.data(), n, W) != 0;
    }
#endif
    // The memory report at the largest size, while its buffers are alive:
    // the overhead is what the process holds beyond the baseline and the
    // benchmark's own buffers (in, out), against every tensor declared.
    declaredBytes += n * esz;
    if (job.reportMemory && bytes * 2 > o.maxBytes) {
      printWorkerMemory(rank, base, currentMemory(), in.size() + out.size(), declaredBytes,
                        job.sharedMemory ? shm::ownedSegmentBytes(shm::jobPrefix(job.token),
                                                                  NodeId{Role::kWorker, rank})
                                         : 0);
    }
    // Every worker checks its own result; the job-wide verdict is one more sum.
    const bool checked = o.codec.empty() || o.codec.rfind("fp16", 0) == 0 ||
                         o.codec.rfind("bf16", 0) == 0;
    okFlag = (checked && countWrong(dtype, out.data(), n, W)) || execWrong ? 1 : 0;
    worker->pushPull("bench.check", DType::kInt32, 1, &okFlag, &okSum, ReduceOp::kSum, 0)
        .wait(Deadline::after(job.opTimeout))
        .check();
    const bool ok = okSum == 0;
    failures += !ok;
    const double algbw = double(n * esz) / secs / 1e9;
    if (lead) {
      if (o.json) {
        fmt::print("{{\"size_bytes\": {}, \"seconds\": {:.9f}, \"algbw_gbps\": {:.4f}, "
                   "\"busbw_gbps\": {:.4f}, \"ok\": {}, \"workers\": {}, \"servers\": {}, "
                   "\"dtype\": \"{}\", \"transport\": \"{}\", \"iters\": {}, "
                   "\"codec\": \"{}\", \"checked\": {}{}}}\n",
                   n * esz, secs, algbw, algbw * busFactor, ok ? "true" : "false", W,
                   worker->numServers(), dtypeName(dtype), job.transport, iters, o.codec,
                   checked ? "true" : "false",
                   o.executor ? fmt::format(", \"executor_seconds\": {:.9f}", execSecs) : "");
      } else {
        fmt::print("  {:>12} {:>12} {:>10} {:>12.1f} {:>12.3f} {:>12.3f} {:>6}{}\n", n * esz, n,
                   iters, secs * 1e6, algbw, algbw * busFactor,
                   !checked ? "lossy" : ok ? "ok" : "WRONG",
                   o.executor ? fmt::format(" {:>12.1f} {:>12.2f}", execSecs * 1e6, execSecs / secs)
                              : "");
      }
      std::fflush(stdout);
    }
  }
  worker->shutdown(Deadline::after(job.opTimeout));
  if (failures) {
    fmt::print(stderr, "cortado bench pushpull: {} sizes had wrong results\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace cortado::launcher
