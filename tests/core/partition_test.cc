// Partitioning and key balance against brute-force expectations.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "core/common/error.h"
#include "core/partition.h"

namespace cortado {
namespace {

TEST(Partition, ChunksCoverTheTensorExactlyAndAreNearlyEqual) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    ServerPlacement p(1 + trial % 5);
    uint64_t n = rng() % 5000000;
    size_t esz = size_t(1) << (rng() % 4);
    uint64_t part = 16 + rng() % (1 << 20);
    auto chunks = p.place(trial, n, esz, part);
    ASSERT_FALSE(chunks.empty());
    uint64_t off = 0, mn = ~0ull, mx = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      EXPECT_EQ(chunks[i].offset, off);
      EXPECT_EQ(chunks[i].key, chunkKey(trial, i));
      EXPECT_LE(chunks[i].numElements * esz, part);
      off += chunks[i].numElements;
      mn = std::min(mn, chunks[i].numElements);
      mx = std::max(mx, chunks[i].numElements);
    }
    EXPECT_EQ(off, n);
    EXPECT_LE(mx - mn, 1u);
    // The fewest chunks that respect the partition size.
    uint64_t perChunk = part / esz;
    EXPECT_EQ(chunks.size(), n == 0 ? 1 : (n + perChunk - 1) / perChunk);
  }
}

TEST(Partition, PlacementBalancesBytes) {
  // Many tensors of mixed sizes: the greedy placement keeps every server
  // within one chunk of the mean.
  std::mt19937_64 rng(9);
  for (int servers : {1, 2, 3, 7}) {
    ServerPlacement p(servers);
    const uint64_t part = 4 << 20;
    uint64_t total = 0;
    for (int t = 0; t < 300; ++t) {
      uint64_t n = 1 + rng() % (8 << 20);
      p.place(t, n, 4, part);
      total += n * 4;
    }
    auto& load = p.bytesPerServer();
    uint64_t sum = std::accumulate(load.begin(), load.end(), uint64_t(0));
    EXPECT_GE(sum, total);  // empty tensors count one byte
    auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, part) << servers << " servers";
  }
}

TEST(Partition, SamePlacementOnEveryWorker) {
  ServerPlacement a(3), b(3);
  for (int t = 0; t < 50; ++t) {
    auto ca = a.place(t, 1000 + t * 777, 4, 4096);
    auto cb = b.place(t, 1000 + t * 777, 4, 4096);
    ASSERT_EQ(ca.size(), cb.size());
    for (size_t i = 0; i < ca.size(); ++i) EXPECT_EQ(ca[i].server, cb[i].server);
  }
}

TEST(Partition, Errors) {
  ServerPlacement p(2);
  EXPECT_THROW(p.place(0, 10, 8, 4), Error);  // chunk smaller than an element
  EXPECT_THROW(p.place(0, (kMaxChunksPerTensor + 1) * 4, 4, 16), Error);
  EXPECT_THROW(ServerPlacement(0), Error);
}

}  // namespace
}  // namespace cortado
