// The plan executor (DESIGN.md, "A tensor's way through a worker"): runs each
// tensor's plan::TensorOption on this worker, step by step.
//
// - Communication steps: flat steps over the world group, intra steps over
//   this machine's group, inter steps over the group of the same local rank
//   on every machine (collective::Groups, kSameLocalRank), and push/pull
//   through the CPU servers (Worker::exchange). In a hierarchical push/pull
//   only one worker per machine pushes a given shard key (local rank l its
//   intra reduce-scatter/alltoall block l; the machine root after an intra
//   reduce/gather), so those keys are declared with numMachines contributors.
// - Compressed data moves only through gathers, alltoalls, broadcasts and
//   push/pull. Every sum happens after decoding: the gathered payloads are
//   decoded one by one and added in fp32 (the servers do the same).
// - Error feedback lives at every encode step, keyed by tensor, step index
//   and piece (a piece is the part of the tensor that one payload covers: an
//   alltoall block or a server chunk), across iterations.
// - Buffers live on the executor's device (core/device/device.h; docs/
//   executor.md, "Devices"): host memory on the host device (the default),
//   CUDA memory on the CUDA device. Each step runs where the plan puts it:
//   a "gpu" encode or decode runs the device's codec on device memory (on
//   the host device that is the CPU twin, which reads and writes the same
//   payloads as the CUDA codec); a "cpu" one copies the data to pinned host
//   memory first and runs the CPU codec there; a push/pull goes from pinned
//   host memory and its answer is copied back. Dense collectives run on the
//   device's groups (MPI on host, NCCL on CUDA), payload blobs on the MPI
//   groups in host memory. Two streams (compute, copy) and per-tensor events
//   order the work; run() waits only for its own tensor's work.
//
// Without a plan each tensor runs BytePS's default: hierarchical and
// uncompressed, intra reduce-scatter, push/pull of each shard, intra
// allgather. Without Groups (a worker not started under mpirun) every worker
// is its machine's only worker: intra steps are no-ops, push/pull works, and
// plans with flat or inter-collective steps are refused.
//
// Threads: one thread at a time calls an Executor (the collective groups are
// single-threaded). run() is synchronous; every wait has the given deadline.
// Errors name the tensor, the step and the peer or group.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "compressor/gravac.h"
#include "core/collective/collectives.h"
#include "core/common/deadline.h"
#include "core/common/trace.h"
#include "core/config.h"
#include "core/device/device.h"
#include "core/executor/fusion_search.h"
#include "core/plan/plan.h"
#include "core/plan/profile_report.h"
#include "core/worker.h"

