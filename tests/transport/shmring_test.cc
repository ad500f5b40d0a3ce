// Same-host messages through shared-memory rings (core/shm/mailbox.h,
// core/transport/shmring): the ring itself (order across wrap-around, a full
// ring, a consumer that sleeps is woken, malformed records refused, a dead
// producer or consumer detected within a deadline), and the conformance
// suite on the ring transport in front of ZeroMQ, where the rings carry the
// small messages and ZeroMQ the large ones.
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/common/deadline.h"
#include "core/common/idle_cpus.h"
#include "core/shm/job_threads.h"
#include "core/shm/mailbox.h"
#include "core/transport/inproc/factory.h"
#include "core/transport/shmring/factory.h"
#include "core/transport/zmq/factory.h"
#include "tests/transport/transport_test.h"

namespace cortado::transport::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using shm::Mailbox;
using shm::MailboxSender;
using Result = MailboxSender::Result;

const NodeId kWorker{Role::kWorker, 3};
const NodeId kServer{Role::kServer, 1};

std::string uniqueName(const char* what) {
  static std::atomic<int> n{0};
  return fmt::format("/cortado-ringtest-{}-{}-{}", ::getpid(), what, n++);
}

bool segmentExists(const std::string& name) {
  return ::access(fmt::format("/dev/shm{}", name).c_str(), F_OK) == 0;
}

Buffer u64(uint64_t v) { return Buffer::copyOf(&v, sizeof(v)); }
uint64_t u64(const Buffer& b) {
  uint64_t v = ~0ull;
  if (b.size() == sizeof(v)) std::memcpy(&v, b.data(), sizeof(v));
  return v;
}

// Waits on the mailbox for one record of ring `r`, with a deadline.
std::optional<Mailbox::Record> nextRecord(Mailbox& mb, uint32_t r, Clock::time_point until) {
  while (Clock::now() < until) {
    if (auto rec = mb.front(r)) return rec;
    mb.wait(0us, std::min(until, Clock::now() + 100ms));
  }
  return std::nullopt;
}

TEST(Mailbox, RecordsArriveInOrderAcrossWrapAroundWithTheirParts) {
  const std::string name = uniqueName("order");
  auto mb = Mailbox::create(name, "h", {4, 8, 128});
  auto tx = MailboxSender::open(name, kWorker, "h");
  ASSERT_TRUE(tx);
  auto rings = mb->rings();
  ASSERT_EQ(rings.size(), 1u);
  EXPECT_EQ(mb->producer(rings[0]), kWorker);
  EXPECT_EQ(mb->producerPid(rings[0]), ::getpid());
  constexpr uint64_t kCount = 5000;  // 625 times round the 8 slots
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCount; ++i) {
      // Zero-length parts, and a varying number of parts.
      std::vector<Buffer> parts{u64(i), Buffer(), Buffer::copyOf("abc", i % 4)};
      const auto until = Clock::now() + 20s;
      while (tx->trySend(parts, i / 7) == Result::kFull && Clock::now() < until)
        std::this_thread::yield();
    }
  });
  const auto until = Clock::now() + 30s;
  uint64_t got = 0;
  for (; got < kCount; ++got) {
    auto rec = nextRecord(*mb, rings[0], until);
    ASSERT_TRUE(rec) << "record " << got << " did not arrive";
    ASSERT_EQ(rec->parts.size(), 3u);
    ASSERT_EQ(u64(rec->parts[0]), got);
    EXPECT_EQ(rec->parts[1].size(), 0u);
    ASSERT_EQ(rec->parts[2].size(), got % 4);
    EXPECT_EQ(std::memcmp(rec->parts[2].data(), "abc", got % 4), 0);
    EXPECT_EQ(rec->afterInner, got / 7);
    EXPECT_EQ(rec->producer, kWorker);
    mb->pop(rings[0]);
  }
  producer.join();
  EXPECT_FALSE(mb->front(rings[0]));
}

TEST(Mailbox, AFullRingRefusesUntilTheConsumerTakesOneAndTooBigIsSaid) {
  const std::string name = uniqueName("full");
  auto mb = Mailbox::create(name, "h", {2, 4, 64});
  auto tx = MailboxSender::open(name, kWorker, "h");
  ASSERT_TRUE(tx);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(tx->trySend({u64(i)}, 0), Result::kSent);
  EXPECT_EQ(tx->trySend({u64(4)}, 0), Result::kFull);
  // 16 bytes of record header, 4 of length: 44 bytes is the most a part holds.
  EXPECT_EQ(shm::recordBytes({Buffer::allocate(44)}, {2, 4, 64}), 64u);
  EXPECT_EQ(shm::recordBytes({Buffer::allocate(45)}, {2, 4, 64}), 0u);
  const uint32_t r = mb->rings().at(0);
  ASSERT_TRUE(mb->front(r));
  mb->pop(r);
  EXPECT_EQ(tx->trySend({u64(4)}, 0), Result::kSent);
  EXPECT_EQ(tx->trySend({Buffer::allocate(45)}, 0), Result::kTooBig);
  for (uint64_t i = 1; i <= 4; ++i) {
    auto rec = mb->front(r);
    ASSERT_TRUE(rec);
    EXPECT_EQ(u64(rec->parts.at(0)), i);
    mb->pop(r);
  }
}

TEST(Mailbox, OtherHostsRingsAreNotUsedAndTheSegmentGoesWithItsCreator) {
  const std::string name = uniqueName("host");
  {
    auto mb = Mailbox::create(name, "host-a", {3, 4, 64});
    EXPECT_TRUE(segmentExists(name));
    EXPECT_FALSE(MailboxSender::open(name, kWorker, "host-b"));
    // One ring per producer: the same node in the same process takes its
    // back, so the worker holds one ring of the three after two opens.
    EXPECT_TRUE(MailboxSender::open(name, kWorker, "host-a"));
    EXPECT_TRUE(MailboxSender::open(name, kWorker, "host-a"));
    auto a = MailboxSender::open(name, kServer, "host-a");
    auto b = MailboxSender::open(name, NodeId{Role::kServer, 2}, "host-a");
    ASSERT_TRUE(a);
    ASSERT_TRUE(b);
    EXPECT_FALSE(MailboxSender::open(name, NodeId{Role::kServer, 3}, "host-a"))
        << "a fourth producer got a ring of three";
    mb->shut();
    EXPECT_EQ(a->trySend({u64(1)}, 0), Result::kRefused);
    EXPECT_FALSE(a->consumerOpen());
  }
  EXPECT_FALSE(segmentExists(name)) << name << " stayed after its mailbox went";
  EXPECT_FALSE(MailboxSender::open(name, kWorker, "host-a"));
}

