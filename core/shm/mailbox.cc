#include "core/shm/mailbox.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>
#include <utility>

#include "core/common/error.h"
#include "core/common/logging.h"
#include "core/shm/job_threads.h"

namespace cortado::shm {
namespace {

constexpr uint64_t kMagic = 0x31584f424c49414dull;  // "MAILBOX1"
constexpr uint32_t kVersion = 2;
constexpr size_t kHostBytes = 64;

// Ring states.
constexpr uint32_t kFree = 0, kClaiming = 1, kReady = 2, kRefused = 3;

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t rings, slots, slotBytes;
  int32_t consumerPid;
  char host[kHostBytes];
  alignas(64) std::atomic<uint32_t> doorbell;  // the futex word
  alignas(64) std::atomic<uint32_t> sleeping;  // 1: the consumer waits on the doorbell
  std::atomic<uint32_t> claimed;               // rings claimed, for the consumer's scan
  std::atomic<uint32_t> open;                  // 0 once the consumer shut it
  std::atomic<int32_t> sleeperSlot;            // the sleeping thread's JobThreads slot, or -1
};

struct RingHeader {
  std::atomic<uint32_t> state;
  int32_t producerPid;
  uint32_t producerRole;
  int32_t producerRank;
  std::atomic<uint32_t> left;              // 1: the producer left in order (leave())
  alignas(64) std::atomic<uint64_t> tail;  // the producer's: records published
  alignas(64) std::atomic<uint64_t> head;  // the consumer's: records consumed
};

struct RecordHeader {
  uint32_t bytes;  // of the whole record, this header included
  uint16_t parts;
  uint16_t reserved;
  uint64_t afterInner;
};
static_assert(sizeof(RecordHeader) == 16);

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory rings need lock-free atomics");

constexpr size_t kHeaderBytes = (sizeof(Header) + 63) & ~size_t(63);
constexpr size_t kRingHeaderBytes = (sizeof(RingHeader) + 63) & ~size_t(63);

size_t ringBytes(const MailboxShape& s) { return kRingHeaderBytes + size_t(s.slots) * s.slotBytes; }
size_t totalBytes(const MailboxShape& s) { return kHeaderBytes + size_t(s.rings) * ringBytes(s); }

Header* header(Segment& seg) { return reinterpret_cast<Header*>(seg.data()); }
MailboxShape shapeOf(const Header* h) { return {h->rings, h->slots, h->slotBytes}; }
RingHeader* ring(Segment& seg, uint32_t r) {
  return reinterpret_cast<RingHeader*>(seg.data() + kHeaderBytes + r * ringBytes(shapeOf(header(seg))));
}
uint8_t* slot(Segment& seg, uint32_t r, uint64_t index) {
  const Header* h = header(seg);
  return reinterpret_cast<uint8_t*>(ring(seg, r)) + kRingHeaderBytes +
         (index & (h->slots - 1)) * h->slotBytes;
}

// Not FUTEX_PRIVATE: the producers are other processes, and a thread moves
// between the doorbell and the parking word, which must be of one kind.
long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

// Moves every thread asleep on `from` to `to` without waking it, if `from`
// still holds `expect`; -1 (EAGAIN) when it does not.
long requeueAll(std::atomic<uint32_t>* from, std::atomic<uint32_t>* to, uint32_t expect) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(from), FUTEX_CMP_REQUEUE, 0,
                 reinterpret_cast<void*>(static_cast<uintptr_t>(INT_MAX)),
                 reinterpret_cast<uint32_t*>(to), expect);
}

void wakeAll(std::atomic<uint32_t>* word) { futex(word, FUTEX_WAKE, INT_MAX, nullptr); }

// A relative timeout for FUTEX_WAIT until `until`, or nothing when it passed.
std::optional<timespec> timeoutUntil(std::chrono::steady_clock::time_point until) {
  const auto left = until - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

}  // namespace

bool processAlive(int32_t pid) {
  if (pid <= 0) return false;
  return kill(pid, 0) == 0 || errno == EPERM;
}

size_t recordBytes(const std::vector<Buffer>& parts, const MailboxShape& shape) {
  if (parts.size() > 0xFFFF) return 0;
  size_t bytes = sizeof(RecordHeader) + 4 * parts.size();
  for (const auto& p : parts) {
    if (p.size() > shape.slotBytes) return 0;
    bytes += p.size();
  }
  return bytes <= shape.slotBytes ? bytes : 0;
}

