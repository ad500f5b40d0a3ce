// The plan executor's insides (core/executor/executor.h), shared by its files:
// plans.cc (setting a plan: tensor states, shard keys, residuals folded),
// batch.cc (batches: phases, the pipeline), groups.cc (fused groups),
// steps.cc (one tensor's steps: Run) and online.cc (profiling windows, the
// scheduler's verdicts, plan switches at an iteration). Private to core/.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "compressor/error_feedback.h"
#include "compressor/gravac_compressor.h"
#include "core/common/page_allocator.h"
#include "core/device/device.h"
#include "core/executor/executor.h"
#include "core/zen_collective.h"

namespace cortado::executor {
namespace detail {

using plan::CommOp;
using plan::Scope;
using plan::Step;
using plan::StepKind;

// A part of the tensor: elements [off, off + len).
struct Region {
  uint64_t off = 0;
  uint64_t len = 0;
  uint64_t end() const { return off + len; }
  bool operator==(const Region&) const = default;
};

// Block i of g of a region: ceil-sized blocks, the last ones shorter or empty.
// The same split on every rank, so blocks line up with padded collectives.
inline uint64_t blockSize(const Region& r, int g) { return (r.len + g - 1) / g; }
inline Region block(const Region& r, int g, int i) {
  const uint64_t b = blockSize(r, g);
  const uint64_t s = std::min<uint64_t>(uint64_t(i) * b, r.len);
  const uint64_t e = std::min<uint64_t>(uint64_t(i + 1) * b, r.len);
  return {r.off + s, e - s};
}

// Compressed data: pieces of the tensor, each one payload (or a dense piece).
// Several segments may cover the same elements (contributions not yet summed).
struct Seg {
  uint64_t off = 0;
  uint64_t count = 0;
  bool dense = false;  // bytes are fp32 elements (a server's dense answer)
  std::vector<std::byte> bytes;
};
using Segs = std::vector<Seg>;

// GraVAC's message for a state's elements (Executor::runGravac): the
// (index, value) pairs this worker sends in the iteration, indices strictly
// ascending in the state's element space (a group's: each member's at its
// offset in the concatenation).
struct GivenPayload {
  std::vector<uint64_t> index;
  std::vector<float> value;
};

// A group, or none (a worker without MPI: a group of one).
struct Group {
  collective::Collectives* c = nullptr;
  int size() const { return c ? c->size() : 1; }
  int rank() const { return c ? c->rank() : 0; }
  std::string name() const { return c ? c->name() : std::string("self"); }
};

// "encode on gpu", "flat allgather compressed": a step, for error messages.
std::string describeStep(const Step& s);

}  // namespace detail

struct Executor::TensorState {
  std::string name;
  // A fused group's members with their run counts, in order ("a#2, b#2";
  // empty for a tensor): the end of its collectives' label, so that groups
  // with the same first and last member but others between them differ.
  std::string members;
  uint64_t n = 0;
  plan::TensorOption option;
  std::string codecSpec;
  compressor::CodecPtr codec;
  compressor::CodecPtr sparseDecoder;  // top-k form of the servers' sparse sums
  // The same codecs for the executor's device memory (the CUDA codecs on a
  // CUDA device; on the host device the ones above); null where the device
  // has no such codec: its "gpu" steps then run on the CPU (copied to pinned).
  compressor::CodecPtr deviceCodec;
  compressor::CodecPtr deviceSparseDecoder;
  // Error feedback by step index, in the memory of the device that encodes
  // there (device::hostErrorFeedback for steps run on the CPU).
  std::map<size_t, std::unique_ptr<device::ErrorFeedback>> ef;
  std::map<size_t, std::map<uint64_t, uint64_t>> efPieces;  // step -> piece offset -> count
  // step -> how many ranks encode the same data there (after an allreduce,
  // an allgather, a broadcast or a pull, every member holds the same sum and
  // keeps the same residual): a switch folds 1/replicas of it on each.
  std::map<size_t, uint64_t> efReplicas;
  // Residuals of the encode points a plan switch retired, folded into the
  // next input at their element offsets (empty when none).
  std::vector<float, PageAllocator<float>> carry;  // unmapped when freed (dropCarry)
  // A group's: its gathered input holds some member's carry (gatherGroup);
  // its next run restarts the momentum of its encodes (Run::restart_).
  bool carried = false;
  // Where the bytes this state pushes are counted (Executor::pushedBytes).
  uint64_t* pushedTotal = nullptr;
  // Executor::compactSparse(): the blob collectives carry top-k and DGC
  // payloads in their compact wire form where smaller.
  const bool* compactSparse = nullptr;
  std::vector<std::string> shardKeys;  // push/pull keys, by shard
  // The shard this worker pushes and pulls: its local rank's block after an
  // intra split, else the only one. Every worker declares every shard key.
  size_t ownShard(int localRank) const { return shardKeys.size() > 1 ? size_t(localRank) : 0; }
  // Its option pulls compressed (the servers re-encode the sum and keep a
  // residual) and its last run was not a flushed round: setPlan runs a flush
  // round for it before retiring its keys. Set by Executor::complete on
  // every worker alike (whether this rank itself pushed or not), so that
  // every worker runs the same flush rounds.
  bool serverOwes = false;
  std::vector<detail::Region> shardRegions;
  std::vector<std::vector<ChunkSpan>> shardChunks;
  std::set<uint64_t> cuts;  // where payload pieces may start or end
  uint64_t round = 0;
  // Of those rounds, the flush rounds setPlan ran (flushServerResiduals):
  // no training iteration, so not counted by iteration().
  uint64_t flushRounds = 0;
  // The training iterations this state ran: its rounds less setPlan's flush
  // rounds. The trace's iteration and Executor::runs(). A flush round runs
  // only for the tensors that owed the servers a residual, so counting it
  // would put the tensors of one iteration under different numbers.
  uint64_t iteration() const { return round - flushRounds; }
  // One more round done; `flush`: setPlan's flush round.
  void ranRound(bool flush) {
    ++round;
    if (flush) ++flushRounds;
  }
  uint64_t seedBase = 0;
  // A plan group's state (Plan::groups) runs its option on the concatenation
  // of `parts`, each at its offset; a tensor's has none.
  std::vector<Executor::TensorState*> parts;
  std::vector<uint64_t> partOffsets;
  device::Buffer buffer;  // a group's concatenation (device memory), kept across runs
  // A tensor's plan group under the current plan (nullptr: none).
  Executor::TensorState* group = nullptr;
  // The state whose encode points hold this tensor's residuals: itself,
  // its group, or nullptr when no encode point holds any. A run on another
  // state first retires this one (Executor::retire), so that group
  // boundaries may change between batches with nothing lost or sent twice.
  Executor::TensorState* layout = nullptr;
  // Kept across runs, made at the first use (Executor::lanes): payloads and
  // host data staged into device memory, pinned staging for the copies to
  // and from the host, and the events that order them. (The collectives'
  // padded buffers are the executor's, shared by every state: Lanes.)
  device::Buffer staged, payloads;
  device::Buffer pinned, pinnedBytes;
  std::unique_ptr<device::Event> computed;  // the compute stream's work so far
  std::unique_ptr<device::Event> copied;    // the copy stream's work so far
  // GraVAC, for one iteration (Executor::runGravac): the encode step at
  // index givenStep takes this message as its payload, per piece, instead of
  // running the codec (no selection, no error feedback there: GraVAC's own
  // committed what is sent). Null: every encode runs the codec.
  const detail::GivenPayload* given = nullptr;
  size_t givenStep = 0;
  // A Zen option's sums over the world group (core/zen_collective.h), made
  // at its first run with the option's scheme, kept across runs (its index
  // lists are O(n) to build).
  std::unique_ptr<ZenCollective> zen;
  collective::Collectives* zenGroup = nullptr;  // the group `zen` runs over
};

namespace detail {

// The executor's device and its two streams: compute (codecs, kernels,
// copies within the device) and copy (to and from pinned host memory), with
// each tensor state's events between them. Every helper orders its work
// after what the state's earlier work left on the streams; nothing waits
// for the whole device.
struct Lanes {
  device::Device* dev = nullptr;
  device::Stream* compute = nullptr;
  device::Stream* copy = nullptr;
  // Device memory is host memory and streams run inline
  // (Device::hostAddressable): toHost answers the data itself, stagingFor
  // the destination itself, and fromStaging copies nothing.
  bool direct = false;
  // The collective steps' padded send and receive buffers (device memory),
  // one pair per executor, sized by the largest tensor: a step fills them
  // on the compute stream, waits for it (settle), runs its collective, which
  // returns when done, and copies out on the compute stream, so the next
  // user, whatever its tensor, is ordered after it. Only the steps that
  // communicate use them, and those run on one thread (Executor::runBatch's
  // pipeline starts the next unit's local steps alone).
  device::Buffer* whole = nullptr;  // n blocks
  device::Buffer* block = nullptr;  // one block
  // The CPU codec calls' helpers (Executor::setCodecThreads); nullptr: the
  // calling thread alone.
  ThreadPool* codecPool = nullptr;

