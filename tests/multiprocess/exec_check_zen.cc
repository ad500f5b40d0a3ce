// The plan executor's check, mode zen (exec_check.cc describes the modes):
// tensors on Zen's plan options (balanced parallelism and hierarchical
// centralization, core/zen_collective: flat over the world group, and
// hierarchical, each local rank's shard of the intra-machine reduce-scatter
// over the inter-machine group) beside a tensor
// on the default push/pull, under mpirun, for --iters iterations, alone
// (run) and in a batch (runBatch), summed and averaged. Every rank draws
// every rank's input from the same formula, so it holds the dense reference
// (a plain sum) and compares its output exactly: the values are small
// integers (exact in fp32 in any order) and the average divides by 4 or 2.
// Sparse inputs are about 1% non-zero per rank, with a share of indices
// common to all ranks (overlap) and index 0 and the last index always set;
// a denser tensor (about 50%) checks the bitmap answers.
#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/planner/option_tree.h"
#include "tests/multiprocess/exec_check.h"

namespace exec_check {

namespace {

// Rank r's element i of tensor t at iteration `iter`: non-zero with
// probability about `percent`/100 (every rank at i % 211 == 0), in [-4, 4].
float zenInput(int rank, size_t t, int iter, uint64_t i, uint64_t n, int percent) {
  const uint64_t h =
      (uint64_t(rank) * 7919 + t * 104729 + uint64_t(iter) * 1299709 + i * 15485863) % 1000003;
  const bool shared = i % 211 == 0 || i == 0 || i + 1 == n;
  if (!shared && int(h % 100) >= percent) return 0.0f;
  const int64_t k = int64_t(h % 9) - 4;
  return float(k == 0 ? 1 : k);
}

}  // namespace

void Check::runZen() {
  struct Tensor {
    std::string name;
    plan::TensorOption option;
    int percent;
  };
  const std::vector<Tensor> tensors = {
      {"zen_bp", planner::zenOption(plan::CommOp::kZenBalanced), 1},
      {"zen_hc", planner::zenOption(plan::CommOp::kZenCentralized), 1},
      {"zen_bp_dense", planner::zenOption(plan::CommOp::kZenBalanced), 50},
      {"zen_hc_dense", planner::zenOption(plan::CommOp::kZenCentralized), 50},
      {"zen_h_bp", planner::zenOption(plan::CommOp::kZenBalanced, true), 1},
      {"zen_h_hc", planner::zenOption(plan::CommOp::kZenCentralized, true), 1},
      {"pushpull", executor::defaultOption(), 100},
  };
  plan::Plan p;
  p.version = 1;
  for (const Tensor& t : tensors) {
    ex.declare(t.name, DType::kFloat32, n);
    p.tensors[t.name] = t.option;
  }
  ex.setPlan(p, opDeadline());
  if (me == 0)
    std::printf("zen: %zu tensors of %llu elements, %d ranks on %d machines\n", tensors.size(),
                static_cast<unsigned long long>(n), W, topo.numMachines);
  const auto start = std::chrono::steady_clock::now();
  for (int iter = 0; iter < iters; ++iter) {
    const bool batched = iter % 2 == 1;
    const ReduceOp op = iter == 2 ? ReduceOp::kAverage : ReduceOp::kSum;
    std::vector<std::vector<float>> in(tensors.size()), out(tensors.size());
    std::vector<executor::BatchItem> batch;
    for (size_t t = 0; t < tensors.size(); ++t) {
      in[t].resize(n);
      out[t].assign(n, -99.0f);
      for (uint64_t i = 0; i < n; ++i) in[t][i] = zenInput(me, t, iter, i, n, tensors[t].percent);
      if (batched) {
        batch.push_back({tensors[t].name, in[t].data(), out[t].data(), n});
      } else {
        runOn(ex, tensors[t].name, in[t].data(), out[t].data(), n, op, opDeadline());
      }
    }
    if (batched) runBatchOn(ex, batch, op, opDeadline(batch.size()));
    for (size_t t = 0; t < tensors.size(); ++t) {
      int shown = 0;
      uint64_t nonzeros = 0;
      for (uint64_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < W; ++r) want += zenInput(r, t, iter, i, n, tensors[t].percent);
        if (op == ReduceOp::kAverage) want /= float(W);
        nonzeros += want != 0;
        if (out[t][i] != want && shown++ < 5)
          fail(
              fmt::format("zen: iteration {} ({}), tensor {} ({}), element {}: {} != the plain "
                          "sum's {}",
                          iter, batched ? "batch" : "run", tensors[t].name,
                          tensors[t].option.describe(), i, out[t][i], want));
      }
      if (me == 0 && iter == 0)
        std::printf("zen: %s (%s): %llu of %llu non-zero in the sum\n", tensors[t].name.c_str(),
                    tensors[t].option.describe().c_str(), static_cast<unsigned long long>(nonzeros),
                    static_cast<unsigned long long>(n));
    }
    progress(iter + 1, iters, tensors.size(), "tensors", start);
  }
}

}  // namespace exec_check
