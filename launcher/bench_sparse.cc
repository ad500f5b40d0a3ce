#include "launcher/bench_sparse.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/backends.h"
#include "core/collective/mpi/factory.h"
#include "core/common/env.h"
#include "core/common/logging.h"
#include "core/worker.h"
#include "core/zen_collective.h"
#include "launcher/launch.h"
#include "launcher/sparse_pairs.h"

namespace cortado::launcher {
namespace {

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int relaunch(const SparseBenchOptions& o) {
  LaunchOptions lo;
  lo.job = readJobConfig(false);
  lo.job.numWorkers = o.workers;
  lo.job.numServers = o.servers;
  if (!getEnv({"CORTADO_LOG_LEVEL"})) lo.job.logLevel = "warn";
  lo.hosts.mpi = true;
  lo.command = {selfExecutable(),
                "bench",
                "sparse",
                "--elements",
                std::to_string(o.elements),
                "--densities",
                o.densities,
                "--iters",
                std::to_string(o.iters),
                "--warmup",
                std::to_string(o.warmup)};
  return runLaunch(lo);
}

}  // namespace

int runSparseBench(const SparseBenchOptions& o) {
  if (!getEnv({"CORTADO_ROLE", "DMLC_ROLE"})) return relaunch(o);
  JobConfig job = readJobConfig(true);
  CORTADO_ENFORCE(job.role == Role::kWorker, ErrorCode::kInvalidArgument,
                  "cortado bench sparse runs as a worker, but CORTADO_ROLE is {}",
                  roleName(job.role));
  setupLogging(fmt::format("worker {}", job.rank), job.logLevel);
  std::vector<double> densities;
  for (size_t at = 0; at < o.densities.size();) {
    size_t end = o.densities.find(',', at);
    if (end == std::string::npos) end = o.densities.size();
    densities.push_back(std::stod(o.densities.substr(at, end - at)) / 100.0);
    at = end + 1;
  }
  collective::mpi::Runtime mpi;
  auto worker = startWorker(job, Deadline::after(job.connectTimeout));
  const int W = worker->size(), rank = worker->rank();
  CORTADO_ENFORCE(mpi.worldSize() == W, ErrorCode::kInvalidArgument,
                  "cortado bench sparse: {} MPI ranks but {} workers", mpi.worldSize(), W);
  const uint64_t n = o.elements;
  const Deadline late = Deadline::after(Millis(600000));
  TensorOptions sparse;
  sparse.sparse = true;
  worker->declare("bench.zen", DType::kFloat32, n, sparse, late);
  worker->declare("bench.dense", DType::kFloat32, n, late);
  collective::mpi::Options mo = collective::mpi::Options::fromEnv();
  mo.checkArguments = false;
  const collective::Groups groups = collective::mpi::createGroups(mpi, mo, late);
  std::vector<float> dense(n), out(n), ref(n);
  if (rank == 0) {
    fmt::print(
        "# cortado bench sparse: {} workers, {} servers, {} float32 elements ({:.1f} MB "
        "dense), skewed indices, {} timed iterations after {} warm-up, transport {}\n",
        W, worker->numServers(), n, double(n) * 4 / 1e6, o.iters, o.warmup, job.transport);
    fmt::print(
        "| density/worker | density of sum | Zen ms | dense push/pull ms | allgather "
        "pairs ms | MPI_Allreduce ms | dense PP / Zen | allgather / Zen | Allreduce / "
        "Zen | Zen-MPI BP ms | Zen-MPI HC ms | measured choice | allgather / Zen-MPI BP | "
        "allgather / Zen-MPI HC | Allreduce / Zen-MPI BP | Zen-MPI BP MB sent/rank | check |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }
  int failures = 0;
  for (size_t di = 0; di < densities.size(); ++di) {
    const Pairs mine = skewedPairs(n, densities[di], rank, di + 1);
    std::fill(dense.begin(), dense.end(), 0.0f);
    for (size_t i = 0; i < mine.index.size(); ++i) dense[mine.index[i]] = mine.value[i];
    // The reference: every worker's pairs, regenerated here.
    std::fill(ref.begin(), ref.end(), 0.0f);
    uint64_t unionNnz = 0;
    for (int r = 0; r < W; ++r) {
      const Pairs p = r == rank ? mine : skewedPairs(n, densities[di], r, di + 1);
      for (size_t i = 0; i < p.index.size(); ++i) ref[p.index[i]] += p.value[i];
    }
    for (float x : ref) unionNnz += x != 0.0f;
    auto timed = [&](const std::function<void()>& once) {
      for (int i = 0; i < o.warmup; ++i) once();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) once();
      double t = seconds(t0) / o.iters, worst = 0;
      MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      return worst;
    };
    bool ok = true;
    auto check = [&](const char* what) {
      if (out != ref) {
        ok = false;
        CORTADO_LOG_ERROR("worker {}: {} at density {}: wrong sum", rank, what, densities[di]);
      }
    };
    // Zen: placement, COO pushes, answers (bitmaps or index lists) decoded into `out`.
    SparseInput in;
    in.indices = mine.index.data();
    in.values = mine.value.data();
    in.count = mine.index.size();
    const double tZen = timed([&] {
      worker->pushPullSparse("bench.zen", in, out.data(), ReduceOp::kSum, 0).wait(late).check();
    });
    check("zen");
    // Dense push/pull of the whole tensor.
    const double tDense = timed([&] {
      worker
          ->pushPull("bench.dense", DType::kFloat32, n, dense.data(), out.data(), ReduceOp::kSum, 0)
          .wait(late)
          .check();
    });
    check("dense push/pull");
    // AGsparse: allgather the counts, then every worker's indices and values
    // (MPI_Allgatherv), and add them up into `out`.
    std::vector<int> counts(W), displs(W);
    std::vector<uint32_t> allIdx;
    std::vector<float> allVal;
    const double tGather = timed([&] {
      int mineCount = int(mine.index.size());
      MPI_Allgather(&mineCount, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
      int total = 0;
      for (int r = 0; r < W; ++r) displs[r] = total, total += counts[r];
      allIdx.resize(total);
      allVal.resize(total);
      MPI_Allgatherv(mine.index.data(), mineCount, MPI_UINT32_T, allIdx.data(), counts.data(),
                     displs.data(), MPI_UINT32_T, MPI_COMM_WORLD);
      MPI_Allgatherv(mine.value.data(), mineCount, MPI_FLOAT, allVal.data(), counts.data(),
                     displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
      std::memset(out.data(), 0, n * sizeof(float));
      for (int i = 0; i < total; ++i) out[allIdx[i]] += allVal[i];
    });
    check("allgather");
    const double tAllreduce = timed([&] {
      MPI_Allreduce(dense.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    check("MPI_Allreduce");
    // Zen without servers over the MPI world group, each scheme forced, then
    // the one chosen from the sparsity measured in its first rounds.
    namespace zen = compressor::zen;
    // Returns the round's time and the bytes rank 0 sent to the others
    // (its pushes and answers).
    auto zenMpi = [&](std::optional<zen::Scheme> scheme, const char* tag) {
      ZenCollectiveOptions zo;
      zo.scheme = scheme;
      zo.compact = job.compactSparse;  // CORTADO_COMPACT_SPARSE, as the workers' pushes
      ZenCollective z(*groups.world, fmt::format("bench.zen.{}.{}", tag, di), n, zo);
      const double t = timed([&] {
        z.allreduce(mine.index, mine.value, out.data(), ReduceOp::kSum, late);
      });
      check(tag);
      return std::make_pair(t, z.lastRound().bytesSent);
    };
    const auto [tBp, bpBytes] = zenMpi(zen::Scheme::kBalancedParallelism, "bp");
    const double tHc = zenMpi(zen::Scheme::kHierarchicalCentralization, "hc").first;
    ZenCollective probe(*groups.world, fmt::format("bench.zen.choice.{}", di), n);
    for (int i = 0; i < 2; ++i)
      probe.allreduce(mine.index, mine.value, out.data(), ReduceOp::kSum, late);
    check("zen-mpi measured");
    const char* chosen = probe.nextScheme() == zen::Scheme::kBalancedParallelism ? "BP" : "HC";
    int bad = ok ? 0 : 1, anyBad = 0;
    MPI_Allreduce(&bad, &anyBad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    failures += anyBad;
    if (rank == 0) {
      fmt::print(
          "| {:.2f}% | {:.2f}% | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | "
          "{:.2f} | {:.1f} | {:.1f} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {} |\n",
          100.0 * double(mine.index.size()) / double(n), 100.0 * double(unionNnz) / double(n),
          1e3 * tZen, 1e3 * tDense, 1e3 * tGather, 1e3 * tAllreduce, tDense / tZen, tGather / tZen,
          tAllreduce / tZen, 1e3 * tBp, 1e3 * tHc, chosen, tGather / tBp, tGather / tHc,
          tAllreduce / tBp, double(bpBytes) / 1e6, anyBad ? "WRONG" : "ok");
      std::fflush(stdout);
    }
  }
  worker->shutdown(late);
  return failures ? 1 : 0;
}

}  // namespace cortado::launcher
