// The transport conformance suite (see transport_test.h): what the contract in
// core/transport/transport.h promises, checked on every backend. Every wait
// has a deadline, so a broken backend fails a test instead of hanging it.
#include "tests/transport/transport_test.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "core/common/deadline.h"

namespace cortado::transport::testing {
namespace {

using namespace std::chrono_literals;

constexpr Millis kWait = 20s;  // generous: a loaded CI machine, sanitizers

NodeId worker(int rank) { return NodeId{Role::kWorker, rank}; }
NodeId server(int rank) { return NodeId{Role::kServer, rank}; }

// Bytes that depend on the seed and the position, so that a part from the
// wrong message or at the wrong offset is caught.
Buffer pattern(size_t size, uint64_t seed) {
  Buffer b = Buffer::allocate(size);
  auto* p = b.data();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < size; ++i) p[i] = static_cast<uint8_t>(seed + i);
  return b;
}

bool samePattern(const Buffer& b, size_t size, uint64_t seed) {
  if (b.size() != size) return false;
  if (size == 0) return true;
  Buffer want = pattern(size, seed);
  return std::memcmp(b.data(), want.data(), size) == 0;
}

Buffer u64(uint64_t v) { return Buffer::copyOf(&v, sizeof(v)); }
uint64_t u64(const Buffer& b) {
  uint64_t v = ~0ull;
  if (b.size() == sizeof(v)) std::memcpy(&v, b.data(), sizeof(v));
  return v;
}

Message msgOf(std::vector<Buffer> parts) { return Message{NodeId{}, std::move(parts)}; }

// Collects what a callback hands over; waits with a deadline.
template <typename T>
class Inbox {
 public:
  void push(T v) {
    {
      std::lock_guard g(mu_);
      items_.push_back(std::move(v));
    }
    cv_.notify_all();
  }
  bool waitFor(size_t n, Millis timeout = kWait) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return items_.size() >= n; });
  }
  std::vector<T> take() {
    std::lock_guard g(mu_);
    return std::move(items_);
  }
  size_t size() {
    std::lock_guard g(mu_);
    return items_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<T> items_;
};

struct PeerError {
  NodeId peer;
  Status status;
};

struct Node {
  Inbox<Message> inbox;
  Inbox<PeerError> errors;
  std::string address;
  std::unique_ptr<Transport> t;  // last: closed before the inboxes go
};

// The errors a node's transport reported, for failure messages.
std::string errorsOf(Node& n) {
  std::string out;
  for (const PeerError& e : n.errors.take())
    out += fmt::format("[{}: {}] ", e.peer.toString(), e.status.message());
  return out.empty() ? "none" : out;
}

class Fixture {
 public:
  explicit Fixture(const TransportFactory& f) : env_(f.makeEnv()) {}

  // A node whose messages go to its inbox and errors to its errors, or to
  // the test's own callbacks: set before listen(), as the Transport contract
  // asks (a second setCallbacks after listen() raced with the first
  // messages, which then reached the inbox instead: CallbackMaySend got 0 of
  // 200 back about once in 100 runs on a loaded machine).
  using OnRecv = std::function<void(Node&, Message&&)>;
  using OnError = std::function<void(Node&, const NodeId&, const Status&)>;
  std::unique_ptr<Node> node(const NodeId& id, bool listen = true, OnRecv onRecv = nullptr,
                             OnError onError = nullptr) {
    auto n = std::make_unique<Node>();
    n->t = env_.makeTransport(id);
    Node* raw = n.get();
    n->t->setCallbacks(
        [raw, onRecv](Message&& m) {
          if (onRecv)
            onRecv(*raw, std::move(m));
          else
            raw->inbox.push(std::move(m));
        },
        [raw, onError](const NodeId& peer, const Status& s) {
          if (onError)
            onError(*raw, peer, s);
          else
            raw->errors.push({peer, s});
        });
    if (listen) n->address = n->t->listen(env_.listenAddress());
    return n;
  }

  TransportEnv& env() { return env_; }

 private:
  TransportEnv env_;
};

TEST_P(TransportTest, NameSelfAndListenAddress) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(3));
  EXPECT_FALSE(a->t->name().empty());
  EXPECT_EQ(a->t->self(), worker(3));
  auto scheme = fx.env().listenAddress();
  scheme = scheme.substr(0, scheme.find("://") + 3);
  EXPECT_TRUE(a->address.starts_with(scheme)) << a->address;
  EXPECT_EQ(a->address.find(":0"), std::string::npos) << "port 0 must be replaced: " << a->address;
}

