// PageAllocator (core/common/page_allocator.h): a large block's memory goes
// back to the system when it is freed, even after glibc's malloc has raised
// its mmap threshold (which would put a block of that size in its heap and
// keep it there once freed). Measured by the kernel's count of this
// process's private memory (RssAnon).
#include "core/common/page_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "core/common/memory.h"

namespace cortado {
namespace {

uint64_t anon() { return currentMemory().anon; }

TEST(PageAllocator, LargeBlocksGoBackWhenFreed) {
  const uint64_t mib = 1 << 20;
  // Raise glibc's dynamic mmap threshold as a freed residual of 12 MiB does.
  void* big = std::malloc(12 * mib);
  ASSERT_NE(big, nullptr);
  static_cast<volatile char*>(big)[0] = 1;
  std::free(big);
  std::vector<std::vector<float, PageAllocator<float>>> held;
  const uint64_t before = anon();
  for (int i = 0; i < 8; ++i) held.emplace_back(size_t(mib), 1.0f);  // 8 x 4 MiB, written
  const uint64_t during = anon();
  EXPECT_GE(during, before + 30 * mib);
  // Free every other one: blocks in the middle, which a heap would keep.
  for (size_t i = 0; i < held.size(); i += 2) std::vector<float, PageAllocator<float>>().swap(held[i]);
  const uint64_t after = anon();
  EXPECT_LE(after, during - 15 * mib);
  for (size_t i = 1; i < held.size(); i += 2) EXPECT_EQ(held[i][12345], 1.0f);
  // Small blocks take the default allocator, and work alike.
  std::vector<float, PageAllocator<float>> small(100, 2.0f);
  small.push_back(3.0f);
  EXPECT_EQ(small.size(), 101u);
  EXPECT_EQ(small[100], 3.0f);
}

}  // namespace
}  // namespace cortado
