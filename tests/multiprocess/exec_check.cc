// A worker program for the plan executor's multi-process tests, run as the
// MPI ranks of a job: `cortado launch --mpi -w 4 -s 2 -- exec_check ...`. Every rank computes every
// rank's inputs (a formula), so each checks its results against a plain summation.
//
//   --mode all     every option of enumerateOptions({parameterServer=true})
//                  (or the --shard of --shards part of them), one tensor each,
//                  with the codec fp16 and integer-valued inputs: every fp32
//                  and fp16 sum is exact, so results must equal the reference
//                  exactly, lossless and compressed options alike.
//   --mode lossy   the compressed options (every --stride-th) with --codec
//                  (e.g. topk:ratio=0.25) and error feedback over --iters
//                  iterations: the running sum of outputs must track the
//                  running sum of the true sums within --bound (error feedback
//                  keeps what was not sent), and must not drift with time.
//                  --bound 0: a bound per option derived from the codec and the
//                  option's encode points (see derivedBound below).
//   --mode errors  the refusals: a plan naming an undeclared tensor, a plan
//                  missing a declared one, a codec that cannot apply, a size
//                  mismatch at run().
//   --mode switch  plan switches mid-run (online re-planning): plan A, then at
//                  iteration --switch-at a very different plan B (hierarchical
//                  push/pull options <-> flat and inter collectives, other
//                  encode points), then at --switch-at2 every tensor on the
//                  lossless default. With --codec fp16 (exact inputs) every
//                  iteration must equal the reference exactly; with a lossy
//                  codec and error feedback the running sums must track within
//                  --bound across the first switch, and after the switch to the
//                  lossless plan the running sums must agree to rounding: every
//                  residual of a retired encode point was sent once, the
//                  servers' included (half of plan A's options have the servers
//                  re-encode a compressed pull; their residuals go out in the
//                  dense answers of A's last round). --bound 0: per tensor, the
//                  larger derivedBound of its two lossy options. Also: the
//                  profiling window's report, a plan scheduled too late, and
//                  malformed profile reports refused by the scheduler.
//   --mode replan  online re-planning from the job's config: the executor gets
//                  executor::onlineOptions(job) (CORTADO_PROFILE_WINDOW) and
//                  beginIteration() every iteration; --tensors tensors of
//                  --elements integer-valued inputs (every fourth one of
//                  --elements/128: small enough that compressing it pays on a
//                  slow link only) start on the default plan
//                  and run --iters iterations, or until --stop-file exists
//                  (then --after more) or --max-seconds pass, whatever plans the
//                  scheduler hands out. Every result of every iteration must
//                  equal the reference sum exactly, so the scheduler's codec
//                  (CORTADO_REPLAN_CODEC) must be lossless on them (fp16).
//                  Rank 0 prints each plan version it switched to with the
//                  iteration and every tensor's option, and writes
//                  "ITERATION VERSION" to --progress-file each iteration.
//                  --batch: each iteration's tensors as one runBatch (tensor
//                  fusion), as bench model hands them over.
//   --mode fusion  tensor fusion (Executor::runBatch): per fusible option of
//                  the tree (uncompressed, collectives only) three tensors
//                  in a row (sizes --elements, --elements + 5, 1), then a
//                  tensor that must run alone (push/pull, or compressed with
//                  --codec fp16) or, every third, one on the first triple's
//                  option (fused with it from afar), all in one batch per
//                  iteration, under four
//                  thresholds: the default (each triple one execution), 0
//                  (off), one byte less than the first tensor (every tensor
//                  alone) and exactly the first two (pairs). Every result is
//                  checked against a plain summation (exact: integer
//                  inputs), and the profile's communication entries show the
//                  fused sizes where fusion is on and only single sizes
//                  where it is off.
//   --mode groups  the plan's fused groups (plan::Plan::groups): per option of
//                  the tree (--shard of --shards) a group of three tensors
//                  (--elements, --elements + 5 and 3 elements), every group
//                  in one plan, over --iters iterations whose batches hold
//                  the groups whole, split over two batches (every member
//                  alone), reversed, one tensor at a time, or whole through
//                  runBatch with an AwaitItem (every input written only when
//                  awaited; with the pipeline on and off: each item awaited
//                  once in order, on the second thread exactly for the
//                  executions started ahead), so that the
//                  group boundaries change between iterations. With --codec
//                  fp16 (integer inputs) every result must equal the plain
//                  sum; with a lossy codec (the compressed options, every
//                  --stride-th) the running sums must track the true ones
//                  within derivedBound (servers' points counted twice: a
//                  residual may wait on the group's key or a member's own):
//                  error feedback across changing boundaries loses nothing
//                  and sends nothing twice. The buffers change too, two
//                  iterations each: a buffer per tensor, one flat buffer in
//                  place (a framework's flat gradient buffer), flat outputs
//                  with inputs apart. Each iteration checks that the groups
//                  ran as one execution exactly when whole, and in place
//                  exactly when their outputs were consecutive.
//   --mode search  MergeComp's fusion search (Executor::setFusionSearch) over
//                  --tensors tensors (every fourth on the default option,
//                  the others on one compressed option, fp16), rank 1
//                  slower than the others: every iteration exact, and at the
//                  end every rank on the same cuts and the same plan, with
//                  the other option's tensors kept apart; then the search
//                  over two alternatives (the second made slower): the
//                  first kept on every rank, exact throughout; then three
//                  alternatives screened, only the fastest (the last)
//                  searched on: it is kept, the other two left out; then
//                  a search from groups that every other grouping is slower
//                  than: they join the final round and are kept; then one
//                  flat buffer laid out in another order than the tensors
//                  run: the kept groups list their tensors in the buffer's
//                  order and run in place, and where the ranks' layouts
//                  differ they keep the ready order, exact throughout.
//   --mode gravac  GraVAC (Executor::setGravac, top-k) over the compressed
//                  options (every --stride-th) and one default tensor, the
//                  ranks' gradients differing: one CF sequence on every rank,
//                  a re-plan and every level, and after GraVAC is
//                  turned off and the plan made raw, outputs that add up to
//                  every gradient exactly (exec_check_gravac.cc).
//   --mode zen     tensors on Zen's plan options (flat zen_bp, zen_hc: core/
//                  zen_collective over the world group; and H: i.rs x.zen
//                  i.ag, over the inter-machine group) at about 1% and 50%
//                  non-zeros per rank, beside one on the default push/pull,
//                  run alone and in batches, summed and averaged: every
//                  output equal to the plain sum (exec_check_zen.cc).
//   --no-mpi       (errors mode) no collective groups: the default plan runs,
//                  a plan with a flat step is refused.
//   --queued-streams  the host device with a thread per stream (its work runs
//                  after the call returns, as on a GPU): the executor's event
//                  waits must order every copy, or the sums come out wrong.
// The executor runs on the device CORTADO_DEVICE names (host by default;
// cuda on a GPU machine, scripts/device/exec_checks.sh): its host vectors are
// mirrored in device memory there (exec_check_device.cc).
#include "tests/multiprocess/exec_check.h"

