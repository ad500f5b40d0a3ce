// Zen's hierarchical hashing (specs/zen.md §3, Algorithm 1): which server
// owns each index of a sparse tensor, and how a worker splits its non-zeros
// into one (index, value) list per server without sorting and without losing
// or repeating any.
//
// Level 1, Ownership: h0(index) -> server, a hash seeded per tensor that every
// worker and server computes alike. Hashing rather than contiguous ranges is
// what balances skewed indices (most non-zeros of an embedding sit in a few
// ranges): each index lands on a server independently of its neighbours.
// IndexLists holds, per server p, I_p = the ascending indices that p owns,
// which is the order of the bits of p's pull answer (zen_payload.h).
//
// Level 2, HierarchicalHash: per server a table of r1 "parallel" slots and
// r2 "serial" (overflow) slots. An index tries k slots h1..hk of its owner's
// table, claiming an empty one with a compare-and-swap (finding itself there
// means a duplicate, whose value is added to the slot); when all k are held
// by other indices it takes the next overflow slot from a per-server counter,
// and when the overflow area is full too it goes to a spill list. So every
// input pair lands exactly once. Empty is 0xFFFFFFFF, never a valid index
// (tensors have fewer elements), so index 0 is placed like any other. The
// artifact's faults that this avoids are listed in specs/zen.md ("Pitfalls").
//
// Threads: place() may run its loop on a ThreadPool (slots claimed with
// atomic compare-and-swap, values added atomically); one HierarchicalHash
// serves one place() at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "compressor/format.h"
#include "core/common/thread_pool.h"