namespace cortado {
class ThreadPool;
namespace compressor {
class Registry;
class GravacCompressor;
}  // namespace compressor

namespace executor {

namespace detail {
struct Lanes;
struct GivenPayload;
}  // namespace detail

// Online profiling and plan switches (docs/planner.md, "Online re-planning").
struct OnlineOptions {
  // Iterations per profiling window (CORTADO_PROFILE_WINDOW); 0: no
  // profiling. Windows follow each other: window n covers iterations
  // [warmup + n*window, warmup + (n+1)*window).
  uint64_t window = 0;
  uint64_t warmup = 1;  // iterations left out before the first window
  // Send each window's report to the scheduler and take the plans it hands
  // out (PlanUpdate) in beginIteration(). Off: reports stay local
  // (lastReport()) and plans come only through schedulePlan().
  bool exchange = true;
};

// The online options a job asks for: windows of JobConfig::profileWindow
// iterations (CORTADO_PROFILE_WINDOW; 0: off) after one warm-up iteration,
// exchanged with the scheduler. A training loop that calls beginIteration()
// passes them to setOnline().
OnlineOptions onlineOptions(const JobConfig& job);

// Reads a plan file (plan::Plan JSON, e.g. `cortado plan ... --json`); throws
// kInvalidArgument naming the file and what is wrong.
plan::Plan loadPlanFile(const std::string& path);

// The default option for a tensor: H: i.rs x.push x.pull i.ag (raw).
plan::TensorOption defaultOption();

// The fusion threshold a job gets without CORTADO_FUSION_BYTES: 64 MiB,
// Horovod's default fusion buffer.
inline constexpr uint64_t kDefaultFusionBytes = 64ull << 20;
// The codec threads a job's executor gets (Executor::setCodecThreads):
// JobConfig::codecThreads (CORTADO_CODEC_THREADS) where set, else the
// machine's cores over twice its `workersPerMachine`, at least 1 (half the
// cores stay with the servers and the training's own threads).
int codecThreadsFor(const JobConfig& job, int workersPerMachine);

// The phase size a job gets without CORTADO_PHASE_BYTES (Executor::setPhaseBytes).
inline constexpr uint64_t kDefaultPhaseBytes = 64ull << 20;

// One tensor of a batch (Executor::runBatch): sums `input` over all workers
// into `output` (may alias), as run() does.
struct BatchItem {
  std::string name;
  const float* input = nullptr;
  float* output = nullptr;
  uint64_t numElements = 0;
  // When the gradient became ready, for online profiling: a caller that runs
  // gradients on another thread while the computation goes on (the Python
  // binding's submit) gives it. Unset: the time of the call less the time
  // spent in the executor since the iteration began (one thread doing both).
  std::optional<std::chrono::steady_clock::time_point> readyAt = std::nullopt;
};

// GraVAC in the executor (Executor::setGravac): what the plan's compressed
// steps carry. GraVAC's worker part (compressor::GravacCompressor) compresses
// each gradient with its own codec and error feedback; the plan then sums the
// decoded messages, its compressed steps as top-k at the plan's CF. This is
// `p` with every compressed option's codec made "topk:ratio=1/cf" (options
// without a codec stay raw) and its version raised by one.
plan::Plan gravacCarrierPlan(const plan::Plan& p, double cf);

// Re-plans for a new GraVAC CF (Executor::setGravacReplanner): given the plan
// the job runs and the CF the next iteration sends at, the plan to switch to
// (its codecs are made the carrier afterwards, gravacCarrierPlan). Every
// worker must answer the same plan.
using GravacReplanner = std::function<plan::Plan(const plan::Plan& current, double cf)>;

class Executor {
 public:
  // `groups` may be null (no MPI). `codecs`: nullptr = the CPU codecs; must
  // be the registry the servers know.
  // `planFile` (JobConfig::planFile, CORTADO_PLAN): the plan that the first
  // run() applies when no plan was set; empty: the default plan.
  // `device` (makeDevice in core/backends.h): where run()'s buffers live and
  // the codecs run; nullptr: the host device over `groups`. Its groups, when
  // it has any, must span the same ranks as `groups`.
  Executor(Worker& worker, const collective::Groups* groups,
           std::shared_ptr<const compressor::Registry> codecs = nullptr, std::string planFile = {},
           std::shared_ptr<device::Device> device = nullptr);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const collective::Topology& topology() const { return topo_; }
  // The device the buffers of run() and runBatch() are memory of.
  device::Device& device() const { return *device_; }

  // Registers a tensor (local only; the keys are declared with the servers
  // when the plan is applied). Float32 only. Re-registering with another
  // size throws.
  void declare(const std::string& name, DType dtype, uint64_t numElements);

  // Validates `p` against the declared tensors and this job's topology and
  // declares its shard keys (collective over all workers: every worker calls
  // it with the same plan). Throws kInvalidArgument naming the tensor: a plan
  // for an undeclared tensor, a declared tensor missing from the plan, a
  // codec that is unknown or does not apply, a step this job cannot run.
  void setPlan(const plan::Plan& p, Deadline deadline);
  // Every declared tensor on defaultOption().
  void setDefaultPlan(Deadline deadline);
  bool hasPlan() const { return plan_.has_value(); }
  // Sets the plan a run would set when none is set: the plan file given to
  // the constructor (CORTADO_PLAN), else the default plan (collective, like
  // setPlan). Does nothing when a plan is set.
  void ensurePlan(Deadline deadline);
  const plan::Plan& currentPlan() const;

  // Sums `input` over all workers into `output` (may alias) by the tensor's
  // option. `numElements` must be the declared count. Both are memory of
  // device() (host memory on the host device); the output is written when
  // run() returns.
  void run(const std::string& name, const float* input, float* output, uint64_t numElements,
           ReduceOp op, Deadline deadline);