#include <CLI/CLI.hpp>


#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "core/backends.h"
#include "core/collective/mpi/factory.h"
#include "core/common/crash.h"
#include "core/common/logging.h"
#include "core/device/host/factory.h"
#include "core/executor/executor.h"
#include "core/plan/profile_report.h"
#include <nlohmann/json.hpp>
#include "scheduler/planner/option_tree.h"

namespace exec_check {

const std::chrono::steady_clock::time_point kProgramStart = std::chrono::steady_clock::now();
int failures = 0;
bool mirrorAlways = false;

void fail(const std::string& what) {
  ++failures;
  if (failures <= 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

void progress(int done, int iters, size_t units, const char* unit,
              std::chrono::steady_clock::time_point start) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d of %d iterations in %.1f s (%.2f ms per %s and iteration)\n", done, iters, s,
              1e3 * s / (double(done) * double(std::max<size_t>(units, 1))), unit);
  std::fflush(stdout);
}

float exactInput(int rank, size_t option, int iter, uint64_t i) {
  return float(int((rank * 7 + i * 3 + option * 5 + iter * 11 + (i * i) % 7) % 9) - 4);
}

std::vector<executor::BatchItem> exactBatch(const TreeTensors& t, const std::vector<size_t>& order, int rank,
                                            int iter, std::vector<std::vector<float>>& in,
                                            std::vector<std::vector<float>>& out) {
  in.resize(order.size());
  out.resize(order.size());
  std::vector<executor::BatchItem> batch;
  for (size_t b = 0; b < order.size(); ++b) {
    const size_t k = order[b];
    in[b].resize(t.lens[k]);
    out[b].assign(t.lens[k], -1000.0f);
    for (uint64_t i = 0; i < t.lens[k]; ++i) in[b][i] = exactInput(rank, b, iter, i);
    float* o = b % 2 ? in[b].data() : out[b].data();  // half in place
    batch.push_back({t.names[k], in[b].data(), o, t.lens[k]});
  }
  return batch;
}

std::vector<std::string> exactMismatches(const TreeTensors& t, const std::vector<size_t>& order,
                                         const std::vector<executor::BatchItem>& batch, int W, int iter) {
  std::vector<std::string> bad;
  for (size_t b = 0; b < order.size(); ++b) {
    const std::string& name = t.names[order[b]];
    for (uint64_t i = 0; i < batch[b].numElements; ++i) {
      float ref = 0;
      for (int w = 0; w < W; ++w) ref += exactInput(w, b, iter, i);
      if (batch[b].output[i] != ref) {
        bad.push_back(fmt::format("item {} (tensor {}, {}), element {}: {} != reference {}", b, name,
                                  t.plan.tensors.at(name).describe(), i, batch[b].output[i], ref));
        break;
      }
    }
  }
  return bad;
}

float lossyInput(int rank, size_t option, int iter, uint64_t i) {
  double mean = std::sin(double(i * 13 + option));
  double noise = std::cos(double(rank * 101 + iter * 17 + i * 7 + option)) * 0.5;
  return float(mean + noise);
}

double derivedBound(const plan::TensorOption& o, const std::string& codec, int W, int serverKeys) {
  const std::string name = codec.substr(0, codec.find(':'));
  double c = 0;
  if (name == "onebit" || name == "efsignsgd" || name == "terngrad") c = 1;
  if (c == 0) return 0;
  int workerPoints = 0, serverPoints = 0;
  for (const auto& st : o.steps) {
    if (st.kind == plan::StepKind::kEncode) ++workerPoints;
    if (st.kind == plan::StepKind::kComm && st.op == plan::CommOp::kPull && st.compressed) ++serverPoints;
  }
  const double A = 1.5 * W;
  return (workerPoints * W + serverPoints * serverKeys) * c * A;
}

std::vector<plan::TensorOption> Check::treeOptions() const {
  planner::TreeConfig tc;
  tc.parameterServer = true;
  tc.codec = codec;
  return planner::enumerateOptions(tc);
}

void Check::runErrors() {
  ex.declare("a", DType::kFloat32, n);
  ex.declare("b", DType::kFloat32, n);
  plan::Plan p;
  p.tensors["a"] = executor::defaultOption();
  expectThrow("plan missing tensor b", "'b'", [&] { ex.setPlan(p, deadline); });
  p.tensors["b"] = executor::defaultOption();
  p.tensors["c"] = executor::defaultOption();
  expectThrow("plan with undeclared tensor c", "'c'", [&] { ex.setPlan(p, deadline); });
  p.tensors.erase("c");
  plan::TensorOption pw = executor::defaultOption();
  pw.codec = "powersgd";
  pw.steps = {plan::Step::comm(plan::Scope::kIntra, plan::CommOp::kReduceScatter, false),
              plan::Step::encode(plan::Device::kCpu),
              plan::Step::comm(plan::Scope::kInter, plan::CommOp::kPush, true),
              plan::Step::comm(plan::Scope::kInter, plan::CommOp::kPull, false),
              plan::Step::comm(plan::Scope::kIntra, plan::CommOp::kAllgather, false)};
  p.tensors["b"] = pw;
  expectThrow("codec powersgd", "powersgd", [&] { ex.setPlan(p, deadline); });
  pw.codec = "nosuchcodec";
  p.tensors["b"] = pw;
  expectThrow("unknown codec", "nosuchcodec", [&] { ex.setPlan(p, deadline); });
  if (noMpi) {
    plan::TensorOption flat;
    flat.steps = {plan::Step::comm(plan::Scope::kFlat, plan::CommOp::kAllreduce, false)};
    p.tensors["b"] = flat;
    expectThrow("flat step without MPI", "mpirun", [&] { ex.setPlan(p, deadline); });
  }
  expectThrow("missing plan file", "cannot read plan file",
              [&] { executor::loadPlanFile("/nonexistent/plan.json"); });
  {
    // A plan file for another job's tensors, handed in as CORTADO_PLAN would.
    const std::string path = fmt::format("/tmp/exec_check_plan_{}_{}.json", ::getpid(), me);
    plan::Plan other;
    other.tensors["fc9"] = executor::defaultOption();
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(plan::toJsonString(other).c_str(), f);
    std::fclose(f);
    executor::Executor ex2(*worker, noMpi ? nullptr : &groups, nullptr, path);
    ex2.declare("a", DType::kFloat32, n);
    std::vector<float> in(n), out(n);
    expectThrow("CORTADO_PLAN file naming another tensor", "'fc9'", [&] {
      runOn(ex2, "a", in.data(), out.data(), n, ReduceOp::kSum, deadline);
    });
    std::remove(path.c_str());
  }
  std::vector<float> in(n), out(n);
  expectThrow("size mismatch", "declared with", [&] {
    runOn(ex, "a", in.data(), out.data(), n + 1, ReduceOp::kSum, deadline);
  });
  expectThrow("undeclared tensor", "never declared", [&] {
    runOn(ex, "zz", in.data(), out.data(), n, ReduceOp::kSum, deadline);
  });
  // The default plan (no plan set) still runs and sums exactly.
  for (int iter = 0; iter < 2; ++iter) {
    for (uint64_t i = 0; i < n; ++i) in[i] = exactInput(me, 0, iter, i);
    runOn(ex, "a", in.data(), out.data(), n, ReduceOp::kSum, deadline);
    for (uint64_t i = 0; i < n; ++i) {
      float ref = 0;
      for (int w = 0; w < W; ++w) ref += exactInput(w, 0, iter, i);
      if (out[i] != ref) fail(fmt::format("default plan: element {} = {}, expected {}", i, out[i], ref));
    }
  }
  std::printf("default plan: %s\n", failures ? "FAILED" : "exact");
  if (!noMpi) {
    // Workers on different tensors of the same size and option: rank 0 runs
    // "a" while the others run "b". Every rank is refused, naming both, and
    // nothing moved: both then run exactly.
    plan::TensorOption flat;
    flat.steps = {plan::Step::comm(plan::Scope::kFlat, plan::CommOp::kAllreduce, false)};
    plan::Plan q;
    q.version = 2;
    q.tensors["a"] = flat;
    q.tensors["b"] = flat;
    // The default plan's dense intra reduce-scatter and allgather filled the
    // collectives' padded pair (at least the tensor, with more than one
    // worker a machine); a plan without such steps gives it back, and on
    // the host device with inline streams the executor then holds no
    // buffer at all (Executor::memory).
    const bool counted = ex.topology().localSize > 1 && ex.device().hostAddressable();
    if (counted && ex.memory().buffers < n * sizeof(float))
      fail(fmt::format("default plan: the executor's buffers hold {} bytes, below the {} of the "
                       "padded pair",
                       ex.memory().buffers, n * sizeof(float)));
    ex.setPlan(q, deadline);
    if (counted && ex.memory().buffers != 0)
      fail(fmt::format("a plan without padded collectives: the executor still holds {} bytes of "
                       "buffers",
                       ex.memory().buffers));
    std::vector<float> keep(n);
    for (uint64_t i = 0; i < n; ++i) keep[i] = in[i] = exactInput(me, 1, 0, i);
    out.assign(n, -1000.0f);
    // Each result below must be the plain sum of every rank's input.
    auto expectExact = [&](const std::string& what, const std::vector<float>& got) {
      for (uint64_t i = 0; i < n; ++i) {
        float ref = 0;
        for (int w = 0; w < W; ++w) ref += exactInput(w, 1, 0, i);
        if (got[i] != ref) {
          fail(fmt::format("{}: element {} = {}, expected {}", what, i, got[i], ref));
          return;
        }
      }
    };
    const char* mine = me == 0 ? "a" : "b";
    expectThrow("workers on different tensors",
                "every worker must run the same tensors in the same order",
                [&] { runOn(ex, mine, in.data(), out.data(), n, ReduceOp::kSum, deadline); });
    expectThrow("workers on different tensors (names)",
                "rank 0: tensor 'a' run 2 step 0 (flat allreduce), rank 1: tensor 'b' run 0",
                [&] { runOn(ex, mine, in.data(), out.data(), n, ReduceOp::kSum, deadline); });
    if (in != keep) fail("workers on different tensors: the refused run changed its input");
    for (const char* name : {"a", "b"}) {
      runOn(ex, name, in.data(), out.data(), n, ReduceOp::kSum, deadline);
      expectExact(fmt::format("after the refusal, tensor {}", name), out);
    }
    // The same in a fused batch: rank 0 fuses a, b, c, the others a, d, c
    // (the same group name, fused3:a..c, and the same total size).
    ex.declare("c", DType::kFloat32, n);
    ex.declare("d", DType::kFloat32, n);
    q.version = 3;
    q.tensors["c"] = flat;
    q.tensors["d"] = flat;
    ex.setPlan(q, deadline);
    std::vector<std::vector<float>> ins(3, keep), outs(3, std::vector<float>(n, -1000.0f));
    auto batchOf = [&](const char* middle) {
      std::vector<executor::BatchItem> b;
      const char* names[] = {"a", middle, "c"};
      for (size_t k = 0; k < 3; ++k) b.push_back({names[k], ins[k].data(), outs[k].data(), n});
      return b;
    };
    const auto mixed = batchOf(me == 0 ? "b" : "d");
    expectThrow("fused groups with other members",
                "rank 0: tensor 'fused3:a..c' run 3 step 0 (flat allreduce) of a#3, b#1, c#0",
                [&] { runBatchOn(ex, mixed, ReduceOp::kSum, deadline); });
    const auto same = batchOf("b");
    runBatchOn(ex, same, ReduceOp::kSum, deadline);
    for (size_t k = 0; k < 3; ++k)
      expectExact(fmt::format("after the refused batch, item {}", k), outs[k]);
    // Workers that set different plans (rank 0 has b on push/pull) are
    // refused at setPlan, every one, before anything changed.
    plan::Plan other = q;
    other.version = q.version = 4;
    other.tensors["b"] = executor::defaultOption();
    expectThrow("workers setting different plans", "every worker must set the same plan",
                [&] { ex.setPlan(me == 0 ? other : q, deadline); });
    ex.setPlan(q, deadline);
    runOn(ex, "b", in.data(), out.data(), n, ReduceOp::kSum, deadline);
    expectExact("after the refused plan", out);
    std::printf("workers on different tensors: %s\n", failures ? "FAILED" : "refused, then exact");
  }
}

void Check::runSweep() {
  auto options = treeOptions();
  std::vector<size_t> chosen;
  for (size_t i = 0; i < options.size(); ++i) {
    if (int(i % shards) != shard) continue;
    if (mode == "lossy" && (!options[i].compressed() || (i / shards) % stride != 0)) continue;
    chosen.push_back(i);
  }
  plan::Plan p;
  p.version = 1;
  for (size_t i : chosen) {
    std::string name = fmt::format("opt{}", i);
    ex.declare(name, DType::kFloat32, n);
    p.tensors[name] = options[i];
  }
  ex.setPlan(p, opDeadline());
  if (me == 0)
    std::printf("%zu of %zu options (shard %d of %d), %d ranks on %d machines, %d iterations\n",
                chosen.size(), options.size(), shard, shards, W, topo.numMachines, iters);
  std::vector<float> in(n), out(n), ref(n);
  std::vector<std::vector<double>> runOut(chosen.size(), std::vector<double>(n, 0.0)),
      runRef(chosen.size(), std::vector<double>(n, 0.0));
  double worst = 0, worstFirstHalf = 0, worstRatio = 0;
  std::vector<double> bounds(chosen.size(), bound);
  if (mode == "lossy" && bound <= 0) {
    for (size_t c = 0; c < chosen.size(); ++c) {
      bounds[c] = derivedBound(options[chosen[c]], codec, W);
      if (bounds[c] <= 0) {
        fail(fmt::format("no derived bound for codec '{}': pass --bound", codec));
        bounds[c] = 1e30;
      }
    }
  }
  const auto sweepStart = std::chrono::steady_clock::now();
  for (int iter = 0; iter < iters; ++iter) {
    if (me == 0 && iter > 0) progress(iter, iters, chosen.size(), "option", sweepStart);
    for (size_t c = 0; c < chosen.size(); ++c) {
      const size_t o = chosen[c];
      const bool exact = mode == "all";
      for (uint64_t i = 0; i < n; ++i) {
        in[i] = exact ? exactInput(me, o, iter, i) : lossyInput(me, o, iter, i);
        double r = 0;
        for (int w = 0; w < W; ++w) r += exact ? exactInput(w, o, iter, i) : lossyInput(w, o, iter, i);
        ref[i] = float(r);
      }
      try {
        runOn(ex, fmt::format("opt{}", o), in.data(), out.data(), n, ReduceOp::kSum, opDeadline());
      } catch (const Error& e) {
        fail(e.what());
        continue;
      }
      for (uint64_t i = 0; i < n; ++i) {
        if (exact && out[i] != ref[i]) {
          fail(fmt::format("option {} ({}), iteration {}, element {}: {} != reference {}", o,
                           options[o].describe(), iter, i, out[i], ref[i]));
          break;
        }
        runOut[c][i] += out[i];
        runRef[c][i] += ref[i];
        double err = std::abs(runOut[c][i] - runRef[c][i]);
        worst = std::max(worst, err);
        if (iter < iters / 2) worstFirstHalf = std::max(worstFirstHalf, err);
        if (!exact) worstRatio = std::max(worstRatio, err / bounds[c]);
        if (!exact && err > bounds[c]) {
          fail(fmt::format("option {} ({}), iteration {}, element {}: running sum {} vs "
                           "reference {}: error {} > bound {}",
                           o, options[o].describe(), iter, i, runOut[c][i], runRef[c][i], err,
                           bounds[c]));
          break;
        }
      }
    }
  }
  if (mode == "lossy")
    std::printf("rank %d: worst running-sum error %.4f (first half %.4f), worst error/bound "
                "%.3f\n", me, worst, worstFirstHalf, worstRatio);
}

}  // namespace exec_check