namespace cortado::compressor::zen {

// The empty slot. Indices are u32 and a tensor has at most kMaxElements
// elements, so no index equals it.
inline constexpr uint32_t kEmpty = 0xffffffffu;
inline constexpr uint64_t kMaxElements = 0xffffffffull;  // indices 0 .. 2^32 - 2

// Memory for the large tables that are read at random (slots, index lists,
// accumulators): above 2 MiB aligned to and advised for huge pages.
void* allocateLarge(size_t bytes);
void freeLarge(void* p, size_t bytes);
template <typename T>
struct LargeAllocator {
  using value_type = T;
  LargeAllocator() = default;
  template <typename U>
  LargeAllocator(const LargeAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(allocateLarge(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { freeLarge(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const LargeAllocator<U>&) const {
    return true;
  }
};
template <typename T>
using LargeVector = std::vector<T, LargeAllocator<T>>;

// Level 1: index -> owning server, the same on every node for one tensor.
class Ownership {
 public:
  Ownership() = default;
  // Throws kInvalidArgument for numElements > kMaxElements or numServers 0.
  Ownership(uint64_t numElements, uint32_t numServers, uint64_t seed);

  uint64_t numElements() const { return numElements_; }
  uint32_t numServers() const { return numServers_; }
  uint64_t seed() const { return seed_; }

  // The server of index idx (< numElements, unchecked): the hash's top 32
  // bits scaled to [0, numServers), which avoids the bias of a modulo.
  uint32_t owner(uint64_t idx) const {
    const uint64_t h = format::hash2(seed_, idx) >> 32;
    return static_cast<uint32_t>((h * numServers_) >> 32);
  }

  bool operator==(const Ownership&) const = default;

 private:
  uint64_t numElements_ = 0;
  uint32_t numServers_ = 1;
  uint64_t seed_ = 0;
};

// I_p for every server p, built by hashing 0 .. numElements - 1 once
// (4 bytes per element in all).
class IndexLists {
 public:
  explicit IndexLists(const Ownership& own);
  const Ownership& ownership() const { return own_; }
  // I_p, ascending.
  std::span<const uint32_t> of(uint32_t server) const;

 private:
  Ownership own_;
  LargeVector<uint32_t> all_;      // I_0, I_1, ... back to back
  std::vector<uint64_t> offsets_;  // numServers + 1
};

// I_p of one server alone (what a server needs).
std::vector<uint32_t> ownedIndices(const Ownership& own, uint32_t server);

// Level 2 settings (specs/zen.md §5).
struct PlacementOptions {
  uint32_t probes = 3;          // k: slots tried before the overflow area
  double slotFactor = 2.0;      // r1 per server = slotFactor * pairs / servers
  double serialFactor = 0.1;    // r2 = serialFactor * r1
  uint64_t probeSeed = 0x5a5a;  // h1..hk; need not match between workers
  // Indices given strictly ascending (a coalesced gradient, a dense scan)
  // cannot repeat, so level 2 has nothing to merge: each pair is appended to
  // its owner's list in one sequential pass, which on a CPU costs a fraction
  // of the table's random accesses. False: always the table (Algorithm 1).
  bool directWhenAscending = true;
  // Each server's list read out in ascending index order (a radix sort of
  // the table's lists; the direct path's lists ascend already), as a
  // delta-coded push needs (zen_payload.h). False: the slot order.
  bool ascendingLists = false;
};

// One worker's pairs split by owner: indices[p] and values[p] go to server p.
// Within a server's list the order is the slot order (not ascending), or
// ascending with PlacementOptions::ascendingLists or on the direct path.
struct Partitioned {
  std::vector<std::vector<uint32_t>> indices;
  std::vector<std::vector<float>> values;
  // What the last place() did: pairs out of probe slots (each index once),
  // pairs that went to the overflow area and to the spill list (overflow
  // area full; both before their duplicates merged), and input pairs merged
  // into another of the same index.
  uint64_t probed = 0, overflowed = 0, spilled = 0, merged = 0;
  bool direct = false;  // ascending input, appended without the table

  uint64_t pairs() const;
};

class HierarchicalHash {
 public:
  HierarchicalHash(const Ownership& own, PlacementOptions opts = {});

  // Splits the pairs (index[i], value[i]) by owner into `out`; pairs with
  // the same index are summed into one. Throws kInvalidArgument naming the
  // position for an index >= numElements (nothing is placed), or for
  // spans of different lengths. With a pool the loop runs on its threads.
  void place(std::span<const uint32_t> index, std::span<const float> value, Partitioned& out,
             ThreadPool* pool = nullptr);
  // The non-zeros of a dense tensor of numElements floats.
  void placeDense(const float* dense, Partitioned& out, ThreadPool* pool = nullptr);

  const Ownership& ownership() const { return own_; }

 private:
  void placeOne(uint32_t idx, float v);
  void extract(Partitioned& out);

  Ownership own_;
  PlacementOptions opts_;
  uint64_t r1_ = 0, r2_ = 0;  // per server
  // numServers x (r1 + r2); index and value side by side, so that a probe
  // touches one cache line. The index is claimed atomically.
  struct Slot {
    uint32_t index;
    float value;
  };
  LargeVector<Slot> slots_;
  std::vector<uint64_t> next_;  // per server: the next overflow slot, from r1
  std::vector<std::vector<std::pair<uint32_t, float>>> spill_;
  std::mutex spillMu_;  // the spill list fills only when an overflow area is full: rare
  std::vector<uint32_t> scratchIdx_;
  std::vector<float> scratchVal_;
  std::vector<uint64_t> sortA_, sortB_;  // ascendingLists: the radix sort's buffers
};

// Sorts the pairs (index[i], value[i]) by index, ascending (indices below
// numElements and distinct, so no order among equals is needed): an LSD radix
// sort of 11-bit digits over the bits that numElements - 1 uses, in a, b as
// scratch. O(pairs x passes), at most 3 passes.
void sortPairsByIndex(std::vector<uint32_t>& index, std::vector<float>& value, uint64_t numElements,
                      std::vector<uint64_t>& a, std::vector<uint64_t>& b);

}  // namespace cortado::compressor::zen
