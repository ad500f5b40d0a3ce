// The plan executor's check, mode gravac (exec_check.cc describes the
// modes): GraVAC (Executor::setGravac) under mpirun, every compressed option
// of the planner's tree at once (flat and hierarchical, collectives and
// push/pull), with the workers' energies agreed through the world group and
// dense iterations summed by a world allreduce.
//  - every rank takes the same CF sequence (compared across the ranks), the
//    ranks' gradients differing;
//  - nothing is lost: after the iterations, GraVAC is turned off (its
//    residuals join the next inputs) and every tensor put on the raw
//    default plan (the carrier plan's residuals too); one iteration of zero
//    gradients brings the rest out, and the outputs over all iterations add
//    up to the sum of every rank's gradients, exactly (inputs are multiples
//    of 1/8 below 2^8: every partial sum is exact in fp32).
#include <set>
#include <string>
#include <vector>

#include "tests/common/gravac_test_options.h"
#include "tests/multiprocess/exec_check.h"

namespace exec_check {

namespace {

// Rank r's gradient: heavy-tailed in some iterations, flat in others, so
// that the gains move and GraVAC sends at several CFs.
float gravacInput(int rank, size_t tensor, int iter, uint64_t i) {
  const uint64_t h =
      (uint64_t(rank) * 7919 + tensor * 104729 + uint64_t(iter) * 1299709 + i * 15485863) % 1000003;
  const int64_t heavy = (iter / 4) % 2 == 0 ? 3 : 0;
  const int64_t k = int64_t(h % 17) - 8 + ((h % 11 == 0) ? int64_t(h % 7) * 4 * heavy : 0);
  return float(k) / 8.0f;
}

}  // namespace

void Check::runGravac() {
  const auto options = treeOptions();
  plan::Plan p, raw;
  p.version = 1;
  std::vector<std::string> names;
  std::vector<uint64_t> lens;
  for (size_t k = 0; k < options.size(); k += size_t(stride)) {
    if (!options[k].compressed()) continue;
    names.push_back(fmt::format("g{}", names.size()));
    lens.push_back(n + names.size() % 5);
    p.tensors[names.back()] = options[k];
  }
  names.push_back("raw");
  lens.push_back(n);
  p.tensors["raw"] = executor::defaultOption();
  for (const auto& name : names) raw.tensors[name] = executor::defaultOption();
  raw.version = 1000;
  for (size_t t = 0; t < names.size(); ++t) ex.declare(names[t], DType::kFloat32, lens[t]);
  ex.setPlan(p, opDeadline());
  ex.setGravac(cortado::test::gravacTestOptions());
  if (me == 0)
    std::printf("gravac: %zu tensors (%zu compressed options), %d ranks on %d machines\n",
                names.size(), names.size() - 1, W, topo.numMachines);
  std::vector<std::vector<double>> total(names.size()), want(names.size());
  for (size_t t = 0; t < names.size(); ++t) {
    total[t].assign(lens[t], 0.0);
    want[t].assign(lens[t], 0.0);
  }
  auto iteration = [&](int iter, bool zero) {
    std::vector<std::vector<float>> in(names.size()), out(names.size());
    std::vector<executor::BatchItem> batch;
    for (size_t t = 0; t < names.size(); ++t) {
      in[t].resize(lens[t]);
      out[t].assign(lens[t], 0.0f);
      for (uint64_t i = 0; i < lens[t]; ++i) {
        in[t][i] = zero ? 0.0f : gravacInput(me, t, iter, i);
        if (!zero)
          for (int r = 0; r < W; ++r) want[t][i] += gravacInput(r, t, iter, i);
      }
      batch.push_back({names[t], in[t].data(), out[t].data(), lens[t]});
    }
    ex.runBatch(batch, ReduceOp::kSum, opDeadline(batch.size()));
    for (size_t t = 0; t < names.size(); ++t)
      for (uint64_t i = 0; i < lens[t]; ++i) total[t][i] += out[t][i];
  };
  const auto start = std::chrono::steady_clock::now();
  for (int iter = 0; iter < iters; ++iter) {
    iteration(iter, false);
    progress(iter + 1, iters, names.size(), "tensors", start);
  }
  // The same CF sequence on every rank.
  std::string seq;
  std::set<std::string> levels;
  for (const auto& s : ex.gravacHistory()) {
    seq += fmt::format("{}@{} ", compressor::gravacLevelName(s.level), s.ratio);
    levels.insert(compressor::gravacLevelName(s.level));
  }
  const int64_t digest = int64_t(std::hash<std::string>{}(seq) >> 1);
  std::vector<int64_t> all(static_cast<size_t>(W), 0);
  groups.world->allgather(&digest, 1, all.data(), DType::kInt64, opDeadline());
  for (int r = 0; r < W; ++r)
    if (all[size_t(r)] != digest)
      fail(fmt::format("rank {} took another CF sequence than rank {}: {}", r, me, seq));
  if (me == 0)
    std::printf("gravac: %s(%llu re-plans, plan CF %g)\n", seq.c_str(),
                static_cast<unsigned long long>(ex.gravacReplans()), ex.gravacPlanRatio());
  if (ex.gravacReplans() < 1) fail("gravac: no re-plan in " + seq);
  if (levels.size() < 3) fail("gravac: not every level (candidate, minimum, dense) ran: " + seq);
  // Everything out, then the totals.
  ex.setGravac(std::nullopt);
  ex.setPlan(raw, opDeadline());
  iteration(0, true);
  int shown = 0;
  for (size_t t = 0; t < names.size(); ++t)
    for (uint64_t i = 0; i < lens[t]; ++i)
      if (total[t][i] != want[t][i] && shown++ < 5)
        fail(
            fmt::format("gravac: tensor {} ({}), element {}: the outputs add up to {}, the "
                        "gradients to {}",
                        names[t], p.tensors.at(names[t]).describe(), i, total[t][i], want[t][i]));
}

}  // namespace exec_check
