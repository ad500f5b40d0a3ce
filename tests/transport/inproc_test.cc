// The conformance suite on the in-process transport.
#include "core/common/deadline.h"
#include "core/transport/inproc/factory.h"
#include "tests/transport/transport_test.h"

namespace cortado::transport::testing {
namespace {

TransportFactory inprocFactory() {
  return {"inproc", [] {
            auto hub = inproc::createHub();
            inproc::InprocOptions o;
            o.connectTimeout = Millis(1500);
            return TransportEnv{
                [hub, o](const NodeId& self) { return inproc::create(hub, self, o); },
                [] { return std::string("inproc://*"); },
                "inproc://nobody-listens-here",
            };
          }};
}

CORTADO_TRANSPORT_CONFORMANCE(Inproc, inprocFactory());

}  // namespace
}  // namespace cortado::transport::testing