TEST_P(TransportTest, ManyMessagesFromOneSenderArriveInOrder) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  a->t->connect(server(0), b->address);
  constexpr uint64_t kCount = 5000;
  for (uint64_t i = 0; i < kCount; ++i) a->t->send(server(0), msgOf({u64(i)}));
  ASSERT_TRUE(b->inbox.waitFor(kCount)) << "got " << b->inbox.size() << " of " << kCount;
  auto got = b->inbox.take();
  ASSERT_EQ(got.size(), kCount);
  for (uint64_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(got[i].from, worker(0));
    ASSERT_EQ(got[i].parts.size(), 1u);
    ASSERT_EQ(u64(got[i].parts[0]), i) << "message " << i << " out of order";
  }
  EXPECT_EQ(a->errors.size(), 0u);
}

// Large messages (which UCX holds back behind CORTADO_UCX_PEER_SENDS) among
// small ones, from two threads, to two receivers: each receiver gets each
// sender's messages in the order sent, intact.
TEST_P(TransportTest, LargeAndSmallMessagesKeepTheirOrder) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  auto c = fx.node(server(1));
  a->t->connect(server(0), b->address);
  a->t->connect(server(1), c->address);
  constexpr uint64_t kCount = 60;
  auto sizeOf = [](uint64_t i) -> size_t { return i % 3 == 0 ? (300u << 10) + i : 100 + i; };
  auto sendTo = [&](NodeId to) {
    for (uint64_t i = 0; i < kCount; ++i) a->t->send(to, msgOf({u64(i), pattern(sizeOf(i), i)}));
  };
  std::thread other([&] { sendTo(server(1)); });
  sendTo(server(0));
  other.join();
  for (auto* n : {b.get(), c.get()}) {
    ASSERT_TRUE(n->inbox.waitFor(kCount)) << "got " << n->inbox.size() << " of " << kCount;
    auto got = n->inbox.take();
    ASSERT_EQ(got.size(), kCount);
    for (uint64_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(got[i].parts.size(), 2u);
      ASSERT_EQ(u64(got[i].parts[0]), i) << "message " << i << " out of order";
      EXPECT_TRUE(samePattern(got[i].parts[1], sizeOf(i), i)) << "message " << i;
    }
  }
  EXPECT_EQ(a->errors.size(), 0u);
}

TEST_P(TransportTest, MultiPartZeroLengthPartsAndZeroPartMessages) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(1));
  auto b = fx.node(server(2));
  a->t->connect(server(2), b->address);
  const std::vector<std::vector<size_t>> shapes = {
      {}, {0}, {1, 0, 100000, 0, 7}, {0, 0, 0}, {}, {33, 1 << 20, 8191, 8192, 8193}, {5}};
  for (size_t m = 0; m < shapes.size(); ++m) {
    std::vector<Buffer> parts;
    for (size_t p = 0; p < shapes[m].size(); ++p) parts.push_back(pattern(shapes[m][p], m * 100 + p));
    a->t->send(server(2), msgOf(std::move(parts)));
  }
  ASSERT_TRUE(b->inbox.waitFor(shapes.size()));
  auto got = b->inbox.take();
  ASSERT_EQ(got.size(), shapes.size());
  std::string seen;  // part sizes as received, for the failure message
  for (const auto& m : got) {
    seen += "[";
    for (const auto& p : m.parts) seen += std::to_string(p.size()) + " ";
    seen += "] ";
  }
  for (size_t m = 0; m < shapes.size(); ++m) {
    EXPECT_EQ(got[m].from, worker(1));
    ASSERT_EQ(got[m].parts.size(), shapes[m].size()) << "message " << m << "; received " << seen;
    for (size_t p = 0; p < shapes[m].size(); ++p) {
      EXPECT_TRUE(samePattern(got[m].parts[p], shapes[m][p], m * 100 + p))
          << "message " << m << " part " << p << " size " << got[m].parts[p].size();
    }
  }
}

