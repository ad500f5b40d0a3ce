// Same-host messages through shared-memory rings (core/shm/mailbox.h,
// core/transport/shmring): the ring itself (order across wrap-around, a full
// ring, a consumer that sleeps is woken, malformed records refused, a dead
// producer or consumer detected within a deadline), and the conformance
// suite on the ring transport in front of ZeroMQ, where the rings carry the
// small messages and ZeroMQ the large ones.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/common/deadline.h"
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
  std::vector<std::pair<NodeId, Status>> errors;
  std::unique_ptr<Transport> t;

  RingNode(std::shared_ptr<inproc::Hub> hub, const NodeId& self, const std::string& prefix,
           shm::MailboxShape shape = {}) {
    shmring::RingOptions o;
    o.prefix = prefix;
    o.host = "h";
    o.shape = shape;
    o.checkEvery = 50ms;
    t = shmring::create(inproc::create(std::move(hub), self), o);
    t->setCallbacks(
        [this](Message&& m) {
          std::lock_guard lk(mu);
          got.push_back(std::move(m));
          cv.notify_all();
        },
        [this](const NodeId& peer, const Status& s) {
          std::lock_guard lk(mu);
          errors.emplace_back(peer, s);
          cv.notify_all();
        });
  }
  template <typename Pred>
  bool waitUntil(Pred pred, Millis timeout = 20s) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, pred);
  }
};

TEST(RingTransport, ADeadProducerIsReportedWithinADeadline) {
  const std::string prefix = uniqueName("deadproducer");
  auto hub = inproc::createHub();
  RingNode server(hub, kServer, prefix);
  server.t->listen("inproc://s");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = forkChild([&] {
    // No threads here: the producer's side is the mailbox sender alone.
    auto tx = MailboxSender::open(shm::segmentName(prefix, kServer, shm::kMailboxIndex), kWorker, "h");
    char c = tx && tx->trySend({u64(42)}, 0) == Result::kSent;
    (void)!::write(ready[1], &c, 1);
    (void)tx.release();
  });
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 1) << "the child could not write into the server's ring";
  ASSERT_TRUE(server.waitUntil([&] { return server.got.size() == 1; }));
  EXPECT_EQ(server.got[0].from, kWorker);
  EXPECT_EQ(u64(server.got[0].parts.at(0)), 42u);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto start = Clock::now();
  ASSERT_TRUE(server.waitUntil([&] { return !server.errors.empty(); }, 5s))
      << "the killed producer was not reported";
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(server.errors[0].first, kWorker);
  EXPECT_EQ(server.errors[0].second.code(), ErrorCode::kPeerDead);
  EXPECT_NE(server.errors[0].second.message().find(kWorker.toString()), std::string::npos);
  server.t->close();
  ::close(ready[0]);
  ::close(ready[1]);
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

zmq::ZmqOptions zmqOptions() {
  zmq::ZmqOptions o;
  o.connectTimeout = Millis(1500);
  o.heartbeatInterval = Millis(500);
  o.heartbeatTimeout = Millis(3000);
  return o;
}

TransportFactory ringOverZmq(std::chrono::microseconds spin) {
  return {spin.count() ? "shmring_zmq_spin" : "shmring_zmq", [spin] {
            const std::string prefix = uniqueName("conformance");
            return TransportEnv{
                [prefix, spin](const NodeId& self) {
                  shmring::RingOptions o;
                  o.prefix = prefix;
                  o.spin = spin;
                  return shmring::create(zmq::create(self, zmqOptions()), o);
                },
                [] { return std::string("tcp://127.0.0.1:0"); },
                "tcp://127.0.0.1:1",
            };
          }};
}

CORTADO_TRANSPORT_CONFORMANCE(ShmRing, ringOverZmq(0us), ringOverZmq(200us));

}  // namespace
}  // namespace cortado::transport::testing
