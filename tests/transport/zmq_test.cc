// The conformance suite on the ZeroMQ transport, over TCP and over Unix sockets.
#include <unistd.h>

#include <atomic>

#include "core/common/deadline.h"
#include "core/transport/zmq/factory.h"
#include "tests/transport/transport_test.h"

namespace cortado::transport::testing {
namespace {

zmq::ZmqOptions testOptions() {
  zmq::ZmqOptions o;
  o.connectTimeout = Millis(1500);
  o.heartbeatInterval = Millis(500);
  o.heartbeatTimeout = Millis(3000);
  return o;
}

TransportFactory zmqTcpFactory() {
  return {"zmq_tcp", [] {
            return TransportEnv{
                [](const NodeId& self) { return zmq::create(self, testOptions()); },
                [] { return std::string("tcp://127.0.0.1:0"); },
                // Port 1 (tcpmux) is privileged and unused: connections are refused.
                "tcp://127.0.0.1:1",
            };
          }};
}

TransportFactory zmqIpcFactory() {
  return {"zmq_ipc", [] {
            static std::atomic<int> envs{0};
            std::string prefix = fmt::format("/tmp/cortado-transport-test-{}-{}", ::getpid(), envs++);
            // The socket files go with the env: ZeroMQ leaves one behind
            // where a test's listener is not closed in order (hundreds piled
            // up in /tmp over CI runs).
            auto counter = std::shared_ptr<std::atomic<int>>(new std::atomic<int>(0), [prefix](std::atomic<int>* n) {
              for (int i = 0; i < n->load(); ++i) ::unlink(fmt::format("{}-{}.sock", prefix, i).c_str());
              delete n;
            });
            return TransportEnv{
                [](const NodeId& self) { return zmq::create(self, testOptions()); },
                [counter, prefix] { return fmt::format("ipc://{}-{}.sock", prefix, (*counter)++); },
                fmt::format("ipc://{}-nobody.sock", prefix),
            };
          }};
}

// Busy polling (ZmqOptions::busyPoll, CORTADO_BUSY_POLL_US): the loop polls
// without sleeping after work. The suite's ordering, echo and close tests
// hold with it on.
TransportFactory zmqBusyPollFactory() {
  return {"zmq_tcp_busy_poll", [] {
            zmq::ZmqOptions o = testOptions();
            o.busyPoll = std::chrono::microseconds(500);
            return TransportEnv{
                [o](const NodeId& self) { return zmq::create(self, o); },
                [] { return std::string("tcp://127.0.0.1:0"); },
                "tcp://127.0.0.1:1",
            };
          }};
}

CORTADO_TRANSPORT_CONFORMANCE(Zmq, zmqTcpFactory(), zmqIpcFactory());
CORTADO_TRANSPORT_CONFORMANCE(ZmqBusyPoll, zmqBusyPollFactory());

}  // namespace
}  // namespace cortado::transport::testing
