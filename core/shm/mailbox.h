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
// Turns: threads of the consumer's process may take turns as the consumer
// (a thread that waits for a reply takes its reply from the rings itself:
// core/transport/shmring). Only the thread whose turn it is sleeps on the
// doorbell, so a producer's FUTEX_WAKE reaches it; the thread it took the
// turn from parks on a word of this process instead. Both moves are
// FUTEX_CMP_REQUEUEs of a sleeping thread from one word to the other:
// taking a turn wakes nobody, and giving it back leaves the parked thread
// asleep on the doorbell as if it had gone to sleep there itself.
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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/common/buffer.h"
#include "core/common/node.h"
#include "core/shm/shm_segment.h"

namespace cortado::shm {

class JobThreads;

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

// The consumer's side. The thread whose turn it is calls wait(); front()
// and pop() are serialized by their user; wake(), shut() and the queries
// may be called from any thread.
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
  // Whether ring r's producer left in order (MailboxSender::leave): its
  // process may exit without being a dead peer.
  bool producerLeft(uint32_t r) const;

  // Returns at once when a ring holds a record that front() has not yet
  // shown, a ring was claimed, the mailbox was shut, or `ready()` (given:
  // something else the caller waits for, looked at after the doorbell was
  // read, so that a wake() after it turned true ends the sleep); otherwise
  // polls for up to `spin` (yielding the core between looks), then sleeps
  // on the doorbell until a producer rings it, wake() is called, or
  // `until`. True when there is something. `turn` is the caller's (turn()
  // when it took it): once another thread took a later one, wait() returns
  // false at once, or as soon as it wakes, leaving the doorbell's state to
  // that thread.
  bool wait(std::chrono::microseconds spin, std::chrono::steady_clock::time_point until,
            uint64_t turn, const std::function<bool()>& ready = nullptr);
  // The job's awake threads (core/shm/job_threads.h; nullptr: not counted,
  // the default): a thread that sleeps in wait() counts itself asleep just
  // before and awake when it wakes, and leaves its slot in the header so
  // that the producer that rings the doorbell stamps it awake before the
  // FUTEX_WAKE (MailboxSender::trySend given the job's JobThreads). Set
  // before the consumer's threads start.
  void countThreads(JobThreads* threads) { threads_ = threads; }
  // The same for a mailbox whose only consumer is the calling thread.
  bool wait(std::chrono::microseconds spin, std::chrono::steady_clock::time_point until) {
    return wait(spin, until, turn());
  }
  // A bounded poll instead of a sleep, for a consumer that expects a record
  // soon (a server whose round waits for pushes): looks at the rings until
  // a record comes that front() has not shown, a ring is claimed or the
  // mailbox is shut (true), or `bound` passes, another thread takes a
  // later turn than `turn`, or `keepOn()` says kStop (false: the caller
  // sleeps in wait()). keepOn (none: kSpin throughout) is looked at first
  // and then every kPollCheck: whether the poll is still worth a CPU
  // (core/common/idle_cpus.h), and how: kSpin looks without yielding (no
  // other thread wants the CPU), kYield calls sched_yield() between looks
  // (threads of the caller's job want the CPU: one of them that shares it
  // runs first). It may make a system call.
  enum class PollMode { kStop, kSpin, kYield };
  bool poll(std::chrono::microseconds bound, uint64_t turn,
            const std::function<PollMode()>& keepOn);
  static constexpr std::chrono::microseconds kPollCheck{5};
  // Statistics for the logs: polls begun, those that found a record, and
  // those that yielded between looks at some point.
  uint64_t polls() const { return polls_.load(std::memory_order_relaxed); }
  uint64_t pollHits() const { return pollHits_.load(std::memory_order_relaxed); }
  uint64_t yieldingPolls() const { return yieldingPolls_.load(std::memory_order_relaxed); }
  // Polls that ended because keepOn said kStop (the gate closed) after they began.
  uint64_t pollsStopped() const { return pollsStopped_.load(std::memory_order_relaxed); }
  // Wakes the thread asleep on the doorbell (the one whose turn it is).
  void wake();
  // Producers stop writing (their sends go to the transport) and wait()
  // and park() return: the consumer is closing.
  void shut();

  // Turns (the file's comment). The current one.
  uint64_t turn() const { return turn_.load(std::memory_order_seq_cst); }
  // Starts a new turn, the calling thread's: a thread asleep in wait() of
  // an earlier turn is moved onto the parking word without being woken,
  // one about to sleep returns at once. Returns the new turn.
  uint64_t takeTurn();
  // Ends the calling thread's turn (it looked at every ring since its last
  // record): the parked thread, asleep in park() or in a wait() of an
  // earlier turn, is moved back onto the doorbell without being woken,
  // announced as sleeping, so that the next record wakes it; woken at
  // once when a record came since the last look. The parked thread then
  // takes up its turn (its user says whose turn it is).
  // `sleeperSlot`: the parked thread's JobThreads slot (-1: none).
  void giveBack(int32_t sleeperSlot = -1);
  // A thread whose turn it is not: take a ticket, look whose turn it is
  // (giveBack() after the ticket makes park() return at once), then park
  // until giveBack(), shut() or `until`.
  uint32_t parkTicket() const { return parking_.load(std::memory_order_seq_cst); }
  void park(uint32_t ticket, std::chrono::steady_clock::time_point until);

  const std::string& name() const;
  // Futex waits on the doorbell (a statistic for the logs).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }

 private:
  explicit Mailbox(std::unique_ptr<Segment> seg);
  bool changed();
  std::unique_ptr<Segment> seg_;
  // Per ring: the tail front() last saw (atomics: wait() of one thread reads
  // what front() under its user's lock on another wrote).
  std::unique_ptr<std::atomic<uint64_t>[]> seen_;
  std::atomic<uint32_t> claimedSeen_{0};
  std::atomic<uint64_t> sleeps_{0};
  std::atomic<uint64_t> polls_{0}, pollHits_{0}, yieldingPolls_{0}, pollsStopped_{0};
  std::atomic<uint64_t> turn_{0};
  std::atomic<uint32_t> parking_{0};  // a futex word of this process
  JobThreads* threads_ = nullptr;
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
  // Leaves the ring (leave()).
  ~MailboxSender();

  // Says that this producer leaves in order (its transport closes): the
  // consumer still takes what it published, but no longer reports the
  // process as dead once it exits (Mailbox::producerLeft). Taking the ring
  // back (open() again) clears it.
  void leave();

  enum class Result { kSent, kFull, kTooBig, kRefused };
  // Copies `parts` into the next slot and publishes it; rings the doorbell
  // when the consumer sleeps, stamping the sleeping thread awake in
  // `threads` first when given (Mailbox::countThreads). Never blocks.
  Result trySend(const std::vector<Buffer>& parts, uint64_t afterInner,
                 JobThreads* threads = nullptr);
  // False once the consumer's process is gone (kill(pid, 0)).
  bool consumerAlive() const;
  // False once the consumer shut its mailbox (it is closing).
  bool consumerOpen() const;
  // True while the consumer has announced that it sleeps on the doorbell
  // (the next record rings it).
  bool consumerAsleep() const;
  int32_t consumerPid() const;

 private:
  MailboxSender(std::unique_ptr<Segment> seg, uint32_t ring);
  std::unique_ptr<Segment> seg_;
  uint32_t ring_;
};

// Whether process `pid` exists (a zombie counts as gone only once reaped).
bool processAlive(int32_t pid);

}  // namespace cortado::shm