  // The state's buffers and events on this device, made at the first use.
  void bind(Executor::TensorState& t) const;
  // Waits on the host until the compute stream's work so far is done (before
  // a collective, which orders itself after nothing, and before run() returns).
  void settle(Executor::TensorState& t, Deadline d, const char* what) const;
  // `n` floats of device memory at `src` copied to the state's pinned buffer,
  // after the compute stream's work so far; the host may read the answer
  // (`src` itself where direct).
  const float* toHost(Executor::TensorState& t, const float* src, uint64_t n, Deadline d) const;
  // The state's pinned buffer for the host to write `n` floats into (after
  // its last copy from it).
  float* hostStaging(Executor::TensorState& t, uint64_t n, Deadline d) const;
  // The pinned buffer's first `n` floats copied to `dst` (device memory); the
  // compute stream's later work waits for it.
  void toDevice(Executor::TensorState& t, float* dst, uint64_t n) const;
  // Where the host writes `n` floats bound for `dst`: the pinned buffer
  // (hostStaging), or `dst` itself where direct; then fromStaging(t, dst, n)
  // puts them there (toDevice, or nothing where direct).
  float* stagingFor(Executor::TensorState& t, float* dst, uint64_t n, Deadline d) const {
    return direct ? dst : hostStaging(t, n, d);
  }
  void fromStaging(Executor::TensorState& t, float* dst, uint64_t n) const {
    if (!direct) toDevice(t, dst, n);
  }
};

// The carry is folded: its memory goes back (clear() would keep the
// capacity, a copy of the tensor, beside the next plan's residuals).
inline void dropCarry(Executor::TensorState& t) {
  std::vector<float, PageAllocator<float>>().swap(t.carry);
}

// Adds the residuals of retired encode points that `t` still owes (carry)
// to its data at `x` (t.n elements, device memory) and clears them: once, in
// whichever execution runs the tensor next (alone, in a group, or fused by
// size). Returns whether it owed any.
bool foldCarry(const Lanes& l, Executor::TensorState& t, float* x, Deadline d);
// A group's concatenation (a plan group, or tensors fused by size): its
// members' inputs, each with the carry it owes, as one span of consecutive
// elements in the members' order. In place, with no copy, when the outputs
// are consecutive in memory in that order (a framework's flat gradient
// buffer: DDP's gradient_as_bucket_view, cortado.torch's DistributedOptimizer,
// the model replay) and every input either is its output or lies outside
// the outputs' span; gathered into `buffer` otherwise. Returns the span's
// start: the output of the first member, or buffer.data().
// `carried`: whether some member's carry was folded in.
float* gatherGroup(const Lanes& l, std::span<Executor::TensorState* const> parts,
                   std::span<const BatchItem* const> items, device::Buffer& buffer, Deadline d,
                   bool& carried);
// After the group ran at `at` (gatherGroup's answer): a gathered group's
// results copied to its members' outputs; nothing to do in place.
void scatterGroup(const Lanes& l, const float* at, std::span<Executor::TensorState* const> parts,
                  std::span<const BatchItem* const> items);

}  // namespace detail

// The open profiling window's summaries (plan::ProfileReport's lists, keyed).
struct Executor::Profiler {
  using Clock = std::chrono::steady_clock;
  struct Acc {
    uint64_t calls = 0;
    double us = 0;
    double maxUs = 0;  // the slowest call (codecs)
  };
  uint64_t firstIteration = 0;
  bool active = false;  // inside a window (past the warm-up)
  std::chrono::steady_clock::time_point windowStart;  // beginIteration(firstIteration)
  bool batched = false;  // runBatch ran a batch of several in the window (fusion as fusionBytes_ says)
  Clock::time_point iterStart;
  double inRunUs = 0;                  // spent inside run() since iterStart
  std::set<std::string> readyThisIter;
  std::map<std::string, std::pair<uint64_t, Acc>> ready;  // tensor -> (elements, acc)
  std::map<std::tuple<std::string, bool, uint64_t>, Acc> codecs;  // (spec, encode, elements)
  // (op, scope, compressed, group, bytes; push: chunks, elements, pull compressed)
  std::map<std::tuple<int, int, bool, int, uint64_t, uint64_t, uint64_t, bool>, Acc> comms;

