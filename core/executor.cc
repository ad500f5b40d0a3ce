#include "core/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>
#include <tuple>

#include "compressor/error_feedback.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "compressor/registry.h"
#include "core/common/logging.h"

namespace cortado::executor {
namespace {

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
uint64_t blockSize(const Region& r, int g) { return (r.len + g - 1) / g; }
Region block(const Region& r, int g, int i) {
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

// Blob framing for collectives: u64 count, then per segment u64 off, u64
// count, u64 dense, u64 bytes, bytes.
void putU64(std::vector<std::byte>& out, uint64_t v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + 8);
}
std::vector<std::byte> pack(const Segs& segs) {
  std::vector<std::byte> out;
  putU64(out, segs.size());
  for (const Seg& s : segs) {
    putU64(out, s.off);
    putU64(out, s.count);
    putU64(out, s.dense ? 1 : 0);
    putU64(out, s.bytes.size());
    out.insert(out.end(), s.bytes.begin(), s.bytes.end());
  }
  return out;
}
void unpackInto(const std::byte* p, size_t n, Segs& out, uint64_t tensorLen) {
  size_t at = 0;
  auto get = [&]() {
    CORTADO_ENFORCE(at + 8 <= n, ErrorCode::kProtocol, "truncated compressed blob ({} bytes)", n);
    uint64_t v;
    std::memcpy(&v, p + at, 8);
    at += 8;
    return v;
  };
  const uint64_t count = get();
  for (uint64_t i = 0; i < count; ++i) {
    Seg s;
    s.off = get();
    s.count = get();
    s.dense = get() != 0;
    const uint64_t bytes = get();
    CORTADO_ENFORCE(s.off <= tensorLen && s.count <= tensorLen - s.off && bytes <= n - at,
                    ErrorCode::kProtocol, "malformed compressed blob: segment [{}, +{}) of {} bytes",
                    s.off, s.count, bytes);
    s.bytes.assign(p + at, p + at + bytes);
    at += bytes;
    out.push_back(std::move(s));
  }
}

// A group, or none (a worker without MPI: a group of one).
struct Group {
  collective::Collectives* c = nullptr;
  int size() const { return c ? c->size() : 1; }
  int rank() const { return c ? c->rank() : 0; }
  std::string name() const { return c ? c->name() : std::string("self"); }
};

using Blob = std::vector<std::byte>;

std::vector<Blob> allgatherBlob(Group g, const Blob& mine, Deadline d) {
  if (g.size() == 1) return {mine};
  std::vector<int64_t> sizes(g.size());
  int64_t my = static_cast<int64_t>(mine.size());
  g.c->allgather(&my, 1, sizes.data(), DType::kInt64, d);
  std::vector<size_t> counts(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  Blob all(total);
  g.c->allgatherv(mine.data(), mine.size(), all.data(), counts, DType::kUInt8, d);
  std::vector<Blob> out;
  size_t at = 0;
  for (size_t c : counts) {
    out.emplace_back(all.begin() + at, all.begin() + at + c);
    at += c;
  }
  return out;
}

std::vector<Blob> alltoallBlob(Group g, const std::vector<Blob>& toEach, Deadline d) {
  if (g.size() == 1) return toEach;
  const int n = g.size();
  std::vector<int64_t> sendSizes(n), recvSizes(n);
  for (int i = 0; i < n; ++i) sendSizes[i] = static_cast<int64_t>(toEach[i].size());
  g.c->alltoall(sendSizes.data(), recvSizes.data(), 1, DType::kInt64, d);
  std::vector<size_t> sc(sendSizes.begin(), sendSizes.end()), rc(recvSizes.begin(), recvSizes.end());
  Blob send;
  for (const Blob& b : toEach) send.insert(send.end(), b.begin(), b.end());
  size_t total = 0;
  for (size_t c : rc) total += c;
  Blob recv(total);
  g.c->alltoallv(send.data(), sc, recv.data(), rc, DType::kUInt8, d);
  std::vector<Blob> out;
  size_t at = 0;
  for (size_t c : rc) {
    out.emplace_back(recv.begin() + at, recv.begin() + at + c);
    at += c;
  }
  return out;
}

// On the root: every rank's blob; elsewhere empty.
std::vector<Blob> gatherBlob(Group g, const Blob& mine, Deadline d) {
  if (g.size() == 1) return {mine};
  std::vector<int64_t> sizes(g.size());
  int64_t my = static_cast<int64_t>(mine.size());
  g.c->gather(&my, 1, sizes.data(), DType::kInt64, 0, d);
  std::vector<size_t> counts;
  size_t total = 0;
  if (g.rank() == 0) {
    counts.assign(sizes.begin(), sizes.end());
    for (size_t c : counts) total += c;
  }
  Blob all(total);
  g.c->gatherv(mine.data(), mine.size(), all.data(), counts, DType::kUInt8, 0, d);
  std::vector<Blob> out;
  size_t at = 0;
  for (size_t c : counts) {
    out.emplace_back(all.begin() + at, all.begin() + at + c);
    at += c;
  }
  return out;
}

void broadcastBlob(Group g, Blob& blob, Deadline d) {
  if (g.size() == 1) return;
  int64_t size = static_cast<int64_t>(blob.size());
  g.c->broadcast(&size, 1, DType::kInt64, 0, d);
  blob.resize(static_cast<size_t>(size));
  g.c->broadcast(blob.data(), blob.size(), DType::kUInt8, 0, d);
}

std::string describeStep(const Step& s) {
  if (s.kind == StepKind::kEncode) return fmt::format("encode on {}", plan::toString(s.device));
  if (s.kind == StepKind::kDecode) return fmt::format("decode on {}", plan::toString(s.device));
  return fmt::format("{} {}{}", plan::toString(s.scope), plan::toString(s.op),
                     s.compressed ? " compressed" : "");
}

bool isFirst(CommOp op) {
  return op == CommOp::kReduceScatter || op == CommOp::kReduce || op == CommOp::kAlltoall ||
         op == CommOp::kGather;
}

}  // namespace

struct Executor::TensorState {
  std::string name;
  uint64_t n = 0;
  plan::TensorOption option;
  std::string codecSpec;
  compressor::CodecPtr codec;
  compressor::CodecPtr sparseDecoder;  // top-k form of the servers' sparse sums
  std::map<size_t, std::unique_ptr<compressor::ErrorFeedback>> ef;  // by step index
  std::map<size_t, std::map<uint64_t, uint64_t>> efPieces;  // step -> piece offset -> count
  // step -> how many ranks encode the same data there (after an allreduce,
  // an allgather, a broadcast or a pull, every member holds the same sum and
  // keeps the same residual): a switch folds 1/replicas of it on each.
  std::map<size_t, uint64_t> efReplicas;
  // Residuals of the encode points a plan switch retired, folded into the
  // next input at their element offsets (empty when none).
  std::vector<float> carry;
  std::vector<std::string> shardKeys;  // push/pull keys, by shard
  // The shard keys this worker pushed and pulled under the current plan:
  // setPlan releases them (Worker::release), after their last round.
  std::set<std::string> exchanged;
  std::vector<Region> shardRegions;
  std::vector<std::vector<ChunkSpan>> shardChunks;
  std::set<uint64_t> cuts;  // where payload pieces may start or end
  uint64_t round = 0;
  uint64_t seedBase = 0;
  std::vector<float> scratch1, scratch2;  // padded collective buffers, kept across runs
};

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

plan::Plan loadPlanFile(const std::string& path) {
  std::ifstream in(path);
  CORTADO_ENFORCE(in.good(), ErrorCode::kInvalidArgument,
                  "cannot read plan file '{}' (CORTADO_PLAN): check the path", path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return plan::planFromJsonString(ss.str());
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("plan file '{}': {}", path, e.what()));
  }
}

plan::TensorOption defaultOption() {
  plan::TensorOption o;
  o.hierarchical = true;
  o.steps = {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
             Step::comm(Scope::kInter, CommOp::kPush, false),
             Step::comm(Scope::kInter, CommOp::kPull, false),
             Step::comm(Scope::kIntra, CommOp::kAllgather, false)};
  return o;
}

Executor::Executor(Worker& worker, const collective::Groups* groups,
                   std::shared_ptr<const compressor::Registry> codecs, std::string planFile)
    : worker_(worker), groups_(groups), codecs_(std::move(codecs)), planFile_(std::move(planFile)) {
  if (!codecs_) {
    auto r = std::make_shared<compressor::Registry>();
    compressor::registerCpuCodecs(*r);
    codecs_ = std::move(r);
  }
  if (groups_) {
    topo_ = groups_->topology;
    CORTADO_ENFORCE(topo_.size == worker_.size(), ErrorCode::kInvalidArgument,
                    "the MPI world has {} ranks but the job has {} workers: start every worker "
                    "of the job under one mpirun",
                    topo_.size, worker_.size());
    CORTADO_ENFORCE(groups_->inter != nullptr, ErrorCode::kInvalidArgument,
                    "the executor needs an inter-machine group on every rank "
                    "(InterGroups::kSameLocalRank)");
  } else {
    // One worker per machine.
    topo_.rank = worker_.rank();
    topo_.size = worker_.size();
    topo_.machine = worker_.rank();
    topo_.numMachines = worker_.size();
    topo_.localRank = 0;
    topo_.localSize = 1;
  }
}

Executor::~Executor() = default;

void Executor::declare(const std::string& name, DType dtype, uint64_t numElements) {
  CORTADO_ENFORCE(dtype == DType::kFloat32, ErrorCode::kInvalidArgument,
                  "tensor '{}' is {}: the plan executor runs float32 tensors (use "
                  "Worker::pushPull for others)",
                  name, dtypeName(dtype));
  if (auto it = tensors_.find(name); it != tensors_.end()) {
    CORTADO_ENFORCE(it->second->n == numElements, ErrorCode::kInvalidArgument,
                    "tensor '{}' was declared with {} elements, now with {}: a name keeps its "
                    "shape",
                    name, it->second->n, numElements);
    return;
  }
  auto t = std::make_unique<TensorState>();
  t->name = name;
  t->n = numElements;
  t->seedBase = std::hash<std::string>{}(name);
  tensors_.emplace(name, std::move(t));
}

const plan::Plan& Executor::currentPlan() const {
  CORTADO_ENFORCE(plan_.has_value(), ErrorCode::kInvalidArgument, "no plan was set");
  return *plan_;
}

void Executor::setDefaultPlan(Deadline deadline) {
  plan::Plan p;
  for (const auto& [name, t] : tensors_) p.tensors[name] = defaultOption();
  setPlan(p, deadline);
}

void Executor::setPlan(const plan::Plan& p, Deadline deadline) {
  // Check everything before declaring anything.
  for (const auto& [name, option] : p.tensors) {
    CORTADO_ENFORCE(tensors_.count(name), ErrorCode::kInvalidArgument,
                    "the plan names tensor '{}', which this job did not declare: plan the job's "
                    "own tensors (declared: {})",
                    name, tensors_.size());
    plan::validate(option, name);
    for (size_t i = 0; i < option.steps.size(); ++i) {
      const Step& s = option.steps[i];
      if (s.kind != StepKind::kComm || groups_) continue;
      CORTADO_ENFORCE(s.scope != Scope::kFlat &&
                          (s.scope != Scope::kInter || s.op == CommOp::kPush || s.op == CommOp::kPull),
                      ErrorCode::kInvalidArgument,
                      "plan for tensor '{}', step {} ({}): this worker runs without MPI, so it "
                      "has no collectives beyond push/pull; start the workers under mpirun "
                      "(cortado launch --hosts ...) or use a plan without flat and "
                      "inter-machine collective steps",
                      name, i, describeStep(s));
    }
    if (!option.codec.empty()) {
      try {
        compressor::CodecPtr c = codecs_->create(codecs_->canonical(option.codec));
        CORTADO_ENFORCE(c->id() != compressor::CodecId::kPowerSgd, ErrorCode::kInvalidArgument,
                        "powersgd needs a matrix shape and two reductions per round; choose "
                        "another codec");
      } catch (const Error& e) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("plan for tensor '{}': codec '{}' cannot apply: {}", name,
                                option.codec, e.what()));
      }
    }
  }
  for (const auto& [name, t] : tensors_) {
    CORTADO_ENFORCE(p.tensors.count(name), ErrorCode::kInvalidArgument,
                    "the plan has no option for declared tensor '{}': add it to the plan (or "
                    "run without a plan for BytePS's default)",
                    name);
  }
  const uint64_t gen = ++generation_;  // names each plan's shard keys apart
  const int L = topo_.localSize, M = topo_.numMachines, W = topo_.size;
  for (const auto& [name, option] : p.tensors) {
    TensorState& t = *tensors_.at(name);
    // Every encode point of the old plan is retired: its error-feedback
    // residual (mass encoded but not yet sent) joins this worker's next input
    // at its element offsets, so the new plan sends it; new encode points
    // start from zero. Sums are linear, so nothing is lost or sent twice.
    // An encode point that several ranks run on the same data (replicas)
    // holds the same residual on each, owed once: each folds its share.
    for (const auto& [step, pieces] : t.efPieces) {
      auto it = t.ef.find(step);
      if (it == t.ef.end()) continue;
      const float share = 1.0f / float(std::max<uint64_t>(1, t.efReplicas[step]));
      for (const auto& [off, count] : pieces) {
        auto r = it->second->residual(off);
        if (r.empty()) continue;
        if (t.carry.empty()) t.carry.assign(t.n, 0.0f);
        for (uint64_t i = 0; i < r.size() && off + i < t.n; ++i) t.carry[off + i] += r[i] * share;
      }
    }
    t.efPieces.clear();
    t.efReplicas.clear();
    // The old plan's shard keys are done on this worker (its last round's
    // answer is in): the servers free each once all its pushers said so.
    // Without this every switch left a plan's sums, answers and residuals
    // on the servers for the rest of the job (about 2.7x the model's bytes
    // per switch on resnet101, docs/benchmarks.md run X).
    for (const std::string& key : t.exchanged) worker_.release(key);
    t.exchanged.clear();
    t.option = option;
    t.codec.reset();
    t.sparseDecoder.reset();
    t.ef.clear();
    t.shardKeys.clear();
    t.shardRegions.clear();
    t.shardChunks.clear();
    t.cuts.clear();
    t.codecSpec.clear();
    if (!option.codec.empty()) {
      t.codecSpec = codecs_->canonical(option.codec);
      t.codec = codecs_->create(t.codecSpec);
      if (t.codec->sparse()) t.sparseDecoder = codecs_->create("topk");
    }
    const Region whole{0, t.n};
    t.cuts = {0, t.n};
    auto addBlocks = [&](const Region& r, int g) {
      for (int i = 0; i <= g; ++i) t.cuts.insert(std::min(r.end(), r.off + uint64_t(i) * blockSize(r, g)));
    };
    // Which shards a push covers, from the intra first step.
    bool intraSplit = false;
    bool hasPush = false, pushCompressed = false, pullCompressed = false;
    for (const Step& s : option.steps) {
      if (s.kind != StepKind::kComm) continue;
      if (s.scope == Scope::kIntra && (s.op == CommOp::kReduceScatter || s.op == CommOp::kAlltoall))
        intraSplit = true;
      if (s.op == CommOp::kPush) hasPush = true, pushCompressed = s.compressed;
      if (s.op == CommOp::kPull) pullCompressed = s.compressed;
      if (s.op == CommOp::kAlltoall && s.scope == Scope::kFlat) addBlocks(whole, W);
      if (s.op == CommOp::kAlltoall && s.scope == Scope::kIntra) addBlocks(whole, L);
    }
    for (const Step& s : option.steps) {
      if (s.kind == StepKind::kComm && s.scope == Scope::kInter && s.op == CommOp::kAlltoall) {
        if (intraSplit) {
          for (int l = 0; l < L; ++l) addBlocks(block(whole, L, l), M);
        } else {
          addBlocks(whole, M);
        }
      }
    }
    if (hasPush) {
      const int shards = intraSplit ? L : 1;
      for (int s = 0; s < shards; ++s) {
        Region r = intraSplit ? block(whole, L, s) : whole;
        std::string key = fmt::format("{}/plan{}/shard{}", name, gen, s);
        TensorOptions o;
        if (pushCompressed || pullCompressed) o.codec = t.codecSpec;
        // The executor keeps its encode steps' residuals itself (exchange()
        // pushes its payloads as given); the flag makes the servers keep
        // theirs where they re-encode a sum for a compressed pull.
        o.errorFeedback = true;
        o.contributors = static_cast<uint32_t>(M);
        worker_.declare(key, DType::kFloat32, r.len, o, deadline);
        auto chunks = worker_.chunks(key);
        for (const ChunkSpan& c : chunks) {
          t.cuts.insert(r.off + c.offset);
          t.cuts.insert(r.off + c.offset + c.numElements);
        }
        t.shardKeys.push_back(std::move(key));
        t.shardRegions.push_back(r);
        t.shardChunks.push_back(std::move(chunks));
      }
    }
  }
  plan_ = p;
}