TEST_P(TransportTest, LargeMessagesArriveIntact) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  a->t->connect(server(0), b->address);
  constexpr size_t kLarge = 64ull << 20;
  a->t->send(server(0), msgOf({u64(1), pattern(kLarge, 11)}));
  a->t->send(server(0), msgOf({u64(2), pattern(kLarge + 3, 12), pattern(3, 13)}));
  ASSERT_TRUE(b->inbox.waitFor(2));
  auto got = b->inbox.take();
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(got[0].parts.size(), 2u);
  EXPECT_EQ(u64(got[0].parts[0]), 1u);
  EXPECT_TRUE(samePattern(got[0].parts[1], kLarge, 11));
  ASSERT_EQ(got[1].parts.size(), 3u);
  EXPECT_EQ(u64(got[1].parts[0]), 2u);
  EXPECT_TRUE(samePattern(got[1].parts[1], kLarge + 3, 12));
  EXPECT_TRUE(samePattern(got[1].parts[2], 3, 13));
}

TEST_P(TransportTest, ManyConcurrentSendersToOneReceiver) {
  Fixture fx(GetParam());
  auto b = fx.node(server(0));
  constexpr int kSenders = 8;
  constexpr uint64_t kEach = 300;
  std::vector<std::unique_ptr<Node>> senders;
  for (int r = 0; r < kSenders; ++r) {
    senders.push_back(fx.node(worker(r), /*listen=*/false));
    senders.back()->t->connect(server(0), b->address);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kSenders; ++r) {
    threads.emplace_back([&, r] {
      for (uint64_t i = 0; i < kEach; ++i) {
        senders[r]->t->send(server(0), msgOf({u64(i), pattern(i % 7 == 0 ? 20000 : 64, r * 1000 + i)}));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(b->inbox.waitFor(kSenders * kEach)) << "got " << b->inbox.size();
  std::vector<uint64_t> next(kSenders, 0);
  for (auto& m : b->inbox.take()) {
    ASSERT_EQ(m.from.role, Role::kWorker);
    ASSERT_GE(m.from.rank, 0);
    ASSERT_LT(m.from.rank, kSenders);
    ASSERT_EQ(m.parts.size(), 2u);
    uint64_t i = u64(m.parts[0]);
    ASSERT_EQ(i, next[m.from.rank]) << "from " << m.from.toString();
    ASSERT_TRUE(samePattern(m.parts[1], i % 7 == 0 ? 20000 : 64, m.from.rank * 1000 + i));
    ++next[m.from.rank];
  }
  for (int r = 0; r < kSenders; ++r) EXPECT_EQ(next[r], kEach) << "worker " << r;
}

TEST_P(TransportTest, CallbackMaySend) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  std::atomic<uint64_t> echoed{0};
  // The echo server answers from its receive callback, on its loop thread.
  auto echo = fx.node(server(1), true, [&echoed](Node& self, Message&& m) {
    const NodeId from = m.from;  // `m` moves into send's argument
    self.t->send(from, std::move(m));
    ++echoed;
  });
  echo->t->connect(worker(0), a->address);
  a->t->connect(server(1), echo->address);
  constexpr uint64_t kCount = 200;
  for (uint64_t i = 0; i < kCount; ++i) a->t->send(server(1), msgOf({u64(i), pattern(100, i)}));
  ASSERT_TRUE(a->inbox.waitFor(kCount))
      << "got " << a->inbox.size() << " of " << kCount << "; the echo received " << echoed.load()
      << "; errors at the sender: " << errorsOf(*a) << "; at the echo: " << errorsOf(*echo);
  auto got = a->inbox.take();
  for (uint64_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(got[i].from, server(1));
    ASSERT_EQ(got[i].parts.size(), 2u);
    EXPECT_EQ(u64(got[i].parts[0]), i);
    EXPECT_TRUE(samePattern(got[i].parts[1], 100, i));
  }
}

// A callback's send() may go out at once (ZeroMQ and UCX skip their queue on
// the loop thread), but never ahead of a send() that another thread finished
// before it: the sender's order is the contract.
TEST_P(TransportTest, CallbackSendsStayBehindOtherThreadsEarlierSends) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto echo = fx.node(server(1), true, [](Node& self, Message&& m) {
    const uint64_t i = u64(m.parts[0]);
    // Another thread's send, returned before the callback's own.
    std::thread([&self, i] { self.t->send(worker(0), msgOf({u64(2 * i)})); }).join();
    self.t->send(worker(0), msgOf({u64(2 * i + 1)}));
  });
  echo->t->connect(worker(0), a->address);
  a->t->connect(server(1), echo->address);
  constexpr uint64_t kCount = 100;
  for (uint64_t i = 0; i < kCount; ++i) a->t->send(server(1), msgOf({u64(i)}));
  ASSERT_TRUE(a->inbox.waitFor(2 * kCount))
      << "got " << a->inbox.size() << " of " << 2 * kCount
      << "; errors at the sender: " << errorsOf(*a) << "; at the echo: " << errorsOf(*echo);
  auto got = a->inbox.take();
  for (uint64_t i = 0; i < 2 * kCount; ++i) ASSERT_EQ(u64(got[i].parts[0]), i) << "message " << i;
}

// Requests in lockstep (each sent once the previous answer came, so that the
// sender's loop is often asleep: UCX then starts the send on the calling
// thread) from several nodes at once, each node's lockstep thread mixed with
// a second thread that streams its own requests: every answer matches a sum
// computed here, and each thread's requests are answered in the order sent.
TEST_P(TransportTest, LockstepRequestsFromManyNodesAreAnsweredInOrder) {
  Fixture fx(GetParam());
  auto byteSum = [](const Buffer& b) {
    uint64_t sum = 0;
    for (size_t i = 0; i < b.size(); ++i) sum += b.data()[i];
    return sum;
  };
  // The server answers from its receive callback: (request id, byte sum).
  auto srv = fx.node(server(0), true, [byteSum](Node& self, Message&& m) {
    const NodeId from = m.from;
    const uint64_t sum = m.parts.size() == 2 ? byteSum(m.parts[1]) : ~0ull;
    self.t->send(from, msgOf({std::move(m.parts[0]), u64(sum)}));
  });
  constexpr int kNodes = 4;
  constexpr uint64_t kEach = 150;
  struct Answers {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Message> got[2];  // per sending thread, by the id's high half
  };
  auto size = [](uint64_t i) -> size_t { return i % 5 == 0 ? 20000 : 4096; };
  auto seed = [](int r, uint64_t th, uint64_t i) { return r * 100000 + th * 10000 + i; };
  std::vector<std::unique_ptr<Answers>> answers;
  std::vector<std::unique_ptr<Node>> nodes;
  for (int r = 0; r < kNodes; ++r) {
    answers.push_back(std::make_unique<Answers>());
    Answers* a = answers.back().get();
    nodes.push_back(fx.node(worker(r), true, [a](Node&, Message&& m) {
      const uint64_t th = u64(m.parts[0]) >> 32;
      {
        std::lock_guard g(a->mu);
        a->got[th < 2 ? th : 1].push_back(std::move(m));
      }
      a->cv.notify_all();
    }));
    srv->t->connect(worker(r), nodes.back()->address);
    nodes.back()->t->connect(server(0), srv->address);
  }
  std::atomic<bool> stalled{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    for (uint64_t th = 0; th < 2; ++th) {
      threads.emplace_back([&, r, th] {
        Answers& a = *answers[r];
        for (uint64_t i = 0; i < kEach && !stalled; ++i) {
          nodes[r]->t->send(server(0),
                            msgOf({u64(th << 32 | i), pattern(size(i), seed(r, th, i))}));
          if (th != 0) continue;
          std::unique_lock lk(a.mu);
          if (!a.cv.wait_for(lk, kWait, [&] { return a.got[0].size() > i; })) stalled = true;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(stalled) << "a lockstep request was not answered; errors at the server: "
                        << errorsOf(*srv);
  for (int r = 0; r < kNodes; ++r) {
    Answers& a = *answers[r];
    std::unique_lock lk(a.mu);
    ASSERT_TRUE(a.cv.wait_for(lk, kWait, [&] { return a.got[1].size() == kEach; }))
        << "worker " << r << ": " << a.got[1].size() << " of " << kEach << " streamed answers";
    for (uint64_t th = 0; th < 2; ++th) {
      ASSERT_EQ(a.got[th].size(), kEach) << "worker " << r << " thread " << th;
      for (uint64_t i = 0; i < kEach; ++i) {
        const Message& m = a.got[th][i];
        ASSERT_EQ(m.from, server(0));
        ASSERT_EQ(m.parts.size(), 2u);
        ASSERT_EQ(u64(m.parts[0]), th << 32 | i) << "worker " << r << " thread " << th;
        EXPECT_EQ(u64(m.parts[1]), byteSum(pattern(size(i), seed(r, th, i))))
            << "worker " << r << " thread " << th << " request " << i;
      }
    }
  }
}

// sendAll() is send() of each message in turn (a backend may wake its loop
// once for all of them): mixed with send(), the order holds; after close()
// it throws kClosed as send() does.
TEST_P(TransportTest, SendAllKeepsTheOrderOfSends) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  a->t->connect(server(0), b->address);
  constexpr uint64_t kRounds = 50;
  for (uint64_t i = 0; i < kRounds; ++i) {
    a->t->send(server(0), msgOf({u64(3 * i)}));
    std::vector<Message> two;
    two.push_back(msgOf({u64(3 * i + 1)}));
    two.push_back(msgOf({u64(3 * i + 2), pattern(20000, i)}));
    a->t->sendAll(server(0), std::move(two));
    a->t->sendAll(server(0), {});  // nothing to send: nothing arrives
  }
  ASSERT_TRUE(b->inbox.waitFor(3 * kRounds))
      << "got " << b->inbox.size() << " of " << 3 * kRounds << "; errors: " << errorsOf(*a);
  auto got = b->inbox.take();
  ASSERT_EQ(got.size(), 3 * kRounds);
  for (uint64_t i = 0; i < 3 * kRounds; ++i) {
    ASSERT_EQ(u64(got[i].parts[0]), i) << "message " << i;
    if (i % 3 == 2) {
      EXPECT_TRUE(samePattern(got[i].parts[1], 20000, i / 3));
    }
  }
  a->t->close();
  std::vector<Message> late;
  late.push_back(msgOf({u64(0)}));
  try {
    a->t->sendAll(server(0), std::move(late));
    ADD_FAILURE() << "sendAll after close() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kClosed) << e.what();
  }
}

TEST_P(TransportTest, SendsBeforeConnectAreHeldUntilConnect) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  for (uint64_t i = 0; i < 3; ++i) a->t->send(server(0), msgOf({u64(i)}));
  a->t->connect(server(0), b->address);
  ASSERT_TRUE(b->inbox.waitFor(3));
  auto got = b->inbox.take();
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(u64(got[i].parts[0]), i);
}

TEST_P(TransportTest, SenderBuffersAreReleasedAfterDelivery) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  a->t->connect(server(0), b->address);
  auto released = std::make_shared<std::promise<void>>();
  auto done = released->get_future();
  {
    Buffer data = pattern(1 << 20, 5);
    std::shared_ptr<void> owner(nullptr, [data, released](void*) mutable { released->set_value(); });
    a->t->send(server(0), msgOf({Buffer::wrap(data.data(), data.size(), std::move(owner))}));
  }
  ASSERT_TRUE(b->inbox.waitFor(1));
  EXPECT_TRUE(samePattern(b->inbox.take()[0].parts[0], 1 << 20, 5));
  EXPECT_EQ(done.wait_for(kWait), std::future_status::ready)
      << "the transport kept the sender's buffer after delivering it";
}

TEST_P(TransportTest, ClosedPeerIsReportedWithItsNameAndAddress) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(4));
  a->t->connect(server(4), b->address);
  a->t->send(server(4), msgOf({u64(1)}));
  ASSERT_TRUE(b->inbox.waitFor(1));
  b->t->close();
  ASSERT_TRUE(a->errors.waitFor(1)) << "no error reported after the peer closed";
  auto e = a->errors.take()[0];
  EXPECT_EQ(e.peer, server(4));
  EXPECT_FALSE(e.status.ok());
  EXPECT_NE(e.status.message().find(server(4).toString()), std::string::npos) << e.status.message();
  EXPECT_NE(e.status.message().find(b->address), std::string::npos) << e.status.message();
  // Sending to it afterwards neither throws nor blocks.
  a->t->send(server(4), msgOf({pattern(1 << 20, 1)}));
}

TEST_P(TransportTest, UnreachablePeerIsReported) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  const std::string dead = fx.env().deadAddress;
  a->t->connect(server(7), dead);
  a->t->send(server(7), msgOf({u64(1)}));
  ASSERT_TRUE(a->errors.waitFor(1)) << "no error for a peer that nothing listens for";
  auto e = a->errors.take()[0];
  EXPECT_EQ(e.peer, server(7));
  EXPECT_NE(e.status.message().find(server(7).toString()), std::string::npos) << e.status.message();
  EXPECT_NE(e.status.message().find(dead), std::string::npos) << e.status.message();
}

TEST_P(TransportTest, SendToPeerNeverConnectedIsReported) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  a->t->send(server(9), msgOf({u64(1)}));
  ASSERT_TRUE(a->errors.waitFor(1));
  auto e = a->errors.take()[0];
  EXPECT_EQ(e.peer, server(9));
  EXPECT_NE(e.status.message().find(server(9).toString()), std::string::npos) << e.status.message();
}

