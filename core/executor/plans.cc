#include "core/executor/executor.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <system_error>
#include <thread>

#include "compressor/registry.h"
#include "core/common/logging.h"
#include "core/common/thread_pool.h"
#include "core/device/host/factory.h"
#include "core/executor/run.h"

namespace cortado::executor {

using detail::Run;
using detail::Region;
using detail::block;
using detail::blockSize;
using detail::describeStep;
using plan::CommOp;
using plan::Scope;
using plan::Step;
using plan::StepKind;

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
                   std::shared_ptr<const compressor::Registry> codecs, std::string planFile,
                   std::shared_ptr<device::Device> device)
    : worker_(worker),
      groups_(groups),
      codecs_(std::move(codecs)),
      planFile_(std::move(planFile)),
      device_(std::move(device)) {
  if (!codecs_) {
    auto r = std::make_shared<compressor::Registry>();
    compressor::registerCpuCodecs(*r);
    codecs_ = std::move(r);
  }
  if (!device_) {
    device::host::Options o;
    o.groups = groups_;
    o.codecs = codecs_;
    device_ = device::host::create(o);
  }
  if (const collective::Groups* dg = device_->groups(); dg && groups_) {
    CORTADO_ENFORCE(dg->topology.size == groups_->topology.size &&
                        dg->topology.rank == groups_->topology.rank &&
                        dg->topology.numMachines == groups_->topology.numMachines,
                    ErrorCode::kInvalidArgument,
                    "device {}: its groups (rank {} of {} on {} machines) are not the MPI "
                    "groups' (rank {} of {} on {} machines): form them over the same ranks",
                    device_->name(), dg->topology.rank, dg->topology.size, dg->topology.numMachines,
                    groups_->topology.rank, groups_->topology.size, groups_->topology.numMachines);
  }
  CORTADO_ENFORCE(groups_ || !device_->groups(), ErrorCode::kInvalidArgument,
                  "device {} has collective groups but the executor has no MPI groups for "
                  "its compressed payloads: start the workers under mpirun",
                  device_->name());
  compute_ = device_->createStream();
  copy_ = device_->createStream();
  padded_ = device::Buffer(*device_, false);
  block_ = device::Buffer(*device_, false);
  fusionBuffer_ = device::Buffer(*device_, false);
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

detail::Lanes Executor::lanes() const {
  return detail::Lanes{device_.get(), compute_.get(), copy_.get(),
                       device_->hostAddressable(), &padded_, &block_, codecPool_.get()};
}

int codecThreadsFor(const JobConfig& job, int workersPerMachine) {
  if (job.codecThreads > 0) return job.codecThreads;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / (2 * std::max(1, workersPerMachine)));
}

void Executor::setCodecThreads(int threads) {
  CORTADO_ENFORCE(threads >= 1 && threads <= JobConfig::kMaxCodecThreads,
                  ErrorCode::kInvalidArgument,
                  "codec threads {} out of range 1..{} (CORTADO_CODEC_THREADS; 0 there picks "
                  "the machine's cores over twice its workers)",
                  threads, JobConfig::kMaxCodecThreads);
  if (threads == codecThreads_) return;
  codecPool_.reset();
  if (threads > 1) codecPool_ = std::make_unique<ThreadPool>(size_t(threads - 1));
  codecThreads_ = threads;
}

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