namespace {

// One tensor's run: the data, where it is valid, and the pairs still open.
class Run {
 public:
  Run(Executor::TensorState& t, Worker& w, const collective::Groups* groups,
      const collective::Topology& topo, Deadline d, Tracer* tracer, Executor::Profiler* prof,
      bool flushResidual)
      : t_(t), worker_(w), groups_(groups), topo_(topo), d_(d),
        tracer_(tracer && tracer->wants(int64_t(t.round)) ? tracer : nullptr), prof_(prof),
        flushResidual_(flushResidual) {}

  void go(const float* in, float* out, ReduceOp op) {
    start(in, out);
    finish(op);
  }

  // The input in the output, then the option's leading encode and decode
  // steps: everything before its first communication, which touches only
  // this tensor's own state (no collective, no server), so that another
  // thread may run it while the executor's thread communicates another
  // tensor (Executor::setPipeline).
  void start(const float* in, float* out) {
    // Work in the output: no copy of the tensor beyond the input's.
    x_ = out;
    if (in != out) std::copy_n(in, t_.n, out);
    if (!t_.carry.empty()) {  // residuals of encode points the last switch retired
      for (uint64_t i = 0; i < t_.n; ++i) x_[i] += t_.carry[i];
      t_.carry.clear();
    }
    r_ = Region{0, t_.n};
    step_ = 0;
    runSteps(Until::kBeforeComm);
  }