TEST(Mailbox, ASleepingConsumerIsWokenByTheProducer) {
  const std::string name = uniqueName("wake");
  auto mb = Mailbox::create(name, "h", {2, 4, 64});
  auto tx = MailboxSender::open(name, kWorker, "h");
  ASSERT_TRUE(tx);
  const uint32_t r = mb->rings().at(0);
  ASSERT_FALSE(mb->wait(0us, Clock::now() + 10ms));  // nothing: times out
  for (int round = 0; round < 20; ++round) {
    std::thread producer([&] {
      std::this_thread::sleep_for(20ms);  // the consumer is asleep by then
      EXPECT_EQ(tx->trySend({u64(round)}, 0), Result::kSent);
    });
    const auto start = Clock::now();
    bool woke = false;
    while (!woke && Clock::now() - start < 30s) woke = mb->wait(0us, start + 30s);
    const auto took = Clock::now() - start;
    producer.join();
    ASSERT_TRUE(woke);
    EXPECT_LT(took, 10s) << "the doorbell did not wake the consumer; the deadline did";
    auto rec = mb->front(r);
    ASSERT_TRUE(rec);
    EXPECT_EQ(u64(rec->parts.at(0)), uint64_t(round));
    mb->pop(r);
  }
  EXPECT_GE(mb->sleeps(), 20u);
  // wake() from another thread ends a wait too (close()).
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    mb->wake();
  });
  const auto start = Clock::now();
  mb->wait(0us, start + 30s);
  waker.join();
  EXPECT_LT(Clock::now() - start, 10s);
}

// The bounded poll (a server's ring thread while a worker waits for an
// answer): a record written while it polls ends it at once, without a
// futex sleep; with nothing to find it gives up when its bound passes or,
// sooner, when keepOn() turns false, and a later turn of another thread
// ends it too.
TEST(Mailbox, ABoundedPollFindsARecordOrGivesUp) {
  constexpr auto kSpin = Mailbox::PollMode::kSpin, kStop = Mailbox::PollMode::kStop;
  const std::string name = uniqueName("poll");
  auto mb = Mailbox::create(name, "h", {2, 4, 64});
  auto tx = MailboxSender::open(name, kWorker, "h");
  ASSERT_TRUE(tx);
  const uint32_t r = mb->rings().at(0);
  ASSERT_FALSE(mb->front(r));  // the claim seen

  // Nothing comes: it gives up after its bound, and keepOn was looked at
  // every few microseconds meanwhile.
  int looks = 0;
  auto start = Clock::now();
  EXPECT_FALSE(mb->poll(2ms, mb->turn(), [&] { return ++looks, kSpin; }));
  auto took = Clock::now() - start;
  EXPECT_GE(took, 2ms);
  EXPECT_LT(took, 5s);
  EXPECT_GE(looks, 2);
  EXPECT_EQ(mb->polls(), 1u);
  EXPECT_EQ(mb->pollHits(), 0u);

  // keepOn false at the first look: no poll at all; false later: it stops
  // then, long before its bound.
  looks = 0;
  EXPECT_FALSE(mb->poll(10s, mb->turn(), [&] { return ++looks, kStop; }));
  EXPECT_EQ(looks, 1);
  EXPECT_EQ(mb->polls(), 1u);
  looks = 0;
  start = Clock::now();
  EXPECT_FALSE(mb->poll(10s, mb->turn(), [&] { return ++looks < 4 ? kSpin : kStop; }));
  EXPECT_EQ(looks, 4);
  EXPECT_LT(Clock::now() - start, 5s);
  // A zero bound never polls.
  EXPECT_FALSE(mb->poll(0us, mb->turn(), std::function<Mailbox::PollMode()>()));
  EXPECT_EQ(mb->polls(), 2u);

  // A record written while it polls ends it, and no futex sleep was made.
  const uint64_t sleeps = mb->sleeps();
  for (int round = 0; round < 5; ++round) {
    std::thread producer([&] {
      std::this_thread::sleep_for(2ms);
      EXPECT_EQ(tx->trySend({u64(round)}, 0), Result::kSent);
    });
    start = Clock::now();
    const bool got = mb->poll(20s, mb->turn(), [] { return kSpin; });
    took = Clock::now() - start;
    producer.join();
    ASSERT_TRUE(got);
    EXPECT_LT(took, 10s);
    auto rec = mb->front(r);
    ASSERT_TRUE(rec);
    EXPECT_EQ(u64(rec->parts.at(0)), uint64_t(round));
    mb->pop(r);
  }
  EXPECT_EQ(mb->pollHits(), 5u);
  EXPECT_EQ(mb->sleeps(), sleeps);
  // A record already there: true without polling.
  EXPECT_EQ(tx->trySend({u64(99)}, 0), Result::kSent);
  EXPECT_TRUE(mb->poll(10s, mb->turn(), [] { return kSpin; }));
  mb->pop(r);
  ASSERT_FALSE(mb->front(r));

  // Another thread takes a later turn: the poll of the earlier one ends.
  const uint64_t mine = mb->turn();
  std::thread taker([&] {
    std::this_thread::sleep_for(2ms);
    mb->takeTurn();
  });
  start = Clock::now();
  EXPECT_FALSE(mb->poll(20s, mine, [] { return kSpin; }));
  EXPECT_LT(Clock::now() - start, 10s);
  taker.join();
  mb->giveBack();
}

