// How a worker process's C library malloc hands memory back to the kernel.
//
// A training script that gives push_pull a fresh tensor every step (a
// torch.cat of the gradients, a clone, TensorFlow's gradients through NumPy)
// allocates and frees several MB per step through glibc's malloc, which
// PyTorch's and NumPy's CPU allocators call. By default glibc returns
// such blocks to the kernel: blocks above a threshold that adapts to the
// sizes freed (128 KiB at first, at most 32 MiB) are mmap'ed and unmapped
// one by one, and free space above twice that threshold at the top of the
// heap is trimmed. The next step's tensors, and the backward pass's
// temporaries that land where they were, then fault in fresh zeroed pages
// (docs/python.md, "Fresh tensors"; docs/benchmarks.md has the counts).
// keepFreedMemory() fixes both thresholds so that blocks up to 32 MiB come
// from the heap and up to `keepBytes` of freed heap stay in the process.
//
// Process-wide by nature (mallopt): the Python binding applies it once, in
// cortado.init(), and only where the process's environment does not
// configure malloc itself.
#pragma once

#include <cstdint>
#include <string>

namespace cortado {

// The largest block that glibc lets mallopt(M_MMAP_THRESHOLD) serve from
// the heap on 64-bit systems (HEAP_MAX_SIZE / 2); larger blocks are mmap'ed
// whatever the setting.
inline constexpr uint64_t kMallocHeapMaxBlock = 32ull << 20;

struct MallocTuning {
  bool applied = false;
  std::string detail;  // what was set, or why nothing was
};

// Sets glibc's M_MMAP_THRESHOLD to kMallocHeapMaxBlock and M_TRIM_THRESHOLD
// to `keepBytes`. Does nothing (and says why in `detail`) when keepBytes is
// 0, when the environment configures malloc (MALLOC_TRIM_THRESHOLD_,
// MALLOC_MMAP_THRESHOLD_, MALLOC_MMAP_MAX_, MALLOC_TOP_PAD_, or
// GLIBC_TUNABLES naming glibc.malloc), when the C library is not glibc, or
// when mallopt refuses a value. Never throws.
MallocTuning keepFreedMemory(uint64_t keepBytes);

}  // namespace cortado
