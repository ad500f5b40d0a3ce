// The executor's work on its device (core/device/device.h): the stream and
// event discipline that Run's steps and the fused groups use (Lanes in
// run.h), and the carry of retired residuals folded into device memory.
#include "core/executor/run.h"

namespace cortado::executor::detail {

using device::CopyKind;

void Lanes::bind(Executor::TensorState& t) const {
  if (t.computed) return;
  t.staged = device::Buffer(*dev, false);
  t.payloads = device::Buffer(*dev, false);
  t.buffer = device::Buffer(*dev, false);
  t.pinned = device::Buffer(*dev, true);
  t.pinnedBytes = device::Buffer(*dev, true);
  t.computed = dev->createEvent();
  t.copied = dev->createEvent();
}

void Lanes::settle(Executor::TensorState& t, Deadline d, const char* what) const {
  bind(t);
  t.computed->record(*compute);
  t.computed->synchronize(d, what);
}

float* Lanes::hostStaging(Executor::TensorState& t, uint64_t n, Deadline d) const {
  bind(t);
  // The host may not write the staging while a copy from it is in flight.
  t.copied->synchronize(d, "the copy from pinned memory");
  return t.pinned.floats(n);
}

const float* Lanes::toHost(Executor::TensorState& t, const float* src, uint64_t n, Deadline d) const {
  if (direct) return src;
  float* h = hostStaging(t, n, d);
  t.computed->record(*compute);
  dev->wait(*copy, *t.computed);
  dev->copy(h, src, n * sizeof(float), CopyKind::kDeviceToHost, *copy);
  t.copied->record(*copy);
  t.copied->synchronize(d, "the copy to pinned memory");
  return h;
}

void Lanes::toDevice(Executor::TensorState& t, float* dst, uint64_t n) const {
  // After the compute stream's earlier work on dst, and before its later.
  t.computed->record(*compute);
  dev->wait(*copy, *t.computed);
  dev->copy(dst, t.pinned.floats(n), n * sizeof(float), CopyKind::kHostToDevice, *copy);
  t.copied->record(*copy);
  dev->wait(*compute, *t.copied);
}

bool foldCarry(const Lanes& l, Executor::TensorState& t, float* x, Deadline d) {
  if (t.carry.empty()) return false;
  if (l.direct) {
    l.bind(t);
    l.dev->add(x, t.carry.data(), t.n, *l.compute);
    dropCarry(t);
    return true;
  }
  float* h = l.hostStaging(t, t.n, d);
  std::copy_n(t.carry.data(), t.n, h);
  float* dev = t.staged.floats(t.n);
  // The staging may still be read by the compute stream's earlier work.
  t.computed->record(*l.compute);
  l.dev->wait(*l.copy, *t.computed);
  l.dev->copy(dev, h, t.n * sizeof(float), CopyKind::kHostToDevice, *l.copy);
  t.copied->record(*l.copy);
  l.dev->wait(*l.compute, *t.copied);
  l.dev->add(x, dev, t.n, *l.compute);
  dropCarry(t);
  return true;
}

}  // namespace cortado::executor::detail