// The gate of the polls: /proc/loadavg's runnable threads against the CPUs.
// Threads that never sleep until stop() (or the end of the scope): each is
// runnable all the time, whatever else the machine runs.
class BusyThreads {
 public:
  explicit BusyThreads(int n) {
    for (int i = 0; i < n; ++i)
      threads_.emplace_back([this] {
        while (!stop_.load(std::memory_order_relaxed)) {
        }
      });
  }
  ~BusyThreads() { stop(); }
  void stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

TEST(IdleCpus, TheRunnableCountIsParsedAndBusyThreadsCloseTheGate) {
  const char good[] = "0.52 0.58 0.59 3/467 12345\n";
  EXPECT_EQ(IdleCpus::parseRunnable(good, int(sizeof(good) - 1)), 3);
  const char wide[] = "12.00  8.10  4.05  17/1024 99\n";
  EXPECT_EQ(IdleCpus::parseRunnable(wide, int(sizeof(wide) - 1)), 17);
  for (const char* bad : {"", "0.52 0.58", "0.52 0.58 0.59 x/467 1", "0.52 0.58 0.59 3 467",
                          "0.52 0.58 0.59 "})
    EXPECT_EQ(IdleCpus::parseRunnable(bad, int(std::strlen(bad))), -1) << "'" << bad << "'";

  // The caller runs, so it counts itself: a gate of more CPUs than the
  // machine's threads is open.
  IdleCpus roomy(1 << 20);
  EXPECT_TRUE(roomy.spare());
  EXPECT_GE(roomy.lastRunnable(), 1);
  // Two threads that never sleep, and the caller: at least three runnable,
  // more than a gate of one CPU allows, whatever else the machine runs.
  BusyThreads busy(2);
  IdleCpus one(1, 0us);
  bool closed = false;
  const auto until = Clock::now() + 5s;
  while (!closed && Clock::now() < until) closed = !one.spare();  // the threads have started
  // Found closed, a gate says closed without a read for a while, 8 us
  // after the first closed read and twice as long after each further one
  // (here up to 10 s): after 18 closed reads (about a second of holds in
  // all) it holds for over a second, and says closed without a read even
  // once the machine has room.
  IdleCpus held(1, 10s);
  while (held.reads() < 18 && Clock::now() < until + 10s) {
    const auto n = held.reads();
    if (held.spare()) break;  // cannot be: the busy threads still run
    if (held.reads() == n) continue;  // held closed, no read
  }
  const auto reads = held.reads();
  const int counted = held.lastRunnable();
  busy.stop();
  EXPECT_TRUE(closed) << "runnable " << one.lastRunnable() << " with two busy threads";
  EXPECT_GE(one.lastRunnable(), 3);
  ASSERT_EQ(reads, 18u) << "the held gate opened with two busy threads (runnable "
                        << held.lastRunnable() << ")";
  IdleCpus fresh(1 << 20);
  EXPECT_TRUE(fresh.spare());
  EXPECT_EQ(fresh.reads(), 1u);
  EXPECT_FALSE(held.spare());
  EXPECT_EQ(held.reads(), reads);
  EXPECT_EQ(held.lastRunnable(), counted);
}

// The gate with the job's threads counted (CORTADO_SHM_YIELD_POLLS): open
// while the runnable threads are at most the CPUs; past that, open for the
// job only while the job's awake threads are at least the runnable ones.
TEST(IdleCpus, TheJobsOwnThreadsOpenTheGateOnlyWhenNoOtherWantsACpu) {
  using V = IdleCpus::Verdict;
  struct Case {
    int runnable, cpus, job;
    V want;
  } cases[] = {
      {1, 2, -1, V::kSpare},   {2, 2, -1, V::kSpare},    {3, 2, -1, V::kClosed},
      {2, 2, 0, V::kSpare},    {5, 2, 5, V::kJobOnly},   {5, 2, 6, V::kJobOnly},
      {5, 2, 4, V::kClosed},   {5, 2, 0, V::kClosed},    {3, 2, -1, V::kClosed},
      {0, 2, 5, V::kClosed},   {-1, 2, 5, V::kClosed},   {17, 16, 17, V::kJobOnly},
  };
  for (const auto& c : cases)
    EXPECT_EQ(IdleCpus::judge(c.runnable, c.cpus, c.job), c.want)
        << c.runnable << " runnable on " << c.cpus << " CPUs, " << c.job << " of the job's";

  // Two threads that never sleep, and the caller, on a gate of one CPU: the
  // gate is closed, unless the count of the job's threads covers them all;
  // the count is asked only when the runnable threads are more than the CPUs.
  BusyThreads busy(2);
  IdleCpus one(1, 0us);
  int asked = 0;
  V closed = V::kSpare, job = V::kSpare;
  const auto until = Clock::now() + 5s;
  while (closed != V::kClosed && Clock::now() < until)
    closed = one.look([&] { return ++asked, 0; });
  const int askedWhenClosed = asked;
  while (job != V::kJobOnly && Clock::now() < until)
    job = one.look([&] { return ++asked, 1 << 20; });
  // A kJobOnly read holds (here 10 s) without a read, whatever the count
  // says meanwhile; a gate without the hold reads again.
  IdleCpus heldForJob(1, 0us, 10s);
  V first = V::kSpare;
  while (first != V::kJobOnly && Clock::now() < until)
    first = heldForJob.look([] { return 1 << 20; });
  const auto readsThen = heldForJob.reads();
  const V later = heldForJob.look([] { return 0; });
  const auto readsLater = heldForJob.reads();
  IdleCpus unheld(1, 0us, 0us);
  V unheldFirst = V::kSpare, unheldLater = V::kSpare;
  while (unheldFirst != V::kJobOnly && Clock::now() < until)
    unheldFirst = unheld.look([] { return 1 << 20; });
  while (unheldLater != V::kClosed && Clock::now() < until)
    unheldLater = unheld.look([] { return 0; });
  busy.stop();
  EXPECT_EQ(closed, V::kClosed) << "runnable " << one.lastRunnable();
  EXPECT_GE(askedWhenClosed, 1);
  EXPECT_EQ(job, V::kJobOnly) << "runnable " << one.lastRunnable() << ", job " << one.lastJob();
  EXPECT_GE(one.said(V::kClosed), 1u);
  EXPECT_GE(one.said(V::kJobOnly), 1u);
  EXPECT_EQ(first, V::kJobOnly);
  EXPECT_EQ(later, V::kJobOnly) << "a held kJobOnly gate read again";
  EXPECT_EQ(readsLater, readsThen);
  EXPECT_EQ(unheldFirst, V::kJobOnly);
  EXPECT_EQ(unheldLater, V::kClosed) << "without the hold, the job's count of 0 closes the gate";
  // With room, the count is not asked.
  IdleCpus roomy(1 << 20);
  int roomyAsked = 0;
  EXPECT_EQ(roomy.look([&] { return ++roomyAsked, 0; }), V::kSpare);
  EXPECT_EQ(roomyAsked, 0);
  EXPECT_EQ(roomy.lastJob(), -1);
}

// A waiting thread's polls back off while they miss: after the k-th miss in
// a row the next 2^k - 1 waits sleep at once, at most 63; a hit starts over.
TEST(PollBackoff, MissesSkipTwoToTheKMinusOneWaitsUpToSixtyThree) {
  PollBackoff b;
  EXPECT_TRUE(b.shouldPoll());
  EXPECT_TRUE(b.shouldPoll()) << "no miss yet: every wait polls";
  // Miss k (1..8): the next 2^min(k,6) - 1 waits skip, then one polls.
  for (int k = 1; k <= 8; ++k) {
    b.missed();
    const int want = (1 << std::min(k, 6)) - 1;
    EXPECT_EQ(b.misses(), std::min(k, 6));
    int skipped = 0;
    while (!b.shouldPoll() && skipped <= 100) ++skipped;
    EXPECT_EQ(skipped, want) << "after miss " << k;
  }
  // A hit starts over: the next miss skips one wait.
  b.hit();
  EXPECT_EQ(b.misses(), 0);
  EXPECT_TRUE(b.shouldPoll());
  b.missed();
  EXPECT_FALSE(b.shouldPoll());
  EXPECT_TRUE(b.shouldPoll());
  // A hit after misses, with skips left, does not cancel those skips (the
  // thread polls only once they are used), but the next miss counts from 1.
  b.missed();  // miss 2: 3 skips
  EXPECT_FALSE(b.shouldPoll());
  b.hit();
  EXPECT_EQ(b.skipsLeft(), 2);
  EXPECT_FALSE(b.shouldPoll());
  EXPECT_FALSE(b.shouldPoll());
  EXPECT_TRUE(b.shouldPoll());
  b.missed();
  EXPECT_EQ(b.skipsLeft(), 1);
}

// The job's awake threads in shared memory (core/shm/job_threads.h): each
// thread counts while stamped and for at most the grace after; two objects
// on one prefix (two processes) see one count; another thread's slot can
// be stamped by the thread that wakes it; the last object unlinks.
TEST(JobThreads, AwakeThreadsCountForTheirGraceAcrossObjects) {
  const std::string prefix = uniqueName("threads");
  const std::string name = shm::JobThreads::segmentName(prefix);
  auto a = shm::JobThreads::open(prefix, 2s);
  auto b = shm::JobThreads::open(prefix, 2s);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(segmentExists(name));
  EXPECT_EQ(a->count(), 0);
  EXPECT_EQ(a->claimed(), 2u) << "each object registers its process once";
  a->awake();
  EXPECT_EQ(a->count(), 1);
  EXPECT_EQ(b->count(), 1) << "another object of the job sees the same count";
  b->awake();  // the same thread, its own slot in b
  EXPECT_EQ(a->count(), 2);
  a->asleep();
  EXPECT_EQ(b->count(), 1);
  b->asleep();
  EXPECT_EQ(a->count(), 0);

  // Three threads awake at once, then asleep; a fourth is stamped by this
  // thread, as a waker does, and counts without having run.
  int32_t sleeperSlot = -1;
  {
    std::mutex mu;
    std::condition_variable cv;
    int stamped = 0;
    bool release = false;
    std::vector<std::thread> ts;
    for (int i = 0; i < 3; ++i)
      ts.emplace_back([&] {
        a->awake();
        std::unique_lock<std::mutex> lk(mu);
        ++stamped;
        cv.notify_all();
        cv.wait(lk, [&] { return release; });
        a->asleep();
      });
    std::thread sleeper([&] {
      std::lock_guard<std::mutex> lk(mu);
      sleeperSlot = a->slotIndex();
    });
    sleeper.join();
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return stamped == 3; });
      EXPECT_EQ(b->count(), 3);
      release = true;
      cv.notify_all();
    }
    for (auto& t : ts) t.join();
  }
  EXPECT_EQ(a->count(), 0);
  ASSERT_GE(sleeperSlot, 0);
  b->awake(sleeperSlot);
  EXPECT_EQ(a->count(), 1) << "the slot its waker stamped";
  b->awake(-1);
  b->awake(int32_t(shm::JobThreads::kSlots));  // out of range: ignored
  EXPECT_EQ(a->count(), 1);

  // A thread that stops refreshing its stamp without clearing it counts for
  // at most the grace (2 s here).
  a->awake();
  EXPECT_EQ(a->count(), 2);
  const auto deadline = Clock::now() + 10s;
  while (a->count() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(a->count(), 0) << "stale stamps still counted after the grace";

  a.reset();
  EXPECT_TRUE(segmentExists(name)) << "unlinked while another object of the job has it";
  b.reset();
  EXPECT_FALSE(segmentExists(name)) << "the last object of the job left its segment behind";
}