  // Runs `items`, each as run() would, with the plan's groups (groupRuns():
  // a group whose every tensor the batch holds once runs as one execution)
  // and tensor fusion (docs/executor.md, "Tensor fusion"): items outside
  // complete groups whose options are equal and fusible
  // (plan::TensorOption::fusible: uncompressed, collectives only) run as one
  // execution of that option on a fusion buffer (their inputs concatenated,
  // the results scattered to their outputs; in place instead when the
  // outputs are consecutive, see inPlaceGroupRuns()), packed in item order into
  // groups whose summed bytes stay within fusionBytes(). Order: the items
  // that run alone and the plan's groups first (in order, a group at the
  // place of its last tensor), then the fused-by-size groups, option by
  // option in the order of each option's first item. Uncompressed results
  // equal running each item alone (exact for integer-valued data); a plan
  // group's codec sees the group's statistics. Every worker calls it with the
  // same items in the same order (collective, like run()). An item's input
  // may alias its own output, not another item's buffers. Every item is
  // checked (declared, element count, buffers) before anything runs; an
  // error names the item.
  void runBatch(std::span<const BatchItem> items, ReduceOp op, Deadline deadline);
  // A batch whose items become ready while it runs (a whole iteration handed
  // over at once): before an execution's first step, `await(i)` is called
  // for each of its items i in order and must return once item i's input is
  // written (or throw, which fails the batch as a failed step does). It is
  // called on the thread that runs that execution's leading local steps:
  // with the pipeline, the second thread, while the previous execution
  // communicates on the calling one, so an execution's encode overlaps the
  // previous one's exchange across what would otherwise be separate
  // batches. An item's ready time for the profiles is taken after its
  // await (unless it has readyAt). Fused-by-size groups wait for all their
  // items and run after the units, as in runBatch(). Not with GraVAC
  // (setGravac): it sums the batch at once. Everything else is runBatch()'s.
  using AwaitItem = std::function<void(size_t item)>;
  void runBatch(std::span<const BatchItem> items, ReduceOp op, Deadline deadline,
                const AwaitItem& await);
  // The fusion threshold in bytes (JobConfig::fusionBytes, CORTADO_FUSION_BYTES;
  // default kDefaultFusionBytes); 0: no fusion, runBatch() runs item by item.
  // Every worker sets the same one.
  void setFusionBytes(uint64_t bytes) { fusionBytes_ = bytes; }
  uint64_t fusionBytes() const { return fusionBytes_; }
  // Phases (JobConfig::phaseBytes, CORTADO_PHASE_BYTES; default
  // kDefaultPhaseBytes): runBatch() runs the items that run alone (not fused)
  // in phases of consecutive items up to this many bytes of input, a tensor
  // at most once in a phase: every item's steps before its first
  // communication, then every item's first communication step, then every
  // item's steps up to its next one, and so on. Every rank computes while
  // the others do and communicates while they do, so a collective does not
  // wait for a peer still encoding another tensor, nor for a core that a
  // peer's next encode holds (docs/executor.md, "Phases"). Each tensor runs
  // the same steps on the same data as one after the other, so results are
  // bit for bit the same, and every rank issues the same collectives in the
  // same order. A phase holds its items' payloads at once. 0: one item after
  // the other. The pipeline, when on, takes precedence. Every worker sets
  // the same value.
  void setPhaseBytes(uint64_t bytes) { phaseBytes_ = bytes; }
  uint64_t phaseBytes() const { return phaseBytes_; }
  // Communication steps run for two or more items in a row of a phase so far.
  uint64_t phasedSteps() const { return phasedSteps_; }
  // The encode pipeline (JobConfig::pipeline, CORTADO_PIPELINE; default off):
  // in runBatch(), while one item that runs alone (or a plan group)
  // communicates, the next one's leading encode (the steps before its first
  // communication; for a group, the gather into its buffer too) runs on
  // another thread, one execution ahead. Across batches only within one
  // runBatch() with an AwaitItem (a batch that ends waits for its last
  // exchange). Results are bit for bit those of running the items one
  // after the other, and every collective and push comes in the same order.
  // A batch that fails at an item may have encoded the next one already:
  // its error-feedback residual then counts that round's gradient as sent
  // (a failed step ends the job's use of the executor anyway: its groups or
  // keys are left mid-round). The planner's simulator models it without
  // fusion by size (planner::Cluster::pipeline; docs/executor.md).
  void setPipeline(bool on) { pipeline_ = on; }
  bool pipeline() const { return pipeline_; }
  // Threads of this worker's codec calls on the CPU (the "cpu" steps, and
  // the "gpu" steps on the host device): 1 runs each encode and decode on
  // the calling thread; n > 1 splits each over the calling thread and a pool
  // of n - 1 (JobConfig::codecThreads, codecThreadsFor). The codecs write the
  // same bytes either way (compressor tests, EveryCodec.ThreadPoolGivesTheSameBytes),
  // so results do not change. `cortado bench model` probes the codecs with
  // as many threads, so that its curves price a call as it runs here. Call
  // it between runs, not during one. Throws kInvalidArgument outside
  // 1..JobConfig::kMaxCodecThreads.
  void setCodecThreads(int threads);
  int codecThreads() const { return codecThreads_; }
  // Top-k and DGC payloads in the gather, broadcast, allgather and alltoall
  // steps travel in their compact wire form where that is smaller
  // (compressor/compact.h; JobConfig::compactSparse, CORTADO_COMPACT_SPARSE;
  // default on). Either form is read. Push/pull steps follow the worker's
  // WorkerOptions::compactSparse.
  void setCompactSparse(bool on) { compactSparse_ = on; }
  bool compactSparse() const { return compactSparse_; }
  // Leading encodes the pipeline has run beside another item's steps so far.
  uint64_t pipelinedStarts() const { return pipelinedStarts_; }
  // Executions of the plan's groups (plan::Plan::groups) so far: a batch
  // that holds each tensor of a group exactly once runs the group's option
  // once on their concatenation, at the place of its last tensor (one
  // encode, one communication step or server key, one decode; the codec's
  // statistics are the group's). A batch that holds only some of a group's
  // tensors (or one twice) runs those on their own. Error feedback follows:
  // before a tensor runs on another state than the one whose encode points
  // hold its residual, those residuals are folded into its next input
  // (retire), so boundaries may change between batches with nothing lost or
  // sent twice.
  uint64_t groupRuns() const { return groupRuns_; }
  // Executions of a plan group or a fused-by-size group that ran in place,
  // with no copy: their items' outputs were consecutive in memory in the
  // group's order (one flat gradient buffer, as DDP's
  // gradient_as_bucket_view and cortado.torch's DistributedOptimizer lay
  // gradients out) and every input was its output or lay outside them.
  // The others were gathered into a buffer and scattered back: two passes
  // over the group's bytes.
  uint64_t inPlaceGroupRuns() const { return inPlaceGroupRuns_; }