  // The remaining steps, then the average's scale.
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
  void scale(ReduceOp op) {
    const float scale = op == ReduceOp::kAverage ? 1.0f / float(topo_.size) : 1.0f;
    if (scale != 1.0f)
      for (uint64_t i = 0; i < t_.n; ++i) x_[i] *= scale;
  }

 private:
  enum class Until { kBeforeComm, kAfterComm, kEnd };

  // Steps from step_ on, until the end, or just before the next
  // communication step, or just after it.
  void runSteps(Until until) {
    const auto& steps = t_.option.steps;
    while (step_ < steps.size()) {
      const Step& s = steps[step_];
      const bool comm = s.kind == StepKind::kComm;
      if (comm && until == Until::kBeforeComm) return;
      try {
        const bool wasActive = active_;
        const size_t at = step_;
        const double start = tracer_ ? Tracer::now() : 0;
        if (prof_) {
          timedStep(s);
        } else {
          runStep(s);
        }
        if (tracer_ && (wasActive || active_)) record(steps, at, start);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("worker {}: tensor '{}', step {} ({}) of plan '{}': {}",
                                          topo_.rank, t_.name, step_, describeStep(s),
                                          t_.option.describe(), e.what()));
      }
      ++step_;
      if (comm && until == Until::kAfterComm) return;
    }
  }

