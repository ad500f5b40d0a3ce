// Fused groups (docs/executor.md, "Fused groups" and "Tensor fusion"):
// several tensors run their option once, on the concatenation of their
// inputs, in place where the caller's buffers are already consecutive.
#include <algorithm>
#include <cstdint>

#include "core/common/logging.h"
#include "core/executor/executor.h"
#include "core/executor/run.h"

namespace cortado::executor {

using detail::Run;

namespace detail {

namespace {

// Whether [a, a + n) and [b, b + m) share an element (as addresses: the
// buffers may belong to different allocations).
bool overlaps(const float* a, uint64_t n, const float* b, uint64_t m) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return n != 0 && m != 0 && x < y + m * sizeof(float) && y < x + n * sizeof(float);
}

// gatherGroup's in-place test.
bool inPlace(std::span<Executor::TensorState* const> parts, std::span<const BatchItem* const> items,
             uint64_t total) {
  float* const base = items.front()->output;
  if (base == nullptr) return false;
  uint64_t at = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const uint64_t n = parts[k]->n;
    if (n != 0 && items[k]->output != base + at) return false;
    at += n;
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    const BatchItem& it = *items[k];
    if (it.input != it.output && overlaps(it.input, parts[k]->n, base, total)) return false;
  }
  return true;
}

}  // namespace

float* gatherGroup(const Lanes& l, std::span<Executor::TensorState* const> parts,
                   std::span<const BatchItem* const> items, device::Buffer& buffer, Deadline d,
                   bool& carried) {
  carried = false;
  uint64_t total = 0;
  for (const Executor::TensorState* t : parts) total += t->n;
  float* at = nullptr;
  if (inPlace(parts, items, total)) {
    at = items.front()->output;
  } else {
    at = buffer.floats(total);
  }
  uint64_t off = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    Executor::TensorState& t = *parts[k];
    if (items[k]->input != at + off)
      l.dev->copy(at + off, items[k]->input, t.n * sizeof(float), device::CopyKind::kDeviceToDevice,
                  *l.compute);
    l.bind(t);
    if (foldCarry(l, t, at + off, d)) carried = true;
    off += t.n;
  }
  return at;
}

void scatterGroup(const Lanes& l, const float* at, std::span<Executor::TensorState* const> parts,
                  std::span<const BatchItem* const> items) {
  uint64_t off = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    if (items[k]->output != at + off)
      l.dev->copy(items[k]->output, at + off, parts[k]->n * sizeof(float),
                  device::CopyKind::kDeviceToDevice, *l.compute);
    off += parts[k]->n;
  }
}

}  // namespace detail

// One execution of the group's option on the concatenation of its members'
// inputs (members: indices into the batch, in order; each input with the
// residual a plan switch folded into it), the results in the outputs.
// Collectives sum element by element, so every element gets what running
// its tensor alone gives it.
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
  f.flushRounds = states.front()->flushRounds;
  f.members.clear();
  for (const TensorState* t : states)
    f.members += fmt::format("{}{}#{}", f.members.empty() ? "" : ", ", t->name, t->round);
  const detail::Lanes l = lanes();
  float* buf = detail::gatherGroup(l, states, items, fusionBuffer_, deadline, f.carried);
  if (buf != fusionBuffer_.data()) ++inPlaceGroupRuns_;
  Profiler* prof = prof_ && prof_->active ? prof_.get() : nullptr;
  try {
    Run(f, worker_, groups_, l, topo_, deadline, iterationTracer(), prof, false).go(buf, buf, op);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{} (tensor fusion: the {} tensors '{}' .. '{}' ran as one, "
                                      "{} bytes; CORTADO_FUSION_BYTES=0 runs them one by one)",
                                      e.what(), states.size(), states.front()->name,
                                      states.back()->name, total * sizeof(float)));
  }
  detail::scatterGroup(l, buf, states, items);
  l.settle(f, deadline, "the fused group's results");
  for (TensorState* t : states) t->ranRound(forceFlush_);
}

}  // namespace cortado::executor
