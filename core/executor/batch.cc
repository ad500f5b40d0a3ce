// Batches (Executor::run, Executor::runBatch): which items run alone and which
// fused, and how the lone ones are interleaved: in phases (every item's local
// steps, then every item's next communication step, ...) or with the encode
// pipeline. One tensor's steps are in steps.cc, fused groups in groups.cc.
#include <algorithm>
#include <future>
#include <map>
#include <system_error>

#include "core/common/logging.h"
#include "core/executor/executor.h"
#include "core/executor/run.h"

namespace cortado::executor {

using detail::Run;

namespace {

// The units that run alone, in phases (setPhaseBytes): consecutive units up
// to phaseBytes of input (0: one unit a phase, so one after the other), each
// state at most once (a tensor twice in a batch runs its rounds in turn). In
// a phase every unit's local steps run, then every unit's next communication
// step, and so on until all are done.
template <typename Start, typename Complete>
void runPhases(std::vector<Executor::Unit>& units, const Start& start, const Complete& complete,
               ReduceOp op, uint64_t phaseBytes, uint64_t& phasedSteps) {
  for (size_t k = 0; k < units.size();) {
    std::vector<Executor::Unit*> phase;
    uint64_t bytes = 0;
    for (; k < units.size(); ++k) {
      Executor::Unit& u = units[k];
      const uint64_t b = u.state->n * sizeof(float);
      if (!phase.empty() && bytes + b > phaseBytes) break;
      if (std::any_of(phase.begin(), phase.end(),
                      [&](const Executor::Unit* v) { return v->state == u.state; }))
        break;
      phase.push_back(&u);
      bytes += b;
    }
    std::vector<std::unique_ptr<Run>> runs;
    for (Executor::Unit* u : phase) runs.push_back(start(*u));
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
      complete(*phase[n]);
    }
  }
}

}  // namespace

void Executor::run(const std::string& name, const float* input, float* output, uint64_t numElements,
                   ReduceOp op, Deadline deadline) {
  BatchItem item{name, input, output, numElements};
  runBatch(std::span<const BatchItem>(&item, 1), op, deadline);
}

std::vector<Executor::Unit> Executor::units(std::span<const BatchItem> items,
                                            std::span<TensorState* const> states,
                                            std::vector<std::vector<size_t>>& byOption) const {
  // A plan group runs as one unit when the batch holds each of its tensors
  // exactly once, at the place of its last one (when the group is complete);
  // otherwise its tensors run on their own states.
  std::map<const TensorState*, int> count;
  for (const TensorState* t : states) ++count[t];
  auto whole = [&](const TensorState& g) {
    return std::all_of(g.parts.begin(), g.parts.end(), [&](const TensorState* p) {
      auto it = count.find(p);
      return it != count.end() && it->second == 1;
    });
  };
  std::map<TensorState*, std::vector<size_t>> seen;  // group -> its items so far
  std::vector<Unit> out;
  for (size_t i = 0; i < items.size(); ++i) {
    TensorState* t = states[i];
    if (t->group && whole(*t->group)) {
      auto& got = seen[t->group];
      got.push_back(i);
      if (got.size() < t->group->parts.size()) continue;
      Unit u{t->group, nullptr, nullptr, {}};
      for (const TensorState* p : t->group->parts)  // the members' order
        u.items.push_back(
            *std::find_if(got.begin(), got.end(), [&](size_t j) { return states[j] == p; }));
      out.push_back(std::move(u));
      continue;
    }
    // Tensor fusion by size: per fusible option in the order of its first
    // item, its items packed in order (runBatch runs them after the units).
    if (fusionBytes_ != 0 && t->option.fusible()) {
      auto it = std::find_if(byOption.begin(), byOption.end(), [&](const std::vector<size_t>& g) {
        return states[g.front()]->option == t->option;
      });
      if (it == byOption.end())
        byOption.push_back({i});
      else
        it->push_back(i);
      continue;
    }
    out.push_back(Unit{t, items[i].input, items[i].output, {i}});
  }
  return out;
}

