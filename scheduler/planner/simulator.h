// The timeline simulator: one option per tensor becomes an iteration time
// (when the last gradient's synchronization ends; forward pass and optimizer
// are constant and left out) and, on request, a Chrome trace.
//
// Model (docs/planner.md has the long form):
//  - One representative GPU and its machine are simulated; all are symmetric.
//  - Backward computation runs tensor by tensor; tensor j is ready after its
//    backward time, counting only time when the GPU is not running codec
//    kernels: a GPU encode or decode delays every later computation by its
//    duration.
//  - Every other resource is a set of lanes (the GPU's codec stream, the
//    intra-machine links, the network, the two PCIe directions, one lane per
//    CPU core). Tensors are scheduled in ready order; each operation takes the
//    earliest gap of its lane at or after its inputs are ready, so an earlier
//    tensor is never delayed by a later one, and a later one fills idle gaps.
//  - Because of that rule, tensor j's timeline depends only on tensors 0..j,
//    which is what makes prefix checkpoints exact: changing tensor j's option
//    re-simulates only from j.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "scheduler/planner/compile.h"
#include "scheduler/planner/profile.h"

namespace cortado::planner {

struct Interval {
  double s, e;
  bool operator==(const Interval&) const = default;
};

// The state of all lanes between two tensors.
struct SimState {
  double prevReady = 0;  // ready time of the previous tensor
  double maxFinish = 0;  // latest synchronization end so far
  // When the last execution's first communication step began (its end when
  // it has none): with the encode pipeline (Cluster::pipeline) the next
  // execution's leading local steps start no earlier.
  double exchangeStart = 0;
  std::vector<Interval> iv;      // live intervals, lane by lane
  std::vector<uint32_t> begin;   // lane l is iv[begin[l], begin[l+1])
  // Tensor fusion (Cluster::fusionBytes), as Executor::runBatch runs a
  // batch: its lone executions first, then its fused groups. When the current
  // batch was formed (the tensors ready by then are in it; -1: none yet), its
  // first tensor, where its fused groups start (the end of its lone
  // executions), and the groups so far per option (chunks of summed
  // elements, the last one open). The groups' operations are the last ones
  // reserved on every lane.
  struct Chunk {
    int64_t elements = 0;
    int first = 0, last = 0, count = 0;  // member tensors (for trace labels)
    bool operator==(const Chunk&) const = default;
  };
  struct Pending {
    int option = 0, dtype = 0;
    std::vector<Chunk> chunks;
    bool operator==(const Pending&) const = default;
  };
  double batchStart = -1;
  int batchFirst = 0;
  double pendingStart = 0;
  std::vector<Pending> pending;
};

struct TraceEvent {
  std::string name;
  int lane;
  int tensor;
  double start, dur;
  // The tensor as the trace names it when not the profile's: a fused
  // group's "fused<N>:<first>..<last>" (the name ends with it).
  std::string label = {};
  // A communication step's SimOp::waitUs: the workers' skew the timeline
  // charges just before it, holding no lane (chromeTrace writes it as the
  // event's "skew_wait_us"; a measured step's span holds that wait).
  double waitUs = 0;
};

struct TensorTiming {
  double ready = 0;
  double finish = 0;
};

class Simulator {
 public:
  static constexpr double kInf = std::numeric_limits<double>::infinity();

  Simulator(Cluster cluster, ResolvedCodec codec, ModelProfile profile,
            std::vector<plan::TensorOption> options);

  int tensors() const { return int(profile_.tensors.size()); }
  int optionCount() const { return int(options_.size()); }
  const std::vector<plan::TensorOption>& options() const { return options_; }
  const ModelProfile& profile() const { return profile_; }
  const Cluster& cluster() const { return cluster_; }
  const ResolvedCodec& codec() const { return codec_; }
  // Tensors with the same size, dtype and sparsity (density and overlap,
  // for Zen's options) share a size class (and compiled ops).
  int sizeClass(int tensor) const { return sizeClass_[tensor]; }
  int sizeClasses() const { return int(classElements_.size()); }
  int64_t classElements(int sizeClass) const { return classElements_[sizeClass]; }
  int classDtype(int sizeClass) const { return classDtype_[sizeClass]; }
  const Sparsity& classSparsity(int sizeClass) const { return classSparsity_[sizeClass]; }
  const CompiledOption& compiled(int tensor, int option) { return compiledForClass(sizeClass_[tensor], option); }
  const CompiledOption& compiledForClass(int sizeClass, int option);