  static double since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  // codec() may come from the pipeline's thread (Executor::setPipeline).
  std::mutex mu;
  void codec(const std::string& spec, bool encode, uint64_t elements, double us) {
    std::lock_guard<std::mutex> lk(mu);
    Acc& a = codecs[{spec, encode, elements}];
    ++a.calls;
    a.us += us;
    a.maxUs = std::max(a.maxUs, us);
  }
  void comm(plan::CommOp op, plan::Scope scope, bool compressed, int group, uint64_t bytes,
            uint64_t chunks, uint64_t elements, bool pullCompressed, double us) {
    std::lock_guard<std::mutex> lk(mu);
    Acc& a = comms[{int(op), int(scope), compressed, group, bytes, chunks, elements, pullCompressed}];
    ++a.calls;
    a.us += us;
  }
};

namespace detail {

// One tensor's run: the data, where it is valid, and the pairs still open.
class Run {
 public:
  Run(Executor::TensorState& t, Worker& w, const collective::Groups* groups, const Lanes& lanes,
      const collective::Topology& topo, Deadline d, Tracer* tracer, Executor::Profiler* prof,
      bool flushResidual)
      : t_(t),
        worker_(w),
        groups_(groups),
        lanes_(lanes),
        topo_(topo),
        d_(d),
        tracer_(tracer && tracer->wants(int64_t(t.iteration())) ? tracer : nullptr),
        prof_(prof),
        flushResidual_(flushResidual),
        restart_(t.carried) {
    t_.carried = false;
    lanes_.bind(t_);
  }

