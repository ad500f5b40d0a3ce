// Shared memory for the same-host data path. When a worker and a server run
// on the same machine, pushes and pull responses carry a 16-byte descriptor
// (segment, offset) instead of the tensor bytes: the worker copies its chunk
// into its own segment and the server sums straight from it; the server
// publishes the sum in its segment and the worker copies it out. That is two
// user-space copies per byte instead of four kernel copies through sockets.
//
// Lifetimes need no acknowledgements: the sync protocol already orders them.
// A worker takes a push region for one send (RegionPool) and reuses it only
// after the server has answered that pull (so it has read the push, which
// came before the pull on the same connection), and
// a server alternates two result regions per key, so a round's result is
// overwritten two rounds later, after every worker has pushed the round in
// between (so it has copied the result out).
//
// Segments are POSIX shared memory objects named
// /cortado-<job>-<role><rank>-<index> (mode 0600). Their creator unlinks them
// when it is destroyed; the launcher removes whatever a killed process left.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/common/node.h"

namespace cortado::shm {

// The job's segment-name prefix, derived from the job token (a hash of it,
// so that the token does not appear in /dev/shm).
std::string jobPrefix(const std::string& token);
std::string segmentName(const std::string& prefix, const NodeId& owner, uint32_t index);
// Removes every segment of the job (the launcher's cleanup).
int removeJobSegments(const std::string& prefix);
// The bytes of memory the segments `owner` created in the job hold (the
// pages allocated to them in /dev/shm, not their sizes: an arena reserves
// only the pages of the regions in use): the shared memory that node spends,
// for the memory reports.
uint64_t ownedSegmentBytes(const std::string& prefix, const NodeId& owner);

class Segment {
 public:
  // Creates (and truncates) a segment of `bytes` that holds no memory yet
  // (see reserve); throws Error(kUnavailable) naming it.
  static std::unique_ptr<Segment> create(const std::string& name, size_t bytes);
  // Maps an existing segment read-write; throws Error(kProtocol) naming it
  // when it does not exist.
  static std::unique_ptr<Segment> open(const std::string& name);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

  // The creator's side. reserve() allocates the pages under [offset, +len)
  // now, so that a tmpfs that runs out fails here with Error(kUnavailable)
  // instead of killing a process with SIGBUS on a later write. release()
  // gives the pages wholly inside [offset, +len) back to the system (the
  // mappings read zeros there until the range is written again).
  void reserve(uint64_t offset, uint64_t len);
  void release(uint64_t offset, uint64_t len);

 private:
  Segment(std::string name, uint8_t* data, size_t size, int fd)
      : name_(std::move(name)), data_(data), size_(size), fd_(fd) {}
  std::string name_;
  uint8_t* data_;
  size_t size_;
  int fd_;  // the creator's descriptor (-1: a peer's mapping)
};

// Where a region lives: what a descriptor on the wire carries.
struct Region {
  uint32_t segment = 0;
  uint64_t offset = 0;
  uint8_t* data = nullptr;  // in this process's mapping
};

// A node's own regions: a bump allocator over segments of at least
// `segmentBytes` each, with freed regions reused by later allocations of the
// same (64-byte rounded) size: a released tensor's regions serve the next
// plan's keys, which have the same chunk sizes. Only the pages of the
// regions in use hold memory: allocate() reserves a region's pages, free()
// releases them. Segments live as long as the arena. Thread-safe.
class Arena {
 public:
  Arena(std::string prefix, NodeId owner, size_t segmentBytes = 8ull << 20);
  Region allocate(size_t bytes);
  // `r` (from allocate(bytes)) is no longer read or written by anyone: a
  // later allocate of the same size may return it.
  void free(const Region& r, size_t bytes);

 private:
  static size_t rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + 63) & ~size_t(63); }
  std::mutex mu_;
  std::map<size_t, std::vector<Region>> free_;  // by rounded size
  std::string prefix_;
  NodeId owner_;
  size_t segmentBytes_;
  std::vector<std::unique_ptr<Segment>> segments_;
  size_t used_ = 0;  // in the last segment
};

// A worker's push regions: each taken for one chunk's send and given back
// once its server has answered (so it has read the region), then kept warm
// (its pages held, so that the next copy into it takes no page faults) for
// any later chunk of the same size class. Size classes: 64-byte multiples
// up to 64 KiB, then multiples of an eighth of the power of two below (at
// most 12.5% above the chunk). The regions held, in use and warm, stay
// within `limit` bytes where the chunks in use allow: a take that would go
// past it first gives warm regions' pages back (Arena::free; other classes
// than the one taken or given back first, largest first), and a region
// given back while still past it is freed, not kept.
// So the pushes cost about the bytes in flight (the worker's credits), not
// a copy of every tensor (docs/transports.md, "Memory"). Thread-safe.
class RegionPool {
 public:
  RegionPool(Arena& arena, uint64_t limit) : arena_(arena), limit_(limit) {}
  static size_t classBytes(size_t bytes);
  // A region of classBytes(bytes); throws Error(kUnavailable) as
  // Arena::allocate does (nothing taken).
  Region take(size_t bytes);
  // `r` from take(bytes) is read and written by nobody any more.
  void give(const Region& r, size_t bytes);
  void setLimit(uint64_t limit);
  uint64_t heldBytes() const;  // in use and warm
  uint64_t warmBytes() const;

 private:
  // Under mu_: warm regions freed, largest class first and class `keep`
  // last, until `need` more bytes fit within the limit or none is left.
  void evictLocked(uint64_t need, size_t keep);
  Arena& arena_;
  mutable std::mutex mu_;
  uint64_t limit_;
  std::map<size_t, std::vector<Region>> warm_;  // by class
  uint64_t held_ = 0, warmBytes_ = 0;
};

// Peers' segments, mapped on first use. Thread-safe.
class PeerMappings {
 public:
  explicit PeerMappings(std::string prefix) : prefix_(std::move(prefix)) {}
  // The bytes [offset, offset+len) of `peer`'s segment `index`. Throws
  // Error(kProtocol) naming the peer when the segment does not exist or the
  // range is outside it: a descriptor is never trusted.
  uint8_t* resolve(const NodeId& peer, uint32_t index, uint64_t offset, uint64_t len);

 private:
  std::mutex mu_;
  std::string prefix_;
  std::map<std::pair<NodeId, uint32_t>, std::unique_ptr<Segment>> maps_;
};

// The descriptor that replaces a body on the wire.
struct Descriptor {
  uint32_t segment;
  uint32_t reserved;
  uint64_t offset;
};
static_assert(sizeof(Descriptor) == 16);

}  // namespace cortado::shm