std::unique_ptr<Mailbox> Mailbox::create(const std::string& name, const std::string& host,
                                         MailboxShape shape) {
  CORTADO_ENFORCE(shape.rings > 0 && shape.slots > 0 && (shape.slots & (shape.slots - 1)) == 0 &&
                      shape.slotBytes >= 64 && shape.slotBytes % 8 == 0,
                  ErrorCode::kInvalidArgument,
                  "mailbox {}: {} rings of {} slots of {} bytes: want rings > 0, a power of two "
                  "of slots, slots of at least 64 bytes in multiples of 8",
                  name, shape.rings, shape.slots, shape.slotBytes);
  auto seg = Segment::create(name, totalBytes(shape));
  seg->reserve(0, seg->size());  // a full /dev/shm fails here, not with SIGBUS later
  auto* h = new (seg->data()) Header{};
  h->magic = kMagic;
  h->version = kVersion;
  h->rings = shape.rings;
  h->slots = shape.slots;
  h->slotBytes = shape.slotBytes;
  h->consumerPid = static_cast<int32_t>(getpid());
  std::strncpy(h->host, host.c_str(), kHostBytes - 1);
  h->open.store(1, std::memory_order_relaxed);
  h->sleeperSlot.store(-1, std::memory_order_relaxed);
  for (uint32_t r = 0; r < shape.rings; ++r) new (ring(*seg, r)) RingHeader{};
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<Mailbox>(new Mailbox(std::move(seg)));
}

Mailbox::Mailbox(std::unique_ptr<Segment> seg) : seg_(std::move(seg)) {
  const uint32_t n = header(*seg_)->rings;
  seen_ = std::make_unique<std::atomic<uint64_t>[]>(n);
  for (uint32_t r = 0; r < n; ++r) seen_[r].store(0, std::memory_order_relaxed);
}

Mailbox::~Mailbox() = default;

const std::string& Mailbox::name() const { return seg_->name(); }

std::vector<uint32_t> Mailbox::rings() {
  std::vector<uint32_t> out;
  const Header* h = header(*seg_);
  claimedSeen_.store(h->claimed.load(std::memory_order_acquire), std::memory_order_relaxed);
  for (uint32_t r = 0; r < h->rings; ++r)
    if (ring(*seg_, r)->state.load(std::memory_order_acquire) == kReady) out.push_back(r);
  return out;
}

NodeId Mailbox::producer(uint32_t r) const {
  RingHeader* rh = ring(*seg_, r);
  return NodeId{static_cast<Role>(rh->producerRole), rh->producerRank};
}

int32_t Mailbox::producerPid(uint32_t r) const { return ring(*seg_, r)->producerPid; }

bool Mailbox::producerLeft(uint32_t r) const {
  return ring(*seg_, r)->left.load(std::memory_order_acquire) != 0;
}

std::optional<Mailbox::Record> Mailbox::front(uint32_t r) {
  const Header* h = header(*seg_);
  RingHeader* rh = ring(*seg_, r);
  if (rh->state.load(std::memory_order_acquire) != kReady) return std::nullopt;
  const uint64_t head = rh->head.load(std::memory_order_relaxed);
  const uint64_t tail = rh->tail.load(std::memory_order_acquire);
  seen_[r].store(tail, std::memory_order_relaxed);
  if (head == tail) return std::nullopt;
  const NodeId who = producer(r);
  auto refuse = [&](const std::string& why) {
    rh->state.store(kRefused, std::memory_order_release);
    return Error(ErrorCode::kProtocol,
                 fmt::format("shared-memory ring of {} (pid {}) in {}: {}; the ring is refused and "
                             "its producer falls back to the transport",
                             who.toString(), rh->producerPid, seg_->name(), why));
  };
  if (tail - head > h->slots) throw refuse(fmt::format("{} records published in {} slots", tail - head, h->slots));
  const uint8_t* s = slot(*seg_, r, head);
  RecordHeader rec;
  std::memcpy(&rec, s, sizeof(rec));
  if (rec.bytes > h->slotBytes || rec.bytes < sizeof(RecordHeader) + 4ull * rec.parts)
    throw refuse(fmt::format("a record of {} bytes and {} parts in a slot of {} bytes", rec.bytes,
                             rec.parts, h->slotBytes));
  Record out;
  out.producer = who;
  out.producerPid = rh->producerPid;
  out.afterInner = rec.afterInner;
  size_t off = sizeof(RecordHeader) + 4ull * rec.parts;
  out.parts.reserve(rec.parts);
  for (uint16_t i = 0; i < rec.parts; ++i) {
    uint32_t len;
    std::memcpy(&len, s + sizeof(RecordHeader) + 4ull * i, 4);
    if (len > rec.bytes - off)
      throw refuse(fmt::format("part {} of {} bytes runs past the record's {} bytes", i, len, rec.bytes));
    out.parts.push_back(Buffer::copyOf(s + off, len));
    off += len;
  }
  return out;
}

