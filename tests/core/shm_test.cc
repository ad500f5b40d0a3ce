// The shared-memory pieces of the same-host data path (core/shm): what one
// node writes into its arena, a peer reads through its mappings; descriptors
// from the wire are checked against the segment before anything is read.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/common/error.h"
#include "core/shm/shm_segment.h"

namespace cortado {
namespace {

std::string testPrefix(const char* what) {
  return shm::jobPrefix(fmt::format("shm-test-{}-{}", what, getpid()));
}

int segmentsOf(const std::string& prefix) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    n += e.path().filename().string().rfind(prefix.substr(1), 0) == 0;
  return n;
}

TEST(Shm, JobPrefixHidesTheTokenAndSeparatesJobs) {
  const std::string a = shm::jobPrefix("secret-token-a");
  EXPECT_EQ(a, shm::jobPrefix("secret-token-a"));
  EXPECT_NE(a, shm::jobPrefix("secret-token-b"));
  EXPECT_EQ(a.find("secret"), std::string::npos);
  EXPECT_EQ(a.rfind("/cortado-", 0), 0u);
}

TEST(Shm, PeerReadsWhatTheOwnerWrote) {
  const std::string prefix = testPrefix("rw");
  const NodeId owner{Role::kWorker, 3};
  {
    shm::Arena arena(prefix, owner, /*segmentBytes=*/4096);
    // Regions are 64-byte aligned and never overlap; a region larger than a
    // segment gets a segment of its own.
    shm::Region a = arena.allocate(100), b = arena.allocate(10), big = arena.allocate(10000);
    EXPECT_EQ(a.offset % 64, 0u);
    EXPECT_GE(b.offset, a.offset + 100);
    EXPECT_EQ(a.segment, b.segment);
    EXPECT_NE(big.segment, a.segment);
    for (int i = 0; i < 100; ++i) a.data[i] = uint8_t(i);
    for (int i = 0; i < 10000; ++i) big.data[i] = uint8_t(i * 7);

    shm::PeerMappings peers(prefix);
    const uint8_t* pa = peers.resolve(owner, a.segment, a.offset, 100);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(pa[i], uint8_t(i));
    const uint8_t* pb = peers.resolve(owner, big.segment, big.offset, 10000);
    for (int i = 0; i < 10000; ++i) ASSERT_EQ(pb[i], uint8_t(i * 7));
    // Writes through the owner show through the peer's mapping (one object).
    a.data[5] = 200;
    EXPECT_EQ(peers.resolve(owner, a.segment, a.offset, 100)[5], 200);
    EXPECT_EQ(segmentsOf(prefix), 2);
  }
  // The owner unlinks its segments when it goes.
  EXPECT_EQ(segmentsOf(prefix), 0);
}

// A freed region serves the next allocation of its (64-byte rounded) size,
// and only that size; nothing else moves, and no new segment is made for it.
TEST(Shm, FreedRegionsAreReusedBySameSizedAllocations) {
  const std::string prefix = testPrefix("free");
  shm::Arena arena(prefix, NodeId{Role::kServer, 1}, /*segmentBytes=*/4096);
  shm::Region a = arena.allocate(1000), b = arena.allocate(1000), c = arena.allocate(100);
  arena.free(a, 1000);
  shm::Region d = arena.allocate(2000);  // another size: fresh memory
  EXPECT_NE(d.data, a.data);
  shm::Region e = arena.allocate(990);  // 990 and 1000 both round to 1024
  EXPECT_EQ(e.data, a.data);
  EXPECT_EQ(e.segment, a.segment);
  EXPECT_EQ(e.offset, a.offset);
  shm::Region f = arena.allocate(1000);  // nothing freed of that size left
  EXPECT_NE(f.data, a.data);
  EXPECT_NE(f.data, b.data);
  arena.free(b, 1000);
  arena.free(c, 100);
  EXPECT_EQ(arena.allocate(1000).data, b.data);
  EXPECT_EQ(arena.allocate(100).data, c.data);
  arena.free(shm::Region(), 64);  // an empty region: nothing
  EXPECT_NE(arena.allocate(64).data, nullptr);
}

// Only the regions in use hold memory: a segment's pages are reserved as
// regions are handed out and given back when they are freed, so a node that
// released its tensors (a plan's profiling keys, an old plan's) does not keep
// their memory, and the memory report counts what is held, not segment sizes.
TEST(Shm, OnlyRegionsInUseHoldMemory) {
  const std::string prefix = testPrefix("held");
  const NodeId owner{Role::kServer, 2};
  const uint64_t mib = 1 << 20;
  shm::Arena arena(prefix, owner, /*segmentBytes=*/8 * mib);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), 0u);
  shm::Region a = arena.allocate(mib), b = arena.allocate(2 * mib);
  // The segment is 8 MiB; the two regions hold 3 MiB (whole pages).
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), 3 * mib);
  std::memset(b.data, 7, 2 * mib);
  shm::PeerMappings peers(prefix);
  const uint8_t* pb = peers.resolve(owner, b.segment, b.offset, 2 * mib);
  arena.free(b, 2 * mib);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), mib);
  // Reused: held again, and what the owner writes the peer reads.
  shm::Region c = arena.allocate(2 * mib);
  EXPECT_EQ(c.data, b.data);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), 3 * mib);
  c.data[12345] = 42;
  EXPECT_EQ(pb[12345], 42);
  // A freed region smaller than a page shares its pages with its
  // neighbours: they stay held.
  shm::Region d = arena.allocate(100), e = arena.allocate(100);
  const uint64_t held = shm::ownedSegmentBytes(prefix, owner);
  arena.free(d, 100);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), held);
  e.data[99] = 1;
  arena.free(a, mib);
  arena.free(c, 2 * mib);
  EXPECT_LE(shm::ownedSegmentBytes(prefix, owner), uint64_t(2 * 4096));
}