  // Records every step of every run() (docs/tracing.md): stage names as the
  // planner's simulator has them ("encode", "intra reduce_scatter",
  // "inter allgather*", ...; a push and its pull are one exchange here,
  // recorded as "inter push+pull" with "*" on the compressed side), the
  // iteration being the tensor's run count on this executor. Steps a rank
  // sits out (after an intra reduce or gather) are not recorded. nullptr:
  // off. Set between runs. A fused group (runBatch) is recorded once per
  // step under the tensor name "fused<N>:<first>..<last>" (N tensors, the
  // group's first and last), at the first tensor's run count.
  void setTracer(std::shared_ptr<Tracer> tracer) { tracer_ = std::move(tracer); }
  const std::shared_ptr<Tracer>& tracer() const { return tracer_; }

  // The element count `name` was declared with; nullopt when it was not.
  std::optional<uint64_t> declaredElements(const std::string& name) const;
  // Bytes this worker pushed to the servers through its plans so far, as
  // they went on the wire (Handle::pushedBytes): the payloads of compressed
  // pushes (top-k and DGC in their compact form where it was sent), 4 per
  // element of raw ones (and GraVAC's dense iterations without MPI).
  uint64_t pushedBytes() const { return pushedBytes_; }
  // How many tensors were declared.
  size_t declaredCount() const { return tensors_.size(); }

  // The bytes the executor holds now (the memory reports of `cortado bench
  // model`; docs/executor.md, "Memory"): the error feedback of the current
  // plan's encode points (residuals, and DGC's velocities: 1x, or 2x, the
  // elements encoded, inherent to error feedback; half that with bf16 state,
  // plus its fp32 scratch, on the host and on a CUDA device), the residuals of encode
  // points that a plan switch retired and that no run has folded into an
  // input yet (host memory, released once folded), and every buffer besides
  // (the states' staging, payload and pinned buffers, the groups'
  // concatenations, the collectives' padded pair, the fusion buffer).
  struct Memory {
    uint64_t residuals = 0;
    uint64_t carry = 0;
    uint64_t buffers = 0;
  };
  Memory memory() const;

  // How many times run() has completed for `name` (its iteration count), not
  // counting the flush rounds setPlan runs for tensors that owed the servers
  // a residual: every tensor of an iteration has the same count.
  uint64_t runs(const std::string& name) const;

  // --- online re-planning -----------------------------------------------------
  // Sets (or, with window 0, turns off) online profiling. An open window is
  // dropped: its summaries stop there and no report is sent for it; with
  // profiling on, the next window opens at the next beginIteration() past the
  // warm-up. Verdicts already awaited are still taken by beginIteration().
  void setOnline(const OnlineOptions& o);
  // Marks the start of training iteration `iteration` (strictly increasing,
  // and consecutive with online profiling on; every worker calls it with the
  // same numbers). In this order: closes a profiling window that ends here
  // (and sends its report), takes the scheduler's verdict on every window
  // whose plan would take effect at the next iteration (waiting for it up to
  // the deadline: kTimeout naming the window), and switches to a scheduled
  // plan whose switch iteration is this one (setPlan: collective, like every
  // run()). Every worker so learns of a plan before the last iteration of
  // the plan it replaces, whatever the scheduler's delay.
  void beginIteration(uint64_t iteration, Deadline deadline);
  // The last iteration begun (0 before the first).
  uint64_t iteration() const { return iteration_; }
  // Plan `p` replaces the current plan at the start of iteration `switchAt`.
  // Throws kMismatch when iteration `switchAt` has already begun, and
  // kInvalidArgument when `p.version` is not newer than the current plan's.
  void schedulePlan(const plan::Plan& p, uint64_t switchAt);
  // The last complete window's report, if any.
  const std::optional<plan::ProfileReport>& lastReport() const { return lastReport_; }