void Mailbox::pop(uint32_t r) {
  RingHeader* rh = ring(*seg_, r);
  rh->head.store(rh->head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

bool Mailbox::changed() {
  Header* h = header(*seg_);
  if (h->claimed.load(std::memory_order_acquire) != claimedSeen_.load(std::memory_order_relaxed))
    return true;
  for (uint32_t r = 0; r < h->rings; ++r) {
    RingHeader* rh = ring(*seg_, r);
    if (rh->state.load(std::memory_order_relaxed) == kReady &&
        rh->tail.load(std::memory_order_acquire) != seen_[r].load(std::memory_order_relaxed))
      return true;
  }
  return false;
}

bool Mailbox::wait(std::chrono::microseconds spin, std::chrono::steady_clock::time_point until,
                   uint64_t turn, const std::function<bool()>& ready) {
  using Clock = std::chrono::steady_clock;
  Header* h = header(*seg_);
  // wake(), takeTurn() or shut() between here and the futex makes it
  // return at once.
  const uint32_t bell = h->doorbell.load(std::memory_order_seq_cst);
  // takeTurn() moves the turn before it rings: a thread that read the bell
  // after that sees the new turn here.
  auto displaced = [&] { return turn_.load(std::memory_order_seq_cst) != turn; };
  auto something = [&] {
    return changed() || h->open.load(std::memory_order_acquire) == 0 || (ready && ready());
  };
  if (displaced()) return false;
  if (something()) return true;
  if (spin.count() > 0) {
    const auto spinUntil = std::min(until, Clock::now() + spin);
    while (Clock::now() < spinUntil) {
      sched_yield();  // a thread that shares the core runs in between
      if (displaced()) return false;
      if (something() || h->doorbell.load(std::memory_order_acquire) != bell) return true;
    }
  }
  if (threads_) {
    h->sleeperSlot.store(threads_->slotIndex(), std::memory_order_relaxed);
    threads_->asleep();
  }
  h->sleeping.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (something()) {
    h->sleeping.store(0, std::memory_order_relaxed);
    if (threads_) threads_->awake();
    return true;
  }
  if (auto ts = timeoutUntil(until)) {
    futex(&h->doorbell, FUTEX_WAIT, bell, &*ts);
    sleeps_.fetch_add(1, std::memory_order_relaxed);
  }
  if (threads_) threads_->awake();
  // Another thread's turn now: `sleeping` is its to say.
  if (displaced()) return false;
  h->sleeping.store(0, std::memory_order_relaxed);
  return something();
}

namespace {

// Tells the CPU that this is a polling loop (a hyperthread sibling gets the
// core's resources meanwhile).
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

bool Mailbox::poll(std::chrono::microseconds bound, uint64_t turn,
                   const std::function<PollMode()>& keepOn) {
  using Clock = std::chrono::steady_clock;
  Header* h = header(*seg_);
  auto something = [&] { return changed() || h->open.load(std::memory_order_acquire) == 0; };
  if (turn_.load(std::memory_order_seq_cst) != turn) return false;
  if (something()) return true;
  if (bound.count() <= 0) return false;
  PollMode mode = keepOn ? keepOn() : PollMode::kSpin;
  if (mode == PollMode::kStop) return false;
  polls_.fetch_add(1, std::memory_order_relaxed);
  bool yielded = false;
  const auto start = Clock::now();
  const auto end = start + bound;
  auto nextCheck = start + kPollCheck;
  for (;;) {
    // Yielding, one look between yields: a look at every ring is not free,
    // and a thread of the job that has work waits for it.
    const int looks = mode == PollMode::kYield ? 1 : 16;
    for (int i = 0; i < looks; ++i) {
      if (something()) {
        pollHits_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      if (looks > 1) cpuRelax();
    }
    if (mode == PollMode::kYield) {
      if (!std::exchange(yielded, true)) yieldingPolls_.fetch_add(1, std::memory_order_relaxed);
      sched_yield();  // a thread of the job that shares the CPU runs first
    }
    const auto now = Clock::now();
    if (now >= end || turn_.load(std::memory_order_seq_cst) != turn) return false;
    if (now >= nextCheck) {
      if (keepOn && (mode = keepOn()) == PollMode::kStop) {
        pollsStopped_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      nextCheck = now + kPollCheck;
    }
  }
}

uint64_t Mailbox::takeTurn() {
  Header* h = header(*seg_);
  const uint64_t t = turn_.fetch_add(1, std::memory_order_seq_cst) + 1;
  uint32_t bell = h->doorbell.fetch_add(1, std::memory_order_seq_cst) + 1;
  for (int tries = 0; tries < 8; ++tries) {
    if (requeueAll(&h->doorbell, &parking_, bell) >= 0) return t;
    if (errno != EAGAIN) break;
    bell = h->doorbell.load(std::memory_order_seq_cst);  // a producer rang meanwhile
  }
  // The doorbell kept ringing: wake whoever sleeps on it; a thread of an
  // earlier turn then parks by itself.
  wakeAll(&h->doorbell);
  return t;
}

void Mailbox::giveBack(int32_t sleeperSlot) {
  Header* h = header(*seg_);
  if (threads_) h->sleeperSlot.store(sleeperSlot, std::memory_order_relaxed);
  const uint32_t bell = h->doorbell.load(std::memory_order_seq_cst);
  // Announce the parked thread as asleep before the last look, as wait()
  // does: a producer that publishes after the look sees `sleeping` and
  // rings.
  h->sleeping.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // A park() between its ticket and its sleep returns at once.
  const uint32_t ticket = parking_.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (changed() || requeueAll(&parking_, &h->doorbell, ticket) < 0) {
    h->sleeping.store(0, std::memory_order_relaxed);
    wakeAll(&parking_);
    return;
  }
  // A producer that rang before the parked thread was on the doorbell woke
  // nobody.
  if (h->doorbell.load(std::memory_order_seq_cst) != bell) wakeAll(&h->doorbell);
}

void Mailbox::park(uint32_t ticket, std::chrono::steady_clock::time_point until) {
  if (header(*seg_)->open.load(std::memory_order_acquire) == 0) return;
  if (auto ts = timeoutUntil(until)) futex(&parking_, FUTEX_WAIT, ticket, &*ts);
}

void Mailbox::shut() {
  header(*seg_)->open.store(0, std::memory_order_release);
  wake();
  parking_.fetch_add(1, std::memory_order_seq_cst);
  wakeAll(&parking_);
}

void Mailbox::wake() {
  Header* h = header(*seg_);
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  wakeAll(&h->doorbell);
}

std::unique_ptr<MailboxSender> MailboxSender::open(const std::string& name, const NodeId& self,
                                                   const std::string& host) {
  std::unique_ptr<Segment> seg;
  try {
    seg = Segment::open(name);
  } catch (const Error&) {
    return nullptr;  // no mailbox: the peer takes no ring messages
  }
  if (seg->size() < kHeaderBytes) return nullptr;
  Header* h = header(*seg);
  if (h->magic != kMagic || h->version != kVersion || h->rings == 0 || h->slots == 0 ||
      (h->slots & (h->slots - 1)) != 0 || h->slotBytes < 64 ||
      seg->size() < totalBytes(shapeOf(h))) {
    CORTADO_LOG_WARN("shared-memory mailbox {} is not one this build reads; using the transport",
                     name);
    return nullptr;
  }
  if (std::strncmp(h->host, host.c_str(), kHostBytes - 1) != 0 ||
      h->open.load(std::memory_order_acquire) == 0)
    return nullptr;
  // A consumer whose pid this process cannot see (another pid namespace
  // sharing /dev/shm) could not be told dead: its messages keep the transport.
  if (!processAlive(h->consumerPid)) return nullptr;
  const int32_t pid = static_cast<int32_t>(getpid());
  const uint32_t role = static_cast<uint32_t>(self.role);
  for (uint32_t r = 0; r < h->rings; ++r) {
    RingHeader* rh = ring(*seg, r);
    uint32_t st = rh->state.load(std::memory_order_acquire);
    if (st == kReady && rh->producerPid == pid && rh->producerRole == role &&
        rh->producerRank == self.rank) {
      rh->left.store(0, std::memory_order_release);
      return std::unique_ptr<MailboxSender>(new MailboxSender(std::move(seg), r));
    }
    if (st != kFree) continue;
    if (!rh->state.compare_exchange_strong(st, kClaiming, std::memory_order_acq_rel)) continue;
    rh->producerPid = pid;
    rh->producerRole = role;
    rh->producerRank = self.rank;
    rh->left.store(0, std::memory_order_relaxed);
    rh->state.store(kReady, std::memory_order_release);
    h->claimed.fetch_add(1, std::memory_order_acq_rel);
    // A consumer asleep learns of the ring at once.
    if (h->sleeping.load(std::memory_order_seq_cst) == 1) {
      h->doorbell.fetch_add(1, std::memory_order_acq_rel);
      futex(&h->doorbell, FUTEX_WAKE, 1, nullptr);
    }
    return std::unique_ptr<MailboxSender>(new MailboxSender(std::move(seg), r));
  }
  return nullptr;  // every ring taken
}

MailboxSender::MailboxSender(std::unique_ptr<Segment> seg, uint32_t ring)
    : seg_(std::move(seg)), ring_(ring) {}

MailboxSender::~MailboxSender() { leave(); }

void MailboxSender::leave() {
  if (seg_) ring(*seg_, ring_)->left.store(1, std::memory_order_release);
}

int32_t MailboxSender::consumerPid() const { return header(*seg_)->consumerPid; }

bool MailboxSender::consumerOpen() const {
  return header(*seg_)->open.load(std::memory_order_acquire) != 0;
}

bool MailboxSender::consumerAlive() const { return processAlive(consumerPid()); }

bool MailboxSender::consumerAsleep() const {
  return header(*seg_)->sleeping.load(std::memory_order_seq_cst) == 1;
}

MailboxSender::Result MailboxSender::trySend(const std::vector<Buffer>& parts, uint64_t afterInner,
                                             JobThreads* threads) {
  Header* h = header(*seg_);
  RingHeader* rh = ring(*seg_, ring_);
  if (rh->state.load(std::memory_order_acquire) != kReady ||
      h->open.load(std::memory_order_acquire) == 0)
    return Result::kRefused;
  const size_t bytes = recordBytes(parts, shapeOf(h));
  if (bytes == 0) return Result::kTooBig;
  const uint64_t tail = rh->tail.load(std::memory_order_relaxed);
  if (tail - rh->head.load(std::memory_order_acquire) >= h->slots) return Result::kFull;
  uint8_t* s = slot(*seg_, ring_, tail);
  RecordHeader rec{static_cast<uint32_t>(bytes), static_cast<uint16_t>(parts.size()), 0, afterInner};
  std::memcpy(s, &rec, sizeof(rec));
  size_t off = sizeof(RecordHeader) + 4 * parts.size();
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint32_t len = static_cast<uint32_t>(parts[i].size());
    std::memcpy(s + sizeof(RecordHeader) + 4 * i, &len, 4);
    if (len) std::memcpy(s + off, parts[i].data(), len);
    off += len;
  }
  rh->tail.store(tail + 1, std::memory_order_release);
  // Pairs with the consumer's store of `sleeping` and its look at the tails
  // (both sequentially consistent): one of the two sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (h->sleeping.load(std::memory_order_relaxed) == 1 &&
      h->sleeping.exchange(0, std::memory_order_acq_rel) == 1) {
    // Runnable from the wake-up on: counted as the job's from then.
    if (threads) threads->awake(h->sleeperSlot.load(std::memory_order_relaxed));
    h->doorbell.fetch_add(1, std::memory_order_acq_rel);
    futex(&h->doorbell, FUTEX_WAKE, 1, nullptr);
  }
  return Result::kSent;
}

}  // namespace cortado::shm