  // The simulator's stage name and lane of step `i`.
  void record(const std::vector<Step>& steps, size_t i, double start) {
    const Step& s = steps[i];
    std::string stage, lane;
    if (s.kind == StepKind::kEncode || s.kind == StepKind::kDecode) {
      stage = s.kind == StepKind::kEncode ? "encode" : "decode";
      lane = "cpu";  // host buffers: the CPU twin runs, also for "gpu" steps
    } else if (s.op == CommOp::kPush) {
      const Step& pull = steps.at(i + 1);
      stage = fmt::format("inter push{}+pull{}", s.compressed ? "*" : "", pull.compressed ? "*" : "");
      lane = "network";
    } else {
      stage = fmt::format("{} {}{}", plan::toString(s.scope), plan::toString(s.op),
                          s.compressed ? "*" : "");
      lane = s.scope == Scope::kIntra ? "intra" : "network";
    }
    tracer_->record(stage, t_.name, int64_t(t_.round), lane, start, Tracer::now());
  }

  struct Frame {
    Region parent;
    bool active;
    Scope scope;
  };

  static float* scratch(std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }

  // What this rank holds before a step: payload bytes while compressed, else
  // its region's fp32 bytes.
  uint64_t bytesHeld(bool compressed) const {
    if (!compressed) return r_.len * sizeof(float);
    uint64_t b = 0;
    for (const Seg& s : segs_) b += s.bytes.size();
    return b;
  }

  // runStep, timed into the profiler (only what this rank took part in).
  void timedStep(const Step& s) {
    using Clock = Executor::Profiler::Clock;
    const bool active = active_;
    const size_t first = step_;
    uint64_t elements = r_.len, bytes = 0, chunks = 0;
    int gsize = 1;
    if (s.kind == StepKind::kDecode) {
      elements = 0;
      for (const Seg& x : segs_) elements += x.dense ? 0 : x.count;
    }
    if (s.kind == StepKind::kComm) {
      bytes = bytesHeld(s.compressed);
      gsize = group(s.scope).size();
      if (s.op == CommOp::kPush) {
        bytes *= std::max<size_t>(1, t_.shardKeys.size());
        for (const auto& c : t_.shardChunks) chunks += c.size();
      }
    }
    const auto t0 = Clock::now();
    runStep(s);
    const double us = Executor::Profiler::since(t0);
    if (!active) return;
    if (s.kind == StepKind::kEncode) {
      prof_->codec(t_.codecSpec, true, elements, us);
    } else if (s.kind == StepKind::kDecode) {
      prof_->codec(t_.codecSpec, false, elements, us);
    } else {
      const bool push = s.op == CommOp::kPush;
      prof_->comm(s.op, s.scope, s.compressed, gsize, bytes, chunks, push ? uint64_t(r_.len) : 0,
                  push && t_.option.steps.at(first + 1).compressed, us);
    }
  }

  Group group(Scope s) const {
    if (!groups_) return Group{};
    switch (s) {
      case Scope::kFlat: return Group{groups_->world.get()};
      case Scope::kIntra: return Group{groups_->intra.get()};
      case Scope::kInter: return Group{groups_->inter.get()};
    }
    return Group{};
  }

  void runStep(const Step& s) {
    if (s.kind == StepKind::kEncode) {
      if (active_) encode();
      return;
    }
    if (s.kind == StepKind::kDecode) {
      if (active_) decode();
      return;
    }
    Group g = group(s.scope);
    if (s.op == CommOp::kPush) {
      replicas_ *= uint64_t(topo_.numMachines);  // every machine's pusher pulls the same sum
      if (active_) pushPull(s, t_.option.steps.at(step_ + 1));
      ++step_;  // the pull ran with it
      return;
    }
    if (isFirst(s.op)) {
      frames_.push_back({r_, active_, s.scope});
      if (!active_) return;
      switch (s.op) {
        case CommOp::kReduceScatter: reduceScatter(g); break;
        case CommOp::kReduce:
          if (g.size() > 1) {
            float* sum = scratch(t_.scratch1, r_.len);
            g.c->reduce(x_ + r_.off, sum, r_.len, DType::kFloat32, 0, d_);
            if (g.rank() == 0) std::copy_n(sum, r_.len, x_ + r_.off);
          }
          active_ = g.rank() == 0;
          break;
        case CommOp::kAlltoall: alltoall(g); break;
        case CommOp::kGather: {
          if (g.size() > 1) {
            auto blobs = gatherBlob(g, pack(segs_), d_);
            segs_.clear();
            for (const Blob& b : blobs) unpackInto(b.data(), b.size(), segs_, t_.n);
          }
          active_ = g.rank() == 0;
          break;
        }
        default: break;
      }
      return;
    }
    // Second steps close the open pair of their scope; else indivisible.
    const bool second = !frames_.empty() && frames_.back().scope == s.scope &&
                        (s.op == CommOp::kAllgather || s.op == CommOp::kBroadcast);
    if (!second) {
      replicas_ *= uint64_t(g.size());  // allreduce, compressed allgather
      if (!active_) return;
      if (s.op == CommOp::kAllreduce) {
        if (g.size() > 1)
          g.c->allreduce(x_ + r_.off, x_ + r_.off, r_.len, DType::kFloat32, d_);
      } else {  // compressed allgather
        allgatherSegs(g);
      }
      return;
    }
    Frame f = frames_.back();
    frames_.pop_back();
    replicas_ *= uint64_t(g.size());  // the pair's members end with the same data
    if (!f.active) return;  // this rank sat the whole pair out
    if (s.op == CommOp::kAllgather) {
      if (s.compressed) {
        allgatherSegs(g);
      } else {
        allgatherRaw(g, f.parent);
      }
      r_ = f.parent;
    } else {  // broadcast from the root of the pair
      if (s.compressed && g.size() > 1) {
        Blob b = active_ ? pack(segs_) : Blob{};
        broadcastBlob(g, b, d_);
        segs_.clear();
        unpackInto(b.data(), b.size(), segs_, t_.n);
      } else if (g.size() > 1) {
        g.c->broadcast(x_ + f.parent.off, f.parent.len, DType::kFloat32, 0, d_);
      }
      r_ = f.parent;
      active_ = true;
    }
  }