// A role killed with kill -9 while counted awake: its stamp stops counting
// within the grace, its slots are taken over once no free one is left, and
// the last live object still unlinks the segment. A segment of another
// size (another build) is refused with a warning, not used.
TEST(JobThreads, AKilledProcessCountsForAtMostTheGraceAndItsSlotsAreTakenOver) {
  const std::string prefix = uniqueName("killed");
  const std::string name = shm::JobThreads::segmentName(prefix);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child: registers, stamps a thread awake for good, says so, waits.
    auto jt = shm::JobThreads::open(prefix, 2s);
    if (!jt) ::_exit(2);
    jt->awake();
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(3);
    for (;;) {
      jt->awake();  // refreshes, as a polling thread does
      ::usleep(1000);
    }
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the child never counted itself";
  ::close(ready[0]);
  auto jt = shm::JobThreads::open(prefix, 2s);
  ASSERT_TRUE(jt);
  EXPECT_EQ(jt->count(), 1) << "the child's awake thread";
  EXPECT_EQ(jt->claimed(), 3u) << "the child's registration and thread, and ours";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const auto killed = Clock::now();
  while (jt->count() > 0 && Clock::now() - killed < 10s) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(jt->count(), 0) << "a killed process's thread still counted after the grace";
  // Threads of ours claim every free slot; then one more takes over a slot
  // of the dead process.
  const uint32_t free = shm::JobThreads::kSlots - jt->claimed();
  for (uint32_t i = 0; i < free; ++i) {
    int32_t got = -2;
    std::thread([&] { got = jt->slotIndex(); }).join();
    ASSERT_GE(got, 0) << "slot " << i << " of " << free;
  }
  EXPECT_EQ(jt->claimed(), shm::JobThreads::kSlots);
  int32_t taken = -2;
  std::thread([&] {
    taken = jt->slotIndex();
    jt->awake();
  }).join();
  EXPECT_GE(taken, 0) << "no slot taken over from the dead process or dead threads";
  EXPECT_EQ(jt->count(), 1);
  jt.reset();
  EXPECT_FALSE(segmentExists(name)) << "the only live process left the segment behind";

  // A segment of another size is not used.
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 100), 0);
  ::close(fd);
  EXPECT_EQ(shm::JobThreads::open(prefix), nullptr);
  ::shm_unlink(name.c_str());
}

