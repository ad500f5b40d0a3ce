// A worker program for the plan executor's multi-process tests, run as the
// MPI ranks of a job: `cortado launch --mpi -w 4 -s 2 -- exec_check ...`. Every rank computes every rank's
// inputs (a formula), so each checks its results against a plain summation.
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
//   --no-mpi       (errors mode) no collective groups: the default plan runs,
//                  a plan with a flat step is refused.
#include <CLI/CLI.hpp>

#include <unistd.h>

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
#include "core/executor.h"
#include "core/plan/profile_report.h"
#include <nlohmann/json.hpp>
#include "scheduler/planner/option_tree.h"

using namespace cortado;


// Started before main: the bound on the reports' wall times.
const auto kProgramStart = std::chrono::steady_clock::now();
namespace {

int failures = 0;

void fail(const std::string& what) {
  ++failures;
  if (failures <= 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

// Integer-valued inputs in [-4, 4]: sums of 4 are exact in fp16 and fp32.
float exactInput(int rank, size_t option, int iter, uint64_t i) {
  return float(int((rank * 7 + i * 3 + option * 5 + iter * 11 + (i * i) % 7) % 9) - 4);
}

// Each of `options` that `keep` accepts, followed by the default push/pull,
// as tensors "<prefix><k>" of n + (k + 1) % 5 elements, in one plan.
struct TreeTensors {
  plan::Plan plan;
  std::vector<std::string> names;
  std::vector<uint64_t> lens;
};
template <typename Keep>
TreeTensors withDefaults(const std::vector<plan::TensorOption>& options, const Keep& keep, const char* prefix,
                         uint64_t n) {
  TreeTensors t;
  t.plan.version = 1;
  for (const plan::TensorOption& opt : options) {
    if (!keep(opt)) continue;
    for (const plan::TensorOption& o : {opt, executor::defaultOption()}) {
      t.names.push_back(fmt::format("{}{}", prefix, t.names.size()));
      t.lens.push_back(n + t.names.size() % 5);
      t.plan.tensors[t.names.back()] = o;
    }
  }
  return t;
}

// A batch of t's tensors in `order` (a tensor may come twice): item b gets
// exactInput(rank, b, iter, .), and every other item runs in place.
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

// For each item of an exactBatch whose output is not the plain sum over W
// ranks, where and what: "item b (tensor, option), element i: x != reference r".
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

// Lossy mode gradients: a per-element mean plus per-rank noise.
float lossyInput(int rank, size_t option, int iter, uint64_t i) {
  double mean = std::sin(double(i * 13 + option));
  double noise = std::cos(double(rank * 101 + iter * 17 + i * 7 + option)) * 0.5;
  return float(mean + noise);
}

// The lossy mode's bound, per option. With error feedback at every encode
// point (the workers' encode steps and the servers' re-encode for a
// compressed pull), every point sends over rounds 0..T what it was given
// minus its current residual, and everything after a point is a sum, so
//   running sum of outputs - running sum of true sums = -(sum of the current
//   residuals of every point and encoder that covers the element)
// up to fp32 rounding. It does not grow with T. Per element a residual is
// e = p - decode(encode(p)) with |e_i| <= c * max|p|: c = 1 for onebit and
// efsignsgd (sign times a mean magnitude that is at most max|p|: the error is
// at most max(|p_i| - mean, mean)) and for terngrad (0 or max|p| times a sign:
// at most max(|p_i|, max|p| - |p_i|)). max|p| is taken as the data's scale A:
// the largest sum of all W ranks' inputs (1.5 W here: |mean| <= 1, |noise| <=
// 0.5), which bounds every partial sum a point encodes; that leaves out the
// residual's own share of p (a bounded-residual assumption, not a proof). At
// most W workers encode an element at one worker step, one server at the
// servers' re-encode. So
//   bound = (workerEncodeSteps * W + serverReencodes) * c * A.
// Dropped mass instead grows with T: without the servers' residuals onebit's
// error reached 41 after 30 iterations here and grows linearly past this bound
// (about 70-90 for these options) by 90 iterations.
// Sparse codecs answer losslessly at the servers (no server point); other
// codecs get no derived bound here (pass --bound).
double derivedBound(const plan::TensorOption& o, const std::string& codec, int W) {
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
  return (workerPoints * W + serverPoints) * c * A;
}

template <typename F>
void expectThrow(const std::string& what, const std::string& needle, F f) {
  try {
    f();
    fail(what + ": did not throw");
  } catch (const Error& e) {
    if (std::string(e.what()).find(needle) == std::string::npos)
      fail(what + ": error does not mention '" + needle + "': " + e.what());
    else
      std::printf("ok (refused): %s: %s\n", what.c_str(), e.what());
  }
}

}  // namespace

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
  bool noMpi = false;
  app.add_option("--mode", mode)->check(CLI::IsMember({"all", "lossy", "errors", "switch", "replan", "fusion", "pipeline", "phased"}));
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
  CLI11_PARSE(app, argc, argv);

  // Start-up and the error checks share one deadline; every operation of the
  // option runs gets its own (all options over emulated hosts take minutes).
  const Deadline deadline = Deadline::after(Millis(60000));
  auto opDeadline = [] { return Deadline::after(Millis(60000)); };
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
  executor::Executor ex(*worker, noMpi ? nullptr : &groups, nullptr, job.planFile);
  const auto& topo = ex.topology();
  const int W = topo.size;
  const int me = topo.rank;

  if (mode == "replan") {
    ex.setOnline(executor::onlineOptions(job));
    if (me == 0)
      std::printf("replan: %d tensors of %llu elements, %d ranks on %d machines, profiling window "
                  "%llu iterations\n",
                  tensors, (unsigned long long)n, W, topo.numMachines,
                  (unsigned long long)job.profileWindow);
    auto sizeOf = [&](int t) { return t % 4 == 3 ? std::max<uint64_t>(1, n / 128) : n; };
    for (int t = 0; t < tensors; ++t) ex.declare(fmt::format("g{}", t), DType::kFloat32, sizeOf(t));
    ex.setDefaultPlan(deadline);
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> in(n), out(n);
    std::vector<std::vector<float>> bin(static_cast<size_t>(tensors)), bout(static_cast<size_t>(tensors));
    uint64_t version = ex.currentPlan().version;
    std::string versions = std::to_string(version);
    int stopAt = -1;  // the iteration after which every rank stops
    int iter = 0;
    for (;; ++iter) {
      // Stop together: rank 0's view (stop file, time) decides for all.
      int32_t stop = 0, anyStop = 0;
      if (me == 0) {
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (secs > maxSeconds) stop = 2;
        else if (!stopFile.empty() && access(stopFile.c_str(), F_OK) == 0) stop = 1;
      }
      const Deadline itDeadline = Deadline::after(Millis(60000));
      groups.world->allreduce(&stop, &anyStop, 1, DType::kInt32, itDeadline);
      if (anyStop == 2) {
        if (me == 0) std::printf("replan: stopping at iteration %d: --max-seconds %.0f passed\n", iter, maxSeconds);
        break;
      }
      if (anyStop == 1 && stopAt < 0) stopAt = iter + after;
      if ((stopAt >= 0 && iter >= stopAt) || iter >= iters) break;
      try {
        ex.beginIteration(uint64_t(iter), itDeadline);
      } catch (const Error& e) {
        fail(fmt::format("beginIteration({}): {}", iter, e.what()));
        break;
      }
      const plan::Plan& cur = ex.currentPlan();
      if (cur.version != version || iter == 0) {
        version = cur.version;
        if (iter > 0) versions += "," + std::to_string(version);
        int compressed = 0;
        std::string opts;
        for (const auto& [name, o] : cur.tensors) {
          compressed += o.compressed();
          opts += fmt::format("{}{}={}{}", opts.empty() ? "" : "; ", name, o.describe(),
                              o.codec.empty() ? "" : " " + o.codec);
        }
        if (me == 0)
          std::printf("replan: iteration %d: plan version %llu: %d of %d tensors compressed: %s\n",
                      iter, (unsigned long long)version, compressed, tensors, opts.c_str());
      }
      // --batch: the iteration's tensors as one runBatch (fused where the
      // plan lets them: the reports then carry the fusion threshold, and
      // the scheduler plans with it), else one run() each.
      std::vector<executor::BatchItem> batchItems;
      bool batchFailed = false;
      if (batch) {
        for (int t = 0; t < tensors; ++t) {
          const uint64_t len = sizeOf(t);
          bin[t].resize(len);
          bout[t].resize(len);
          for (uint64_t i = 0; i < len; ++i) bin[t][i] = exactInput(me, size_t(t), iter, i);
          batchItems.push_back({fmt::format("g{}", t), bin[t].data(), bout[t].data(), len});
        }
        try {
          ex.runBatch(batchItems, ReduceOp::kSum, itDeadline);
        } catch (const Error& e) {
          fail(fmt::format("iteration {}, batch (plan version {}): {}", iter, version, e.what()));
          batchFailed = true;
        }
      }
      for (int t = 0; t < tensors && !batchFailed; ++t) {
        const uint64_t len = sizeOf(t);
        if (batch) {
          std::copy(bout[t].begin(), bout[t].end(), out.begin());
        } else {
          for (uint64_t i = 0; i < len; ++i) in[i] = exactInput(me, size_t(t), iter, i);
          try {
            ex.run(fmt::format("g{}", t), in.data(), out.data(), len, ReduceOp::kSum, itDeadline);
          } catch (const Error& e) {
            fail(fmt::format("iteration {}, tensor g{} (plan version {}): {}", iter, t, version, e.what()));
            continue;
          }
        }
        for (uint64_t i = 0; i < len; ++i) {
          float ref = 0;
          for (int w = 0; w < W; ++w) ref += exactInput(w, size_t(t), iter, i);
          if (out[i] != ref) {
            fail(fmt::format("iteration {}, tensor g{} (plan version {}), element {}: {} != reference {}",
                             iter, t, version, i, out[i], ref));
            break;
          }
        }
      }
      if (me == 0 && !progressFile.empty()) {
        const std::string tmp = progressFile + ".tmp";
        if (FILE* f = std::fopen(tmp.c_str(), "w")) {
          std::fprintf(f, "%d %llu\n", iter, (unsigned long long)version);
          std::fclose(f);
          std::rename(tmp.c_str(), progressFile.c_str());
        }
      }
      std::fflush(stdout);
    }
    std::printf("rank %d: %d iterations checked, plan versions %s\n", me, iter, versions.c_str());
    const int ran = int(std::count(versions.begin(), versions.end(), ',')) + 1;
    if (ran < minVersions)
      fail(fmt::format("rank {}: {} plan versions ran ({}), --min-versions {}", me, ran, versions,
                       minVersions));
  } else if (mode == "switch") {
    planner::TreeConfig tc;
    tc.parameterServer = true;
    tc.codec = codec;
    auto options = planner::enumerateOptions(tc);
    const bool exact = codec.rfind("fp16", 0) == 0;
    // A: hierarchical options with push/pull, every other tensor one whose
    // pull is compressed (the servers re-encode the sum and keep a residual:
    // the executor's last round before the switch has them flush it into a
    // dense answer); B: flat or inter-collective options; both compressed
    // where the codec is lossy, so that the encode points differ.
    std::vector<size_t> hier, hierServer, flat;
    for (size_t i = 0; i < options.size(); ++i) {
      const auto& o = options[i];
      bool push = false, serverEncodes = false;
      for (const auto& st : o.steps) {
        push |= st.kind == plan::StepKind::kComm && st.op == plan::CommOp::kPush;
        serverEncodes |= st.kind == plan::StepKind::kComm && st.op == plan::CommOp::kPull && st.compressed;
      }
      if (!exact && !o.compressed()) continue;
      if (o.hierarchical && push) (serverEncodes ? hierServer : hier).push_back(i);
      if (!push) flat.push_back(i);
    }
    if (hier.empty() || hierServer.empty() || flat.empty())
      throw Error(ErrorCode::kInternal, fmt::format("codec '{}': no options to switch between", codec));
    // --bound 0: per tensor, the larger of its two lossy options' derived
    // bounds (the running-sum error is the current residuals of the live
    // encode points; the switch folds the retired ones into the new input).
    std::vector<double> bounds;
    const int T = 6;
    plan::Plan a, b, c;
    a.version = 1, b.version = 2, c.version = 3;
    for (int j = 0; j < T; ++j) {
      std::string name = fmt::format("t{}", j);
      ex.declare(name, DType::kFloat32, n + j);
      a.tensors[name] = j % 2 == 0 ? options[hierServer[(j * 37) % hierServer.size()]]
                                   : options[hier[(j * 37) % hier.size()]];
      b.tensors[name] = options[flat[(j * 53 + 11) % flat.size()]];
      c.tensors[name] = executor::defaultOption();
      double bj = bound;
      if (!exact && bound <= 0) {
        bj = std::max(derivedBound(a.tensors[name], codec, W), derivedBound(b.tensors[name], codec, W));
        if (bj <= 0) throw Error(ErrorCode::kInvalidArgument,
                                 fmt::format("no derived bound for codec '{}': pass --bound", codec));
      }
      bounds.push_back(bj);
      if (me == 0)
        std::printf("%s: A %s | B %s\n", name.c_str(), a.tensors[name].describe().c_str(),
                    b.tensors[name].describe().c_str());
    }
    executor::OnlineOptions on;
    on.window = 3;
    on.warmup = 1;
    on.exchange = false;
    ex.setOnline(on);
    ex.setPlan(a, deadline);
    std::vector<std::vector<double>> runOut(T), runRef(T);
    double worst = 0, worstAfterLossless = 0, worstRatio = 0;
    int worstAfterTensor = -1;
    for (int iter = 1; iter <= iters; ++iter) {
      if (iter == switchAt - 2) ex.schedulePlan(b, switchAt);
      if (iter == switchAt2 - 1) ex.schedulePlan(c, switchAt2);
      ex.beginIteration(iter, deadline);
      const uint64_t want = iter >= switchAt2 ? 3 : iter >= switchAt ? 2 : 1;
      if (ex.currentPlan().version != want)
        fail(fmt::format("iteration {}: plan version {}, expected {}", iter, ex.currentPlan().version, want));
      for (int j = 0; j < T; ++j) {
        const uint64_t len = n + j;
        std::vector<float> in(len), out(len);
        runOut[j].resize(len), runRef[j].resize(len);
        for (uint64_t i = 0; i < len; ++i)
          in[i] = exact ? exactInput(me, j, iter, i) : lossyInput(me, j, iter, i);
        try {
          ex.run(fmt::format("t{}", j), in.data(), out.data(), len, ReduceOp::kSum, deadline);
        } catch (const Error& e) {
          fail(e.what());
          continue;
        }
        for (uint64_t i = 0; i < len; ++i) {
          double r = 0;
          for (int w = 0; w < W; ++w) r += exact ? exactInput(w, j, iter, i) : lossyInput(w, j, iter, i);
          if (exact && out[i] != float(r)) {
            fail(fmt::format("t{} iteration {} (plan {}), element {}: {} != reference {}", j, iter,
                             want, i, out[i], r));
            break;
          }
          runOut[j][i] += out[i];
          runRef[j][i] += r;
          const double err = std::abs(runOut[j][i] - runRef[j][i]);
          worst = std::max(worst, err);
          if (iter >= switchAt2 && err > worstAfterLossless) {
            worstAfterLossless = err;
            worstAfterTensor = j;
          }
          if (!exact) worstRatio = std::max(worstRatio, err / bounds[j]);
          if (!exact && err > bounds[j]) {
            fail(fmt::format("t{} iteration {} (plan {}), element {}: running sum {} vs reference "
                             "{}: error {} > bound {}",
                             j, iter, want, i, runOut[j][i], runRef[j][i], err, bounds[j]));
            break;
          }
        }
      }
    }
    // Folded residuals: after the lossless plan ran once, nothing is owed.
    if (!exact && iters >= switchAt2 && worstAfterLossless > 1e-3)
      fail(fmt::format("after the switch to the lossless plan the running sums of t{} differ by "
                       "{}: a residual was lost or sent twice",
                       worstAfterTensor, worstAfterLossless));
    std::printf("rank %d: worst running-sum error %.5f (error/bound %.3f), after the lossless "
                "switch %.6f\n",
                me, worst, worstRatio, worstAfterLossless);
    // The profile of the last complete window.
    const auto& rep = ex.lastReport();
    if (!rep) {
      fail("no profiling window was closed");
    } else {
      if (rep->ready.size() != size_t(T)) fail(fmt::format("report has {} ready times, expected {}", rep->ready.size(), T));
      if (rep->comms.empty()) fail("report has no communication timings");
      if (rep->endIteration - rep->firstIteration != 3) fail("report window is not 3 iterations");
      // Its wall time per iteration: measured, and its 3 iterations within
      // this program's run time.
      const double ranUs =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - kProgramStart).count();
      if (!(rep->iterationUs > 0) || rep->iterationUs * 3 > ranUs)
        fail(fmt::format("report's time per iteration {} us is not in (0, {} / 3]", rep->iterationUs, ranUs));
      plan::ProfileReport back = plan::profileFromJsonString(plan::toJsonString(*rep));
      if (back.comms.size() != rep->comms.size()) fail("report does not survive JSON");
      if (me == 0)
        std::printf("window %llu [%llu, %llu): %zu ready, %zu codec, %zu comm entries\n",
                    (unsigned long long)rep->window, (unsigned long long)rep->firstIteration,
                    (unsigned long long)rep->endIteration, rep->ready.size(), rep->codecs.size(),
                    rep->comms.size());
    }
    plan::Plan d = a;
    d.version = 4;
    expectThrow("plan scheduled after its switch iteration", "too late",
                [&] { ex.schedulePlan(d, ex.iteration()); });
    d.version = 3;
    expectThrow("plan not newer", "not newer", [&] { ex.schedulePlan(d, ex.iteration() + 5); });
    auto& cc = worker->controlClient();
    expectThrow("profile report that is not JSON", "not valid JSON",
                [&] { cc.sendProfile("{not json", deadline); });
    std::string wrongRank = plan::toJsonString(*rep);
    plan::ProfileReport other = *rep;
    other.rank = (me + 1) % std::max(W, 2);
    if (W > 1)
      expectThrow("profile report for another rank", "a worker reports its own rank",
                  [&] { cc.sendProfile(plan::toJsonString(other), deadline); });
    nlohmann::json bad = plan::toJson(*rep);
    bad["comms"][0]["op"] = "teleport";
    expectThrow("profile report with an unknown operation", "teleport",
                [&] { cc.sendProfile(bad.dump(), deadline); });
    bad = plan::toJson(*rep);
    bad["ready"][0]["readyUs"] = -5;
    expectThrow("profile report with a negative time", "readyUs", [&] { cc.sendProfile(bad.dump(), deadline); });
    expectThrow("profile report over the size limit", "limit",
                [&] { cc.sendProfile(std::string(plan::kMaxProfileBytes + 1, ' '), deadline); });
    // The job still works after the refusals.
    cc.sendProfile(plan::toJsonString(*rep), deadline);
    // Profiling off, runs, profiling on again: the window open when it was
    // turned off is dropped, so the next report covers only iterations
    // begun after it came back on (not the runs while it was off).
    const uint64_t lastWindowEnd = rep->endIteration;
    executor::OnlineOptions off = on;
    off.window = 0;
    ex.setOnline(off);
    {
      std::vector<float> in(n), out(n);
      for (uint64_t i = 0; i < n; ++i) in[i] = exactInput(me, 0, 0, i);
      for (int k = 0; k < 2; ++k) ex.run("t0", in.data(), out.data(), n, ReduceOp::kSum, deadline);
      ex.setOnline(on);
      const uint64_t resume = ex.iteration() + 1;
      for (uint64_t it = resume; it <= resume + 3; ++it) {
        ex.beginIteration(it, deadline);
        if (it < resume + 3) ex.run("t0", in.data(), out.data(), n, ReduceOp::kSum, deadline);
      }
      const auto& again = ex.lastReport();
      if (!again || again->endIteration == lastWindowEnd)
        fail("no profiling window closed after profiling was turned on again");
      else if (again->firstIteration != resume || again->endIteration != resume + 3)
        fail(fmt::format("after profiling was off and on again the window spans iterations [{}, {}), "
                         "expected [{}, {}): the window open when it was turned off was kept",
                         again->firstIteration, again->endIteration, resume, resume + 3));
    }
  } else if (mode == "errors") {
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
        ex2.run("a", in.data(), out.data(), n, ReduceOp::kSum, deadline);
      });
      std::remove(path.c_str());
    }
    std::vector<float> in(n), out(n);
    expectThrow("size mismatch", "declared with", [&] {
      ex.run("a", in.data(), out.data(), n + 1, ReduceOp::kSum, deadline);
    });
    expectThrow("undeclared tensor", "never declared", [&] {
      ex.run("zz", in.data(), out.data(), n, ReduceOp::kSum, deadline);
    });
    // The default plan (no plan set) still runs and sums exactly.
    for (int iter = 0; iter < 2; ++iter) {
      for (uint64_t i = 0; i < n; ++i) in[i] = exactInput(me, 0, iter, i);
      ex.run("a", in.data(), out.data(), n, ReduceOp::kSum, deadline);
      for (uint64_t i = 0; i < n; ++i) {
        float ref = 0;
        for (int w = 0; w < W; ++w) ref += exactInput(w, 0, iter, i);
        if (out[i] != ref) fail(fmt::format("default plan: element {} = {}, expected {}", i, out[i], ref));
      }
    }
    std::printf("default plan: %s\n", failures ? "FAILED" : "exact");
  } else if (mode == "pipeline") {
    // The encode pipeline (Executor::setPipeline): every option of the tree
    // that compresses (its leading encode runs beside the previous item's
    // communication) and the default push/pull between them, as one batch
    // per iteration; with fp16 on these inputs every result is exact.
    planner::TreeConfig tc;
    tc.parameterServer = true;
    tc.codec = codec;
    const TreeTensors t = withDefaults(
        planner::enumerateOptions(tc), [](const plan::TensorOption& o) { return o.compressed(); }, "p", n);
    uint64_t expectStarts = 0;  // per batch: items after the first whose option starts with an encode
    for (size_t k = 1; k < t.names.size(); ++k)
      if (t.plan.tensors.at(t.names[k]).steps.front().kind != plan::StepKind::kComm) ++expectStarts;
    for (size_t k = 0; k < t.names.size(); ++k) ex.declare(t.names[k], DType::kFloat32, t.lens[k]);
    ex.setPlan(t.plan, opDeadline());
    ex.setPipeline(true);
    if (me == 0)
      std::printf("pipeline: %zu tensors (%llu leading encodes pipelined a batch), %d ranks on %d machines\n",
                  t.names.size(), (unsigned long long)expectStarts, W, topo.numMachines);
    std::vector<size_t> order(t.names.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::vector<std::vector<float>> in, out;
    for (int iter = 0; iter < iters; ++iter) {
      const auto batch = exactBatch(t, order, me, iter, in, out);
      const uint64_t before = ex.pipelinedStarts();
      try {
        ex.runBatch(batch, ReduceOp::kSum, opDeadline());
      } catch (const Error& e) {
        fail(fmt::format("pipeline, iteration {}: {}", iter, e.what()));
        continue;
      }
      if (ex.pipelinedStarts() - before != expectStarts)
        fail(fmt::format("pipeline, iteration {}: {} leading encodes ran beside another item, expected {}",
                         iter, ex.pipelinedStarts() - before, expectStarts));
      for (const std::string& m : exactMismatches(t, order, batch, W, iter))
        fail(fmt::format("pipeline, iteration {}: {}", iter, m));
    }
    if (me == 0) std::printf("pipeline: %s\n", failures ? "FAILED" : "exact");
  } else if (mode == "phased") {
    // Phases (Executor::setPhaseBytes): every option of the tree that does
    // not fuse, compressed (fp16: exact on these inputs) or with push/pull,
    // each beside the default push/pull, as one batch per iteration with a
    // push/pull tensor in it twice (its two rounds cannot share a phase).
    // Under four phase sizes: 0 (one item after the other), phases of about
    // three items, the default, and one phase for everything; against a
    // plain sum.
    planner::TreeConfig tc;
    tc.parameterServer = true;
    tc.codec = codec;
    const auto options = planner::enumerateOptions(tc);
    // Fused options run in groups, not in phases.
    const TreeTensors t = withDefaults(
        options, [](const plan::TensorOption& o) { return !o.fusible(); }, "q", n);
    for (size_t k = 0; k < t.names.size(); ++k) ex.declare(t.names[k], DType::kFloat32, t.lens[k]);
    ex.setPlan(t.plan, opDeadline());
    std::vector<size_t> order(t.names.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    order.insert(order.begin() + 2, 1);  // q1 (push/pull: a key's two rounds) twice in a row
    const uint64_t three = 3 * (n + 4) * sizeof(float);
    const std::vector<uint64_t> sizes = {0, three, executor::kDefaultPhaseBytes, uint64_t(1) << 40};
    if (me == 0)
      std::printf("phased: %zu tensors of %zu options in batches of %zu, %d ranks on %d machines\n",
                  t.names.size(), options.size(), order.size(), W, topo.numMachines);
    std::vector<std::vector<float>> in, out;
    int iter = 0;
    for (uint64_t size : sizes) {
      ex.setPhaseBytes(size);
      for (int rep = 0; rep < iters; ++rep, ++iter) {
        // Item b's own data, so that a mix-up between q1's two rounds shows.
        const auto batch = exactBatch(t, order, me, iter, in, out);
        const uint64_t before = ex.phasedSteps();
        try {
          ex.runBatch(batch, ReduceOp::kSum, opDeadline());
        } catch (const Error& e) {
          fail(fmt::format("phased, phases of {} bytes, iteration {}: {}", size, iter, e.what()));
          continue;
        }
        const uint64_t phased = ex.phasedSteps() - before;
        if ((size == 0) != (phased == 0))
          fail(fmt::format("phased, phases of {} bytes, iteration {}: {} communication steps ran for several "
                           "items in a row",
                           size, iter, phased));
        for (const std::string& m : exactMismatches(t, order, batch, W, iter))
          fail(fmt::format("phased, phases of {} bytes, iteration {}: {}", size, iter, m));
      }
    }
    if (me == 0) std::printf("phased: %s\n", failures ? "FAILED" : "exact");
  } else if (mode == "fusion") {
    planner::TreeConfig tc;
    tc.parameterServer = true;
    tc.codec = codec;
    auto options = planner::enumerateOptions(tc);
    std::vector<size_t> fusible, compressed;
    for (size_t i = 0; i < options.size(); ++i) {
      if (options[i].fusible()) fusible.push_back(i);
      else if (options[i].compressed()) compressed.push_back(i);
    }
    if (fusible.empty() || compressed.empty())
      throw Error(ErrorCode::kInternal, "the option tree has no fusible or no compressed option");
    struct T {
      std::string name;
      uint64_t len;
      size_t seed;
    };
    std::vector<T> ts;
    plan::Plan p;
    p.version = 1;
    const uint64_t sizes[3] = {n, n + 5, 1};
    for (size_t k = 0; k < fusible.size(); ++k) {
      for (int m = 0; m < 3; ++m) {
        T t{fmt::format("f{}_{}", k, m), sizes[m], ts.size()};
        p.tensors[t.name] = options[fusible[k]];
        ts.push_back(t);
      }
      // Between two groups a tensor that runs alone (push/pull or compressed),
      // or every third one on the first group's option, which fuses with that
      // group although it is not its neighbour.
      T t{fmt::format("s{}", k), n + 2, ts.size()};
      p.tensors[t.name] = k % 3 == 2   ? options[fusible[0]]
                          : k % 2 == 0 ? executor::defaultOption()
                                       : options[compressed[(k * 7) % compressed.size()]];
      ts.push_back(t);
    }
    for (const T& t : ts) ex.declare(t.name, DType::kFloat32, t.len);
    ex.setPlan(p, opDeadline());
    executor::OnlineOptions on;
    on.window = 1;
    on.warmup = 0;
    on.exchange = false;  // reports stay local: lastReport()
    ex.setOnline(on);
    const uint64_t tripleBytes = (sizes[0] + sizes[1] + sizes[2]) * sizeof(float);
    const uint64_t pairBytes = (sizes[0] + sizes[1]) * sizeof(float);
    struct Case {
      const char* what;
      uint64_t threshold;
      uint64_t fusedBytes;  // a comm entry of this size must appear (0: none fused)
    };
    const Case cases[] = {{"default threshold", executor::kDefaultFusionBytes, tripleBytes},
                          {"off (0)", 0, 0},
                          {"below one tensor", sizes[0] * sizeof(float) - 1, 0},
                          {"exactly two tensors", pairBytes, pairBytes}};
    if (me == 0)
      std::printf("fusion: %zu fusible options, %zu tensors, %d ranks on %d machines\n",
                  fusible.size(), ts.size(), W, topo.numMachines);
    std::vector<std::vector<float>> in(ts.size()), out(ts.size());
    uint64_t iteration = 0;
    for (const Case& c : cases) {
      ex.setFusionBytes(c.threshold);
      for (int iter = 0; iter < iters; ++iter, ++iteration) {
        ex.beginIteration(iteration, opDeadline());  // closes the last iteration's window
        if (iter == 1) {  // the report of this case's first iteration
          std::set<uint64_t> sizesSeen;
          for (const auto& e : ex.lastReport()->comms) sizesSeen.insert(e.bytes);
          const bool sawTriple = sizesSeen.count(tripleBytes) > 0, sawPair = sizesSeen.count(pairBytes) > 0;
          if (c.fusedBytes == tripleBytes && !sawTriple)
            fail(fmt::format("{}: no communication of {} bytes (a fused triple) in the profile",
                             c.what, tripleBytes));
          if (c.fusedBytes == pairBytes && (!sawPair || sawTriple))
            fail(fmt::format("{}: expected pairs of {} bytes and no triple of {}: pair {}, triple {}",
                             c.what, pairBytes, tripleBytes, sawPair, sawTriple));
          if (c.fusedBytes == 0 && (sawPair || sawTriple))
            fail(fmt::format("{}: a fused size in the profile (pair {}, triple {})", c.what, sawPair,
                             sawTriple));
          // The report tells the re-planner the threshold its batches ran with.
          if (ex.lastReport()->fusionBytes != c.threshold)
            fail(fmt::format("{}: the report says fusion threshold {}, the executor ran {}", c.what,
                             ex.lastReport()->fusionBytes, c.threshold));
        }
        std::vector<executor::BatchItem> batch;
        for (size_t k = 0; k < ts.size(); ++k) {
          const T& t = ts[k];
          in[k].resize(t.len);
          out[k].assign(t.len, -1000.0f);
          for (uint64_t i = 0; i < t.len; ++i) in[k][i] = exactInput(me, t.seed, int(iteration), i);
          // Half of them in place, as bench model runs them.
          float* o = k % 2 ? in[k].data() : out[k].data();
          batch.push_back({t.name, in[k].data(), o, t.len});
        }
        try {
          ex.runBatch(batch, ReduceOp::kSum, opDeadline());
        } catch (const Error& e) {
          fail(fmt::format("{}: {}", c.what, e.what()));
          continue;
        }
        for (size_t k = 0; k < ts.size(); ++k) {
          const T& t = ts[k];
          const float* o = batch[k].output;
          for (uint64_t i = 0; i < t.len; ++i) {
            float ref = 0;
            for (int w = 0; w < W; ++w) ref += exactInput(w, t.seed, int(iteration), i);
            if (o[i] != ref) {
              fail(fmt::format("{}: tensor {} ({}), iteration {}, element {}: {} != reference {}",
                               c.what, t.name, p.tensors[t.name].describe(), iteration, i, o[i], ref));
              break;
            }
          }
        }
      }
      if (me == 0) std::printf("fusion, %s (%llu bytes): %s\n", c.what,
                               (unsigned long long)c.threshold, failures ? "FAILED" : "exact");
    }
    // Tensors handed over one at a time (run(): a batch of one) never fuse,
    // and the window's report says so.
    ex.setFusionBytes(executor::kDefaultFusionBytes);
    for (int k = 0; k < 2; ++k, ++iteration) {
      ex.beginIteration(iteration, opDeadline());
      for (size_t j = 0; j < ts.size(); ++j) {
        for (uint64_t i = 0; i < ts[j].len; ++i) in[j][i] = exactInput(me, ts[j].seed, int(iteration), i);
        ex.run(ts[j].name, in[j].data(), out[j].data(), ts[j].len, ReduceOp::kSum, opDeadline());
      }
    }
    if (ex.lastReport()->fusionBytes != 0)
      fail(fmt::format("run() one tensor at a time: the report says fusion threshold {}, expected 0",
                       ex.lastReport()->fusionBytes));
    // A batch with an undeclared item is refused before anything runs.
    std::vector<float> x(n, 1.0f);
    std::vector<executor::BatchItem> bad{{ts[0].name, x.data(), x.data(), ts[0].len},
                                         {"nope", x.data(), x.data(), n}};
    expectThrow("runBatch with an undeclared tensor", "'nope'",
                [&] { ex.runBatch(bad, ReduceOp::kSum, opDeadline()); });
    if (x[0] != 1.0f) fail("the refused batch ran its first item");
  } else {
    planner::TreeConfig tc;
    tc.parameterServer = true;
    tc.codec = codec;
    auto options = planner::enumerateOptions(tc);
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
    for (int iter = 0; iter < iters; ++iter) {
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
          ex.run(fmt::format("opt{}", o), in.data(), out.data(), n, ReduceOp::kSum, opDeadline());
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
  std::printf("rank %d: %s (%d failures)\n", me, failures ? "FAILED" : "PASSED", failures);
  std::fflush(stdout);
  worker->shutdown(Deadline::after(Millis(30000)));
  return failures ? 1 : 0;
}
