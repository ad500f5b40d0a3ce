// The UCX transport (UCP active messages). Addresses are "ucx://host:port":
// the socket address of UCX's connection manager (listen() accepts
// "tcp://host:port" too, and returns the ucx:// form; connect() refuses
// tcp://, which is what a ZeroMQ node advertises); the data then moves over whatever UCX picks
// (shared memory on one machine, TCP or RDMA between machines), as the UCX_* environment variables
// (UCX_TLS, UCX_NET_DEVICES, UCX_RNDV_THRESH, ...) direct. Port 0 picks a
// free port.
//
// Each node listens once and creates one client endpoint per peer that it
// connect()s to; a Message is one active message whose header names the
// sender. A message with one large part (16 KiB or more) and small others,
// which is what pushes and pull answers are, sends the large part from the
// caller's buffer, without a copy, and UCX moves it by rendezvous straight
// into the receive buffer; the small parts ride in the header. Other messages
// are copied into one buffer first. One loop thread owns the UCP worker and progresses it, sleeping
// on the worker's event fd. send() from another thread starts the message itself while the loop
// sleeps (to a same-host peer, over the direct endpoint), or else queues it
// for the loop; send() from the loop thread itself (a receive callback's
// answer) starts it at once; either way not ahead of earlier sends that
// are still queued.
//
// With sameHostDirect (the default), a peer on the same host (same boot id and
// host name) gets a second, direct endpoint made from its UCP worker address,
// on a UCP context of its own, which carries the data over UCX's shared-memory
// FIFOs (sysv/posix; no cma unless UCX_TLS names it).
//
// Failure: an endpoint error (the peer died, refused, or timed out) and a
// peer's orderly close() are reported once through the error callback; the
// peer's pending and later messages are dropped until connect() names it again.
//
// Close before the process exits: close() keeps the UCX listener and worker
// (connection requests are rejected), and an exit handler that the first
// close registers destroys them before the libraries' destructors run, which
// must not meet a live UCX worker (docs/transports.md, "Closing a UCX
// transport"). A transport still open at exit is not covered.
#pragma once

#include <chrono>
#include <memory>

#include "core/transport/transport.h"

namespace cortado::transport::ucx {

struct UcxOptions {
  // How long a peer may take to become reachable: from connect() until the
  // endpoint carried its first message, or from a send() to a peer that
  // connect() has not named yet.
  std::chrono::milliseconds connectTimeout{30000};
  // How long close() lets endpoints say goodbye and flush before forcing them.
  std::chrono::milliseconds closeTimeout{1000};
  // Peers on the same host (same boot id and host name) carry the data over a direct
  // endpoint made from the peer's UCP worker address, without peer-failure
  // handling (which in UCX 1.13 leaves shared memory out), so that UCX uses its
  // shared-memory FIFOs; the connection-manager endpoint stays open beside it
  // and reports the peer's failure, and then both are closed by force. The
  // direct endpoints have a UCP context of their own: with UCX_TLS unset its
  // transports are sysv,posix,self (no cma, no tcp) and its FIFO is 1024
  // elements deep (UCX_MM_FIFO_SIZE, when set, wins). cma is left out because
  // UCX 1.13 aborts a process whose cma read fails because the peer died
  // mid-transfer ("process_vm_readv ... No such process"); a UCX_TLS that
  // names cma brings it back, with that risk (a warning says so). Off, or with
  // UCX_TLS naming no shared-memory transport, the connection-manager endpoint
  // carries everything (TCP on one host). (CORTADO_UCX_DIRECT, default 1)
  bool sameHostDirect = true;
  // After work, the loop keeps progressing UCX without sleeping for this
  // long (0: it sleeps at once), so that the next message finds it awake.
  // It costs a core while it polls (CORTADO_BUSY_POLL_US).
  std::chrono::microseconds busyPoll{0};
  // At most this many large data messages (64 KiB or more) in flight to one
  // peer; later messages to it wait, in order, until one completes (0: no
  // bound). UCX progresses all of an endpoint's rendezvous sends together,
  // so without a bound every chunk pushed to a server arrives at the end of
  // the push, and the server can answer none before then
  // (CORTADO_UCX_PEER_SENDS).
  int peerSends = 1;
};

// Throws Error(kUnavailable) naming the cause and the UCX_* settings in force
// when UCX cannot be initialized.
std::unique_ptr<Transport> create(const NodeId& self, const UcxOptions& options = {});

}  // namespace cortado::transport::ucx