TEST_P(TransportTest, DisconnectThenConnectAgain) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  a->t->connect(server(0), b->address);
  a->t->send(server(0), msgOf({u64(1)}));
  ASSERT_TRUE(b->inbox.waitFor(1));
  a->t->disconnect(server(0));
  a->t->connect(server(0), b->address);
  a->t->send(server(0), msgOf({u64(2)}));
  ASSERT_TRUE(b->inbox.waitFor(2));
  auto got = b->inbox.take();
  EXPECT_EQ(u64(got[1].parts[0]), 2u);
  EXPECT_EQ(a->errors.size(), 0u);
}

TEST_P(TransportTest, MethodsAfterCloseThrowClosed) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(server(0));
  a->t->close();
  a->t->close();  // idempotent
  auto expectClosed = [](auto&& fn, const char* what) {
    try {
      fn();
      ADD_FAILURE() << what << " after close() did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kClosed) << what << ": " << e.what();
    }
  };
  expectClosed([&] { a->t->send(server(0), msgOf({u64(1)})); }, "send");
  expectClosed([&] { a->t->connect(server(0), b->address); }, "connect");
  expectClosed([&] { a->t->listen(fx.env().listenAddress()); }, "listen");
  a->t->disconnect(server(0));  // harmless
}

TEST_P(TransportTest, ListenOnAnAddressInUseThrowsUnavailable) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  auto b = fx.node(worker(1), /*listen=*/false);
  try {
    b->t->listen(a->address);
    ADD_FAILURE() << "listen on " << a->address << " succeeded twice";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find(a->address), std::string::npos) << e.what();
  }
}

