// GraVAC in the plan executor (executor.h, "GraVAC"; docs/codecs.md, "GraVAC
// in the plan executor"): one runBatch() is one iteration. Every worker
// encodes its gradients at both CFs, the energies are summed over the
// workers, every controller takes the same decision, and the messages chosen
// are summed by the plan (or, on a dense iteration, raw).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "compressor/format.h"
#include "compressor/gravac_compressor.h"
#include "compressor/payload.h"
#include "compressor/sparse_sum.h"
#include "core/common/logging.h"
#include "core/executor/run.h"

namespace cortado::executor {

plan::Plan gravacCarrierPlan(const plan::Plan& p, double cf) {
  CORTADO_ENFORCE(std::isfinite(cf) && cf >= 1.0, ErrorCode::kInvalidArgument,
                  "GraVAC carrier plan: CF {} is not a compression factor (>= 1)", cf);
  plan::Plan q = p;
  q.version = p.version + 1;
  const std::string spec = fmt::format("topk:ratio={}", 1.0 / cf);
  for (auto& [name, option] : q.tensors)
    if (!option.codec.empty()) option.codec = spec;
  return q;
}

void Executor::setGravacReplanner(GravacReplanner r, std::string what) {
  gravacReplanner_ = std::move(r);
  gravacReplannerName_ = gravacReplanner_ ? std::move(what) : std::string();
}

std::string Executor::gravacReplannerName() const {
  return gravacReplanner_ ? gravacReplannerName_ : "the running plan's options (no re-planner)";
}

plan::Plan Executor::gravacReplan(double cf) {
  plan::Plan next = gravacReplanner_ ? gravacReplanner_(*plan_, cf) : *plan_;
  // The carrier's version must be new whatever the re-planner numbered it.
  next.version = std::max(next.version, plan_->version);
  return gravacCarrierPlan(next, cf);
}

void Executor::setGravac(const std::optional<compressor::GravacOptions>& o,
                         double samplesPerIteration) {
  if (!o) {
    if (!gravac_) return;
    // GraVAC's residuals (with DGC, v + m u: what its next step would add
    // besides the gradient) join each tensor's next input, as a plan
    // switch's do (retire): nothing is lost when it is turned off.
    const float m = gravac_->momentum();
    for (auto& [name, t] : tensors_) {
      auto r = gravac_->residual(t->seedBase);
      auto u = gravac_->velocity(t->seedBase);
      for (size_t i = 0; i < r.size() && i < t->n; ++i) {
        const float v = r[i] + (m > 0 && i < u.size() ? m * u[i] : 0.0f);
        if (v == 0.0f) continue;
        if (t->carry.empty()) t->carry.assign(t->n, 0.0f);
        t->carry[i] += v;
      }
    }
    gravac_.reset();
    gravacNext_.reset();
    gravacPlanGen_ = 0;
    gravacPlanRatio_ = 0;
    return;
  }
  CORTADO_ENFORCE(device_->kind() == device::Kind::kHost, ErrorCode::kInvalidArgument,
                  "worker {}: GraVAC in the plan executor runs on the host device, not {}: run "
                  "the executor on host memory (CORTADO_DEVICE=host)",
                  topo_.rank, device_->name());
  CORTADO_ENFORCE(online_.window == 0 && !searchOptions_, ErrorCode::kInvalidArgument,
                  "worker {}: GraVAC re-plans when its CF moves; online re-planning "
                  "(CORTADO_PROFILE_WINDOW) and the fusion search change the plan too: turn "
                  "them off first",
                  topo_.rank);
  // At an iteration boundary: every tensor ran as often (GraVAC's batches
  // hold each once). It starts afresh (zero residuals, the controller at
  // min_ratio); what the plan's encode points hold is carried by the next
  // switch (retire), as for any plan change.
  for (const auto& [name, t] : tensors_)
    CORTADO_ENFORCE(t->iteration() == tensors_.begin()->second->iteration(),
                    ErrorCode::kInvalidArgument,
                    "worker {}: turn GraVAC on at an iteration boundary: tensor '{}' ran {} times, "
                    "'{}' {} (run every declared tensor as often first)",
                    topo_.rank, name, t->iteration(), tensors_.begin()->first,
                    tensors_.begin()->second->iteration());
  CORTADO_ENFORCE(std::isfinite(samplesPerIteration) && samplesPerIteration > 0,
                  ErrorCode::kInvalidArgument,
                  "GraVAC: samplesPerIteration is {}; give the samples of one iteration over "
                  "all workers (> 0)",
                  samplesPerIteration);
  gravac_ =
      std::make_unique<compressor::GravacCompressor>(*codecs_, *o, topo_.size, samplesPerIteration);
  gravacHistory_.clear();
  gravacBytes_.clear();
  gravacSeconds_.clear();
  gravacNext_.reset();
  gravacPlanGen_ = 0;
  gravacPlanRatio_ = 0;
  gravacTimed_ = false;
  gravacPaused_ = false;
  if (topo_.rank == 0)
    CORTADO_LOG_INFO(
        "GraVAC on {} workers ({} {}x-{}x): a CF 2x away from the plan's is "
        "re-planned by {}",
        topo_.size, o->codec, o->minRatio, o->maxRatio, gravacReplannerName());
}

std::array<double, 5> Executor::agreedSums(std::array<double, 5> local, Deadline deadline) {
  std::array<double, 5> sum{};
  if (groups_) {
    // Every rank sums the same numbers in rank order, so every rank has the
    // same bits (an allreduce may add in another order on each rank).
    std::vector<double> all(5 * size_t(topo_.size));
    collective::CallLabel scope(*groups_->world, "GraVAC: an iteration's energies, time and pause marks");
    groups_->world->allgather(local.data(), 5, all.data(), DType::kFloat64, deadline);
    for (int r = 0; r < topo_.size; ++r)
      for (size_t k = 0; k < 5; ++k) sum[k] += all[5 * size_t(r) + k];
    return sum;
  }
  // The servers sum once and answer every worker the same bytes.
  sumThroughServers("cortado.gravac.sums", local.data(), sum.data(), local.size(), deadline);
  return sum;
}

void Executor::sumDense(std::span<const BatchItem> items, Deadline deadline) {
  if (groups_) {
    for (const BatchItem& it : items) {
      collective::CallLabel scope(*groups_->world,
                                  fmt::format("GraVAC: dense iteration of '{}'", it.name));
      groups_->world->allreduce(it.input, it.output, it.numElements, DType::kFloat32, deadline);
    }
    return;
  }
  // One uncompressed key per tensor, all rounds in flight at once.
  std::vector<Handle> handles;
  for (const BatchItem& it : items) {
    const std::string key = "cortado.gravac.dense/" + it.name;
    if (gravacDenseKeys_.insert(key).second)
      worker_.declare(key, DType::kFloat32, it.numElements, deadline);
    handles.push_back(worker_.pushPull(key, DType::kFloat32, it.numElements, it.input, it.output,
                                       ReduceOp::kSum, 0));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    Status st = handles[i].wait(deadline);
    if (!st.ok())
      throw Error(st.code(),
                  fmt::format("GraVAC: dense iteration of '{}': {}", items[i].name, st.message()));
    pushedBytes_ += handles[i].pushedBytes();
  }
}

size_t Executor::gravacMessageStep(const TensorState& s) const {
  if (!s.codec || s.codec->id() != compressor::CodecId::kTopK) return kNoMessageStep;
  auto size = [&](plan::Scope scope) {
    if (!groups_) return 1;
    switch (scope) {
      case plan::Scope::kFlat: return groups_->world->size();
      case plan::Scope::kIntra: return groups_->intra->size();
      case plan::Scope::kInter: return groups_->inter->size();
    }
    return 1;
  };
  for (const plan::Step& st : s.option.steps) {
    if (st.kind == plan::StepKind::kEncode) return size_t(&st - s.option.steps.data());
    // A decode, a push, a Zen step or a collective over more than this
    // rank changes the data before the encode.
    if (st.kind == plan::StepKind::kDecode || st.op == plan::CommOp::kPush ||
        st.op == plan::CommOp::kPull || plan::isZen(st.op) || size(st.scope) > 1)
      return kNoMessageStep;
  }
  return kNoMessageStep;
}

void Executor::appendPairs(const TensorState& t, uint64_t offset, detail::GivenPayload& out) const {
  const std::span<const std::byte> msg = gravac_->message(t.seedBase);
  const compressor::PayloadHeader h = compressor::parseHeader(msg);
  const size_t first = out.index.size();
  if (compressor::listsIndices(h.codec)) {
    // Top-k and DGC: k u32 indices, then their k f32 values.
    CORTADO_ENFORCE(h.bodyBytes == 8 * h.count && h.numel == t.n, ErrorCode::kInternal,
                    "GraVAC's message for '{}' is not a sparse payload of its {} elements: {}",
                    t.name, t.n, compressor::describe(h));
    const std::byte* idx = msg.data() + compressor::kHeaderBytes;
    const std::byte* val = idx + 4 * h.count;
    out.index.reserve(first + h.count);
    out.value.reserve(first + h.count);
    // Zero values are left out: where the compensated tensor has fewer
    // non-zeros than k (an embedding's rows), the selection filled the
    // payload up with zeros, which add nothing to the sum; so a worker sends
    // min(k, non-zeros) pairs (docs/codecs.md, "Compact index lists"). Its
    // error feedback was committed on the whole payload, whose zeros
    // subtract nothing.
    for (uint64_t j = 0; j < h.count; ++j) {
      const uint32_t e = compressor::loadLe<uint32_t>(idx + 4 * j);
      CORTADO_ENFORCE(e < t.n, ErrorCode::kInternal,
                      "GraVAC's message for '{}' lists index {} of {} elements", t.name, e, t.n);
      const float v = compressor::loadLe<float>(val + 4 * j);
      if (v == 0.0f) continue;
      out.index.push_back(offset + e);
      out.value.push_back(v);
    }
  } else {
    // Random-k sends values only (its indices follow from the round seed):
    // the decoded message's non-zeros.
    std::vector<float> dense(t.n, 0.0f);
    gravac_->decompressAdd(t.seedBase, msg, dense.data());
    for (uint64_t e = 0; e < t.n; ++e)
      if (dense[e] != 0.0f) {
        out.index.push_back(offset + e);
        out.value.push_back(dense[e]);
      }
  }
  // The pieces are cut by index: ascending, each once, as the top-k and DGC
  // formats list them and the dense scan above finds them.
  for (size_t j = first + 1; j < out.index.size(); ++j)
    CORTADO_ENFORCE(out.index[j] > out.index[j - 1], ErrorCode::kInternal,
                    "GraVAC's message for '{}' lists index {} after {}: not ascending", t.name,
                    out.index[j] - offset, out.index[j - 1] - offset);
}

void Executor::runGravac(std::span<const BatchItem> items, ReduceOp op, Deadline deadline) {
  std::vector<TensorState*> states;
  std::set<const TensorState*> seen;
  for (const BatchItem& it : items) {
    TensorState* t = &checkedState(it.name, it.input, it.output, it.numElements);
    CORTADO_ENFORCE(seen.insert(t).second, ErrorCode::kInvalidArgument,
                    "worker {}: GraVAC: tensor '{}' is twice in one batch; a batch is one "
                    "iteration, each tensor once",
                    topo_.rank, it.name);
    states.push_back(t);
  }
  CORTADO_ENFORCE(items.size() == tensors_.size(), ErrorCode::kInvalidArgument,
                  "worker {}: GraVAC decides once per iteration from every tensor's gain: run "
                  "each of the {} declared tensors once per runBatch (this batch has {})",
                  topo_.rank, tensors_.size(), items.size());
  ensurePlan(deadline);
  // GraVAC's own stages, besides the plan's steps, in the trace (tensor
  // "(every tensor)"): its two-level encode of every gradient, the agreed
  // sums, the message made dense for the plan, and a re-plan's switch.
  const int64_t round = int64_t(states.front()->iteration());
  auto span = [&](const char* stage, const char* lane, double start) {
    if (tracer_) tracer_->record(stage, "(every tensor)", round, lane, start, Tracer::now());
  };
  // A re-plan decided in the last iteration takes effect here, at the
  // boundary (that iteration's runs flushed the servers' residuals).
  if (gravacNext_) {
    const double t0 = tracer_ ? Tracer::now() : 0;
    plan::Plan p = std::move(*gravacNext_);
    gravacNext_.reset();
    setPlan(p, deadline);
    gravacPlanGen_ = generation_;
    ++gravacReplans_;
    span("gravac switch", "network", t0);
  }
  const auto now = std::chrono::steady_clock::now();
  const double seconds =
      gravacTimed_ ? std::chrono::duration<double>(now - gravacLast_).count() : 0.0;
  gravacLast_ = now;
  gravacTimed_ = true;

  // 1. Both levels of every gradient; random-k's round seed is the same on
  // every worker (the tensor's name and the iteration).
  const uint64_t iteration = gravac_->controller().iteration() + 1;
  const double t1 = tracer_ ? Tracer::now() : 0;
  for (size_t i = 0; i < items.size(); ++i) {
    compressor::EncodeContext ctx;
    ctx.seed = compressor::format::hash2(states[i]->seedBase, iteration);
    gravac_->prepare(states[i]->seedBase, items[i].input, items[i].numElements, ctx);
  }
  span("gravac encode", "cpu", t1);
  // 2. One decision on every worker, from the energies summed over them.
  const double t2 = tracer_ ? Tracer::now() : 0;
  const compressor::GravacSums mine = gravac_->localSums();
  const double paused = gravacPaused_ ? 1.0 : 0.0;
  gravacPaused_ = false;
  const std::array<double, 5> agreed =
      agreedSums({mine.compensated, mine.minimum, mine.candidate, seconds, paused}, deadline);
  span("gravac agree", "network", t2);
  // A pause marked by any worker (excludeGravacPause) leaves the time out on
  // every worker: the sum of the marks is the same everywhere.
  const double previousSeconds = agreed[4] > 0 ? 0.0 : agreed[3] / double(topo_.size);
  const compressor::GravacStep step =
      gravac_->decide({agreed[0], agreed[1], agreed[2]}, previousSeconds);
  const bool changed = gravacHistory_.empty() || gravacHistory_.back().ratio != step.ratio;
  gravacHistory_.push_back(step);
  gravacSeconds_.push_back(previousSeconds);
  const uint64_t pushedBefore = pushedBytes_;
  struct Count {
    std::vector<uint64_t>& bytes;
    const uint64_t& total;
    uint64_t before;
    ~Count() { bytes.push_back(total - before); }
  } count{gravacBytes_, pushedBytes_, pushedBefore};
  if (changed && topo_.rank == 0)
    CORTADO_LOG_INFO(
        "GraVAC iteration {}: sends the {} at CF {} (gains {:.4f} at CF {}, {:.4f} "
        "at CF {}; plan CF {})",
        step.iteration, compressor::gravacLevelName(step.level), step.ratio, step.gainMin,
        step.minRatio, step.gainCandidate, step.candidateRatio, gravacPlanRatio_);

  // 3. A dense iteration sums every g_ef raw, outside the plan.
  std::vector<BatchItem> sent(items.begin(), items.end());
  if (step.level == compressor::GravacLevel::kDense) {
    for (size_t i = 0; i < items.size(); ++i) {
      auto msg = gravac_->message(states[i]->seedBase);
      sent[i].input = reinterpret_cast<const float*>(msg.data());
    }
    sumDense(sent, deadline);
    if (op == ReduceOp::kAverage)
      for (const BatchItem& it : sent)
        for (uint64_t k = 0; k < it.numElements; ++k) it.output[k] /= float(topo_.size);
    for (TensorState* t : states) ++t->round;
    return;
  }
  // 4. The plan carries the CF sent: the first sparse iteration sets it,
  // and a CF 2x or more away from it re-plans for the next iteration.
  if (gravacPlanGen_ != generation_) {
    const double t4 = tracer_ ? Tracer::now() : 0;
    setPlan(gravacReplan(step.ratio), deadline);
    span("gravac switch", "network", t4);
    gravacPlanGen_ = generation_;
    gravacPlanRatio_ = step.ratio;
    if (topo_.rank == 0)
      CORTADO_LOG_INFO("GraVAC iteration {}: the plan carries CF {} (planned by {})",
                       step.iteration, step.ratio, gravacReplannerName());
  } else if (step.ratio >= 2 * gravacPlanRatio_ || step.ratio <= gravacPlanRatio_ / 2) {
    const double t5 = tracer_ ? Tracer::now() : 0;
    gravacNext_ = gravacReplan(step.ratio);
    span("gravac re-plan", "cpu", t5);
    if (topo_.rank == 0)
      CORTADO_LOG_INFO(
          "GraVAC iteration {}: CF {} is {:.3g}x the plan's CF {}: re-planned by {}, the "
          "new plan (version {}, {} of {} tensors compressed, {} groups) takes over at the next "
          "iteration",
          step.iteration, step.ratio, step.ratio / gravacPlanRatio_, gravacPlanRatio_,
          gravacReplannerName(), gravacNext_->version,
          std::count_if(gravacNext_->tensors.begin(), gravacNext_->tensors.end(),
                        [](const auto& kv) { return kv.second.compressed(); }),
          gravacNext_->tensors.size(), gravacNext_->groups.size());
    gravacPlanRatio_ = step.ratio;
    gravacFlush_ = true;  // this iteration is the current plan's last round
  }
  // 5. The messages go to the plan (after any switch above: the states are
  // the plan's). Where the plan's first encode sees this worker's own data
  // (gravacMessageStep), the message is that encode's payload as it is: its
  // (index, value) pairs, a group's at each member's offset. Elsewhere (an
  // option without a codec, or one that sums before it encodes) the message
  // is decoded into the item's output and the plan runs on that.
  const double t3 = tracer_ ? Tracer::now() : 0;
  std::map<TensorState*, std::unique_ptr<detail::GivenPayload>> given;
  for (size_t i = 0; i < items.size(); ++i) {
    TensorState* unit = states[i]->group ? states[i]->group : states[i];
    const size_t at = gravacMessageStep(*unit);
    if (at == kNoMessageStep) {
      float* out = items[i].output;
      std::fill(out, out + items[i].numElements, 0.0f);
      gravac_->decompressAdd(states[i]->seedBase, gravac_->message(states[i]->seedBase), out);
      sent[i].input = out;
      continue;
    }
    sent[i].input = items[i].output;  // not read: the message stands for it
    auto& g = given[unit];
    if (g) continue;  // a group: made at its first member
    g = std::make_unique<detail::GivenPayload>();
    if (unit->parts.empty()) {
      appendPairs(*states[i], 0, *g);
    } else {
      for (size_t k = 0; k < unit->parts.size(); ++k)
        appendPairs(*unit->parts[k], unit->partOffsets[k], *g);
    }
    unit->given = g.get();
    unit->givenStep = at;
  }
  struct Ungive {
    std::map<TensorState*, std::unique_ptr<detail::GivenPayload>>& g;
    ~Ungive() {
      for (auto& [state, payload] : g) state->given = nullptr;
    }
  } ungive{given};
  span("gravac message", "cpu", t3);
  struct Unflush {
    bool& f;
    ~Unflush() { f = false; }
  } unflush{gravacFlush_};
  runPlanned(sent, op, deadline);
}

}  // namespace cortado::executor
