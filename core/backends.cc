#include "core/backends.h"

#include "core/common/logging.h"
#include "core/transport/zmq/factory.h"
#include "cortado/config.h"

namespace cortado {

std::unique_ptr<transport::Transport> makeTransport(const JobConfig& config, const NodeId& self) {
  std::string kind = config.transport;
  if (kind == "auto") {
    // UCX is not part of this build yet (issue 5); ZeroMQ carries the job.
    CORTADO_LOG_INFO("transport auto: using zmq (this build has no UCX transport)");
    kind = "zmq";
  }
  if (kind == "zmq") {
    transport::zmq::ZmqOptions o;
    return transport::zmq::create(self, o);
  }
  throw Error(ErrorCode::kUnavailable,
              fmt::format("transport '{}' is not available in this build: use "
                          "CORTADO_TRANSPORT=zmq",
                          kind));
}

std::string dataListenAddress(const JobConfig& config) {
  return fmt::format("tcp://{}:0", config.dataHost);
}

}  // namespace cortado