using namespace exec_check;

int runCheck(int argc, char** argv);

int main(int argc, char** argv) {
  installCrashReport("exec_check worker");
  try {
    return runCheck(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exec_check: %s\n", e.what());
    return 1;
  }
}

int runCheck(int argc, char** argv) {
  CLI::App app{"plan executor check"};
  std::string mode = "all", codec = "fp16";
  int shard = 0, shards = 1, iters = 2, stride = 1;
  uint64_t n = 11;
  double bound = 0;
  bool noMpi = false, queuedStreams = false;
  app.add_flag("--queued-streams", queuedStreams,
               "on the host device, run each stream's work on a thread of its own (after the "
               "call returns, as a GPU does), so that missing event waits give wrong sums");
  app.add_flag("--mirror", mirrorAlways,
               "mirror the buffers in device memory also on the host device (as on CUDA)");
  app.add_option("--mode", mode)
      ->check(CLI::IsMember({"all", "lossy", "errors", "switch", "replan", "fusion", "pipeline",
                             "threads", "phased", "groups", "search", "gravac", "zen"}));
  int switchAt = 4, switchAt2 = 8;
  app.add_option("--switch-at", switchAt);
  app.add_option("--switch-at2", switchAt2);
  app.add_option("--shard", shard);
  app.add_option("--shards", shards);
  app.add_option("--iters", iters);
  app.add_option("--stride", stride);
  app.add_option("--elements", n);
  app.add_option("--codec", codec);
  app.add_option("--bound", bound);
  app.add_flag("--no-mpi", noMpi);
  int tensors = 8, after = 3, minVersions = 0;
  app.add_option("--min-versions", minVersions, "replan: fail unless this many plan versions ran");
  double maxSeconds = 60;
  std::string stopFile, progressFile;
  app.add_option("--tensors", tensors)->check(CLI::Range(1, 1000));
  app.add_option("--after", after)->check(CLI::Range(0, 100000));
  app.add_option("--max-seconds", maxSeconds)->check(CLI::Range(1.0, 3600.0));
  app.add_option("--stop-file", stopFile);
  app.add_option("--progress-file", progressFile);
  bool batch = false;
  app.add_flag("--batch", batch, "replan: each iteration's tensors as one Executor::runBatch");
  bool directSwitch = false;
  app.add_flag("--direct-switch", directSwitch,
               "switch: set the plans with Executor::setPlan at the switch iterations instead of "
               "scheduling them (the servers' residuals then come back in setPlan's flush round)");
  CLI11_PARSE(app, argc, argv);

  // Start-up and the error checks share one deadline; in the modes every
  // operation gets its own (opDeadline: all options over emulated hosts take
  // minutes).
  const Deadline deadline = Deadline::after(Millis(60000));
  std::unique_ptr<collective::mpi::Runtime> mpi;
  collective::Groups groups;
  JobConfig base;
  if (!noMpi) {
    mpi = std::make_unique<collective::mpi::Runtime>();
    groups = collective::mpi::createGroups(*mpi, collective::mpi::Options::fromEnv(), deadline);
    base.rank = mpi->worldRank();  // worker rank = MPI rank
  }
  JobConfig job = readJobConfig(true, base);
  auto worker = startWorker(job, deadline);
  std::shared_ptr<device::Device> dev;
  if (queuedStreams && job.device == "host") {
    device::host::Options o;
    o.queued = true;
    o.groups = noMpi ? nullptr : &groups;
    dev = device::host::create(o);
  } else {
    dev = makeDevice(job, noMpi ? nullptr : &groups, nullptr, deadline);
  }
  executor::Executor ex(*worker, noMpi ? nullptr : &groups, nullptr, job.planFile, dev);
  ex.setCompactSparse(job.compactSparse);  // CORTADO_COMPACT_SPARSE
  if (ex.topology().rank == 0) std::printf("device: %s\n", dev->name().c_str());
  const auto& topo = ex.topology();
  const int W = topo.size;
  const int me = topo.rank;

  Check c{mode,     codec,   shard,    shards,       iters,        stride,   n,
          bound,    noMpi,   switchAt, switchAt2,    tensors,      after,    minVersions,
          maxSeconds, stopFile, progressFile, batch, directSwitch,
          deadline, groups,  job,      worker.get(), ex,           topo,     W,
          me};
  c.dev = dev;
  if (mode == "replan") {
    c.runReplan();
  } else if (mode == "switch") {
    c.runSwitch();
  } else if (mode == "errors") {
    c.runErrors();
  } else if (mode == "pipeline") {
    c.runPipeline();
  } else if (mode == "threads") {
    c.runThreads();
  } else if (mode == "phased") {
    c.runPhased();
  } else if (mode == "fusion") {
    c.runFusion();
  } else if (mode == "groups") {
    c.runGroups();
  } else if (mode == "search") {
    c.runSearch();
  } else if (mode == "gravac") {
    c.runGravac();
  } else if (mode == "zen") {
    c.runZen();
  } else {
    c.runSweep();
  }
  std::printf("rank %d: %s (%d failures)\n", me, failures ? "FAILED" : "PASSED", failures);
  std::fflush(stdout);
  worker->shutdown(Deadline::after(Millis(30000)));
  return failures ? 1 : 0;
}