  // --- MergeComp's fusion search (docs/executor.md, "Fusion search") -------
  // Finds the plan's groups by timing real iterations, without a profile:
  // the tensors' gradient-ready order is taken from the first iteration run
  // after `o.warmup` iterations, then each candidate grouping (FusionSearch:
  // layer-wise, one group, then byte-balanced groups whose number doubles
  // while that pays, and a binary search over the number between) becomes
  // the plan's groups for `o.settle` + 1
  // iterations left out and `o.window` iterations timed (begin to begin,
  // so the training's own compute counts), the mean agreed across workers
  // (an allreduce, or a push_pull without MPI groups) so that every worker
  // takes the same next candidate. Candidates switch as scheduled plans do
  // (schedulePlan: at an iteration boundary, the servers' residuals
  // flushed), with the plan's options kept and its version raised. A
  // window's time is the median of its iterations (windowTime()). At the
  // end the final round times each search's `o.finalists` fastest
  // candidates again, twice in mirrored order, and the least sum stays
  // (without it, the fastest grouping timed). Needs beginIteration() every
  // iteration and no online re-planning (both change the plan). nullopt:
  // off (a search under way stops where it is). Every worker calls it alike.
  //
  // `alternatives`: plans whose options are searched in turn, each with a
  // search of its own over the groups (their groups are ignored), and the
  // fastest pair of options and grouping timed stays; MergeComp's setting
  // where one codec may travel on several paths (the servers or an
  // allgather), none known to be faster without a model. With more of them
  // than `o.searched`, each one's first candidate (every tensor on its own)
  // is timed first and only the `o.searched` fastest are searched on. Each
  // is checked as setPlan() checks a plan (kInvalidArgument naming the
  // tensor). Empty: the current plan's options only.
  void setFusionSearch(std::optional<FusionSearchOptions> o,
                       std::vector<plan::Plan> alternatives = {});
  // The search under way, or the last one (nullptr before its order is
  // known, while alternatives are screened, or when off). With alternatives,
  // one search per alternative searched on, in turn: fusionSearchDone() says
  // when all have ended.
  const FusionSearch* fusionSearch() const { return search_.get(); }
  // Every alternative's search has ended and the kept grouping is set (or
  // scheduled for the next iteration).
  bool fusionSearchDone() const { return searchKept_.has_value(); }
  // Done, and the kept grouping is the plan in force: it switches in at the
  // iteration boundary after fusionSearchDone() where another candidate ran
  // last (the search excludes online re-planning and GraVAC, so no other
  // plan is scheduled then).
  bool fusionSearchInForce() const { return searchKept_.has_value() && !scheduled_; }
  // The alternative kept (0 without alternatives) and its cuts, once done.
  std::optional<std::pair<size_t, FusionSearch::Cuts>> fusionSearchResult() const;
  // One line per alternative searched so far (FusionSearch::summary()),
  // the final round's sums and, once done, which one stays.
  std::string fusionSearchSummary() const;
  // Every time measured, in order: per alternative FusionSearch::timesLine(),
  // then the final round's ("final: alternative/groups:ms ...").
  std::string fusionSearchTimes() const;

