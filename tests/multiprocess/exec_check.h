// What the modes of the plan executor's multi-process check share
// (exec_check.cc has the modes' description and main; exec_check_switch.cc
// the switch and replan modes; exec_check_batches.cc fusion, pipeline and
// phased; exec_check_gravac.cc gravac; exec_check_zen.cc zen).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/collective/collectives.h"
#include "core/config.h"
#include "core/executor/executor.h"
#include "core/worker.h"

namespace exec_check {

using namespace cortado;

// Started before main: the bound on the reports' wall times.
extern const std::chrono::steady_clock::time_point kProgramStart;

// Failures so far (fail() counts and prints the first 20).
extern int failures;
void fail(const std::string& what);

// Progress of a check's loop, printed after `done` of `iters` iterations
// over `units` options or groups (`unit` names them) since `start`: a run
// stopped by its time limit (a GPU machine's budget) still says how far it
// got and what one costs.
void progress(int done, int iters, size_t units, const char* unit,
              std::chrono::steady_clock::time_point start);

// Integer-valued inputs in [-4, 4]: sums of 4 are exact in fp16 and fp32.
float exactInput(int rank, size_t option, int iter, uint64_t i);

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
                                            std::vector<std::vector<float>>& out);

// For each item of an exactBatch whose output is not the plain sum over W
// ranks, where and what: "item b (tensor, option), element i: x != reference r".
std::vector<std::string> exactMismatches(const TreeTensors& t, const std::vector<size_t>& order,
                                         const std::vector<executor::BatchItem>& batch, int W, int iter);

// Lossy mode gradients: a per-element mean plus per-rank noise.
float lossyInput(int rank, size_t option, int iter, uint64_t i);

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
// serverKeys: the keys whose residual may be held at once per server point
// (2 where group boundaries change: the group's key and the tensor's own).
double derivedBound(const plan::TensorOption& o, const std::string& codec, int W,
                    int serverKeys = 1);

// Executor::runBatch and run on host vectors, whatever the executor's device:
// on the host device straight through; on another (CORTADO_DEVICE=cuda) the
// buffers are mirrored in device memory first, each run of touching or
// overlapping host buffers as one device allocation (so that aliasing and
// consecutive outputs stay as they were), and the outputs copied back.
// Items the executor will refuse (undeclared, another size) go through
// untouched, so its errors are the same.
// --mirror: mirror on the host device too (to check the mirroring here).
extern bool mirrorAlways;
void runBatchOn(executor::Executor& ex, std::span<const executor::BatchItem> items, ReduceOp op,
                Deadline deadline);
void runOn(executor::Executor& ex, const std::string& name, const float* in, float* out,
           uint64_t n, ReduceOp op, Deadline deadline);

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

// Each operation's own deadline in the modes (every option over emulated
// hosts takes minutes in all).
// A batch's deadline grows with its items: a batch of every option (9821
// tensors in the phased mode) takes about 5 s on the idle 2-core VM, and
// with two busy loops on its cores it had done 5410 of them after 60 s.
inline Deadline opDeadline(size_t items = 1) {
  return Deadline::after(Millis(60000 + 10 * int64_t(items)));
}

// One rank's check: the options parsed and the job started (runCheck).
struct Check {
  std::string mode, codec;
  int shard = 0, shards = 1, iters = 2, stride = 1;
  uint64_t n = 11;
  double bound = 0;
  bool noMpi = false;
  int switchAt = 4, switchAt2 = 8;
  int tensors = 8, after = 3, minVersions = 0;
  double maxSeconds = 60;
  std::string stopFile, progressFile;
  bool batch = false;
  // switch: Executor::setPlan called directly before the switch iteration
  // (no scheduled switch, so no flushed last round), not schedulePlan.
  bool directSwitch = false;
  Deadline deadline;  // start-up and the error checks
  collective::Groups& groups;
  const JobConfig& job;
  Worker* worker;
  executor::Executor& ex;
  const collective::Topology& topo;
  int W = 0, me = 0;

  // Every option of the planner's tree with the servers' push/pull, with
  // --codec where an option compresses.
  std::vector<plan::TensorOption> treeOptions() const;

  // The modes (--mode), each in its own member so that it reads these
  // fields as the one function it was; all and lossy share runSweep.
  void runReplan();
  void runSwitch();
  void runErrors();
  void runPipeline();
  void runThreads();
  void runPhased();
  void runFusion();
  void runGroups();
  void runSearch();
  void runGravac();
  void runZen();
  void runSweep();

  // The check's device (the second executor of the threads mode shares it).
  std::shared_ptr<device::Device> dev = nullptr;
};

}  // namespace exec_check