  void reduceScatter(Group g) {
    const int n = g.size();
    const Region mine = block(r_, n, g.rank());
    if (n > 1) {
      const uint64_t b = blockSize(r_, n);
      float* padded = scratch(t_.scratch1, b * n);
      float* recv = scratch(t_.scratch2, b);
      std::copy_n(x_ + r_.off, r_.len, padded);
      std::fill(padded + r_.len, padded + b * n, 0.0f);
      g.c->reduceScatter(padded, recv, b, DType::kFloat32, d_);
      std::copy_n(recv, mine.len, x_ + mine.off);
    }
    r_ = mine;
  }

  void allgatherRaw(Group g, const Region& parent) {
    const int n = g.size();
    if (n == 1) return;
    const uint64_t b = blockSize(parent, n);
    float* send = scratch(t_.scratch2, b);
    float* recv = scratch(t_.scratch1, b * n);
    std::copy_n(x_ + r_.off, r_.len, send);
    std::fill(send + r_.len, send + b, 0.0f);
    g.c->allgather(send, b, recv, DType::kFloat32, d_);
    std::copy_n(recv, parent.len, x_ + parent.off);
  }

  // Groups of one keep their pieces as they are: packing and unpacking them
  // copies every byte twice (a server's dense answer too: 94 MB for
  // bert-base's embedding in a plan switch's flushed round).
  void allgatherSegs(Group g) {
    if (g.size() == 1) return;
    auto blobs = allgatherBlob(g, pack(segs_), d_);
    segs_.clear();
    for (const Blob& b : blobs) unpackInto(b.data(), b.size(), segs_, t_.n);
  }

  void alltoall(Group g) {
    const int n = g.size();
    if (n == 1) return;  // every piece stays here; block(r_, 1, 0) is r_
    std::vector<Segs> out(n);
    for (Seg& s : segs_) {
      int dest = -1;
      for (int i = 0; i < n; ++i) {
        Region b = block(r_, n, i);
        if (s.off >= b.off && s.off + s.count <= b.end() && (s.count > 0 || b.len == 0)) {
          dest = i;
          break;
        }
      }
      CORTADO_ENFORCE(dest >= 0, ErrorCode::kInternal,
                      "payload piece [{}, +{}) crosses the alltoall blocks of [{}, +{})", s.off,
                      s.count, r_.off, r_.len);
      out[dest].push_back(std::move(s));
    }
    std::vector<Blob> blobs;
    for (const Segs& s : out) blobs.push_back(pack(s));
    auto got = alltoallBlob(g, blobs, d_);
    segs_.clear();
    for (const Blob& b : got) unpackInto(b.data(), b.size(), segs_, t_.n);
    r_ = block(r_, n, g.rank());
  }

  uint64_t seed(uint64_t piece) const {
    uint64_t s = compressor::format::hash2(t_.seedBase, (uint64_t(step_) << 40) ^ piece);
    s = compressor::format::hash2(s, t_.round);
    if (t_.codec->id() == compressor::CodecId::kRandomK) return s;  // the same on every worker
    // Ranks that hold the same data here (replicas_ > 1) draw the same
    // numbers, so their stochastic encodes and residuals stay equal, as the
    // switch's fold of 1/replicas of each assumes (deterministic codecs
    // ignore the seed).
    if (replicas_ > 1) return s;
    return compressor::format::hash2(s, uint64_t(topo_.rank) + 1);
  }

  void encode() {
    auto& ef = t_.ef[step_];
    if (!ef) ef = std::make_unique<compressor::ErrorFeedback>(t_.codec);
    segs_.clear();
    std::vector<uint64_t> cuts{r_.off};
    for (auto it = t_.cuts.upper_bound(r_.off); it != t_.cuts.end() && *it < r_.end(); ++it)
      cuts.push_back(*it);
    cuts.push_back(r_.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      Seg s;
      s.off = cuts[i];
      s.count = cuts[i + 1] - cuts[i];
      if (s.count == 0) continue;
      s.bytes.resize(ef->payloadBytes(s.count));
      t_.efPieces[step_][s.off] = s.count;
      t_.efReplicas[step_] = replicas_;
      compressor::EncodeContext ctx;
      ctx.seed = seed(s.off);
      ef->encode(s.off, x_ + s.off, s.count, s.bytes, ctx);
      segs_.push_back(std::move(s));
    }
  }

  // Sums every segment into the region, in fp32.
  void decode() {
    std::fill_n(x_ + r_.off, r_.len, 0.0f);
    for (const Seg& s : segs_) {
      CORTADO_ENFORCE(s.off >= r_.off && s.off + s.count <= r_.end(), ErrorCode::kInternal,
                      "payload piece [{}, +{}) outside the data's region [{}, +{})", s.off,
                      s.count, r_.off, r_.len);
      float* dst = x_ + s.off;
      if (s.dense) {
        CORTADO_ENFORCE(s.bytes.size() == s.count * sizeof(float), ErrorCode::kProtocol,
                        "dense piece of {} bytes for {} elements", s.bytes.size(), s.count);
        const float* src = reinterpret_cast<const float*>(s.bytes.data());
        for (uint64_t i = 0; i < s.count; ++i) dst[i] += src[i];
        continue;
      }
      const compressor::PayloadHeader h = compressor::parseHeader(s.bytes);
      const compressor::Codec* dec = nullptr;
      if (h.codec == t_.codec->id()) dec = t_.codec.get();
      else if (h.codec == compressor::CodecId::kTopK && t_.sparseDecoder) dec = t_.sparseDecoder.get();
      CORTADO_ENFORCE(dec != nullptr, ErrorCode::kProtocol,
                      "a {} payload for a tensor compressed with '{}'",
                      compressor::codecIdName(h.codec), t_.codecSpec);
      dec->decompressAdd(s.bytes, dst, s.count);
    }
    segs_.clear();
  }

