// The one place (with the tests) that names concrete transports: builds the
// data-plane transport that a job's configuration asks for. Used by the role
// commands and the bindings; the worker and server engines only see the
// Transport interface.
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "core/transport/transport.h"

namespace cortado {

// `transport` is "zmq", "ucx" or "auto" (UCX where it was built, else ZeroMQ;
// the choice and the reason are logged). Throws Error(kUnavailable) when an
// explicitly requested backend is not in this build.
std::unique_ptr<transport::Transport> makeTransport(const JobConfig& config, const NodeId& self);

// The listen address for this node's data plane, e.g. tcp://127.0.0.1:0.
std::string dataListenAddress(const JobConfig& config);

}  // namespace cortado