  void go(const float* in, float* out, ReduceOp op) {
    start(in, out);
    finish(op);
  }

  // The input in the output, then the option's leading encode and decode
  // steps: everything before its first communication, which touches only
  // this tensor's own state (no collective, no server), so that another
  // thread may run it while the executor's thread communicates another
  // tensor (Executor::setPipeline).
  void start(const float* in, float* out);

  // The remaining steps, then the average's scale; the output is ready.
  void finish(ReduceOp op) {
    runSteps(Until::kEnd);
    scale(op);
  }

  // Phases (Executor::setPhaseBytes), after start(): communicate() runs the
  // communication step at step_ (a push with its pull), compute() the local
  // steps up to the next communication step; scale() once done().
  void communicate() { runSteps(Until::kAfterComm); }
  void compute() { runSteps(Until::kBeforeComm); }
  bool done() const { return step_ >= t_.option.steps.size(); }
  // The average's scale; then waits until the output is written.
  void scale(ReduceOp op);

 private:
  enum class Until { kBeforeComm, kAfterComm, kEnd };

  // Steps from step_ on, until the end, or just before the next
  // communication step, or just after it.
  void runSteps(Until until);

  // The simulator's stage name and lane of step `i`.
  void record(const std::vector<Step>& steps, size_t i, double start);

