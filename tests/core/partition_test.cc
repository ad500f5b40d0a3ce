// Partitioning and key balance against brute-force expectations.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "core/common/error.h"
#include "core/partition.h"
#include "send_order_reference.h"

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

// A compressed tensor's chunks are counted by its payload: the fewest whose
// payloads, shared evenly, fit the partition size, the most servers it
// reaches with at least 64 KiB of payload each, or the fewest that hold at
// most 4 MiB of raw data (or the partition size, if larger) each, whichever
// is most, and never more than its raw bytes would make (brute force over
// the counts).
TEST(Partition, CompressedTensorsAreCutByTheirPayload) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int servers = 1 + trial % 6;
    ServerPlacement p(servers);
    const uint64_t n = rng() % 3000000;
    const uint64_t part = trial % 3 == 0 ? 16 + rng() % 4096 : 16 + rng() % (1 << 22);
    // From a few bytes up to more than the raw bytes (a codec that adds a
    // header to a tiny tensor).
    const uint64_t payload = 1 + rng() % (n * 4 + 200);
    const uint64_t raw = n == 0 ? 1 : (n + part / 4 - 1) / (part / 4);
    uint64_t fewest = 1;
    while (fewest * part < payload) ++fewest;
    uint64_t spread = 0;
    for (uint64_t s = 1; s <= uint64_t(servers); ++s)
      if (s * 65536 <= payload) spread = s;
    const uint64_t region = std::max<uint64_t>(part, 4 << 20) / 4;  // elements
    uint64_t regions = 1;
    while (regions * region < n) ++regions;
    auto chunks = p.place(trial, n, 4, part, payload);
    EXPECT_EQ(chunks.size(), std::min(raw, std::max({fewest, spread, regions})))
        << n << " elements, " << payload << " bytes, " << servers << " servers";
    uint64_t off = 0, mn = ~0ull, mx = 0;
    for (const Chunk& c : chunks) {
      EXPECT_EQ(c.offset, off);
      off += c.numElements;
      mn = std::min(mn, c.numElements);
      mx = std::max(mx, c.numElements);
    }
    EXPECT_EQ(off, n);
    EXPECT_LE(mx - mn, 1u);
    // Without a payload, the raw count.
    EXPECT_EQ(chunkCount(n, 4, part), raw);
  }
  // A 4 MiB group of DGC at 1% (about 84 KB of payload) across hosts (256
  // KiB partitions, 4 servers): one chunk, not sixteen; a 64 MiB one (1.3
  // MB) sixteen, one per 4 MiB of gradients; 3 MiB with 300 KB of payload
  // (256 KiB partitions), four, one a server.
  EXPECT_EQ(ServerPlacement(4).place(0, 1 << 20, 4, 256 << 10, 84000).size(), 1u);
  EXPECT_EQ(ServerPlacement(4).place(0, 16 << 20, 4, 256 << 10, 1340000).size(), 16u);
  EXPECT_EQ(ServerPlacement(4).place(0, 3 << 18, 4, 256 << 10, 300000).size(), 4u);
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

std::vector<int> serversOf(const std::vector<Chunk>& chunks) {
  std::vector<int> s;
  for (const Chunk& c : chunks) s.push_back(c.server);
  return s;
}

TEST(Partition, PlainSendOrderIsIndexOrderOnEveryRank) {
  ServerPlacement p(3);
  auto chunks = p.place(0, 10000, 4, 4096);  // 10 chunks
  std::vector<size_t> want(chunks.size());
  std::iota(want.begin(), want.end(), size_t(0));
  for (int r = 0; r < 5; ++r) EXPECT_EQ(sendOrder(chunks, r, false), want) << "rank " << r;
  // One chunk: nothing to reorder.
  auto one = p.place(1, 10, 4, 4096);
  EXPECT_EQ(sendOrder(one, 3, true), std::vector<size_t>{0});
}

