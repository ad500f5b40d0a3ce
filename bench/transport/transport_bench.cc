// Transport micro-benchmark: one-way streaming bandwidth and small-message
// round-trip latency between two endpoints in this process, through raw
// ZeroMQ (DEALER -> ROUTER, zero-copy sends: the ceiling) and through
// Cortado's Transport backends (zmq, ucx where built, inproc). The gap is
// what our layer costs.
//
//   transport_bench [--address tcp://127.0.0.1:0|ipc:///tmp/x] [--io-threads N]
//                   [--total-mib M] [--only raw|zmq|ucx|ucx-direct|inproc]
#include <zmq.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/common/deadline.h"
#include "core/transport/inproc/factory.h"
#include "core/transport/zmq/factory.h"
#include "cortado/config.h"
#if CORTADO_UCX
#include "core/transport/ucx/factory.h"
#endif

namespace cortado::transport {
namespace {

using Seconds = std::chrono::duration<double>;
constexpr Millis kDeadline{120000};

struct Config {
  std::string address = "tcp://127.0.0.1:0";
  int ioThreads = 2;
  size_t totalBytes = 2048ull << 20;
  std::string only;
};

const std::vector<size_t> kSizes = {4 << 10, 64 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20};

size_t countFor(const Config& c, size_t size) {
  return std::max<size_t>(4, std::min<size_t>(20000, c.totalBytes / size));
}

void row(const char* what, size_t size, size_t count, double seconds) {
  double gbps = static_cast<double>(size) * count / seconds / 1e9;
  std::printf("%-8s %10zu B x %6zu  %8.3f s  %7.2f GB/s\n", what, size, count, seconds, gbps);
  std::fflush(stdout);
}

// ---- raw ZeroMQ ----

void check(bool ok, const char* what) {
  if (!ok) throw Error(ErrorCode::kInternal, fmt::format("{}: {}", what, zmq_strerror(errno)));
}

void rawStream(const Config& c, size_t size, const Buffer& payload) {
  void* ctx = zmq_ctx_new();
  zmq_ctx_set(ctx, ZMQ_IO_THREADS, c.ioThreads);
  void* router = zmq_socket(ctx, ZMQ_ROUTER);
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0;
  for (void* s : {router, dealer}) {
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
  }
  check(zmq_bind(router, c.address.c_str()) == 0, "bind");
  char ep[512];
  size_t len = sizeof(ep);
  zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len);
  check(zmq_connect(dealer, ep) == 0, "connect");
  size_t count = countFor(c, size);
  std::thread receiver([&] {
    zmq_msg_t m;
    zmq_msg_init(&m);
    for (size_t i = 0; i < count; ++i) {
      zmq_msg_recv(&m, router, 0);  // routing id
      zmq_msg_recv(&m, router, 0);  // payload
    }
    zmq_msg_close(&m);
  });
  auto start = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    zmq_msg_t m;
    auto* keep = new Buffer(payload);
    zmq_msg_init_data(&m, keep->data(), keep->size(),
                      [](void*, void* hint) { delete static_cast<Buffer*>(hint); }, keep);
    zmq_msg_send(&m, dealer, 0);
  }
  receiver.join();
  row("raw-zmq", size, count, Seconds(Clock::now() - start).count());
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(ctx);
}

// ---- Transport ----

// What b's receive callback does: echo (ping-pong) or count (streaming). The
// callbacks are set once, before the endpoints connect: setCallbacks() is
// queued to the transport's loop, and messages that arrived before a later
// swap went to the previous phase's callback (a stream then never completed).
// The phase changes only when nothing is in flight.
struct Receiver {
  std::mutex mu;
  std::condition_variable cv;
  bool echo = true;
  size_t got = 0;   // streamed messages counted at b
  int back = 0;     // pings answered, counted at a

  template <typename Pred>
  bool waitFor(Pred pred) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, kDeadline, pred);
  }
};

void transportStream(const char* what, Transport& a, Transport& b, Receiver& r, size_t size,
                     size_t count, Buffer payload) {
  {
    std::lock_guard g(r.mu);
    r.echo = false;
    r.got = 0;
  }
  auto start = Clock::now();
  for (size_t i = 0; i < count; ++i) a.send(b.self(), Message{NodeId{}, {payload}});
  if (!r.waitFor([&] { return r.got == count; })) {
    std::lock_guard g(r.mu);
    throw Error(ErrorCode::kTimeout, fmt::format("{}: {} of {} messages after {} ms", what, r.got,
                                                 count, kDeadline.count()));
  }
  row(what, size, count, Seconds(Clock::now() - start).count());
}