  struct Frame {
    Region parent;
    bool active;
    Scope scope;
  };

  // What this rank holds before a step: payload bytes while compressed, else
  // its region's fp32 bytes.
  uint64_t bytesHeld(bool compressed) const;

  // runStep, timed into the profiler (only what this rank took part in).
  void timedStep(const Step& s);

  // The group for data in device memory (the device's: NCCL on CUDA), and
  // the one for payload blobs in host memory (the MPI groups).
  Group group(Scope s) const;
  Group hostGroup(Scope s) const;
  // dst = src, n floats of device memory, on the compute stream.
  void copyOnDevice(float* dst, const float* src, uint64_t n) {
    lanes_.dev->copy(dst, src, n * sizeof(float), device::CopyKind::kDeviceToDevice,
                     *lanes_.compute);
  }
  // Before a collective on device memory: the compute stream's work is done.
  void settle(const char* what) { lanes_.settle(t_, d_, what); }

  void runStep(const Step& s);

  void reduceScatter(Group g);

  void allgatherRaw(Group g, const Region& parent);

  // Groups of one keep their pieces as they are: packing and unpacking them
  // copies every byte twice (a server's dense answer too: 94 MB for
  // bert-base's embedding in a plan switch's flushed round).
  void allgatherSegs(Group g);

  void alltoall(Group g);

  uint64_t seed(uint64_t piece) const;

  // Where the step at step_ runs its codec: on the device (its codec on
  // device memory) or on the CPU (after a copy to pinned memory).
  bool onDevice() const;
  bool compactBlobs() const { return t_.compactSparse && *t_.compactSparse; }
  void encode();
  // encode() at the step that takes GraVAC's message (TensorState::given):
  // each piece a top-k payload of the message's pairs inside it, as many as
  // there are (the servers and the blob collectives take any count).
  void encodeGiven();
  bool givenAt(size_t step) const { return t_.given && step == t_.givenStep; }

  // Sums every segment into the region, in fp32.
  void decode();
  void decodeOnHost();
  // The dense pieces (servers' answers) added into the region on the device.
  void addDenseOnDevice();

  void pushPull(const Step& push, const Step& pull);

  // A Zen step (plan::CommOp::kZenBalanced, kZenCentralized): the region,
  // in host memory, scanned for its non-zeros and summed over `g` (the
  // world group for a flat step, the inter-machine group of this local rank
  // for the shard of a hierarchical one; host memory) with the step's
  // scheme (zen_step.cc).
  void zenStep(const Step& s, Group g);

  Executor::TensorState& t_;
  Worker& worker_;
  const collective::Groups* groups_;
  const Lanes& lanes_;
  const collective::Topology& topo_;
  Deadline d_;
  float* x_ = nullptr;
  Region r_;
  Segs segs_;
  bool active_ = true;
  std::vector<Frame> frames_;
  size_t step_ = 0;
  Tracer* tracer_ = nullptr;
  uint64_t replicas_ = 1;  // ranks that hold the same data as this one
  Executor::Profiler* prof_ = nullptr;
  bool flushResidual_ = false;  // the key's last round: Exchange::flushResidual
  // The input holds folded residuals (carry): every encode of this run
  // restarts its momentum (EncodeContext::restartMomentum).
  bool restart_ = false;
  const char* lane_ = "cpu";    // where the last encode or decode ran (trace lanes)
};

}  // namespace detail
}  // namespace cortado::executor