// The producer that rings a sleeping consumer's doorbell stamps the
// consumer's thread awake in the job's count before its FUTEX_WAKE (the
// woken thread is runnable from then on, but could stamp itself only once
// it runs). The consumer is a child process, stopped with SIGSTOP once it
// sleeps, so that the stamp seen is the producer's.
TEST(JobThreads, AProducerStampsTheSleepingConsumerItWakes) {
  const std::string prefix = uniqueName("waker");
  const std::string name = fmt::format("{}-mb", prefix);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto jt = shm::JobThreads::open(prefix, 30s);
    auto mb = Mailbox::create(name, "host-a");
    if (!jt || !mb) ::_exit(2);
    mb->countThreads(jt.get());
    jt->awake();
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(3);
    const auto until = Clock::now() + 60s;
    while (Clock::now() < until) {
      for (uint32_t r : mb->rings())  // learns the claimed ring, takes what came
        while (mb->front(r)) mb->pop(r);
      mb->wait(0us, until);  // sleeps on the doorbell
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
  } reap{child};
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the child never made its mailbox";
  ::close(ready[0]);
  auto jt = shm::JobThreads::open(prefix, 30s);
  ASSERT_TRUE(jt);
  auto tx = MailboxSender::open(name, kWorker, "host-a");
  ASSERT_TRUE(tx);
  // The claim of the ring may wake the child once; it sleeps again.
  const auto deadline = Clock::now() + 20s;
  while (!(tx->consumerAsleep() && jt->count() == 0) && Clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(tx->consumerAsleep()) << "the child never slept on its doorbell";
  EXPECT_EQ(jt->count(), 0) << "a sleeping consumer still counted awake";
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  ASSERT_TRUE(tx->consumerAsleep());
  ASSERT_EQ(tx->trySend({u64(7)}, 0, jt.get()), Result::kSent);
  EXPECT_FALSE(tx->consumerAsleep()) << "the record did not ring the doorbell";
  EXPECT_EQ(jt->count(), 1) << "the waker did not stamp the stopped consumer's thread";
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  tx.reset();
  jt.reset();
  EXPECT_FALSE(segmentExists(shm::JobThreads::segmentName(prefix)))
      << "the last live process of the job left its count behind";
  ::shm_unlink(name.c_str());
}

TEST(Mailbox, MalformedRecordsAreRefusedNamingTheProducer) {
  const std::string name = uniqueName("bad");
  auto mb = Mailbox::create(name, "h", {2, 4, 128});
  auto tx = MailboxSender::open(name, kWorker, "h");
  ASSERT_TRUE(tx);
  const uint64_t marker = 0x5eed5eed5eed5eedull;
  ASSERT_EQ(tx->trySend({u64(marker)}, 0), Result::kSent);
  // What a broken or hostile producer could write: find the record by its
  // bytes (header, one length, the part) and claim a length past the slot.
  auto seg = shm::Segment::open(name);
  uint8_t* at = static_cast<uint8_t*>(memmem(seg->data(), seg->size(), &marker, sizeof(marker)));
  ASSERT_NE(at, nullptr);
  const uint32_t huge = 1u << 30;
  std::memcpy(at - 4, &huge, 4);  // the part's length
  const uint32_t r = mb->rings().at(0);
  try {
    mb->front(r);
    FAIL() << "a part running past its record was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol);
    EXPECT_NE(std::string(e.what()).find(kWorker.toString()), std::string::npos) << e.what();
  }
  EXPECT_EQ(tx->trySend({u64(1)}, 0), Result::kRefused) << "the producer kept using a refused ring";
}

// Whether thread `tid` of this process is blocked (state S in its stat).
bool blocked(pid_t tid) {
  FILE* f = std::fopen(fmt::format("/proc/self/task/{}/stat", tid).c_str(), "r");
  if (!f) return false;
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // the name may hold spaces
  return n > 0 && paren && paren[1] == ' ' && paren[2] == 'S';
}

// Waits (up to 5 s) until the thread whose id `tid` holds has blocked.
bool untilBlocked(const std::atomic<pid_t>& tid) {
  const auto until = Clock::now() + 5s;
  while (Clock::now() < until) {
    if (tid.load() != 0 && blocked(tid.load())) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

// The consumer's turns: the thread whose turn it is gets the producer's
// wake-up; the thread of an earlier turn (asleep in wait(), or parked) is
// neither woken by the turn's taking nor by its giving back, and the first
// record after the giving back wakes it.
TEST(Mailbox, TheTurnsThreadGetsTheWakeUpAndTheParkedOneSleepsUntilItsTurnComes) {
  const std::string name = uniqueName("turns");
  auto mb = Mailbox::create(name, "h", {2, 8, 64});
  auto tx = MailboxSender::open(name, kWorker, "h");
  ASSERT_TRUE(tx);
  const uint32_t r = mb->rings().at(0);
  // This thread's turn: records 0..9 must wake it, not the other.
  auto takeRecords = [&](uint64_t turn, uint64_t from) {
    for (uint64_t i = from; i < from + 10; ++i) {
      std::thread producer([&] {
        std::this_thread::sleep_for(5ms);
        EXPECT_EQ(tx->trySend({u64(i)}, 0), Result::kSent);
      });
      const auto start = Clock::now();
      bool woke = false;
      while (!woke && Clock::now() - start < 30s) woke = mb->wait(0us, start + 30s, turn);
      producer.join();
      ASSERT_TRUE(woke);
      EXPECT_LT(Clock::now() - start, 10s) << "the doorbell did not wake the turn's thread";
      auto rec = mb->front(r);
      ASSERT_TRUE(rec);
      EXPECT_EQ(u64(rec->parts.at(0)), i);
      mb->pop(r);
    }
  };

  // A thread asleep in wait() of turn t0.
  std::atomic<pid_t> tid{0};
  std::atomic<bool> back{false}, result{true};
  const uint64_t t0 = mb->turn();
  std::thread sleeper([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    result = mb->wait(0us, Clock::now() + 30s, t0);
    back = true;
  });
  ASSERT_TRUE(untilBlocked(tid)) << "the first consumer never slept";
  const uint64_t t1 = mb->takeTurn();
  EXPECT_NE(t1, t0);
  takeRecords(t1, 0);
  EXPECT_FALSE(back) << "taking the turn or its records woke the thread of the earlier turn";
  mb->giveBack();
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(back) << "giving the turn back woke the parked thread with the rings empty";
  ASSERT_EQ(tx->trySend({u64(100)}, 0), Result::kSent);
  const auto until = Clock::now() + 10s;
  while (!back && Clock::now() < until) std::this_thread::sleep_for(1ms);
  sleeper.join();
  ASSERT_TRUE(back);
  EXPECT_FALSE(result) << "a wait() of an earlier turn said there was something";
  auto rec = mb->front(r);
  ASSERT_TRUE(rec);
  EXPECT_EQ(u64(rec->parts.at(0)), 100u);
  mb->pop(r);

  // A thread parked while another one has the turn.
  tid = 0;
  back = false;
  const uint64_t t2 = mb->takeTurn();
  std::thread parked([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    mb->park(mb->parkTicket(), Clock::now() + 30s);
    back = true;
  });
  ASSERT_TRUE(untilBlocked(tid)) << "the parked thread never slept";
  takeRecords(t2, 200);
  EXPECT_FALSE(back) << "a record woke the parked thread instead of the turn's";
  mb->giveBack();
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(back);
  ASSERT_EQ(tx->trySend({u64(300)}, 0), Result::kSent);
  const auto until2 = Clock::now() + 10s;
  while (!back && Clock::now() < until2) std::this_thread::sleep_for(1ms);
  parked.join();
  EXPECT_TRUE(back) << "the record after giveBack() did not wake the parked thread";
  auto last = mb->front(r);  // the record that woke it is still there
  ASSERT_TRUE(last);
  EXPECT_EQ(u64(last->parts.at(0)), 300u);
  mb->pop(r);
}

// A child process that creates a mailbox (consumer) or writes to ours
// (producer), then is killed: the other side tells within a deadline.
pid_t forkChild(const std::function<void()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    body();
    while (true) ::pause();  // until killed
  }
  return pid;
}

TEST(Mailbox, ADeadConsumerIsDetectedWithinADeadline) {
  const std::string name = uniqueName("deadconsumer");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = forkChild([&] {
    auto mb = Mailbox::create(name, "h", {2, 4, 64}).release();  // never destroyed
    (void)mb;
    char c = 1;
    (void)!::write(ready[1], &c, 1);
  });
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  auto tx = MailboxSender::open(name, kWorker, "h");
  ASSERT_TRUE(tx);
  EXPECT_EQ(tx->consumerPid(), child);
  EXPECT_TRUE(tx->consumerAlive());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto until = Clock::now() + 5s;
  while (tx->consumerAlive() && Clock::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(tx->consumerAlive()) << "the killed consumer still seemed alive";
  ::shm_unlink(name.c_str());  // what the launcher does for a killed role
  ::close(ready[0]);
  ::close(ready[1]);
}

// The ring transport in front of the in-process one, for the tests that
// fork (ZeroMQ's threads do not survive a fork) and count wake-ups.
struct RingNode {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Message> got;
  std::vector<std::thread::id> gotOn;  // the thread each message was delivered on
  std::vector<std::pair<NodeId, Status>> errors;
  // For done() of receiveWhileWaiting, which takes no lock.
  std::atomic<size_t> gotCount{0}, errorCount{0};
  std::atomic<int> inCallback{0}, mostInCallback{0};  // callbacks at once
  // Runs in the receive callback first (set before listen()).
  std::function<void(const Message&)> onMessage;
  std::unique_ptr<Transport> t;

  RingNode(std::shared_ptr<inproc::Hub> hub, const NodeId& self, const std::string& prefix,
           shm::MailboxShape shape = {}, bool waiterReceives = true) {
    shmring::RingOptions o;
    o.prefix = prefix;
    o.host.assign(1, 'h');  // not = "h": GCC 12 warns (-Wrestrict) on that assign once inlined
    o.shape = shape;
    o.checkEvery = 50ms;
    o.waiterReceives = waiterReceives;
    t = shmring::create(inproc::create(std::move(hub), self), o);
    t->setCallbacks(
        [this](Message&& m) {
          enter();
          if (onMessage) onMessage(m);
          {
            std::lock_guard lk(mu);
            got.push_back(std::move(m));
            gotOn.push_back(std::this_thread::get_id());
            gotCount.store(got.size());
            cv.notify_all();
          }
          leave();
          t->wakeWaiting();  // a waiting thread's done() may have turned true
        },
        [this](const NodeId& peer, const Status& s) {
          enter();
          {
            std::lock_guard lk(mu);
            errors.emplace_back(peer, s);
            errorCount.store(errors.size());
            cv.notify_all();
          }
          leave();
          t->wakeWaiting();
        });
  }
  void enter() {
    const int n = inCallback.fetch_add(1) + 1;
    int most = mostInCallback.load();
    while (n > most && !mostInCallback.compare_exchange_weak(most, n)) {
    }
  }
  void leave() { inCallback.fetch_sub(1); }
  // Messages delivered on thread `id`.
  size_t deliveredOn(std::thread::id id) {
    std::lock_guard lk(mu);
    return std::count(gotOn.begin(), gotOn.end(), id);
  }
  template <typename Pred>
  bool waitUntil(Pred pred, Millis timeout = 20s) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, pred);
  }
};

// Forks a producer into the server mailbox of `prefix`: `send` opens the
// sender (given the mailbox's name) and writes (true: all of it went in);
// the sender is then kept, never leaving the ring, until the child is
// killed, as a crash. Returns the child's pid once it has sent, or -1 with
// a failure added when it could not.
pid_t forkProducer(
    const std::string& prefix,
    const std::function<bool(const std::string& mailbox, std::unique_ptr<MailboxSender>& tx)>& send) {
  int ready[2];
  if (::pipe(ready) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return -1;
  }
  pid_t child = forkChild([&] {
    // No threads here: the producer's side is the mailbox sender alone.
    std::unique_ptr<MailboxSender> tx;
    char c = send(shm::segmentName(prefix, kServer, shm::kMailboxIndex), tx);
    (void)!::write(ready[1], &c, 1);
    (void)tx.release();
  });
  char c = 0;
  const bool told = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  ::close(ready[1]);
  if (!told || c != 1) {
    ADD_FAILURE() << "the child could not write into the server's ring";
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    return -1;
  }
  return child;
}

// One message of `value` from a producer that then stays until killed.
pid_t forkProducerOf(const std::string& prefix, uint64_t value) {
  return forkProducer(prefix, [&](const std::string& mailbox, std::unique_ptr<MailboxSender>& tx) {
    tx = MailboxSender::open(mailbox, kWorker, "h");
    return tx && tx->trySend({u64(value)}, 0) == Result::kSent;
  });
}

// Kills the producer `child` (kWorker) and expects `server` to report it
// dead within 5 s, naming it.
void expectKilledProducerReported(RingNode& server, pid_t child) {
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto start = Clock::now();
  ASSERT_TRUE(server.waitUntil([&] { return !server.errors.empty(); }, 5s))
      << "the killed producer was not reported";
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(server.errors[0].first, kWorker);
  EXPECT_EQ(server.errors[0].second.code(), ErrorCode::kPeerDead);
  EXPECT_NE(server.errors[0].second.message().find(kWorker.toString()), std::string::npos);
}

TEST(RingTransport, ADeadProducerIsReportedWithinADeadline) {
  const std::string prefix = uniqueName("deadproducer");
  auto hub = inproc::createHub();
  RingNode server(hub, kServer, prefix);
  server.t->listen("inproc://s");
  const pid_t child = forkProducerOf(prefix, 42);
  ASSERT_GT(child, 0);
  ASSERT_TRUE(server.waitUntil([&] { return server.got.size() == 1; }));
  EXPECT_EQ(server.got[0].from, kWorker);
  EXPECT_EQ(u64(server.got[0].parts.at(0)), 42u);
  expectKilledProducerReported(server, child);
  server.t->close();
}

// A producer that leaves in order (its transport closes, or its sender goes)
// and then exits is not a dead peer: what it published is delivered and no
// error comes (the normal end of a job: workers exit before the servers).
// One that takes its ring back and is then killed is reported again.
TEST(RingTransport, AProducerThatLeftInOrderIsNotReportedDead) {
  const std::string prefix = uniqueName("leftproducer");
  auto hub = inproc::createHub();
  RingNode server(hub, kServer, prefix);
  server.t->listen("inproc://s");
  pid_t child = forkChild([&] {
    auto tx = MailboxSender::open(shm::segmentName(prefix, kServer, shm::kMailboxIndex), kWorker, "h");
    if (!tx || tx->trySend({u64(7)}, 0) != Result::kSent) ::_exit(3);
    tx.reset();  // leaves the ring in order
    ::_exit(0);
  });
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not send";
  ASSERT_TRUE(server.waitUntil([&] { return server.got.size() == 1; }));
  EXPECT_EQ(u64(server.got[0].parts.at(0)), 7u);
  // Eight of the consumer's checks (every 50 ms) after the exit: no report.
  EXPECT_FALSE(server.waitUntil([&] { return !server.errors.empty(); }, 400ms))
      << "a producer that left in order was reported: " << server.errors[0].second.message();
  server.t->close();
}

TEST(RingTransport, AProducerThatTookItsRingBackIsReportedDeadAgain) {
  const std::string prefix = uniqueName("backproducer");
  auto hub = inproc::createHub();
  RingNode server(hub, kServer, prefix);
  server.t->listen("inproc://s");
  const pid_t child =
      forkProducer(prefix, [](const std::string& mailbox, std::unique_ptr<MailboxSender>& tx) {
        tx = MailboxSender::open(mailbox, kWorker, "h");
        bool sent = tx && tx->trySend({u64(1)}, 0) == Result::kSent;
        tx.reset();                                     // left
        tx = MailboxSender::open(mailbox, kWorker, "h");  // and back: the same ring
        return sent && tx && tx->trySend({u64(2)}, 0) == Result::kSent;
      });
  ASSERT_GT(child, 0);
  ASSERT_TRUE(server.waitUntil([&] { return server.got.size() == 2; }));
  expectKilledProducerReported(server, child);
  server.t->close();
}

TEST(RingTransport, AFullRingFallsBackToTheTransportAndOrderHolds) {
  const std::string prefix = uniqueName("fallback");
  auto hub = inproc::createHub();
  // 2 slots: most messages find the ring full and take the in-process
  // transport; large ones never fit. Every message must still arrive in
  // the order sent.
  RingNode a(hub, kWorker, prefix, {2, 2, 128});
  RingNode b(hub, kServer, prefix, {2, 2, 128});
  a.t->listen("inproc://a");
  b.t->listen("inproc://b");
  a.t->connect(kServer, "inproc://b");
  constexpr uint64_t kCount = 3000;
  std::thread sender([&] {
    for (uint64_t i = 0; i < kCount; ++i) {
      std::vector<Buffer> parts;
      parts.reserve(2);
      parts.push_back(u64(i));
      if (i % 5 == 0) parts.push_back(Buffer::allocate(1000));  // too big for a slot
      if (i % 3 == 0) {
        std::vector<Message> two(2);
        two[0].parts = std::move(parts);
        two[1].parts.push_back(u64(++i));
        a.t->sendAll(kServer, std::move(two));
      } else {
        Message m;
        m.parts = std::move(parts);
        a.t->send(kServer, std::move(m));
      }
    }
  });
  sender.join();
  ASSERT_TRUE(b.waitUntil([&] { return b.got.size() >= kCount; }))
      << b.got.size() << " of " << kCount << " arrived";
  std::lock_guard lk(b.mu);
  for (uint64_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(u64(b.got[i].parts.at(0)), i) << "message " << i << " out of order";
    EXPECT_EQ(b.got[i].from, kWorker);
  }
  EXPECT_TRUE(b.errors.empty());
}

TEST(RingTransport, MailboxesAreUnlinkedWhenTheTransportGoes) {
  const std::string prefix = uniqueName("unlink");
  auto hub = inproc::createHub();
  const std::string name = shm::segmentName(prefix, kWorker, shm::kMailboxIndex);
  {
    RingNode a(hub, kWorker, prefix);
    EXPECT_TRUE(segmentExists(name));
    a.t->close();
  }
  EXPECT_FALSE(segmentExists(name));
}

// A thread in receiveWhileWaiting() as the consumer: the order across the
// ring and the fallback holds while it takes the records in turns of a few
// milliseconds (each turn's end hands the role back to the ring thread, the
// next takes it again), and it took some of them on its own thread.
TEST(RingTransport, AWaitingThreadTakesTheRecordsInOrderAcrossRingAndFallback) {
  const std::string prefix = uniqueName("waitorder");
  auto hub = inproc::createHub();
  RingNode a(hub, kWorker, prefix, {2, 4, 128});
  RingNode b(hub, kServer, prefix, {2, 4, 128});
  a.t->listen("inproc://a");
  b.t->listen("inproc://b");
  a.t->connect(kServer, "inproc://b");
  constexpr uint64_t kCount = 4000;
  std::thread sender([&] {
    for (uint64_t i = 0; i < kCount; ++i) {
      Message m;
      m.parts.push_back(u64(i));
      if (i % 5 == 0) m.parts.push_back(Buffer::allocate(1000));  // too big for a slot
      a.t->send(kServer, std::move(m));
      // Pauses: the consumer sleeps on the doorbell, the next record wakes it.
      if (i % 200 == 0) std::this_thread::sleep_for(2ms);
    }
  });
  const auto end = Clock::now() + 30s;
  int turns = 0;
  while (b.gotCount < kCount && Clock::now() < end) {
    // Turns of 1-4 ms.
    const auto until = Clock::now() + std::chrono::microseconds(1000 * (1 + turns % 4));
    EXPECT_TRUE(b.t->receiveWhileWaiting([&] { return b.gotCount >= kCount; }, until));
    ++turns;
  }
  sender.join();
  ASSERT_TRUE(b.waitUntil([&] { return b.got.size() >= kCount; }))
      << b.got.size() << " of " << kCount << " arrived";
  std::lock_guard lk(b.mu);
  for (uint64_t i = 0; i < kCount; ++i)
    ASSERT_EQ(u64(b.got[i].parts.at(0)), i) << "message " << i << " out of order";
  const size_t mine = std::count(b.gotOn.begin(), b.gotOn.end(), std::this_thread::get_id());
  EXPECT_GT(mine, 0u) << "the waiting thread took no record in " << turns << " turns";
  EXPECT_EQ(b.mostInCallback.load(), 1) << "two callbacks ran at once";
  EXPECT_TRUE(b.errors.empty());
}

// A caller whose deadline passes returns and hands the role back: what comes
// afterwards reaches the ring thread, nothing is lost; what comes during its
// turn, it takes itself.
TEST(RingTransport, ACallerWhoseDeadlinePassesHandsTheRoleBack) {
  const std::string prefix = uniqueName("waitdeadline");
  auto hub = inproc::createHub();
  RingNode a(hub, kWorker, prefix);
  RingNode b(hub, kServer, prefix);
  a.t->listen("inproc://a");
  b.t->listen("inproc://b");
  a.t->connect(kServer, "inproc://b");
  auto sendOne = [&](uint64_t v) {
    Message m;
    m.parts.push_back(u64(v));
    a.t->send(kServer, std::move(m));
  };
  const auto me = std::this_thread::get_id();
  // During its turn: it takes them itself.
  std::thread during([&] {
    std::this_thread::sleep_for(20ms);
    for (uint64_t i = 0; i < 5; ++i) sendOne(i);
  });
  const auto start = Clock::now();
  EXPECT_TRUE(b.t->receiveWhileWaiting([&] { return b.gotCount >= 5; }, start + 30s));
  during.join();
  EXPECT_LT(Clock::now() - start, 10s) << "its done() did not end the turn";
  ASSERT_EQ(b.gotCount.load(), 5u);
  EXPECT_EQ(b.deliveredOn(me), 5u) << "the waiting thread did not take the records of its turn";
  // A turn that ends at its deadline with nothing come.
  const auto t0 = Clock::now();
  EXPECT_TRUE(b.t->receiveWhileWaiting([] { return false; }, t0 + 50ms));
  EXPECT_GE(Clock::now() - t0, 50ms);
  EXPECT_LT(Clock::now() - t0, 10s);
  // Afterwards: the ring thread takes them, in order, none lost.
  for (uint64_t i = 5; i < 105; ++i) sendOne(i);
  ASSERT_TRUE(b.waitUntil([&] { return b.got.size() >= 105; }))
      << b.got.size() << " of 105 arrived after the caller's turn";
  std::lock_guard lk(b.mu);
  for (uint64_t i = 0; i < 105; ++i) EXPECT_EQ(u64(b.got[i].parts.at(0)), i);
  EXPECT_EQ(std::count(b.gotOn.begin(), b.gotOn.end(), me), 5)
      << "records after the turn went to the thread that had left";
}

// A producer killed while a caller is the consumer is reported within the
// ring thread's bound, as when the ring thread consumes.
TEST(RingTransport, ADeadProducerIsReportedWhileACallerConsumes) {
  const std::string prefix = uniqueName("waitdead");
  auto hub = inproc::createHub();
  RingNode server(hub, kServer, prefix);
  server.t->listen("inproc://s");
  // The caller is the consumer (asleep on the doorbell) before the
  // producer writes, and stays it until the error.
  std::atomic<pid_t> tid{0};
  std::thread::id callerId;
  std::atomic<bool> callerBack{false};
  std::thread caller([&] {
    callerId = std::this_thread::get_id();
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    server.t->receiveWhileWaiting([&] { return server.errorCount > 0; }, Clock::now() + 20s);
    callerBack = true;
  });
  ASSERT_TRUE(untilBlocked(tid)) << "the caller never slept";
  const pid_t child = forkProducerOf(prefix, 42);
  ASSERT_GT(child, 0);
  ASSERT_TRUE(server.waitUntil([&] { return server.got.size() == 1; }));
  EXPECT_EQ(server.deliveredOn(callerId), 1u) << "the consumer's record went to another thread";
  EXPECT_FALSE(callerBack);
  ASSERT_TRUE(untilBlocked(tid)) << "the caller did not sleep again";
  const auto killedAt = Clock::now();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  while (!callerBack && Clock::now() - killedAt < 10s) std::this_thread::sleep_for(1ms);
  caller.join();
  ASSERT_EQ(server.errorCount.load(), 1u) << "the killed producer was not reported";
  EXPECT_LT(Clock::now() - killedAt, 5s) << "the caller's done() did not end its turn in time";
  EXPECT_EQ(server.errors[0].first, kWorker);
  EXPECT_EQ(server.errors[0].second.code(), ErrorCode::kPeerDead);
  EXPECT_NE(server.errors[0].second.message().find(kWorker.toString()), std::string::npos);
  server.t->close();
}

// Several threads wait, each for its own message: one is the consumer, the
// others wait for the role or for their done(); each returns once its
// message came (long before the deadline), callbacks never overlap, and the
// role passes among them.
TEST(RingTransport, ConcurrentWaitersEachGetTheirMessage) {
  const std::string prefix = uniqueName("waiters");
  auto hub = inproc::createHub();
  constexpr int kWaiters = 4, kRounds = 40;
  std::vector<std::atomic<bool>> seen(kWaiters * kRounds);
  for (auto& x : seen) x = false;
  RingNode a(hub, kWorker, prefix);
  RingNode b(hub, kServer, prefix);
  b.onMessage = [&](const Message& m) { seen.at(u64(m.parts.at(0))) = true; };
  a.t->listen("inproc://a");
  b.t->listen("inproc://b");
  a.t->connect(kServer, "inproc://b");
  std::atomic<int> late{0};
  std::vector<std::thread> waiters;
  std::vector<std::thread::id> waiterIds(kWaiters);
  for (int k = 0; k < kWaiters; ++k) {
    waiters.emplace_back([&, k] {
      waiterIds[k] = std::this_thread::get_id();
      for (int round = 0; round < kRounds; ++round) {
        const uint64_t id = uint64_t(round) * kWaiters + k;
        const auto start = Clock::now();
        b.t->receiveWhileWaiting([&] { return seen[id].load(); }, start + 20s);
        if (!seen[id] || Clock::now() - start >= 10s) ++late;
      }
    });
  }
  for (int round = 0; round < kRounds; ++round) {
    // The waiters' messages in another order each round, one at a time.
    const int order[kWaiters] = {3, 1, 0, 2};
    for (int k : order) {
      std::this_thread::sleep_for(1ms);
      Message m;
      m.parts.push_back(u64(uint64_t(round) * kWaiters + (k + round) % kWaiters));
      a.t->send(kServer, std::move(m));
    }
  }
  for (auto& w : waiters) w.join();
  EXPECT_EQ(late.load(), 0) << "waiters whose message came did not return";
  EXPECT_EQ(b.gotCount.load(), size_t(kWaiters * kRounds));
  EXPECT_EQ(b.mostInCallback.load(), 1) << "two callbacks ran at once";
  size_t onWaiters = 0;
  for (const auto& id : waiterIds) onWaiters += b.deliveredOn(id);
  EXPECT_GT(onWaiters, 0u) << "no waiting thread took a message";
}

// wakeWaiting() ends the sleep of a consumer (and of a thread that waits for
// the role) whose done() another thread turned true; close() ends a
// caller's turn; later calls, calls from a callback and a transport with
// waiterReceives off return false at once.
TEST(RingTransport, WakeWaitingCloseAndRefusals) {
  const std::string prefix = uniqueName("waitwake");
  auto hub = inproc::createHub();
  RingNode b(hub, kServer, prefix);
  b.t->listen("inproc://b");
  std::atomic<bool> first{false}, second{false};
  std::atomic<bool> firstBack{false}, secondBack{false};
  std::thread t1([&] {
    b.t->receiveWhileWaiting([&] { return first.load(); }, Clock::now() + 30s);
    firstBack = true;
  });
  std::thread t2([&] {
    b.t->receiveWhileWaiting([&] { return second.load(); }, Clock::now() + 30s);
    secondBack = true;
  });
  std::this_thread::sleep_for(30ms);  // one consumes, the other waits for the role
  auto start = Clock::now();
  second = true;
  b.t->wakeWaiting();
  while (!secondBack && Clock::now() - start < 10s) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(secondBack) << "wakeWaiting() did not end the second waiter's wait";
  EXPECT_FALSE(firstBack);
  start = Clock::now();
  first = true;
  b.t->wakeWaiting();
  while (!firstBack && Clock::now() - start < 10s) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(firstBack) << "wakeWaiting() did not end the first waiter's wait";
  t1.join();
  t2.join();

  // From a callback: false, at once.
  RingNode c(hub, NodeId{Role::kServer, 5}, prefix);
  std::atomic<int> fromCallback{-1};
  c.onMessage = [&](const Message&) {
    fromCallback = c.t->receiveWhileWaiting([] { return false; }, Clock::now() + 30s) ? 1 : 0;
  };
  c.t->listen("inproc://c");
  RingNode a(hub, kWorker, prefix);
  a.t->listen("inproc://a");
  a.t->connect(NodeId{Role::kServer, 5}, "inproc://c");
  Message m;
  m.parts.push_back(u64(1));
  a.t->send(NodeId{Role::kServer, 5}, std::move(m));
  ASSERT_TRUE(c.waitUntil([&] { return c.got.size() == 1; }));
  EXPECT_EQ(fromCallback.load(), 0) << "receiveWhileWaiting() from a callback did not refuse";

  // close() ends a turn.
  std::atomic<bool> closedBack{false};
  std::thread t3([&] {
    b.t->receiveWhileWaiting([] { return false; }, Clock::now() + 30s);
    closedBack = true;
  });
  std::this_thread::sleep_for(30ms);
  start = Clock::now();
  b.t->close();
  while (!closedBack && Clock::now() - start < 10s) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(closedBack) << "close() did not end the caller's turn";
  t3.join();
  EXPECT_FALSE(b.t->receiveWhileWaiting([] { return false; }, Clock::now() + 30s));

  RingNode off(hub, NodeId{Role::kServer, 7}, prefix, {}, /*waiterReceives=*/false);
  off.t->listen("inproc://off");
  start = Clock::now();
  EXPECT_FALSE(off.t->receiveWhileWaiting([] { return false; }, Clock::now() + 30s));
  EXPECT_LT(Clock::now() - start, 10s);
}

zmq::ZmqOptions zmqOptions() {
  zmq::ZmqOptions o;
  o.connectTimeout = Millis(1500);
  o.heartbeatInterval = Millis(500);
  o.heartbeatTimeout = Millis(3000);
  return o;
}

// `spin`: RingOptions::spin; `yield`: the polls on (50 us each) with the
// job's threads counted (RingOptions::yieldPolls).
TransportFactory ringOverZmq(std::chrono::microseconds spin, bool yield = false) {
  return {yield ? "shmring_zmq_yield" : spin.count() ? "shmring_zmq_spin" : "shmring_zmq",
          [spin, yield] {
            const std::string prefix = uniqueName("conformance");
            return TransportEnv{
                [prefix, spin, yield](const NodeId& self) {
                  shmring::RingOptions o;
                  o.prefix = prefix;
                  o.spin = spin;
                  if (yield) {
                    o.yieldPolls = true;
                    o.pollWhileExpecting = 50us;
                    o.waiterPoll = 50us;
                  }
                  return shmring::create(zmq::create(self, zmqOptions()), o);
                },
                [] { return std::string("tcp://127.0.0.1:0"); },
                "tcp://127.0.0.1:1",
            };
          }};
}

CORTADO_TRANSPORT_CONFORMANCE(ShmRing, ringOverZmq(0us), ringOverZmq(200us),
                              ringOverZmq(0us, /*yield=*/true));

}  // namespace
}  // namespace cortado::transport::testing