  // Full simulation of one option index per tensor.
  double simulate(const std::vector<int>& choice, std::vector<TensorTiming>* timings = nullptr,
                  std::vector<TraceEvent>* trace = nullptr);

  // Incremental evaluation against a base choice: setBase() simulates it and
  // keeps a checkpoint before every tensor; evaluate() simulates the base with
  // some tensors' options replaced (overrides sorted by tensor), starting at
  // the first replaced tensor, and stops early when the state meets the base
  // again or when a lower bound reaches `cutoff` (it then returns a value
  // >= cutoff, not the exact time).
  void setBase(const std::vector<int>& choice);
  double evaluate(const std::vector<std::pair<int, int>>& overrides, double cutoff = kInf);
  // A cheap score of replacing tensor j's option: simulates j and at most
  // `window` more tensors and returns the lower bound on the iteration time
  // from there (exact when the window reaches the end or the state meets the
  // base again). Used to choose which options to evaluate in full.
  //
  // With a finite `bound`, a score that is sure to end above it may be
  // returned early: the value is then still above `bound` but not the
  // exact score (callers that keep the options scoring at or below a
  // threshold get the same options with the same scores).
  double screen(int tensor, int option, int window, double bound = kInf);
  // Lazy base, for the estimated search (decision.cc): changeBase() replaces
  // one tensor's option without re-simulating; checkpoints after it are
  // brought up to date only when asked for (checkpoint(), exactBaseTime(),
  // setBase()). evaluate(), screen(), baseTime(), baseTimings() and
  // lastBubble() need setBase() after the last changeBase().
  void changeBase(int tensor, int option);
  // The exact state before `tensor` under the current base.
  const SimState& checkpoint(int tensor);
  // The current base's exact iteration time.
  double exactBaseTime();
  // Exact: the base with `overrides` (sorted, none before `from`), simulated
  // from the checkpoint before `from` to the end.
  double simulateFrom(int from, const std::vector<std::pair<int, int>>& overrides);
  // An estimate of the base's iteration time with `overrides` (sorted, all in
  // [lo, hi]): tensors lo..hi are simulated exactly from the checkpoint before
  // lo, and the rest is the longest path through the base's later operations
  // from each lane's free time (tailEstimate()). Exact when hi is the last
  // tensor; estimates compared with each other should share lo and hi.
  double estimate(int lo, int hi, const std::vector<std::pair<int, int>>& overrides);
  // The tail part of estimate(): for the state before tensor k, the latest
  // of its synchronization ends so far and, for every lane, its free time
  // plus the longest chain of base operations that can follow it (each
  // operation waits for the previous one of its tensor and, on its lane, for
  // the later tensors' first operation there; computation and the GPU's codec
  // work form one more chain). Exact while the later operations keep their
  // order on each lane (the queue-bound case); gap-filling makes it high.
  double tailEstimate(const SimState& st, int k);
  // estimate(j, j, {{j, o}}) for every o of `options` at once, without
  // simulating: the tensor's operations are placed against the checkpoint
  // and the rest is tailEstimate() with their work added to the lanes.
  // An option whose estimate is sure to be above `bound` may get a lower
  // value than its estimate that is still above `bound`.
  void estimateOptions(int tensor, const std::vector<int>& options, std::vector<double>& out,
                       double bound = kInf);

  // Reference mode, for tests: setBase() re-simulates every tensor,
  // evaluate() simulates the whole iteration from scratch (exact, ignoring
  // `cutoff`) and screen() ignores `bound`. Decisions must not change.
  void setReference(bool on) { reference_ = on; }
  bool reference() const { return reference_; }
  double baseTime() const { return baseTime_; }
  const std::vector<int>& base() const { return base_; }
  const std::vector<TensorTiming>& baseTimings() const { return baseTimings_; }
  // The last tensor j whose ready time is at or after every earlier tensor's
  // synchronization end: the channels drained before it (0 when none).
  int lastBubble() const;

