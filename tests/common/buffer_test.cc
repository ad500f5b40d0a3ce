// Buffer: sharing on copy, views, and what a move leaves behind.
#include "core/common/buffer.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

namespace cortado {
namespace {

TEST(Buffer, AllocateIsZeroedAndAligned) {
  Buffer b = Buffer::allocate(1000);
  ASSERT_EQ(b.size(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.data()[i], 0) << i;
  EXPECT_TRUE(b.unique());
  EXPECT_TRUE(Buffer::allocate(0).empty());
}

TEST(Buffer, CopiesAndSlicesShareTheMemory) {
  const std::vector<uint8_t> src = {1, 2, 3, 4, 5, 6, 7, 8};
  Buffer a = Buffer::copyOf(src.data(), src.size());
  Buffer b = a;
  EXPECT_FALSE(a.unique());
  EXPECT_EQ(b.data(), a.data());
  Buffer s = a.slice(2, 3);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.data()[0], 3);
  a = Buffer();
  b = Buffer();
  EXPECT_TRUE(s.unique());  // the slice alone keeps the memory
  EXPECT_EQ(s.data()[2], 5);
}

TEST(Buffer, AMovedFromBufferIsEmpty) {
  auto released = std::make_shared<int>(0);
  std::vector<uint8_t> mem(16, 9);
  Buffer a = Buffer::wrap(mem.data(), mem.size(),
                          std::shared_ptr<void>(nullptr, [released](void*) { ++*released; }));
  Buffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): what is left
  EXPECT_EQ(a.size(), 0u);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(b.data(), mem.data());
  EXPECT_EQ(b.size(), 16u);
  Buffer c;
  c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(c.size(), 16u);
  EXPECT_EQ(*released, 0);
  c = std::move(c);  // self-move keeps it
  EXPECT_EQ(c.size(), 16u);
  c = Buffer();
  EXPECT_EQ(*released, 1);  // the owner went with the last Buffer
}

}  // namespace
}  // namespace cortado
