// An allocator for large arrays that live as long as a plan or a key (the
// error-feedback residuals, a plan switch's carry): blocks of at least
// kPageAllocatorMinBytes are mapped straight from the kernel and unmapped
// when freed, so their memory goes back to the system at once.
//
// Through glibc's malloc it would not: freeing a block that malloc had
// mapped raises its mmap threshold to that block's size (up to 32 MiB), so
// the blocks allocated after it, of a next plan's residuals say, come from
// the heap, and a heap block freed in the middle of the heap stays in the
// process. A worker that switched from one compressed plan to another held
// the first plan's residuals' bytes that way, 0.6x its gradients beside
// the second's residuals (docs/benchmarks.md, "Memory of the roles").
// Smaller blocks take the default allocator.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <memory>
#include <new>

namespace cortado {

inline constexpr size_t kPageAllocatorMinBytes = size_t(64) << 10;

template <class T>
struct PageAllocator {
  using value_type = T;
  PageAllocator() = default;
  template <class U>
  PageAllocator(const PageAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  T* allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kPageAllocatorMinBytes) return std::allocator<T>().allocate(n);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kPageAllocatorMinBytes)
      std::allocator<T>().deallocate(p, n);
    else
      munmap(p, bytes);
  }
  template <class U>
  bool operator==(const PageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace cortado
