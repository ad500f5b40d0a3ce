// Same-host small messages in shared memory: a node's mailbox. One POSIX
// shared-memory segment per receiving node (its creator, the consumer)
// holds up to `rings` single-producer single-consumer rings of fixed-size
// slots, one claimed by each same-host peer that sends to it (the
// producer), and one doorbell (a futex word) for all of them. A message
// that fits a slot goes through the ring instead of the transport's
// sockets and threads (core/transport/shmring).
//
// Wake-ups: the consumer polls its rings, spins for a bounded time when
// they are empty, then announces that it sleeps and waits on the doorbell
// (FUTEX_WAIT, with a deadline); a producer rings the doorbell
// (FUTEX_WAKE) only when the consumer announced that it sleeps, so a busy
// consumer costs its producers no system call.
//
// Trust: the producer's name and record lengths in the segment are
// checked before they are used (front() refuses a malformed record); the
// consumer's pid and host are in the header, each producer's pid in its
// ring, so either side can tell that the other's process is gone.
//
// Segments are named like the data segments (shm::segmentName, index
// kMailboxIndex), so the launcher's and the reaper's cleanup of the job
// removes them too; the creator unlinks its own when it is destroyed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/common/buffer.h"
#include "core/common/node.h"
#include "core/shm/shm_segment.h"

namespace cortado::shm {

// The segment index that names a node's mailbox (its data segments count
// up from 0).
inline constexpr uint32_t kMailboxIndex = 0xFFFFFFFFu;

struct MailboxShape {
  uint32_t rings = 32;      // producers it takes; more fall back to the transport
  uint32_t slots = 32;      // messages in flight per producer (a power of two)
  uint32_t slotBytes = 512; // record header, part lengths and bytes of one message
};

// The bytes of one message with these parts in a slot, or 0 when it does
// not fit one of `shape`.
size_t recordBytes(const std::vector<Buffer>& parts, const MailboxShape& shape);

// The consumer's side. One thread calls front/pop/wait; wake() and the
// queries may be called from any thread.
class Mailbox {
 public:
  // Creates the segment and reserves its pages; throws Error(kUnavailable)
  // as Segment::create does. `host` is what producers compare with theirs.
  static std::unique_ptr<Mailbox> create(const std::string& name, const std::string& host,
                                         MailboxShape shape = {});
  ~Mailbox();

  struct Record {
    NodeId producer;
    int32_t producerPid = 0;
    uint64_t afterInner = 0;  // the producer's sends over the transport before this one
    std::vector<Buffer> parts;
  };
  // Rings that producers have claimed so far (indices for front/pop).
  std::vector<uint32_t> rings();
  // The oldest record of ring `r`, copied out, or nothing when it is empty.
  // Throws Error(kProtocol) naming the producer when the record is
  // malformed; the ring is then refused (its producer stops using it).
  std::optional<Record> front(uint32_t r);
  void pop(uint32_t r);
  NodeId producer(uint32_t r) const;
  int32_t producerPid(uint32_t r) const;

  // Returns at once when a ring holds a record that front() has not yet
  // shown, or a ring was claimed; otherwise polls for up to `spin` (yielding
  // the core between looks), then sleeps on the doorbell until a producer
  // rings it, wake() is called, or `until`. True when there is something.
  bool wait(std::chrono::microseconds spin, std::chrono::steady_clock::time_point until);
  void wake();
  // Producers stop writing (their sends go to the transport) and wait()
  // returns: the consumer is closing.
  void shut();

  const std::string& name() const;
  // Futex wake-ups this mailbox slept for (a statistic for the logs).
  uint64_t sleeps() const { return sleeps_; }

 private:
  explicit Mailbox(std::unique_ptr<Segment> seg);
  bool changed();
  std::unique_ptr<Segment> seg_;
  std::vector<uint64_t> seen_;  // per ring: the tail front() last saw
  uint32_t claimedSeen_ = 0;
  uint64_t sleeps_ = 0;
};

// The producer's side, for one consumer. Not thread-safe: its user
// serializes the sends to one peer.
class MailboxSender {
 public:
  // Maps `name` and claims a ring for `self` (or takes back the one this
  // process claimed before). Nothing when the mailbox does not exist, names
  // another host than `host`, or has no free ring.
  static std::unique_ptr<MailboxSender> open(const std::string& name, const NodeId& self,
                                             const std::string& host);
  ~MailboxSender();

  enum class Result { kSent, kFull, kTooBig, kRefused };
  // Copies `parts` into the next slot and publishes it; rings the doorbell
  // when the consumer sleeps. Never blocks.
  Result trySend(const std::vector<Buffer>& parts, uint64_t afterInner);
  // False once the consumer's process is gone (kill(pid, 0)).
  bool consumerAlive() const;
  // False once the consumer shut its mailbox (it is closing).
  bool consumerOpen() const;
  int32_t consumerPid() const;

 private:
  MailboxSender(std::unique_ptr<Segment> seg, uint32_t ring);
  std::unique_ptr<Segment> seg_;
  uint32_t ring_;
};

// Whether process `pid` exists (a zombie counts as gone only once reaped).
bool processAlive(int32_t pid);

}  // namespace cortado::shm
