#include "core/common/malloc_tuning.h"

#include <climits>
#include <cstdlib>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

namespace cortado {

namespace {

// The variable by which the environment already configures malloc, if any.
std::string configuredBy() {
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_",
                           "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name) != nullptr) return name;
  }
  if (const char* t = std::getenv("GLIBC_TUNABLES");
      t != nullptr && std::string_view(t).find("glibc.malloc.") != std::string_view::npos)
    return "GLIBC_TUNABLES";
  return {};
}

}  // namespace

MallocTuning keepFreedMemory(uint64_t keepBytes) {
  MallocTuning r;
  if (keepBytes == 0) {
    r.detail = "left as it is (CORTADO_MALLOC_KEEP_BYTES=0)";
    return r;
  }
  if (std::string by = configuredBy(); !by.empty()) {
    r.detail = fmt::format("left as {} configures it", by);
    return r;
  }
#if defined(__GLIBC__)
  // mallopt takes an int; a larger keep means "never trim".
  const int keep = keepBytes > uint64_t(INT_MAX) ? INT_MAX : static_cast<int>(keepBytes);
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocHeapMaxBlock)) != 1) {
    r.detail = fmt::format("left as it is: mallopt(M_MMAP_THRESHOLD, {}) was refused",
                           kMallocHeapMaxBlock);
    return r;
  }
  if (mallopt(M_TRIM_THRESHOLD, keep) != 1) {
    r.detail = fmt::format(
        "blocks up to {} bytes from the heap, but mallopt(M_TRIM_THRESHOLD, "
        "{}) was refused",
        kMallocHeapMaxBlock, keep);
    return r;
  }
  r.applied = true;
  r.detail = fmt::format(
      "blocks up to {} bytes come from the heap, and up to {} freed bytes stay "
      "in it (CORTADO_MALLOC_KEEP_BYTES)",
      kMallocHeapMaxBlock, keep);
#else
  r.detail = "left as it is: the C library is not glibc";
#endif
  return r;
}

}  // namespace cortado