  void pushPull(const Step& push, const Step& pull) {
    // The shard: this rank's intra block after a split, else the whole tensor.
    size_t shard = 0;
    if (t_.shardKeys.size() > 1) shard = static_cast<size_t>(topo_.localRank);
    CORTADO_ENFORCE(shard < t_.shardKeys.size() && t_.shardRegions[shard] == r_,
                    ErrorCode::kInternal, "push of [{}, +{}) matches no shard key", r_.off, r_.len);
    const std::string& key = t_.shardKeys[shard];
    const auto& chunks = t_.shardChunks[shard];
    Exchange ex;
    if (push.compressed) {
      for (const ChunkSpan& c : chunks) {
        Buffer b;
        std::vector<std::byte> cat;
        for (const Seg& s : segs_) {
          if (s.off != r_.off + c.offset) continue;
          CORTADO_ENFORCE(s.count == c.numElements && !s.dense, ErrorCode::kInternal,
                          "payload piece [{}, +{}) does not match server chunk [{}, +{})", s.off,
                          s.count, r_.off + c.offset, c.numElements);
          cat.insert(cat.end(), s.bytes.begin(), s.bytes.end());
        }
        ex.payloads.push_back(Buffer::copyOf(cat.data(), cat.size()));
      }
    } else {
      ex.rawInput = x_ + r_.off;
    }
    auto answersOwned = std::make_shared<std::vector<ExchangeAnswer>>();
    auto& answers = *answersOwned;
    if (pull.compressed) {
      ex.answers = answersOwned;
    } else {
      // In place, as pushPull allows: the answer comes only after the servers
      // have every push of the round, ours included.
      ex.rawOutput = x_ + r_.off;
    }
    ex.flushResidual = flushResidual_;
    Handle h = worker_.exchange(key, std::move(ex), 0);
    t_.exchanged.insert(key);
    Status st = h.wait(d_);
    if (st.code() == ErrorCode::kTimeout) {
      // The round is half done and its answers would still land in the
      // output after run() returned: end this worker's operations first (the
      // job cannot go on, as after a collective that timed out).
      Status why(ErrorCode::kTimeout, fmt::format("push/pull of key '{}': {}", key, st.message()));
      worker_.abort(why);
      throw Error(why.code(), why.message());
    }
    if (!st.ok()) throw Error(st.code(), fmt::format("push/pull of key '{}': {}", key, st.message()));
    segs_.clear();
    if (pull.compressed) {
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (chunks[i].numElements == 0) continue;
        Seg s;
        s.off = r_.off + chunks[i].offset;
        s.count = chunks[i].numElements;
        s.dense = !answers[i].compressed;
        const auto* p = reinterpret_cast<const std::byte*>(answers[i].bytes.data());
        s.bytes.assign(p, p + answers[i].bytes.size());
        segs_.push_back(std::move(s));
      }
    }
  }

  Executor::TensorState& t_;
  Worker& worker_;
  const collective::Groups* groups_;
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
};

}  // namespace

uint64_t Executor::runs(const std::string& name) const {
  auto it = tensors_.find(name);
  CORTADO_ENFORCE(it != tensors_.end(), ErrorCode::kInvalidArgument,
                  "tensor '{}' was never declared to the executor", name);
  return it->second->round;
}

Executor::TensorState& Executor::checkedState(const std::string& name, const float* input,
                                              const float* output, uint64_t numElements) {
  auto it = tensors_.find(name);
  CORTADO_ENFORCE(it != tensors_.end(), ErrorCode::kInvalidArgument,
                  "worker {}: run of tensor '{}', which was never declared to the executor",
                  topo_.rank, name);
  TensorState& t = *it->second;
  CORTADO_ENFORCE(numElements == t.n, ErrorCode::kInvalidArgument,
                  "worker {}: run of tensor '{}' with {} elements, but it was declared with {}",
                  topo_.rank, name, numElements, t.n);
  CORTADO_ENFORCE(t.n == 0 || (input && output), ErrorCode::kInvalidArgument,
                  "run of tensor '{}': null buffer", name);
  return t;
}

void Executor::ensurePlan(Deadline deadline) {
  if (!plan_ && !planFile_.empty()) {
    try {
      setPlan(loadPlanFile(planFile_), deadline);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("plan file '{}' (CORTADO_PLAN): {}", planFile_, e.what()));
    }
  }
  if (!plan_) setDefaultPlan(deadline);
}

void Executor::noteReady(TensorState& t) {
  Profiler* prof = prof_ && prof_->active ? prof_.get() : nullptr;
  if (prof && prof->readyThisIter.insert(t.name).second) {
    // Ready time: compute time since the iteration began (time spent in the
    // executor taken out, as if communication overlapped it).
    auto& [elements, acc] = prof->ready[t.name];
    elements = t.n;
    ++acc.calls;
    acc.us += std::max(0.0, Profiler::since(prof->iterStart) - prof->inRunUs);
  }
}

// The last iteration before a scheduled switch: the switch retires every
// shard key of this plan (the next plan's keys are new), so the servers
// flush their residuals into this round's answers (Exchange::flushResidual).
bool Executor::lastRound() const {
  return begun_ && scheduled_ && scheduled_->second == iteration_ + 1;
}

namespace {

// The items that run alone, in phases (setPhaseBytes): consecutive items up
// to phaseBytes of input (0: one item a phase, so one after the other), each
// tensor at most once (a tensor twice in a batch runs its rounds in turn). In a phase every item's local steps run,
// then every item's next communication step, and so on until all are done.
template <typename MakeRun>
void runPhases(const std::vector<size_t>& alone, const MakeRun& makeRun, std::span<const BatchItem> items,
               std::span<Executor::TensorState* const> states, ReduceOp op, uint64_t phaseBytes,
               uint64_t& phasedSteps) {
  for (size_t k = 0; k < alone.size();) {
    std::vector<size_t> phase;
    uint64_t bytes = 0;
    for (; k < alone.size(); ++k) {
      const size_t i = alone[k];
      const uint64_t b = states[i]->n * sizeof(float);
      if (!phase.empty() && bytes + b > phaseBytes) break;
      if (std::any_of(phase.begin(), phase.end(), [&](size_t j) { return states[j] == states[i]; })) break;
      phase.push_back(i);
      bytes += b;
    }
    std::vector<std::unique_ptr<Run>> runs;
    for (size_t i : phase) {
      runs.push_back(makeRun(i));
      runs.back()->start(items[i].input, items[i].output);
    }
    for (bool more = true; more;) {
      size_t communicated = 0;
      for (auto& r : runs) {
        if (r->done()) continue;
        r->communicate();
        ++communicated;
      }
      if (communicated > 1) ++phasedSteps;
      more = false;
      for (auto& r : runs) {
        if (r->done()) continue;
        r->compute();
        more = more || !r->done();
      }
    }
    for (size_t n = 0; n < phase.size(); ++n) {
      runs[n]->scale(op);
      ++states[phase[n]]->round;
    }
  }
}

}  // namespace

void Executor::run(const std::string& name, const float* input, float* output,
                   uint64_t numElements, ReduceOp op, Deadline deadline) {
  BatchItem item{name, input, output, numElements};
  runBatch(std::span<const BatchItem>(&item, 1), op, deadline);
}