void Executor::checkPlan(const plan::Plan& p) const {
  plan::validate(p);  // options and groups
  for (const auto& [name, option] : p.tensors) {
    CORTADO_ENFORCE(tensors_.count(name), ErrorCode::kInvalidArgument,
                    "the plan names tensor '{}', which this job did not declare: plan the job's "
                    "own tensors (declared: {})",
                    name, tensors_.size());
    for (size_t i = 0; i < option.steps.size(); ++i) {
      const Step& s = option.steps[i];
      if (s.kind != StepKind::kComm || groups_) continue;
      CORTADO_ENFORCE(s.scope != Scope::kFlat &&
                          (s.scope != Scope::kInter || s.op == CommOp::kPush || s.op == CommOp::kPull),
                      ErrorCode::kInvalidArgument,
                      "plan for tensor '{}', step {} ({}): this worker runs without MPI, so it "
                      "has no collectives beyond push/pull; start the workers under mpirun "
                      "(`cortado launch --mpi`, with --hosts for several machines) or use a "
                      "plan without flat and inter-machine collective steps",
                      name, i, describeStep(s));
    }
    CORTADO_ENFORCE(!option.zen() || tensors_.at(name)->n <= compressor::zen::kMaxElements,
                    ErrorCode::kInvalidArgument,
                    "plan for tensor '{}': a Zen option indexes elements with u32, at most {}; "
                    "this tensor has {}: split it, or give it a dense option",
                    name, compressor::zen::kMaxElements, tensors_.at(name)->n);
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
}

void Executor::setPlan(const plan::Plan& p, Deadline deadline) {
  // Check everything before declaring anything.
  checkPlan(p);
  // Every worker must set the same plan. With MPI groups one tiny labelled
  // allreduce compares them (the collective check compares the labels), so
  // that workers given different plans (other plan files, other declared
  // tensors) fail here, naming each one's, instead of waiting on pushes and
  // collectives that the others never make. Nothing has changed yet.
  if (groups_ && groups_->world->checksArguments()) {
    const std::string label =
        fmt::format("plan version {} of {} tensors, digest {:016x}", p.version, p.tensors.size(),
                    std::hash<std::string>{}(plan::toJsonString(p, -1)));
    try {
      collective::CallLabel scope(*groups_->world, label);
      int64_t one = 1, sum = 0;
      groups_->world->allreduce(&one, &sum, 1, DType::kInt64, deadline);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("setting plan version {}: {}{}", p.version, e.what(),
                                        e.code() == ErrorCode::kMismatch
                                            ? " (here: every worker must set the same plan; are "
                                              "the workers' CORTADO_PLAN files or declared tensors "
                                              "different?)"
                                            : ""));
    }
  }
  // The servers' residuals of the old plan's keys come back first (a plan
  // set directly had no flushed last round), then every encode point of the
  // old plan is retired (retire(): residuals into the members' next inputs),
  // and its shard keys released.
  if (plan_) flushServerResiduals(deadline);
  for (auto& [name, t] : tensors_) retire(*t, true);
  for (auto& g : groupStates_) retire(*g, true);
  groupStates_.clear();
  const uint64_t gen = ++generation_;  // names each plan's shard keys apart
  for (const auto& [name, option] : p.tensors) {
    TensorState& t = *tensors_.at(name);
    configure(t, option, name, gen, deadline);
    t.group = nullptr;
  }
  // Each group: one state over its members' concatenation, with its own
  // encode points and shard keys (the members keep theirs, for a batch that
  // holds only some of them).
  for (size_t g = 0; g < p.groups.size(); ++g) {
    const auto& members = p.groups[g];
    auto s = std::make_unique<TensorState>();
    s->name = fmt::format("fused{}:{}..{}", members.size(), members.front(), members.back());
    s->seedBase = std::hash<std::string>{}(s->name);
    for (const std::string& m : members) {
      TensorState& t = *tensors_.at(m);
      s->parts.push_back(&t);
      s->partOffsets.push_back(s->n);
      s->n += t.n;
      t.group = s.get();
    }
    configure(*s, p.tensors.at(members.front()),
              fmt::format("group{}:{}..{}", g, members.front(), members.back()), gen, deadline);
    groupStates_.push_back(std::move(s));
  }
  // The collectives' padded pair (dense reduce-scatter, reduce, allgather)
  // and the fusion buffer (fusible options) go back when the new plan has
  // no step that uses them, after the old plan's work on them.
  bool padded = false, fusible = false;
  for (const auto& [name, option] : p.tensors) {
    fusible = fusible || option.fusible();
    for (const Step& s : option.steps)
      padded = padded || (s.kind == StepKind::kComm && !s.compressed &&
                          (s.op == CommOp::kReduceScatter || s.op == CommOp::kReduce ||
                           s.op == CommOp::kAllgather));
  }
  const bool dropPadded = !padded && (padded_.capacity() > 0 || block_.capacity() > 0);
  const bool dropFusion = !fusible && fusionBuffer_.capacity() > 0;
  if (dropPadded || dropFusion) {
    std::unique_ptr<device::Event> done = device_->createEvent();
    for (device::Stream* s : {compute_.get(), copy_.get()}) {
      done->record(*s);
      done->synchronize(deadline, "the old plan's work, before its buffers go back");
    }
    if (dropPadded) padded_.reset(), block_.reset();
    if (dropFusion) fusionBuffer_.reset();
  }
  plan_ = p;
}