// Placements as the workers make them (after other tensors left the servers
// unevenly loaded) and arbitrary ones, every rank: sendOrder's staggered
// order is the reference's, built server by server.
TEST(Partition, StaggeredSendOrderMatchesTheReference) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 400; ++trial) {
    const int servers = 1 + int(rng() % 7);
    std::vector<Chunk> chunks;
    if (trial % 2 == 0) {
      ServerPlacement p(servers);
      for (int t = 0; t < int(rng() % 4); ++t) p.place(t, 1 + rng() % 30000, 4, 4096);
      chunks = p.place(99, 1 + rng() % 40000, 4, 4096);
    } else {
      chunks.resize(1 + rng() % 25);
      for (size_t i = 0; i < chunks.size(); ++i) {
        chunks[i].key = chunkKey(7, i);
        chunks[i].server = int(rng() % servers);
      }
    }
    for (int r = 0; r < 9; ++r) {
      auto got = sendOrder(chunks, r, true);
      ASSERT_EQ(got, test::staggeredReference(serversOf(chunks), r))
          << "trial " << trial << ", " << chunks.size() << " chunks on " << servers
          << " servers, rank " << r;
      // A permutation that keeps each server's chunks in index order.
      std::vector<size_t> sorted = got;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
      std::map<int, size_t> last;
      for (size_t i : got) {
        auto it = last.find(chunks[i].server);
        if (it != last.end()) ASSERT_LT(it->second, i) << "server " << chunks[i].server;
        last[chunks[i].server] = i;
      }
    }
  }
}

// One tensor on fresh servers (chunk i on server i mod S): worker r's k-th
// chunk goes to server (r + k) mod S, so at every step the first S workers
// push to S different servers, where the plain order has them all push to
// one; and every chunk has been pushed by every worker by the end of its
// round of S steps, as in the plain order.
TEST(Partition, StaggeredWorkersPushToDifferentServersAtEveryStep) {
  for (int S : {2, 3, 4, 6}) {
    for (int N : {2, 3, 4, 6, 8}) {
      ServerPlacement p(S);
      auto chunks = p.place(0, uint64_t(1024) * (3 * S + 1), 4, 4096);  // 3 rounds and one chunk
      ASSERT_EQ(chunks.size(), size_t(3 * S + 1));
      std::vector<std::vector<size_t>> orders, plain;
      for (int r = 0; r < N; ++r) {
        orders.push_back(sendOrder(chunks, r, true));
        plain.push_back(sendOrder(chunks, r, false));
      }
      for (int r = 0; r < N; ++r) {
        EXPECT_EQ(chunks[orders[r][0]].server, r % S) << "S " << S << ", rank " << r;
        for (size_t k = 0; k < size_t(3 * S); ++k)
          ASSERT_EQ(chunks[orders[r][k]].server, int((size_t(r) + k) % size_t(S)))
              << "S " << S << ", rank " << r << ", step " << k;
      }
      for (size_t k = 0; k < chunks.size(); ++k) {
        std::map<int, int> pushers, plainPushers;  // server: workers pushing to it at step k
        for (int r = 0; r < N; ++r) {
          ++pushers[chunks[orders[r][k]].server];
          ++plainPushers[chunks[plain[r][k]].server];
        }
        const int most = std::max_element(pushers.begin(), pushers.end(), [](auto& a, auto& b) {
                           return a.second < b.second;
                         })->second;
        // The last step holds the one chunk of the last round.
        if (k < size_t(3 * S))
          EXPECT_EQ(most, (N + S - 1) / S) << "S " << S << ", N " << N << ", step " << k;
        EXPECT_EQ(plainPushers.size(), 1u);
      }
      // The step by which every worker has pushed chunk i: within its round.
      for (size_t i = 0; i < chunks.size(); ++i) {
        size_t done = 0;
        for (int r = 0; r < N; ++r)
          done = std::max(
              done, size_t(std::find(orders[r].begin(), orders[r].end(), i) - orders[r].begin()));
        EXPECT_LT(done, (i / size_t(S) + 1) * size_t(S)) << "chunk " << i;
      }
    }
  }
}

TEST(Partition, Errors) {
  ServerPlacement p(2);
  EXPECT_THROW(p.place(0, 10, 8, 4), Error);  // chunk smaller than an element
  EXPECT_THROW(p.place(0, (kMaxChunksPerTensor + 1) * 4, 4, 16), Error);
  EXPECT_THROW(ServerPlacement(0), Error);
  EXPECT_THROW(sendOrder(p.place(1, 100, 4, 64), -1, true), Error);
}

}  // namespace
}  // namespace cortado
