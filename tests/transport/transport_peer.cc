// A transport peer in its own process, for killed_peer_test.cc: it listens,
// connects back to the test (worker 0 at argv[2]), says hello with its own
// address, and echoes every message to its sender until it is killed or its
// deadline (argv[3] seconds) passes.
//
//   transport_peer zmq|ucx|ucx_direct <test's address> <seconds>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/transport/zmq/factory.h"
#include "cortado/config.h"
#if CORTADO_UCX
#include "core/transport/ucx/factory.h"
#endif

using namespace cortado;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: transport_peer zmq|ucx <address> <seconds>\n");
    return 2;
  }
  const std::string kind = argv[1], parentAddress = argv[2];
  const int seconds = std::atoi(argv[3]);
  const NodeId self{Role::kServer, 1}, parent{Role::kWorker, 0};
  std::unique_ptr<transport::Transport> t;
  std::string listenAt;
  if (kind == "zmq") {
    t = transport::zmq::create(self);
    listenAt = "tcp://127.0.0.1:0";
#if CORTADO_UCX
  } else if (kind == "ucx" || kind == "ucx_direct") {
    transport::ucx::UcxOptions o;
    o.sameHostDirect = kind == "ucx_direct";
    t = transport::ucx::create(self, o);
    listenAt = "ucx://127.0.0.1:0";
#endif
  } else {
    std::fprintf(stderr, "transport_peer: unknown transport '%s'\n", kind.c_str());
    return 2;
  }
  transport::Transport* tp = t.get();
  t->setCallbacks([tp](transport::Message&& m) {
                    const NodeId from = m.from;  // `m` moves into send's argument
                    tp->send(from, std::move(m));
                  },
                  [](const NodeId& peer, const Status& s) {
                    std::fprintf(stderr, "transport_peer: %s: %s\n", peer.toString().c_str(),
                                 s.message().c_str());
                  });
  std::string address = t->listen(listenAt);
  t->connect(parent, parentAddress);
  transport::Message hello;
  hello.parts.push_back(Buffer::copyOf(address.data(), address.size()));
  t->send(parent, std::move(hello));
  // Runs until killed; the deadline only bounds a test that lost track of it.
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock lk(mu);
  cv.wait_for(lk, std::chrono::seconds(seconds), [] { return false; });
  t->close();
  return 0;
}