void Executor::prepare(Unit& u, std::span<const BatchItem> items, Deadline deadline) {
  TensorState& s = *u.state;
  // A tensor whose residuals are held by another state's encode points (its
  // group's, or its own after running in a group) gets them back as carry
  // first: the group boundaries changed.
  auto adopt = [&](TensorState& t) {
    if (t.layout && t.layout != &s) retire(*t.layout, false);
    t.layout = &s;
  };
  // A state that runs GraVAC's message (TensorState::given) does not read
  // its input: what its tensors owe (carry) joins GraVAC's residuals
  // instead, sent or kept by its next iteration.
  auto owed = [&](TensorState& t) {
    if (!s.given || t.carry.empty()) return;
    gravac_->addResidual(t.seedBase, t.carry);
    detail::dropCarry(t);
  };
  if (s.parts.empty()) {
    adopt(s);
    owed(s);
    return;
  }
  for (TensorState* t : s.parts) adopt(*t), owed(*t);
  s.round = s.parts.front()->round;  // the trace's iteration, as for fusion by size
  s.flushRounds = s.parts.front()->flushRounds;
  s.members.clear();
  std::vector<const BatchItem*> its;
  for (size_t k = 0; k < s.parts.size(); ++k) {
    const TensorState& t = *s.parts[k];
    its.push_back(&items[u.items[k]]);
    s.members += fmt::format("{}{}#{}", s.members.empty() ? "" : ", ", t.name, t.round);
  }
  const detail::Lanes l = lanes();
  l.bind(s);
  float* at = detail::gatherGroup(l, s.parts, its, s.buffer, deadline, s.carried);
  if (at != s.buffer.data()) ++inPlaceGroupRuns_;
  u.in = u.out = at;
}

void Executor::complete(const Unit& u, std::span<const BatchItem> items, Deadline deadline) {
  TensorState& s = *u.state;
  if (!s.parts.empty()) {
    std::vector<const BatchItem*> its;
    for (size_t k = 0; k < s.parts.size(); ++k) its.push_back(&items[u.items[k]]);
    const detail::Lanes l = lanes();
    detail::scatterGroup(l, u.out, s.parts, its);
    l.settle(s, deadline, "the group's results");
  }
  s.serverOwes = !lastRound() && std::any_of(s.option.steps.begin(), s.option.steps.end(),
                                              [](const plan::Step& st) {
                                                return st.kind == plan::StepKind::kComm &&
                                                       st.op == plan::CommOp::kPull && st.compressed;
                                              });
  // setPlan's flush round is no training iteration (TensorState::iteration).
  for (TensorState* t : s.parts) t->ranRound(forceFlush_);
  if (s.parts.empty())
    s.ranRound(forceFlush_);
  else
    ++groupRuns_;
}

void Executor::runBatch(std::span<const BatchItem> items, ReduceOp op, Deadline deadline) {
  if (gravac_) {
    runGravac(items, op, deadline);
    return;
  }
  runPlanned(items, op, deadline, nullptr);
}

void Executor::runBatch(std::span<const BatchItem> items, ReduceOp op, Deadline deadline,
                        const AwaitItem& await) {
  CORTADO_ENFORCE(bool(await), ErrorCode::kInvalidArgument,
                  "runBatch: the AwaitItem is empty; use runBatch() without one for items that are "
                  "ready");
  CORTADO_ENFORCE(!gravac_, ErrorCode::kInvalidArgument,
                  "runBatch with an AwaitItem: GraVAC (setGravac) sums the batch at once; hand over "
                  "the {} items when they are ready, without an AwaitItem",
                  items.size());
  runPlanned(items, op, deadline, &await);
}

