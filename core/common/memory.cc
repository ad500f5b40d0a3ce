#include "core/common/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace cortado {
namespace {

// "Key:   1234 kB" lines.
void readKb(const char* path, std::initializer_list<std::pair<const char*, uint64_t*>> fields) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    for (const auto& [key, out] : fields) {
      const size_t n = std::char_traits<char>::length(key);
      if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
        std::istringstream v(line.substr(n + 1));
        uint64_t kb = 0;
        if (v >> kb) *out = kb * 1024;
      }
    }
  }
}

}  // namespace

MemoryUse currentMemory() {
  MemoryUse m;
  readKb("/proc/self/status",
         {{"VmRSS", &m.rss}, {"VmHWM", &m.hwm}, {"RssAnon", &m.anon}, {"RssShmem", &m.shmem}});
  readKb("/proc/self/smaps_rollup", {{"Pss", &m.pss}});
  return m;
}

MemoryPeaks::MemoryPeaks() : baseline_(currentMemory()), peak_(baseline_) {}

void MemoryPeaks::sample() {
  const MemoryUse m = currentMemory();
  peak_.rss = std::max(peak_.rss, m.rss);
  peak_.hwm = std::max(peak_.hwm, m.hwm);
  peak_.anon = std::max(peak_.anon, m.anon);
  peak_.shmem = std::max(peak_.shmem, m.shmem);
  peak_.pss = std::max(peak_.pss, m.pss);
}

std::string mebibytes(uint64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

uint64_t printWorkerMemory(int rank, const MemoryUse& base, const MemoryUse& now, uint64_t ownBytes,
                       uint64_t gradientBytes, uint64_t segmentBytes) {
  const uint64_t privateAbove = now.anon > base.anon + ownBytes ? now.anon - base.anon - ownBytes : 0;
  const uint64_t overhead = privateAbove + segmentBytes;
  fmt::print(stderr,
             "memory: worker {}: gradients {}; overhead {} ({} private above its start and "
             "the benchmark's own {}, {} of its own shared-memory segments): {:.2f}x the "
             "gradients; resident {} with the peers' segments it maps, proportional {}\n",
             rank, mebibytes(gradientBytes), mebibytes(overhead), mebibytes(privateAbove),
             mebibytes(ownBytes), mebibytes(segmentBytes),
             gradientBytes ? double(overhead) / double(gradientBytes) : 0.0, mebibytes(now.rss),
             mebibytes(now.pss));
  return overhead;
}

void printServerMemory(int rank, const MemoryPeaks& m, uint64_t keyBytes, uint64_t segmentBytes) {
  const MemoryUse& p = m.peak();
  const MemoryUse& b = m.baseline();
  const uint64_t privateGrown = p.anon > b.anon ? p.anon - b.anon : 0;
  const uint64_t owned = privateGrown + segmentBytes;
  fmt::print(stderr,
             "memory: server {}: keys {}; owns {} ({} private above its start, {} of its own "
             "shared-memory segments): {:.2f}x the keys; peak resident {} with the peers' "
             "segments it maps, proportional {}\n",
             rank, mebibytes(keyBytes), mebibytes(owned), mebibytes(privateGrown),
             mebibytes(segmentBytes), keyBytes ? double(owned) / double(keyBytes) : 0.0,
             mebibytes(p.hwm), mebibytes(p.pss));
}

}  // namespace cortado
