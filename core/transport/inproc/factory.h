// The in-process transport: Transports in one process that reach each other
// through a Hub owned by the test (no globals). Addresses are
// "inproc://<name>"; listen("inproc://*") picks a fresh name. Each Transport
// has its own loop thread, so callbacks follow the contract in transport.h as
// they do on the network backends. Received parts are copies made on the
// receiver's loop: the receiver never shares memory with the sender.
#pragma once

#include <chrono>
#include <memory>

#include "core/transport/transport.h"

namespace cortado::transport::inproc {

// The registry of listening names. Shared by the Transports created from it;
// it lives as long as the last of them.
class Hub;

std::shared_ptr<Hub> createHub();

struct InprocOptions {
  // How long a peer may take to become reachable: from connect() until its
  // name is listened on, or from a send() to a peer that connect() has not
  // named yet. Past it, held messages are dropped and the error callback fires.
  std::chrono::milliseconds connectTimeout{30000};
};

std::unique_ptr<Transport> create(std::shared_ptr<Hub> hub, NodeId self,
                                  InprocOptions options = {});

}  // namespace cortado::transport::inproc