void Executor::runPlanned(std::span<const BatchItem> items, ReduceOp op, Deadline deadline,
                          const AwaitItem* await) {
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
  // With an AwaitItem each item is ready when its await returns, on the
  // thread that runs its execution's first steps.
  auto awaitItems = [&](std::span<const size_t> which) {
    if (!await) return;
    for (size_t i : which) {
      (*await)(i);
      noteReady(*states[i], items[i]);
    }
  };
  if (!await)
    for (size_t i = 0; i < states.size(); ++i) noteReady(*states[i], items[i]);
  const bool flush = lastRound();
  const detail::Lanes lanes = this->lanes();
  Tracer* tracer = iterationTracer();
  auto makeRun = [&](TensorState& t) {
    return std::make_unique<Run>(t, worker_, groups_, lanes, topo_, deadline, tracer, prof, flush);
  };
  auto start = [&](Unit& u) {
    awaitItems(u.items);
    prepare(u, items, deadline);
    auto r = makeRun(*u.state);
    r->start(u.in, u.out);
    return r;
  };
  auto done = [&](const Unit& u) { complete(u, items, deadline); };
  auto runAlone = [&](size_t i) {
    Unit u{states[i], items[i].input, items[i].output, {i}};
    start(u)->finish(op);
    done(u);
  };
  // Units first, in order: the items that run on their own and the plan's
  // groups (Plan::groups) whose every tensor the batch holds, at the place
  // of their last tensor. Then, per fusible option in the order of its first
  // item, its items packed in order into groups within the threshold
  // (Horovod too fuses every ready tensor of a kind, not only neighbours).
  // The batch's end is the same in any order; grouping by option lets
  // tensors between compressed ones fuse.
  std::vector<std::vector<size_t>> byOption;
  std::vector<Unit> alone = units(items, states, byOption);
  // The units: in phases (0 bytes: one unit a phase, one after the other),
  // or with the pipeline, where the next one's leading local steps (with an
  // AwaitItem, its wait for its items first; the gather into a group's
  // buffer; Run::start: no communication) run on another thread while this
  // one communicates and decodes; the order of every collective and push is
  // unchanged.
  if (!pipeline_) {
    runPhases(alone, start, done, op, phaseBytes_, phasedSteps_);
  } else {
    auto startsLocal = [&](size_t k) {
      const auto& steps = alone[k].state->option.steps;
      return steps.front().kind != plan::StepKind::kComm && alone[k].state != alone[k - 1].state;
    };
    // The next unit's start, on the second thread: it touches its own
    // state and the tensors it retires, which no other unit of the batch
    // holds (units share no tensor), while this thread runs the current
    // unit's communication, decode and completion.
    std::future<std::unique_ptr<Run>> next;
    for (size_t k = 0; k < alone.size(); ++k) {
      // Its start's error, if any, is this unit's.
      std::unique_ptr<Run> cur = next.valid() ? next.get() : start(alone[k]);
      if (k + 1 < alone.size() && startsLocal(k + 1)) {
        Unit* u = &alone[k + 1];
        auto begin = [&start, u] { return start(*u); };
        try {
          next = std::async(std::launch::async, begin);
          ++pipelinedStarts_;
        } catch (const std::system_error& e) {
          // No thread to be had: the next unit starts in turn, as without the pipeline.
          CORTADO_LOG_WARN("encode pipeline: no second thread ({}); running in turn", e.what());
          next = std::async(std::launch::deferred, begin);
        }
      }
      try {
        cur->finish(op);
      } catch (...) {
        // The next unit's encode may have run (its residual counts this
        // round's gradient as sent); the batch fails here, as after any
        // failed step.
        if (next.valid()) next.wait();
        throw;
      }
      done(alone[k]);
    }
  }
  std::vector<size_t> group;
  auto runGroup = [&] {
    if (group.size() == 1) {
      runAlone(group[0]);
    } else if (!group.empty()) {
      awaitItems(group);
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

}  // namespace cortado::executor