// Size classes: each at least the bytes asked, a multiple of 64, at most
// 12.5% above them past 64 KiB, and never below a smaller size's class;
// checked for every size a step apart against the definition.
TEST(Shm, PushRegionClassesFitTheirSizes) {
  size_t last = 0;
  for (size_t bytes = 1; bytes <= (size_t(9) << 20); bytes += bytes < 70000 ? 1 : 977) {
    const size_t c = shm::RegionPool::classBytes(bytes);
    ASSERT_GE(c, bytes);
    ASSERT_EQ(c % 64, 0u) << bytes;
    if (bytes <= (64u << 10))
      ASSERT_LT(c, bytes + 64) << bytes;
    else
      ASSERT_LE(double(c), double(bytes) * 1.125 + 64) << bytes;
    ASSERT_GE(c, last) << bytes;
    last = c;
  }
  EXPECT_EQ(shm::RegionPool::classBytes(4u << 20), 4u << 20);
  EXPECT_EQ(shm::RegionPool::classBytes((4u << 20) + 1), (4u << 20) + (512u << 10));
}

// The pool keeps regions given back (their pages held) for later takes of
// the same class, as long as what it holds stays within its limit: in-use
// regions may go past it, and then regions given back are freed, and warm
// ones are freed to make room for a class that has none.
TEST(Shm, PushRegionsStayWithinTheLimitAndAreReused) {
  const std::string prefix = testPrefix("pool");
  const NodeId owner{Role::kWorker, 5};
  const uint64_t mib = 1 << 20;
  shm::Arena arena(prefix, owner, /*segmentBytes=*/8 * mib);
  shm::RegionPool pool(arena, 2 * mib);
  shm::Region a = pool.take(mib), b = pool.take(mib), c = pool.take(mib);
  EXPECT_EQ(pool.heldBytes(), 3 * mib);  // in use: past the limit
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), 3 * mib);
  pool.give(a, mib);  // past the limit: freed
  EXPECT_EQ(pool.heldBytes(), 2 * mib);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), 2 * mib);
  pool.give(b, mib);  // within it: kept warm
  pool.give(c, mib);
  EXPECT_EQ(pool.heldBytes(), 2 * mib);
  EXPECT_EQ(pool.warmBytes(), 2 * mib);
  // A take of the class reuses a warm region: its pages, no new ones.
  shm::Region d = pool.take(mib - 100);
  EXPECT_TRUE(d.data == b.data || d.data == c.data);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), 2 * mib);
  // Another class, with the limit reached: the warm 1 MiB region goes first.
  shm::Region e = pool.take(mib / 2);
  EXPECT_EQ(pool.warmBytes(), 0u);
  EXPECT_EQ(pool.heldBytes(), mib + mib / 2);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), mib + mib / 2);
  // A lower limit frees warm regions at once.
  pool.give(d, mib - 100);
  pool.give(e, mib / 2);
  EXPECT_EQ(pool.heldBytes(), mib + mib / 2);
  pool.setLimit(mib / 2);
  EXPECT_LE(pool.heldBytes(), mib / 2);
  EXPECT_EQ(shm::ownedSegmentBytes(prefix, owner), pool.heldBytes());
}

TEST(Shm, DescriptorsAreNeverTrusted) {
  const std::string prefix = testPrefix("bad");
  const NodeId owner{Role::kServer, 0};
  shm::Arena arena(prefix, owner, 4096);
  shm::Region r = arena.allocate(128);
  shm::PeerMappings peers(prefix);
  auto codeOf = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("server 0"), std::string::npos) << e.what();
      return e.code();
    }
    return ErrorCode::kOk;
  };
  // Past the end of the segment, an offset that would wrap, a segment that
  // does not exist, a peer that has none.
  EXPECT_EQ(codeOf([&] { peers.resolve(owner, r.segment, 4000, 200); }), ErrorCode::kProtocol);
  EXPECT_EQ(codeOf([&] { peers.resolve(owner, r.segment, ~uint64_t(0) - 10, 64); }),
            ErrorCode::kProtocol);
  EXPECT_EQ(codeOf([&] { peers.resolve(owner, 7, 0, 8); }), ErrorCode::kProtocol);
  EXPECT_EQ(codeOf([&] { peers.resolve(NodeId{Role::kServer, 0}, r.segment, 0, 4096); }),
            ErrorCode::kOk);
  try {
    peers.resolve(NodeId{Role::kWorker, 9}, 0, 0, 8);
    FAIL() << "resolved a segment nobody created";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol);
    EXPECT_NE(std::string(e.what()).find("w9"), std::string::npos) << e.what();
  }
}

TEST(Shm, RemoveJobSegmentsCleansWhatAKilledProcessLeft) {
  const std::string prefix = testPrefix("left");
  auto seg = shm::Segment::create(shm::segmentName(prefix, NodeId{Role::kWorker, 0}, 0), 4096);
  auto other = shm::Segment::create(shm::segmentName(testPrefix("other"), NodeId{Role::kWorker, 0}, 0), 4096);
  EXPECT_EQ(segmentsOf(prefix), 1);
  EXPECT_EQ(shm::removeJobSegments(prefix), 1);  // only this job's
  EXPECT_EQ(segmentsOf(prefix), 0);
  EXPECT_EQ(segmentsOf(testPrefix("other")), 1);
}

}  // namespace
}  // namespace cortado