  // Advanced: the exhaustive search walks prefixes itself.
  SimState initialState() const;
  // A lower bound on the iteration time of every completion of the prefix
  // that led to `st`: its latest synchronization end, but with tensor fusion
  // only the end of the batch's lone executions while it has fused groups (a
  // later tensor of the batch may grow a group or run before them).
  double settledFinish(const SimState& st) const {
    return st.pending.empty() ? st.maxFinish : std::min(st.maxFinish, st.pendingStart);
  }
  bool fusion() const { return cluster_.oneTensorAtATime && cluster_.fusionBytes > 0; }
  // The encode pipeline is modelled (Cluster::pipeline).
  bool pipelined() const { return cluster_.oneTensorAtATime && cluster_.pipeline && !fusion(); }
  // A "gpu" codec step that runs the CPU twin on host buffers off the
  // computation (gpuCodecPausesCompute off: the plan executor, `cortado
  // bench model`) takes a core. With the pipeline it is placed on the CPU
  // lanes, where the next execution's encode and the previous one's decode
  // and server work compete for the cores as they do; one execution at a
  // time without the pipeline, the lane makes no difference and the GPU
  // lane stays.
  bool twinOnCpu(const SimOp& op) const {
    return op.res == Res::kGpu && pipelined() && !cluster_.gpuCodecPausesCompute &&
           (op.kind == OpKind::kEncode || op.kind == OpKind::kDecode);
  }
  // Where an execution ready at `ready` may start its first operation: at
  // once with overlapping lanes; one execution at a time, when the previous
  // one has ended, or with the pipeline when its exchange has begun.
  double executionStart(const SimState& st, double ready) const {
    if (!cluster_.oneTensorAtATime) return ready;
    return std::max(ready, pipelined() ? st.exchangeStart : st.maxFinish);
  }
  double step(SimState& st, int tensor, int option, std::vector<TraceEvent>* trace = nullptr,
              TensorTiming* timing = nullptr);

  // One execution of `option` on `elements` elements of tensor `tensor`'s
  // dtype on idle lanes, from time 0: a tensor alone (elements = its own),
  // or a fused group of that summed size (the group's last tensor). Returns
  // its duration; `trace` gets its operations, named after `label` where
  // given (a fused group's "fused<N>:<first>..<last>").
  // `leadUs`, when given, gets when its first communication step could
  // begin (the leading local steps' end; its duration when it has none).
  double runAlone(int tensor, int64_t elements, int option, std::vector<TraceEvent>* trace = nullptr,
                  const std::string* label = nullptr, double* leadUs = nullptr);
  // runAlone() of a plan group of `elements` (its last tensor `tensor`):
  // compiledGroup(), with the copies into and out of the group's buffer.
  double runGroup(int tensor, int64_t elements, int option, std::vector<TraceEvent>* trace = nullptr,
                  const std::string* label = nullptr, double* leadUs = nullptr);

  // Explicit fused groups (Plan::groups; Cupcake, fusion_search.h): tensors
  // first..last, consecutive in ready order and of one dtype, run `option`
  // once on their summed size, from when `last` is ready, on the same lanes
  // and with the same gap rule as a lone tensor; their backward runs as for
  // lone tensors (nothing of theirs is reserved before the group starts).
  // The execution is the one runAlone() costs for a fused group of that
  // size. first == last is step() itself. Not with the runtime's tensor
  // fusion (fusion()), which this model does not compose with groups.
  // `timings`, when given, gets one entry per member (all finish together).
  double stepGroup(SimState& st, int first, int last, int option,
                   std::vector<TraceEvent>* trace = nullptr, TensorTiming* timings = nullptr);
  // The two halves of stepGroup(), for the search that extends a group one
  // tensor at a time: when `tensor` becomes ready if its backward starts at
  // `from` (GPU codec work reserved in `st` pauses it), and the group's
  // execution placed against `st` once its last member is ready at `ready`.
  double readyAfter(const SimState& st, double from, int tensor) const;
  double placeGroup(SimState& st, int first, int last, int option, double ready,
                    std::vector<TraceEvent>* trace = nullptr);
  // When `work` microseconds of backward started at `from` end, paused by
  // the GPU codec work reserved in `st` (later reservations only delay it).
  double backwardEnd(const SimState& st, double from, double work) const {
    return advanceCompute(st, from, work);
  }
  // simulate() with fused groups: `groups` lists [first, last] ranges
  // (last > first, ascending, disjoint) whose members share one option in
  // `choice`; every other tensor runs alone.
  double simulateGroups(const std::vector<int>& choice,
                        const std::vector<std::pair<int, int>>& groups,
                        std::vector<TensorTiming>* timings = nullptr,
                        std::vector<TraceEvent>* trace = nullptr);
  // Lane names for traces.
  std::string laneName(int lane) const;
  int lanes() const { return kCpuLane0 + cluster_.cpuCores; }

 private:
  static constexpr int kGpuLane = 0, kIntraLane = 1, kInterLane = 2, kD2HLane = 3, kH2DLane = 4,
                       kCpuLane0 = 5;