void Executor::runBatch(std::span<const BatchItem> items, ReduceOp op, Deadline deadline) {
  std::vector<TensorState*> states;
  states.reserve(items.size());
  for (const BatchItem& it : items)
    states.push_back(&checkedState(it.name, it.input, it.output, it.numElements));
  if (items.empty()) return;
  ensurePlan(deadline);
  for (TensorState* t : states)
    CORTADO_ENFORCE(!t->option.steps.empty(), ErrorCode::kInvalidArgument,
                    "tensor '{}' was declared after the plan was set: set the plan again", t->name);
  Profiler* prof = prof_ && prof_->active ? prof_.get() : nullptr;
  const auto t0 = Profiler::Clock::now();
  // run() is a batch of one: a worker that never hands over more than one
  // tensor at a time never fuses, and its reports say so (fusionBytes 0).
  if (prof && items.size() > 1) prof->batched = true;
  for (TensorState* t : states) noteReady(*t);
  const bool flush = lastRound();
  auto makeRun = [&](size_t i) {
    return std::make_unique<Run>(*states[i], worker_, groups_, topo_, deadline, tracer_.get(),
                                 prof, flush);
  };
  auto runAlone = [&](size_t i) {
    makeRun(i)->go(items[i].input, items[i].output, op);
    ++states[i]->round;
  };
  // Items that run alone first, in order; then, per fusible option in the
  // order of its first item, its items packed in order into groups within
  // the threshold (Horovod too fuses every ready tensor of a kind, not only
  // neighbours). The batch's end is the same in any order; grouping by
  // option lets tensors between compressed ones fuse.
  std::vector<size_t> alone;
  std::vector<std::vector<size_t>> byOption;
  for (size_t i = 0; i < items.size(); ++i) {
    if (fusionBytes_ == 0 || !states[i]->option.fusible()) {
      alone.push_back(i);
      continue;
    }
    auto it = std::find_if(byOption.begin(), byOption.end(), [&](const std::vector<size_t>& g) {
      return states[g.front()]->option == states[i]->option;
    });
    if (it == byOption.end()) byOption.push_back({i});
    else it->push_back(i);
  }
  // The items that run alone: in phases (0 bytes: one item a phase, one
  // after the other), or with the pipeline, where the next one's leading
  // encode (Run::start: no communication) runs on another thread while this
  // one communicates; the order of every collective and push is unchanged.
  if (!pipeline_) {
    runPhases(alone, makeRun, items, states, op, phaseBytes_, phasedSteps_);
  } else {
    auto startsLocal = [&](size_t k) {
      const auto& steps = states[alone[k]]->option.steps;
      return steps.front().kind != plan::StepKind::kComm && states[alone[k]] != states[alone[k - 1]];
    };
    std::unique_ptr<Run> next;
    std::future<void> nextStarted;
    for (size_t k = 0; k < alone.size(); ++k) {
      const size_t i = alone[k];
      std::unique_ptr<Run> cur = std::move(next);
      if (cur) {
        nextStarted.get();  // its start's error, if any, is this item's
      } else {
        cur = makeRun(i);
        cur->start(items[i].input, items[i].output);
      }
      if (k + 1 < alone.size() && startsLocal(k + 1)) {
        const size_t j = alone[k + 1];
        auto r = makeRun(j);
        try {
          nextStarted = std::async(std::launch::async, [r = r.get(), in = items[j].input,
                                                        out = items[j].output] { r->start(in, out); });
          next = std::move(r);
          ++pipelinedStarts_;
        } catch (const std::system_error& e) {
          // No thread to be had: the next item starts in turn, as without the pipeline.
          CORTADO_LOG_WARN("encode pipeline: no second thread ({}); running in turn", e.what());
        }
      }
      try {
        cur->finish(op);
      } catch (...) {
        // The next item's encode ran (its residual counts this round's
        // gradient as sent); the batch fails here, as after any failed step.
        if (nextStarted.valid()) nextStarted.wait();
        throw;
      }
      ++states[i]->round;
    }
  }
  std::vector<size_t> group;
  auto runGroup = [&] {
    if (group.size() == 1) {
      runAlone(group[0]);
    } else if (!group.empty()) {
      runFused(items, states, group, op, deadline);
    }
    group.clear();
  };
  for (const std::vector<size_t>& members : byOption) {
    uint64_t bytes = 0;
    for (size_t i : members) {
      const uint64_t b = states[i]->n * sizeof(float);
      if (!group.empty() && bytes + b > fusionBytes_) runGroup(), bytes = 0;
      group.push_back(i);
      bytes += b;
    }
    runGroup();
  }
  if (prof) prof->inRunUs += Profiler::since(t0);
}

// One execution of the group's option on the concatenation of its members'
// inputs (members: indices into the batch, in order; each input with the
// residual a plan switch folded into it), the results scattered to the
// outputs. Collectives sum element by element, so every element gets what
// running its tensor alone gives it.
void Executor::runFused(std::span<const BatchItem> batch, std::span<TensorState* const> all,
                        const std::vector<size_t>& members, ReduceOp op, Deadline deadline) {
  std::vector<TensorState*> states;
  std::vector<const BatchItem*> items;
  for (size_t i : members) states.push_back(all[i]), items.push_back(&batch[i]);
  uint64_t total = 0;
  for (const TensorState* t : states) total += t->n;
  if (!fused_) fused_ = std::make_unique<TensorState>();
  TensorState& f = *fused_;
  f.name = fmt::format("fused{}:{}..{}", states.size(), states.front()->name, states.back()->name);
  f.n = total;
  f.option = states.front()->option;
  f.round = states.front()->round;  // the trace's iteration
  if (fusionBuffer_.size() < total) fusionBuffer_.resize(total);
  float* buf = fusionBuffer_.data();
  uint64_t at = 0;
  for (size_t k = 0; k < states.size(); ++k) {
    TensorState& t = *states[k];
    std::copy_n(items[k]->input, t.n, buf + at);
    if (!t.carry.empty()) {  // residuals of encode points the last switch retired
      for (uint64_t i = 0; i < t.n; ++i) buf[at + i] += t.carry[i];
      t.carry.clear();
    }
    at += t.n;
  }
  Profiler* prof = prof_ && prof_->active ? prof_.get() : nullptr;
  try {
    Run(f, worker_, groups_, topo_, deadline, tracer_.get(), prof, false).go(buf, buf, op);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{} (tensor fusion: the {} tensors '{}' .. '{}' ran as one, "
                                      "{} bytes; CORTADO_FUSION_BYTES=0 runs them one by one)",
                                      e.what(), states.size(), states.front()->name,
                                      states.back()->name, total * sizeof(float)));
  }
  at = 0;
  for (size_t k = 0; k < states.size(); ++k) {
    TensorState& t = *states[k];
    std::copy_n(buf + at, t.n, items[k]->output);
    at += t.n;
    ++t.round;
  }
}

OnlineOptions onlineOptions(const JobConfig& job) {
  OnlineOptions o;
  o.window = job.profileWindow;
  o.warmup = 1;
  o.exchange = true;
  return o;
}

