// This process's memory, as Linux accounts it, for the roles' memory reports
// (`cortado bench pushpull` and `cortado bench model` print them; issue 35's
// bounds: a server at most 2.5x the bytes of the keys it owns, a worker's
// overhead at most 1x its gradients' bytes).
//
// - rss: resident pages (VmRSS), shared ones counted in full;
// - anon: private anonymous pages (RssAnon): heap, buffers, stacks;
// - shmem: resident shared memory (RssShmem): the /dev/shm segments of the
//   same-host data path, this process's own and those of peers it mapped;
// - pss: the proportional set size (smaps_rollup): shared pages divided
//   among the processes that map them, so that the pss of all the roles on
//   a machine adds up to what the machine spends.
// The kernel keeps a peak of rss only (VmHWM); MemoryPeaks keeps the peak of
// every figure over the samples it was given.
#pragma once

#include <cstdint>
#include <string>

namespace cortado {

struct MemoryUse {
  uint64_t rss = 0, hwm = 0, anon = 0, shmem = 0, pss = 0;  // bytes
};

// Reads /proc/self/status and /proc/self/smaps_rollup; fields that cannot be
// read stay 0 (a kernel without smaps_rollup leaves pss at 0).
MemoryUse currentMemory();

class MemoryPeaks {
 public:
  // Takes the baseline: what the process holds before the work it measures.
  MemoryPeaks();
  void sample();
  const MemoryUse& baseline() const { return baseline_; }
  const MemoryUse& peak() const { return peak_; }

 private:
  MemoryUse baseline_, peak_;
};

// "123.4 MiB"
std::string mebibytes(uint64_t bytes);

// A worker's line of the memory report, on stderr: its overhead is the
// private memory it holds above `base` (taken before its gradients existed)
// beyond the caller's own buffers (`ownBytes`: the gradients and anything
// else the benchmark itself keeps), plus the shared-memory segments it owns
// (`segmentBytes`), against `gradientBytes`. `now` is a later reading or a
// peak (MemoryPeaks::peak). Returns the overhead in bytes.
uint64_t printWorkerMemory(int rank, const MemoryUse& base, const MemoryUse& now, uint64_t ownBytes,
                       uint64_t gradientBytes, uint64_t segmentBytes);

// A server's line of the memory report, on stderr, when the job ends
// (CORTADO_REPORT_MEMORY=1; docs/transports.md, "Memory"): what it owns (its
// private memory's peak above the baseline, and its own shared-memory
// segments) against the peak bytes of its keys.
void printServerMemory(int rank, const MemoryPeaks& m, uint64_t keyBytes, uint64_t segmentBytes);

}  // namespace cortado
