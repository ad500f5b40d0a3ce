// `cortado bench sparse`: Zen against its peers, in one job and one run.
// Run outside a job, it launches a local job of itself (W workers under
// mpirun, S servers); inside a job, for each density every worker draws
// skewed (index, value) pairs of an `elements`-float32 tensor and the job
// times, one after the other: Zen (Worker::pushPullSparse through the
// servers), dense push/pull of the same tensor, an allgather of the pairs
// (MPI_Allgatherv, then a scatter-add: AGsparse), and MPI_Allreduce of the
// dense tensor. Every result is checked against the plain sum; rank 0 prints
// a markdown table of the slowest worker's mean times and the ratios to Zen.
// Needs MPI (the build's CORTADO_MPI).
#pragma once

#include <cstdint>
#include <string>

namespace cortado::launcher {

struct SparseBenchOptions {
  int workers = 4;
  int servers = 4;
  uint64_t elements = 16ull << 20;
  std::string densities = "0.1,1,5";  // percent non-zero per worker
  int iters = 5;
  int warmup = 1;
};

int runSparseBench(const SparseBenchOptions& opts);

}  // namespace cortado::launcher