void Executor::flushServerResiduals(Deadline deadline) {
  std::vector<TensorState*> owing;
  for (auto& [name, t] : tensors_)
    if (t->serverOwes) owing.push_back(t.get());
  for (auto& g : groupStates_)
    if (g->serverOwes) owing.push_back(g.get());
  if (owing.empty()) return;
  // The round is no training iteration: not profiled, not recorded by the
  // fusion search, and flushed (lastRound()).
  struct Restore {
    Executor& e;
    bool profiling, recording;
    ~Restore() {
      e.forceFlush_ = false;
      if (e.prof_) e.prof_->active = profiling;
      e.searchRecording_ = recording;
    }
  } restore{*this, prof_ && prof_->active, searchRecording_};
  if (prof_) prof_->active = false;
  searchRecording_ = false;
  forceFlush_ = true;
  device::Device& dev = *device_;
  std::unique_ptr<device::Stream> stream = dev.createStream();
  std::unique_ptr<device::Event> done = dev.createEvent();
  const float share = 1.0f / float(std::max(1, topo_.size));
  device::Buffer buffer(dev, false);  // each round's input and sums, grown to the largest
  for (TensorState* s : owing) {
    // A group's round runs on the group's state when the batch holds each
    // of its members once (units()); a tensor's alone.
    std::vector<TensorState*> members = s->parts;
    if (members.empty()) members.push_back(s);
    uint64_t total = 0;
    for (const TensorState* m : members) total += m->n;
    float* x = buffer.floats(total);
    dev.fill(x, 0.0f, total, *stream);
    done->record(*stream);
    done->synchronize(deadline, "zeroing the flush round's input");
    std::vector<BatchItem> items;
    uint64_t off = 0;
    for (const TensorState* m : members) {
      items.push_back(BatchItem{m->name, x + off, x + off, m->n});
      off += m->n;
    }
    runPlanned(items, ReduceOp::kSum, deadline);
    std::vector<float> sum(total);
    dev.copy(sum.data(), x, total * sizeof(float), device::CopyKind::kDeviceToHost, *stream);
    done->record(*stream);
    done->synchronize(deadline, "the flush round's sums");
    off = 0;
    for (TensorState* m : members) {
      for (uint64_t i = 0; i < m->n; ++i) {
        if (sum[off + i] == 0.0f) continue;
        if (m->carry.empty()) m->carry.assign(m->n, 0.0f);
        m->carry[i] += sum[off + i] * share;
      }
      off += m->n;
    }
    CORTADO_LOG_DEBUG("plan switch: flushed the servers' residuals of '{}' ({} elements)", s->name,
                      total);
  }
}

void Executor::retire(TensorState& s, bool releaseKeys) {
  // Each encode point's error-feedback residual (mass encoded but not yet
  // sent) joins its tensors' next inputs at their element offsets (carry),
  // so that whatever runs them next sends it; the encode points start again
  // from zero. Sums are linear, so nothing is lost or sent twice. An encode
  // point that several ranks run on the same data (replicas) holds the same
  // residual on each, owed once: each folds its share. With DGC's momentum
  // the carry is v + m u: what the point's next step would have put into v
  // besides the new gradient; the run that takes the carry then restarts the
  // momentum (EncodeContext::restartMomentum), so that v gets the carry once
  // and u does not keep it (Run::restart_).
  auto partAt = [&](uint64_t element) -> std::pair<TensorState*, uint64_t> {
    if (s.parts.empty()) return {&s, 0};
    size_t k = size_t(std::upper_bound(s.partOffsets.begin(), s.partOffsets.end(), element) -
                      s.partOffsets.begin()) -
               1;
    return {s.parts[k], s.partOffsets[k]};
  };
  for (const auto& [step, pieces] : s.efPieces) {
    auto it = s.ef.find(step);
    if (it == s.ef.end()) continue;
    const float share = 1.0f / float(std::max<uint64_t>(1, s.efReplicas[step]));
    const float m = it->second->momentum();
    for (const auto& [off, count] : pieces) {
      device::HostFloats r = it->second->residual(off);
      if (m > 0) {
        const device::HostFloats u = it->second->velocity(off);
        for (size_t i = 0; i < r.size() && i < u.size(); ++i) r[i] += m * u[i];
      }
      for (uint64_t i = 0; i < r.size() && off + i < s.n; ++i) {
        if (r[i] == 0.0f) continue;
        auto [t, base] = partAt(off + i);
        if (t->carry.empty()) t->carry.assign(t->n, 0.0f);
        t->carry[off + i - base] += r[i] * share;
      }
    }
  }
  s.ef.clear();
  s.efPieces.clear();
  s.efReplicas.clear();
  if (s.parts.empty()) s.layout = nullptr;
  for (TensorState* t : s.parts)
    if (t->layout == &s) t->layout = nullptr;
  if (!releaseKeys) return;
  // The old plan's shard keys are done on this worker (its last round's
  // answer is in): the servers free each once all its pushers said so.
  // Without this every switch left a plan's sums, answers and residuals
  // on the servers for the rest of the job (about 2.7x the model's bytes
  // per switch on resnet101, run X in `git show 68cab89:docs/benchmarks.md`).
  // Its own shard's key is released to the servers (also where it never
  // ran: they may hold the other machines' pushes of it); the other local
  // ranks', which it declared but does not push, on this worker alone. So
  // every worker has released every key it declared, and an executor that
  // declares the same tensor names later agrees on new keys everywhere.
  const size_t own = s.ownShard(topo_.localRank);
  for (size_t k = 0; k < s.shardKeys.size(); ++k) {
    if (k == own)
      worker_.release(s.shardKeys[k]);
    else
      worker_.releaseHere(s.shardKeys[k]);
  }
}