  // --- GraVAC (docs/codecs.md, "GraVAC in the plan executor") ---------------
  // Turns GraVAC on (or, with nullopt, off) for every tensor: each runBatch()
  // is then one training iteration and must hold every declared tensor once.
  // In it, on every worker: each gradient is folded into GraVAC's error
  // feedback and encoded at the minimum and the candidate CF; the energies
  // and the previous iteration's duration (runBatch to runBatch) and pause
  // mark (excludeGravacPause) are summed over the workers (one allgather of
  // five float64 over the world group, or a push_pull without MPI), so
  // every worker's controller takes the same
  // decision; the message chosen is decoded into the item's output and the
  // plan sums those (its compressed steps as top-k at the plan's CF,
  // gravacCarrierPlan), or, on a dense iteration, every g_ef is summed raw
  // (world allreduce, or push_pull of a key per tensor). The plan's CF
  // follows the CF sent: when an iteration sends at 2x or more (or half or
  // less) the plan's CF, the re-planner's plan (setGravacReplanner;
  // default: the current one's options) takes over at the next iteration,
  // after this iteration's runs flushed the servers' residuals; until then
  // what the plan's top-k cannot carry stays in the executor's error
  // feedback and goes out later (nothing is lost).
  // `samplesPerIteration`: the numerator of GraVAC's system throughput.
  // Host device only; at an iteration boundary (every declared tensor run as
  // often; GraVAC then starts afresh); not with online re-planning or
  // the fusion search (they change the plan too). Every worker calls it alike.
  // Throws kInvalidArgument on bad options (GravacOptions::validate).
  void setGravac(const std::optional<compressor::GravacOptions>& o,
                 double samplesPerIteration = 1.0);
  bool gravacOn() const { return gravac_ != nullptr; }
  // The worker part (its controller, residuals); nullptr when off.
  const compressor::GravacCompressor* gravac() const { return gravac_.get(); }
  // Every GraVAC iteration's decision, in order (the CF sent: step.ratio),
  // the previous iteration's seconds it was given (agreed: the workers'
  // mean; 0 for the first and after a pause, excludeGravacPause) and the bytes this worker pushed in it
  // (pushedBytes()).
  const std::vector<compressor::GravacStep>& gravacHistory() const { return gravacHistory_; }
  const std::vector<double>& gravacSeconds() const { return gravacSeconds_; }
  // The time from now to the next GraVAC iteration is not an iteration's
  // (the training script evaluates, checkpoints, logs): that iteration
  // passes the controller no time, so no throughput is recorded for the CF
  // sent before the pause. The mark travels with the agreed sums: when any
  // worker marked the pause, every worker leaves the time out (the seconds
  // recorded are then 0), so all take the same decisions. Without GraVAC
  // it does nothing.
  void excludeGravacPause() { gravacPaused_ = true; }
  const std::vector<uint64_t>& gravacBytes() const { return gravacBytes_; }
  // The CF of the carrier plan the next iteration runs (0 before the first
  // sparse iteration; after a re-plan is decided, the new plan's).
  double gravacPlanRatio() const { return gravacPlanRatio_; }
  // GraVAC plan switches so far (each a setPlan at an iteration boundary).
  uint64_t gravacReplans() const { return gravacReplans_; }
  // The re-planner asked at a 2x move (and for the first carrier plan);
  // `what` names it in the log (e.g. "the Espresso planner on profile X").
  // Without one (or with an empty function) a re-plan keeps the running
  // plan's options and changes only the CF. Every worker sets the same one.
  void setGravacReplanner(GravacReplanner r, std::string what = "the re-planner");
  // What re-plans: the name given to setGravacReplanner, or "the running
  // plan's options (no re-planner)".
  std::string gravacReplannerName() const;

  struct TensorState;
  struct Profiler;
  // What a batch runs as one execution: one item on its tensor's state, or a
  // plan group's items (in the group's order) on the group's state.
  struct Unit {
    TensorState* state = nullptr;
    const float* in = nullptr;  // a group's: where it runs, once prepared (detail::gatherGroup)
    float* out = nullptr;
    std::vector<size_t> items;  // indices into the batch
  };

 private:
  Worker& worker_;
  const collective::Groups* groups_;
  std::shared_ptr<const compressor::Registry> codecs_;
  std::string planFile_;
  std::shared_ptr<device::Device> device_;
  std::unique_ptr<device::Stream> compute_, copy_;  // the device's two lanes (detail::Lanes)
  mutable device::Buffer padded_, block_;          // the collectives' (detail::Lanes)
  detail::Lanes lanes() const;
  collective::Topology topo_;
  std::map<std::string, std::unique_ptr<TensorState>> tensors_;
  std::optional<plan::Plan> plan_;
  std::shared_ptr<Tracer> tracer_;
  uint64_t generation_ = 0;  // plans set so far; every worker sets the same ones
  uint64_t fusionBytes_ = kDefaultFusionBytes;
  bool pipeline_ = false;
  int codecThreads_ = 1;
  std::unique_ptr<ThreadPool> codecPool_;  // codecThreads_ - 1 threads; none at 1
  bool compactSparse_ = true;
  uint64_t pipelinedStarts_ = 0;
  uint64_t groupRuns_ = 0;
  uint64_t inPlaceGroupRuns_ = 0;
  uint64_t phaseBytes_ = kDefaultPhaseBytes;
  uint64_t phasedSteps_ = 0;
  uint64_t pushedBytes_ = 0;
  std::vector<std::unique_ptr<TensorState>> groupStates_;  // the plan's groups, in order
  std::unique_ptr<TensorState> fused_;  // the fusion buffer's state (kept: its scratch)
  device::Buffer fusionBuffer_;         // device memory

