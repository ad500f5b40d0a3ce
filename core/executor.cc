#include "core/executor.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <system_error>

#include "compressor/registry.h"
#include "core/common/logging.h"
#include "core/executor_run.h"

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
  for (size_t i = 0; i < states.size(); ++i) noteReady(*states[i], items[i]);
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
  f.members.clear();
  for (const TensorState* t : states)
    f.members += fmt::format("{}{}#{}", f.members.empty() ? "" : ", ", t->name, t->round);
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

}  // namespace cortado::executor
