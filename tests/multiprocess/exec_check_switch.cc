// The plan executor's check, modes switch and replan (exec_check.cc describes
// them): plan switches mid-run, and online re-planning from the job's config.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/plan/profile_report.h"
#include "tests/multiprocess/exec_check.h"

namespace exec_check {

void Check::runSwitch() {
  auto options = treeOptions();
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
    if (!directSwitch && iter == switchAt - 2) ex.schedulePlan(b, switchAt);
    if (!directSwitch && iter == switchAt2 - 1) ex.schedulePlan(c, switchAt2);
    if (directSwitch && iter == switchAt) ex.setPlan(b, opDeadline());
    if (directSwitch && iter == switchAt2) ex.setPlan(c, opDeadline());
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
        runOn(ex, fmt::format("t{}", j), in.data(), out.data(), len, ReduceOp::kSum, deadline);
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
  // Every tensor ran `iters` training iterations: setPlan's flush rounds
  // (with --direct-switch, for A's tensors whose pull the servers re-encode,
  // every other one) are not counted, so the tensors of one iteration share
  // its number in runs() and in the trace.
  for (int j = 0; j < T; ++j) {
    const uint64_t ran = ex.runs(fmt::format("t{}", j));
    if (ran != uint64_t(iters))
      fail(fmt::format("t{}: runs() is {} after {} iterations", j, ran, iters));
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
    for (int k = 0; k < 2; ++k) runOn(ex, "t0", in.data(), out.data(), n, ReduceOp::kSum, deadline);
    ex.setOnline(on);
    const uint64_t resume = ex.iteration() + 1;
    for (uint64_t it = resume; it <= resume + 3; ++it) {
      ex.beginIteration(it, deadline);
      if (it < resume + 3) runOn(ex, "t0", in.data(), out.data(), n, ReduceOp::kSum, deadline);
    }
    const auto& again = ex.lastReport();
    if (!again || again->endIteration == lastWindowEnd)
      fail("no profiling window closed after profiling was turned on again");
    else if (again->firstIteration != resume || again->endIteration != resume + 3)
      fail(fmt::format("after profiling was off and on again the window spans iterations [{}, {}), "
                       "expected [{}, {}): the window open when it was turned off was kept",
                       again->firstIteration, again->endIteration, resume, resume + 3));
  }
  // A second executor over the same worker declaring the same tensor names:
  // its first plan's shard keys have the names of this one's plan A, which
  // the switch released. Every worker must agree on new keys, also with 2
  // ranks per machine, where each pushes only its own shard key of a
  // hierarchical option (there the declarations waited for one another
  // until the executor released the other ranks' shard keys too,
  // Worker::releaseHere), and the sums must be exact on them.
  if (exact) {
    executor::Executor second(*worker, noMpi ? nullptr : &groups, nullptr, "", dev);
    for (int j = 0; j < T; ++j) second.declare(fmt::format("t{}", j), DType::kFloat32, n + j);
    try {
      second.setPlan(a, opDeadline(T));
    } catch (const Error& e) {
      fail(fmt::format("a second executor with the same tensor names: {}", e.what()));
      return;
    }
    for (int j = 0; j < T; ++j) {
      const uint64_t len = n + j;
      std::vector<float> in(len), out(len);
      for (uint64_t i = 0; i < len; ++i) in[i] = exactInput(me, j, iters + 1, i);
      runOn(second, fmt::format("t{}", j), in.data(), out.data(), len, ReduceOp::kSum, deadline);
      for (uint64_t i = 0; i < len; ++i) {
        double r = 0;
        for (int w = 0; w < W; ++w) r += exactInput(w, j, iters + 1, i);
        if (out[i] != float(r)) {
          fail(fmt::format("second executor, t{} element {}: {} != reference {}", j, i, out[i], r));
          break;
        }
      }
    }
  }
}

void Check::runReplan() {
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
      if (iter > 0) versions += fmt::format(",{}", version);  // (GCC 12 -Wrestrict misfires on "," + to_string)
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
        runBatchOn(ex, batchItems, ReduceOp::kSum, itDeadline);
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
          runOn(ex, fmt::format("g{}", t), in.data(), out.data(), len, ReduceOp::kSum, itDeadline);
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
}

}  // namespace exec_check
