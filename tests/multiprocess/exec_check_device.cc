// exec_check's runs on the executor's device (runBatchOn in exec_check.h):
// host vectors mirrored in device memory where the device is not the host.
#include <algorithm>
#include <cstring>

#include "tests/multiprocess/exec_check.h"

namespace exec_check {

namespace {

struct Block {
  const std::byte* lo;
  const std::byte* hi;
  bool written = false;  // holds an output
  device::Buffer dev;
};

}  // namespace

void runBatchOn(executor::Executor& ex, std::span<const executor::BatchItem> items, ReduceOp op,
                Deadline deadline) {
  device::Device& d = ex.device();
  bool plain = d.kind() == device::Kind::kHost;
  for (const auto& it : items) {
    auto n = ex.declaredElements(it.name);
    if (!n || *n != it.numElements || !it.input || !it.output) plain = true;
  }
  if (plain) {
    ex.runBatch(items, op, deadline);
    return;
  }
  std::vector<Block> blocks;
  auto add = [&](const float* p, uint64_t n, bool out) {
    if (n == 0) return;
    auto* lo = reinterpret_cast<const std::byte*>(p);
    blocks.push_back({lo, lo + n * sizeof(float), out, {}});
  };
  for (const auto& it : items) {
    add(it.input, it.numElements, false);
    add(it.output, it.numElements, true);
  }
  std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.lo < b.lo; });
  std::vector<Block> merged;
  for (Block& b : blocks) {
    if (!merged.empty() && b.lo <= merged.back().hi) {
      merged.back().hi = std::max(merged.back().hi, b.hi);
      merged.back().written = merged.back().written || b.written;
    } else {
      merged.push_back(std::move(b));
    }
  }
  auto s = d.createStream();
  auto e = d.createEvent();
  for (Block& b : merged) {
    b.dev = device::Buffer(d, false);
    d.copy(b.dev.reserve(size_t(b.hi - b.lo)), b.lo, size_t(b.hi - b.lo),
           device::CopyKind::kHostToDevice, *s);
  }
  e->record(*s);
  e->synchronize(deadline, "exec_check: inputs to the device");
  auto onDevice = [&](const float* p) -> float* {
    if (!p) return nullptr;
    auto* x = reinterpret_cast<const std::byte*>(p);
    for (Block& b : merged)
      if (x >= b.lo && x < b.hi) return reinterpret_cast<float*>(static_cast<std::byte*>(b.dev.data()) + (x - b.lo));
    return const_cast<float*>(p);  // an empty item: never dereferenced
  };
  std::vector<executor::BatchItem> mirrored(items.begin(), items.end());
  for (auto& it : mirrored) {
    it.input = onDevice(it.input);
    it.output = onDevice(it.output);
  }
  ex.runBatch(mirrored, op, deadline);
  for (Block& b : merged)
    if (b.written)
      d.copy(const_cast<std::byte*>(b.lo), b.dev.data(), size_t(b.hi - b.lo),
             device::CopyKind::kDeviceToHost, *s);
  e->record(*s);
  e->synchronize(deadline, "exec_check: outputs from the device");
}

void runOn(executor::Executor& ex, const std::string& name, const float* in, float* out,
           uint64_t n, ReduceOp op, Deadline deadline) {
  executor::BatchItem item{name, in, out, n};
  runBatchOn(ex, std::span<const executor::BatchItem>(&item, 1), op, deadline);
}

}  // namespace exec_check