  double earliestFit(const SimState& st, int lane, double t, double d) const;
  void insert(SimState& st, int lane, double s, double e) const;
  double reserve(SimState& st, int lane, double t, double d) const;
  void trim(SimState& st, double horizon) const;
  double advanceCompute(const SimState& st, double from, double work) const;
  double lowerBound(const SimState& st, int next) const;
  double scheduleCpu(SimState& st, const SimOp& op, int tensor, double t,
                     std::vector<TraceEvent>* trace, const std::string* label = nullptr);
  // scheduleCpu() without reserving: fills runs_ and returns the end.
  double placeCpu(const SimState& st, const SimOp& op, double t);
  double tailFrom(int k, double t0, double maxFinish, const double* busy) const;
  void traceOp(std::vector<TraceEvent>* trace, const SimOp& op, int lane, int tensor, double s,
               const std::string* label = nullptr) const;
  double scheduleOps(SimState& st, const CompiledOption& c, int tensor, double t,
                     std::vector<TraceEvent>* trace, const std::string* label);
  // Tensor fusion: the compiled option of a fused group's summed size.
  const CompiledOption& compiledFused(int64_t elements, int dtype, int option);
  // A plan group's execution: compiledFused(), in place on a flat gradient
  // buffer (ModelProfile::contiguousGradients); otherwise between the
  // executor's two copies of the members into the group's buffer and back
  // out (detail::gatherGroup/scatterGroup), each a memory-bound pass over
  // the group's bytes on the executor's core at the CPU's summing rate
  // (Cluster::cpuSumGbps).
  const CompiledOption& compiledGroup(int64_t elements, int dtype, int option);
  // Drops every reservation at or after `t` (the open group's).
  void truncate(SimState& st, double t) const;
  // With fusion: the finish of every fused member of the current batch so
  // far is the batch's end so far (an upper bound: groups run one after the
  // other at the batch's end).
  void setBatchFinish(const SimState& st, int j, const std::vector<int>& choice,
                      TensorTiming* timings) const;
  // Re-reserves the batch's fused groups from st.pendingStart; returns their end.
  double schedulePending(SimState& st, std::vector<TraceEvent>* trace);
  std::vector<char> fusible_;  // by option
  std::map<std::tuple<int64_t, int, int>, std::unique_ptr<CompiledOption>> fusedCache_;
  std::map<std::tuple<int64_t, int, int>, std::unique_ptr<CompiledOption>> groupCache_;
  static constexpr size_t kFusedCacheBound = 100000;  // fused sizes differ with every choice

  Cluster cluster_;
  ResolvedCodec codec_;
  ModelProfile profile_;
  std::vector<plan::TensorOption> options_;
  std::vector<int> sizeClass_;
  std::vector<int64_t> classElements_;
  std::vector<int> classDtype_;
  std::vector<Sparsity> classSparsity_;
  std::vector<std::vector<std::unique_ptr<CompiledOption>>> cache_;  // [class][option]

  // Base and its checkpoints.
  std::vector<int> base_;
  std::vector<SimState> checkpoints_;  // before each tensor, and the final state
  std::vector<TensorTiming> baseTimings_;
  std::vector<double> suffixMaxFinish_;
  std::vector<double> suffixBackward_;                 // backward time of tensors >= j
  std::vector<double> suffixIntra_, suffixInter_;      // base lane work of tensors >= j
  double baseTime_ = 0;
  bool baseValid_ = false;
  int validUpTo_ = 0;        // checkpoints_[0..validUpTo_] are exact for base_
  // Tail chains (tailEstimate()): tail_[k * kTailChains + c], for the base's
  // tensors >= k; rows up to tailStale_ need recomputing.
  static constexpr int kTailChains = 7;  // gpu, intra, inter, d2h, h2d, cpu pool, compute
  std::vector<double> tail_;
  int tailStale_ = -1;  // rows 0..tailStale_ are stale (-1: none)
  void updateTail();
  void bringUpTo(int tensor);
  bool reference_ = false;
  SimState scratch_;
  std::vector<std::pair<double, int>> heap_;         // scheduleCpu's scratch
  std::vector<std::tuple<int, double, double>> runs_;
  std::vector<int> coreRun_;
};

// Chrome trace-event JSON (viewable in Perfetto / chrome://tracing).
std::string chromeTrace(const Simulator& sim, const std::vector<TraceEvent>& events);

}  // namespace cortado::planner