void Executor::setOnline(const OnlineOptions& o) {
  online_ = o;
  // Without this the window open last stayed open: every later run() was
  // timed into it, and a window turned on again closed with those runs in it.
  prof_.reset();
}

void Executor::schedulePlan(const plan::Plan& p, uint64_t switchAt) {
  const uint64_t current = plan_ ? plan_->version : 0;
  CORTADO_ENFORCE(!begun_ || switchAt > iteration_, ErrorCode::kMismatch,
                  "worker {}: plan version {} (switch at iteration {}) arrived at iteration {}, "
                  "after its switch iteration; this worker still runs plan version {} while the "
                  "others switched: the plan reached it too late (raise CORTADO_REPLAN_AHEAD)",
                  topo_.rank, p.version, switchAt, iteration_, current);
  CORTADO_ENFORCE(p.version > current, ErrorCode::kInvalidArgument,
                  "worker {}: plan version {} is not newer than the current plan version {}",
                  topo_.rank, p.version, current);
  scheduled_ = std::make_pair(p, switchAt);
}

void Executor::closeWindow(Deadline deadline) {
  Profiler& pr = *prof_;
  plan::ProfileReport r;
  r.rank = topo_.rank;
  r.machines = topo_.numMachines;
  r.localSize = topo_.localSize;
  r.collectives = groups_ != nullptr;
  r.planVersion = plan_ ? plan_->version : 0;
  r.window = windowIndex_++;
  r.firstIteration = pr.firstIteration;
  r.endIteration = iteration_;
  if (iteration_ > pr.firstIteration)
    r.iterationUs = Profiler::since(pr.windowStart) / double(iteration_ - pr.firstIteration);
  r.hostMemory = true;  // this executor's buffers; "gpu" codec steps run the CPU codec
  r.fusionBytes = pr.batched ? fusionBytes_ : 0;
  for (const auto& [name, e] : pr.ready) {
    plan::ReadyTime t{name, e.first, e.second.us / double(std::max<uint64_t>(1, e.second.calls))};
    // The plan it runs, each distinct option once.
    if (auto it = tensors_.find(name); it != tensors_.end() && !it->second->option.steps.empty()) {
      auto o = std::find(r.options.begin(), r.options.end(), it->second->option);
      t.option = int(o - r.options.begin());
      if (o == r.options.end()) r.options.push_back(it->second->option);
    }
    r.ready.push_back(std::move(t));
  }
  for (const auto& [k, a] : pr.codecs)
    r.codecs.push_back({std::get<0>(k), plan::Device::kCpu, std::get<1>(k), std::get<2>(k), a.calls, a.us, a.maxUs});
  for (const auto& [k, a] : pr.comms)
    r.comms.push_back({plan::CommOp(std::get<0>(k)), plan::Scope(std::get<1>(k)), std::get<2>(k),
                       std::get<3>(k), std::get<4>(k), std::get<5>(k), std::get<6>(k), std::get<7>(k),
                       a.calls, a.us});
  lastReport_ = r;
  if (online_.exchange) {
    const uint64_t at = worker_.controlClient().sendProfile(plan::toJsonString(r), deadline);
    if (at > 0) {
      CORTADO_ENFORCE(at > iteration_, ErrorCode::kProtocol,
                      "worker {}: the scheduler says a plan from window {} (ending at iteration "
                      "{}) would take effect at iteration {}, which is not later",
                      topo_.rank, r.window, iteration_, at);
      awaiting_.push_back({r.window, at});
    }
  }
}

void Executor::beginIteration(uint64_t iteration, Deadline deadline) {
  CORTADO_ENFORCE(!begun_ || iteration > iteration_, ErrorCode::kInvalidArgument,
                  "worker {}: beginIteration({}) after iteration {}: iterations must increase",
                  topo_.rank, iteration, iteration_);
  CORTADO_ENFORCE(!begun_ || online_.window == 0 || iteration == iteration_ + 1,
                  ErrorCode::kInvalidArgument,
                  "worker {}: beginIteration({}) after iteration {}: with online re-planning "
                  "(CORTADO_PROFILE_WINDOW) every iteration is begun, one after the other",
                  topo_.rank, iteration, iteration_);
  begun_ = true;
  iteration_ = iteration;
  // 1. Close the window that ends here; open the next.
  if (online_.window > 0) {
    if (!prof_) prof_ = std::make_unique<Profiler>();
    if (prof_->active && iteration >= prof_->firstIteration + online_.window) {
      closeWindow(deadline);
      prof_ = std::make_unique<Profiler>();
    }
    if (!prof_->active && iteration >= online_.warmup) {
      prof_->active = true;
      prof_->firstIteration = iteration;
      prof_->windowStart = Profiler::Clock::now();
    }
  }
  // 2. The scheduler's verdicts on the windows whose plan would take effect
  // at the next iteration: this iteration's runs are the last ones of the
  // current plan then (the servers flush their residuals in them), so every
  // worker must know now. A verdict that is not there yet is waited for.
  if (online_.exchange) {
    while (!awaiting_.empty() && awaiting_.front().second <= iteration + 1) {
      const auto [window, at] = awaiting_.front();
      awaiting_.pop_front();
      control::PlanUpdate u = worker_.controlClient().waitVerdict(window, deadline);
      if (u.version == 0) continue;  // the plan stays
      CORTADO_ENFORCE(u.switchAt == at, ErrorCode::kProtocol,
                      "worker {}: plan version {} from window {} switches at iteration {}, but the "
                      "scheduler acknowledged the window with {}",
                      topo_.rank, u.version, window, u.switchAt, at);
      const uint64_t current = plan_ ? plan_->version : 0;
      CORTADO_ENFORCE(u.version > current && u.version > seenPlanVersion_, ErrorCode::kProtocol,
                      "worker {}: plan version {} from window {} is not newer than version {}",
                      topo_.rank, u.version, window, std::max(current, seenPlanVersion_));
      seenPlanVersion_ = u.version;
      plan::Plan p;
      try {
        p = plan::planFromJsonString(u.planJson);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("worker {}: plan version {} from the scheduler: {}",
                                          topo_.rank, u.version, e.what()));
      }
      p.version = u.version;
      scheduled_ = std::make_pair(std::move(p), u.switchAt);
    }
  }
  // 3. Switch.
  if (scheduled_ && scheduled_->second == iteration) {
    plan::Plan p = std::move(scheduled_->first);
    scheduled_.reset();
    setPlan(p, deadline);
  }
  if (prof_) {
    prof_->iterStart = Profiler::Clock::now();
    prof_->inRunUs = 0;
    prof_->readyThisIter.clear();
  }
}

}  // namespace cortado::executor