  // A state's option, codec, cut points and shard keys ("<keyBase>/plan<gen>/shard<s>").
  void configure(TensorState& t, const plan::TensorOption& option, const std::string& keyBase,
                 uint64_t gen, Deadline deadline);
  // Folds the residuals of every encode point of `s` into its tensors' next
  // inputs and clears them; with releaseKeys, also releases its shard keys.
  void retire(TensorState& s, bool releaseKeys);
  TensorState& checkedState(const std::string& name, const float* input, const float* output,
                            uint64_t numElements);
  void noteReady(TensorState& t, const BatchItem& item);
  // runBatch's units in order; the items left to fusion by size (fusible
  // options, per option) go to byOption.
  std::vector<Unit> units(std::span<const BatchItem> items, std::span<TensorState* const> states,
                          std::vector<std::vector<size_t>>& byOption) const;
  // Before a unit starts: residuals held by other states come back as carry,
  // and a group's inputs (with their carry) are gathered into its buffer.
  void prepare(Unit& u, std::span<const BatchItem> items, Deadline deadline);
  // After it ran: a group's results scattered to its items' outputs; run counts.
  void complete(const Unit& u, std::span<const BatchItem> items, Deadline deadline);
  bool lastRound() const;
  // Before setPlan retires the current plan's keys: for every state whose
  // servers still hold a residual (serverOwes: its last round was not a
  // flushed one, as when a plan is set directly instead of scheduled), one
  // round of the current plan on zero inputs with the flush flag; what it
  // sums (the servers' residual, and what the encode points sent of their
  // own) joins the tensors' next inputs as carry, 1/W on each worker, so
  // that the next plan sends it. Collective, like setPlan.
  void flushServerResiduals(Deadline deadline);
  void runFused(std::span<const BatchItem> batch, std::span<TensorState* const> states,
                const std::vector<size_t>& members, ReduceOp op, Deadline deadline);

  // Online re-planning.
  void closeWindow(Deadline deadline);
  OnlineOptions online_;
  std::unique_ptr<Profiler> prof_;  // the open window's summaries
  bool begun_ = false;
  uint64_t iteration_ = 0;
  uint64_t windowIndex_ = 0;
  uint64_t seenPlanVersion_ = 0;  // newest PlanUpdate taken from the control client
  // Windows reported whose verdict is still to be taken: (window, the
  // iteration a plan from it would take effect at).
  std::deque<std::pair<uint64_t, uint64_t>> awaiting_;
  std::optional<std::pair<plan::Plan, uint64_t>> scheduled_;  // plan and switch iteration
  std::optional<plan::ProfileReport> lastReport_;

  // GraVAC's iteration (gravac.cc): the decision, then the plan's sums.
  void runGravac(std::span<const BatchItem> items, ReduceOp op, Deadline deadline);
  // The carrier plan at `cf` from the re-planner (or the running plan).
  plan::Plan gravacReplan(double cf);
  void runPlanned(std::span<const BatchItem> items, ReduceOp op, Deadline deadline,
                  const AwaitItem* await = nullptr);
  void sumDense(std::span<const BatchItem> items, Deadline deadline);
  // The index of the step of `s`'s option whose payload GraVAC's message can
  // be: its first encode, when it runs the carrier's top-k and every step
  // before it leaves this worker's own data in place (collectives over
  // groups of one: no MPI, or one worker a machine); kNoMessageStep where
  // none can (an option without a codec, or one that sums first).
  static constexpr size_t kNoMessageStep = ~size_t{0};
  size_t gravacMessageStep(const TensorState& s) const;
  // Appends the (index, value) pairs of tensor t's message this iteration,
  // each index plus `offset`, strictly ascending.
  void appendPairs(const TensorState& t, uint64_t offset, detail::GivenPayload& out) const;
  // The workers' sums of E, E_min, E_c, their seconds and their pause marks.
  std::array<double, 5> agreedSums(std::array<double, 5> local, Deadline deadline);
  std::unique_ptr<compressor::GravacCompressor> gravac_;
  std::vector<compressor::GravacStep> gravacHistory_;
  std::vector<uint64_t> gravacBytes_;
  std::vector<double> gravacSeconds_;
  GravacReplanner gravacReplanner_;
  std::string gravacReplannerName_;
  double gravacPlanRatio_ = 0;
  uint64_t gravacPlanGen_ = 0;  // generation_ of the carrier plan GraVAC set
  uint64_t gravacReplans_ = 0;
  std::optional<plan::Plan> gravacNext_;  // set at the next GraVAC iteration
  bool gravacFlush_ = false;              // this batch is the current plan's last round
  bool forceFlush_ = false;               // setPlan's flush round (flushServerResiduals)
  // The tracer for a run now: none in setPlan's flush round, which is no
  // training iteration.
  Tracer* iterationTracer() const { return forceFlush_ ? nullptr : tracer_.get(); }
  bool gravacTimed_ = false;
  bool gravacPaused_ = false;  // excludeGravacPause() since the last iteration
  std::chrono::steady_clock::time_point gravacLast_;
  std::set<std::string> gravacDenseKeys_;

