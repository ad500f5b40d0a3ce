// Fused groups (docs/executor.md, "Tensor fusion"): several tensors run their
// option once, on the concatenation of their inputs.
#include <algorithm>

#include "core/common/logging.h"
#include "core/executor/executor.h"
#include "core/executor/run.h"

namespace cortado::executor {

using detail::Run;

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
    detail::foldCarry(t, buf + at);
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