TEST_P(TransportTest, CloseIsPromptAndReleasesUnsentMessages) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  a->t->connect(server(3), fx.env().deadAddress);
  auto released = std::make_shared<std::atomic<int>>(0);
  constexpr int kCount = 8;
  for (int i = 0; i < kCount; ++i) {
    Buffer data = Buffer::allocate(16 << 20);
    std::shared_ptr<void> owner(nullptr, [data, released](void*) { ++*released; });
    a->t->send(server(3), msgOf({Buffer::wrap(data.data(), data.size(), std::move(owner))}));
  }
  auto start = Clock::now();
  a->t->close();
  auto took = std::chrono::duration_cast<Millis>(Clock::now() - start);
  EXPECT_LT(took.count(), 2000) << "close() with unsent messages took " << took.count() << " ms";
  EXPECT_EQ(released->load(), kCount) << "close() returned while holding the senders' buffers";
}

TEST_P(TransportTest, NoCallbackAfterCloseReturns) {
  Fixture fx(GetParam());
  auto a = fx.node(worker(0));
  std::atomic<bool> closed{false};
  std::atomic<int> late{0};
  auto first = std::make_shared<std::promise<void>>();
  auto started = first->get_future();
  auto once = std::make_shared<std::once_flag>();
  auto b = fx.node(
      server(0), true,
      [&, first, once](Node&, Message&&) {
        if (closed) ++late;
        std::call_once(*once, [&] { first->set_value(); });
      },
      [&](Node&, const NodeId&, const Status&) {
        if (closed) ++late;
      });
  a->t->connect(server(0), b->address);
  std::atomic<bool> stop{false};
  std::thread pump([&] {
    for (uint64_t i = 0; !stop && i < 200000; ++i) a->t->send(server(0), msgOf({u64(i)}));
  });
  if (started.wait_for(kWait) != std::future_status::ready) {
    stop = true;  // a failed assertion must not leave the pump running
    pump.join();
    FAIL() << "no message reached the server within the wait";
  }
  b->t->close();
  closed = true;
  stop = true;
  pump.join();
  a->t->close();
  EXPECT_EQ(late.load(), 0) << "callbacks ran after close() returned";
}

}  // namespace
}  // namespace cortado::transport::testing