  // The fusion search's driver (online.cc).
  void stepFusionSearch(Deadline deadline);
  // Schedules `cuts` as the groups of `base` (nullptr: the current or
  // scheduled plan) for the next iteration.
  void scheduleCandidate(const FusionSearch::Cuts& cuts, const plan::Plan* base);
  // Schedules `cuts` on alternative `alt`'s options (searchBase(alt)).
  void scheduleFor(size_t alt, const FusionSearch::Cuts& cuts);
  // After the last alternative's search: the final round over each one's
  // fastest candidates, or (fewer than two) the fastest kept at once.
  void startFinalRound();
  // Ends the search on alternative `alt`'s grouping `cuts`.
  void keepCandidate(size_t alt, const FusionSearch::Cuts& cuts);
  // search_ for alternative searchAlt_ (its screened search where it has
  // one), its next candidate scheduled.
  void startSearch();
  // The search of alternative `alt`, from its options (forced cuts).
  std::unique_ptr<FusionSearch> makeSearch(size_t alt) const;
  // search_ has ended: its result kept, then the next alternative in
  // searchQueue_ or the final round.
  void finishAlternative();
  const plan::Plan* searchBase(size_t alt) const;  // alternative alt's plan, or nullptr
  double agreedMean(double seconds, Deadline deadline);
  // Without MPI groups: the sum over the workers of `n` float64 through the
  // servers (one push_pull of `key`, declared on first use; every worker
  // gets the same bytes), for the agreements above.
  void sumThroughServers(const std::string& key, const double* in, double* out, size_t n,
                         Deadline deadline);
  std::set<std::string> serverSumKeys_;  // declared by sumThroughServers
  // Checks `p` against the declared tensors and the topology (setPlan's
  // checks, nothing declared).
  void checkPlan(const plan::Plan& p) const;
  std::optional<FusionSearchOptions> searchOptions_;
  std::unique_ptr<FusionSearch> search_;
  std::vector<plan::Plan> searchAlternatives_;
  size_t searchAlt_ = 0;  // the alternative search_ runs on (or being screened)
  // Screening (more alternatives than FusionSearchOptions::searched): each
  // alternative's search, timed at its first candidate, until it is searched
  // on (moved into search_) or left out. Under way while the queue of those
  // to search on is not yet chosen.
  std::vector<std::unique_ptr<FusionSearch>> screened_;
  bool screening() const { return !screened_.empty() && searchQueue_.empty(); }
  std::vector<size_t> searchQueue_;  // the alternatives searched on, in turn
  size_t searchPos_ = 0;             // searchAlt_'s place in searchQueue_
  // Each ended alternative's best cuts, their time and its summary.
  struct SearchedAlternative {
    FusionSearch::Cuts cuts;
    double seconds = 0;
    std::string summary;
    std::string times;                                     // FusionSearch::timesLine()
    std::vector<std::pair<FusionSearch::Cuts, double>> top;  // its finalists (ranked())
  };
  std::map<size_t, SearchedAlternative> searched_;  // by alternative
  std::optional<size_t> searchKept_;      // set once every alternative has ended
  FusionSearch::Cuts searchKeptCuts_;     // and the final round (if any)
  // The final round's finalists (alternative, cuts) and its state.
  std::vector<std::pair<size_t, FusionSearch::Cuts>> finalists_;
  std::unique_ptr<FinalRound> final_;
  std::string finalTimes_;  // "alternative/groups:ms ..." as measured
  // The candidate scheduled last (alternative, cuts): what runs once it switched.
  std::pair<size_t, FusionSearch::Cuts> lastCandidate_;
  // The groups the plan had when the search began (alternative, cuts), where
  // they are consecutive in searchOrder_ and the plan's options are one
  // alternative's (startingGrouping()): a finalist of the final round, so
  // that the search keeps them unless it times something faster.
  std::optional<std::pair<size_t, FusionSearch::Cuts>> searchStart_;
  std::optional<std::pair<size_t, FusionSearch::Cuts>> startingGrouping() const;
  std::vector<std::string> searchOrder_;  // gradient-ready order, recorded
  // Each recorded tensor's output buffer; its place in the buffers' order
  // and whether the next one there starts where it ends, kept where every
  // worker's buffers lie alike (searchAgreedLayout()). A candidate's group
  // whose tensors then lie back to back lists them in the buffers' order
  // (inBufferOrder()), so that gradients laid out in one buffer in another
  // order than they become ready (a BatchNorm's weight and bias: ready bias
  // first, laid out weight first) run in place instead of being copied into
  // a group buffer; any other group keeps the ready order.
  std::map<std::string, std::uintptr_t> searchAddress_;
  std::map<std::string, size_t> searchPlace_;  // empty: the workers' layouts differ
  std::vector<bool> searchAdjacent_;           // by place: the next buffer follows at once
  void searchAgreedLayout(Deadline deadline);
  void inBufferOrder(std::vector<std::string>& group) const;
  bool searchRecording_ = false;
  uint64_t searchFrom_ = 0;          // the iteration the search was turned on at
  uint64_t candidateAt_ = 0;         // the iteration the current candidate took effect
  std::vector<double> searchTimes_;  // the current candidate's timed iterations
  std::chrono::steady_clock::time_point lastBegin_;
};

}  // namespace executor
}  // namespace cortado
