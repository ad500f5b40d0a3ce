// exec_check's runs on the executor's device (runBatchOn in exec_check.h):
// host vectors mirrored in device memory where the device is not the host.
#include <algorithm>
#include <cstring>
#include <memory>

#include "tests/multiprocess/exec_check.h"

namespace exec_check {

namespace {

struct Block {
  const std::byte* lo;
  const std::byte* hi;
  bool written = false;  // holds an output
  size_t at = 0;         // its offset in the arena
};

// One device allocation and stream kept across calls (one cudaMalloc per
// growth, not per block and call), carved into blocks 256-byte aligned with
// a 256-byte gap between them, so that blocks apart in host memory are apart
// on the device too.
struct Arena {
  device::Device* dev = nullptr;
  device::Buffer buf;
  std::unique_ptr<device::Stream> stream;
  std::unique_ptr<device::Event> event;
  void use(device::Device& d) {
    if (dev == &d) return;
    buf = device::Buffer(d, false);
    stream = d.createStream();
    event = d.createEvent();
    dev = &d;
  }
};
// Never destroyed: the device may go first at exit (its memory goes with
// the process). exec_check makes one device per process.
Arena& arena = *new Arena;

}  // namespace

void runBatchOn(executor::Executor& ex, std::span<const executor::BatchItem> items, ReduceOp op,
                Deadline deadline) {
  device::Device& d = ex.device();
  bool plain = d.kind() == device::Kind::kHost && !mirrorAlways;
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
    blocks.push_back({lo, lo + n * sizeof(float), out});
  };
  for (const auto& it : items) {
    add(it.input, it.numElements, false);
    add(it.output, it.numElements, true);
  }
  std::sort(blocks.begin(), blocks.end(),
            [](const Block& a, const Block& b) { return a.lo < b.lo; });
  std::vector<Block> merged;
  for (Block& b : blocks) {
    if (!merged.empty() && b.lo <= merged.back().hi) {
      merged.back().hi = std::max(merged.back().hi, b.hi);
      merged.back().written = merged.back().written || b.written;
    } else {
      merged.push_back(b);
    }
  }
  size_t total = 0;
  for (Block& b : merged) {
    b.at = total;
    total += (size_t(b.hi - b.lo) + 255) / 256 * 256 + 256;
  }
  arena.use(d);
  auto* base = static_cast<std::byte*>(arena.buf.reserve(total));
  device::Stream& s = *arena.stream;
  for (const Block& b : merged)
    d.copy(base + b.at, b.lo, size_t(b.hi - b.lo), device::CopyKind::kHostToDevice, s);
  arena.event->record(s);
  arena.event->synchronize(deadline, "exec_check: inputs to the device");
  auto onDevice = [&](const float* p) -> float* {
    if (!p) return nullptr;
    auto* x = reinterpret_cast<const std::byte*>(p);
    for (const Block& b : merged)
      if (x >= b.lo && x < b.hi) return reinterpret_cast<float*>(base + b.at + (x - b.lo));
    return const_cast<float*>(p);  // an empty item: never dereferenced
  };
  std::vector<executor::BatchItem> mirrored(items.begin(), items.end());
  for (auto& it : mirrored) {
    it.input = onDevice(it.input);
    it.output = onDevice(it.output);
  }
  ex.runBatch(mirrored, op, deadline);
  for (const Block& b : merged)
    if (b.written)
      d.copy(const_cast<std::byte*>(b.lo), base + b.at, size_t(b.hi - b.lo),
             device::CopyKind::kDeviceToHost, s);
  arena.event->record(s);
  arena.event->synchronize(deadline, "exec_check: outputs from the device");
}

void runOn(executor::Executor& ex, const std::string& name, const float* in, float* out, uint64_t n,
           ReduceOp op, Deadline deadline) {
  executor::BatchItem item{name, in, out, n};
  runBatchOn(ex, std::span<const executor::BatchItem>(&item, 1), op, deadline);
}

}  // namespace exec_check