void Executor::configure(TensorState& t, const plan::TensorOption& option,
                         const std::string& keyBase, uint64_t gen, Deadline deadline) {
  const int L = topo_.localSize, M = topo_.numMachines, W = topo_.size;
  // An option without a codec has no payloads: the old option's payload
  // buffers go back, after the work that may still read them.
  if (option.codec.empty() && (t.payloads.capacity() > 0 || t.pinnedBytes.capacity() > 0)) {
    t.computed->record(*compute_);
    t.computed->synchronize(deadline, "the old plan's work, before its payload buffers go back");
    t.copied->synchronize(deadline, "the old plan's copies, before its payload buffers go back");
    t.payloads.reset();
    t.pinnedBytes.reset();
  }
  t.option = option;
  t.pushedTotal = &pushedBytes_;
  t.compactSparse = &compactSparse_;
  t.codec.reset();
  t.sparseDecoder.reset();
  t.deviceCodec.reset();
  t.deviceSparseDecoder.reset();
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
    // The device's twins; none where the device has no such codec (its
    // "gpu" steps then run on the CPU).
    if (device_->kind() == device::Kind::kHost) {
      t.deviceCodec = t.codec;
      t.deviceSparseDecoder = t.sparseDecoder;
    } else {
      const auto& reg = device_->codecs();
      const compressor::Device where = device_->codecDevice();
      const std::string name = t.codecSpec.substr(0, t.codecSpec.find(':'));
      if (reg.has(name, where)) {
        t.deviceCodec = reg.create(t.codecSpec, where);
        if (t.codec->sparse() && reg.has("topk", where))
          t.deviceSparseDecoder = reg.create("topk", where);
        if (t.codec->sparse() && !t.deviceSparseDecoder) t.deviceCodec.reset();
      } else {
        CORTADO_LOG_INFO("tensor '{}': {} has no '{}' codec; its gpu steps run on the CPU", t.name,
                         device_->name(), name);
      }
    }
  }
  const Region whole{0, t.n};
  t.cuts = {0, t.n};
  auto addBlocks = [&](const Region& r, int g) {
    for (int i = 0; i <= g; ++i)
      t.cuts.insert(std::min(r.end(), r.off + uint64_t(i) * blockSize(r, g)));
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
      std::string key = fmt::format("{}/plan{}/shard{}", keyBase, gen, s);
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

Executor::Memory Executor::memory() const {
  Memory m;
  auto add = [&](const TensorState& s) {
    for (const auto& [step, ef] : s.ef)
      if (ef) m.residuals += ef->heldBytes();
    m.carry += s.carry.capacity() * sizeof(float);
    m.buffers += s.staged.capacity() + s.payloads.capacity() + s.pinned.capacity() +
                 s.pinnedBytes.capacity() + s.buffer.capacity();
  };
  for (const auto& [name, t] : tensors_) add(*t);
  for (const auto& g : groupStates_) add(*g);
  if (fused_) add(*fused_);
  m.buffers += padded_.capacity() + block_.capacity() + fusionBuffer_.capacity();
  // A bf16 state's fp32 scratch (shared by the process's error feedback; 0
  // with fp32 state): in host memory for the CPU's encodes, in the device's
  // for its own (CUDA).
  m.residuals += compressor::ErrorFeedback::scratchBytes() + device_->errorFeedbackScratchBytes();
  return m;
}

uint64_t Executor::runs(const std::string& name) const {
  auto it = tensors_.find(name);
  CORTADO_ENFORCE(it != tensors_.end(), ErrorCode::kInvalidArgument,
                  "tensor '{}' was never declared to the executor", name);
  return it->second->iteration();
}

std::optional<uint64_t> Executor::declaredElements(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return it->second->n;
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

}  // namespace cortado::executor
