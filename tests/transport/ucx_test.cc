// The conformance suite on the UCX transport (built when CORTADO_UCX is on).
#include "core/common/deadline.h"
#include "core/transport/ucx/factory.h"
#include "tests/transport/transport_test.h"

namespace cortado::transport::testing {
namespace {

// Connection-manager endpoints only (direct endpoints off), as between hosts.
TransportFactory ucxFactory() {
  return {"ucx", [] {
            ucx::UcxOptions o;
            o.connectTimeout = Millis(1500);
            o.sameHostDirect = false;
            return TransportEnv{
                [o](const NodeId& self) { return ucx::create(self, o); },
                [] { return std::string("ucx://127.0.0.1:0"); },
                "ucx://127.0.0.1:1",
            };
          }};
}

// The same, with same-host peers on direct endpoints (UcxOptions::sameHostDirect,
// the default): the data moves over UCX shared memory, the connection-manager
// endpoints report peers that close or fail.
TransportFactory ucxDirectFactory() {
  return {"ucx_direct", [] {
            ucx::UcxOptions o;
            o.connectTimeout = Millis(1500);
            o.sameHostDirect = true;
            return TransportEnv{
                [o](const NodeId& self) { return ucx::create(self, o); },
                [] { return std::string("ucx://127.0.0.1:0"); },
                "ucx://127.0.0.1:1",
            };
          }};
}

// Busy polling (UcxOptions::busyPoll, CORTADO_BUSY_POLL_US) on direct
// endpoints: the loop progresses UCX without sleeping after work.
TransportFactory ucxBusyPollFactory() {
  return {"ucx_direct_busy_poll", [] {
            ucx::UcxOptions o;
            o.connectTimeout = Millis(1500);
            o.sameHostDirect = true;
            o.busyPoll = std::chrono::microseconds(500);
            return TransportEnv{
                [o](const NodeId& self) { return ucx::create(self, o); },
                [] { return std::string("ucx://127.0.0.1:0"); },
                "ucx://127.0.0.1:1",
            };
          }};
}

// No bound on the large messages in flight to a peer (UcxOptions::peerSends
// 0), on connection-manager endpoints: every message starts when sent.
TransportFactory ucxUnboundedFactory() {
  return {"ucx_unbounded", [] {
            ucx::UcxOptions o;
            o.connectTimeout = Millis(1500);
            o.sameHostDirect = false;
            o.peerSends = 0;
            return TransportEnv{
                [o](const NodeId& self) { return ucx::create(self, o); },
                [] { return std::string("ucx://127.0.0.1:0"); },
                "ucx://127.0.0.1:1",
            };
          }};
}

CORTADO_TRANSPORT_CONFORMANCE(Ucx, ucxFactory());
CORTADO_TRANSPORT_CONFORMANCE(UcxUnbounded, ucxUnboundedFactory());
CORTADO_TRANSPORT_CONFORMANCE(UcxBusyPoll, ucxBusyPollFactory());
CORTADO_TRANSPORT_CONFORMANCE(UcxDirect, ucxDirectFactory());

}  // namespace
}  // namespace cortado::transport::testing
