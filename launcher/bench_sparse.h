// `cortado bench sparse`: Zen against its peers, in one job and one run.
// Run outside a job, it launches a local job of itself (W workers under
// mpirun, S servers); inside a job, for each density every worker draws
// skewed (index, value) pairs of an `elements`-float32 tensor and the job
// times, one after the other: Zen (Worker::pushPullSparse through the
// servers), dense push/pull of the same tensor, an allgather of the pairs
// (MPI_Allgatherv, then a scatter-add: AGsparse), MPI_Allreduce of the
// dense tensor, and Zen without servers over the MPI world group
// (core/zen_collective.h): balanced parallelism (alltoallv push, allgatherv
// pull) and hierarchical centralization, each forced, and the scheme that
// the measured sparsity chooses (equations 1 and 2) printed beside them.
// The group does not compare its arguments across ranks (the peers are raw
// MPI calls). Every result is checked against the plain sum; rank 0 prints
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