void transportPingPong(const char* what, Transport& a, Transport& b, Receiver& r, int rounds) {
  Buffer small = Buffer::allocate(64);
  auto start = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    a.send(b.self(), Message{NodeId{}, {small}});
    if (!r.waitFor([&] { return r.back > i; })) {
      throw Error(ErrorCode::kTimeout, fmt::format("{}: ping {} not answered", what, i));
    }
  }
  double us = Seconds(Clock::now() - start).count() / rounds * 1e6;
  std::printf("%-8s 64 B ping-pong: %.1f us per round trip\n", what, us);
}

void runTransport(const char* what, const Config& c, std::unique_ptr<Transport> a,
                  std::unique_ptr<Transport> b, const std::string& listenAt) {
  Receiver r;
  Transport* bp = b.get();
  b->setCallbacks(
      [bp, &r](Message&& m) {
        {
          std::lock_guard g(r.mu);
          if (!r.echo) {
            ++r.got;
            r.cv.notify_all();
            return;
          }
        }
        const NodeId from = m.from;  // `m` moves into send's argument
        bp->send(from, std::move(m));
      },
      [](const NodeId&, const Status&) {});
  a->setCallbacks(
      [&r](Message&&) {
        std::lock_guard g(r.mu);
        ++r.back;
        r.cv.notify_all();
      },
      [](const NodeId&, const Status&) {});
  auto address = b->listen(listenAt);
  auto aAddress = a->listen(listenAt.starts_with("ipc://") ? listenAt + "-a" : listenAt);
  a->connect(b->self(), address);
  b->connect(a->self(), aAddress);
  transportPingPong(what, *a, *b, r, 2000);
  for (size_t size : kSizes) {
    Buffer payload = Buffer::allocate(size);
    transportStream(what, *a, *b, r, size, countFor(c, size), payload);
  }
  // Both close before `r` goes: no callback runs after close() returns.
  a->close();
  b->close();
}

int run(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--address") c.address = argv[i + 1];
    else if (k == "--io-threads") c.ioThreads = std::stoi(argv[i + 1]);
    else if (k == "--total-mib") c.totalBytes = std::stoull(argv[i + 1]) << 20;
    else if (k == "--only") c.only = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::printf("address %s, io threads %d, about %zu MiB per size\n", c.address.c_str(),
              c.ioThreads, c.totalBytes >> 20);
  NodeId w{Role::kWorker, 0}, s{Role::kServer, 0};
  if (c.only.empty() || c.only == "raw") {
    for (size_t size : kSizes) rawStream(c, size, Buffer::allocate(size));
  }
  if (c.only.empty() || c.only == "zmq") {
    zmq::ZmqOptions o;
    o.ioThreads = c.ioThreads;
    runTransport("zmq", c, zmq::create(w, o), zmq::create(s, o), c.address);
  }
#if CORTADO_UCX
  if (c.only.empty() || c.only == "ucx") {
    ucx::UcxOptions o;
    o.sameHostDirect = false;  // CORTADO_UCX_DIRECT=0: connection-manager endpoints only
    runTransport("ucx", c, ucx::create(w, o), ucx::create(s, o), "ucx://127.0.0.1:0");
  }
  if (c.only.empty() || c.only == "ucx-direct") {
    ucx::UcxOptions o;
    o.sameHostDirect = true;  // the default: same-host direct endpoints over UCX shared memory
    runTransport("ucx-direct", c, ucx::create(w, o), ucx::create(s, o), "ucx://127.0.0.1:0");
  }
#endif
  if (c.only.empty() || c.only == "inproc") {
    auto hub = inproc::createHub();
    runTransport("inproc", c, inproc::create(hub, w), inproc::create(hub, s), "inproc://*");
  }
  return 0;
}


}  // namespace
}  // namespace cortado::transport

int main(int argc, char** argv) {
  try {
    return cortado::transport::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transport_bench: %s\n", e.what());
    return 1;
  }
}
