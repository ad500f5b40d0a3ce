// The ZeroMQ transport: TCP ("tcp://host:port", port 0 picks a free one) and
// Unix sockets ("ipc:///path"). Each node binds one ROUTER socket and
// connects one DEALER per peer, whose routing id is the node's id
// (NodeId::toWire()), so a receiver knows every sender without a handshake of
// its own. One loop thread owns every socket; send() from another thread
// writes the message itself while the loop sleeps in its poll, or else
// queues it and wakes the loop, and send() from the loop thread itself (a
// receive callback's answer) writes at once; either way not ahead of
// earlier sends that are still queued (they go first, in order).
// Parts of at least `zeroCopyBytes` are sent without
// copying (the Buffer is released once ZeroMQ has written it), and received
// parts are ZeroMQ's own memory, wrapped in a Buffer.
//
// Failure: a DEALER whose connection drops (the peer closed or died, or ZMTP
// heartbeats timed out) reports the peer through the error callback, once per
// loss. ZeroMQ keeps reconnecting and keeps the queued messages (the caller's
// buffers, not copies) until the peer is back or disconnect() forgets it.
#pragma once

#include <chrono>
#include <memory>

#include "core/transport/transport.h"

namespace cortado::transport::zmq {

struct ZmqOptions {
  // ZeroMQ I/O threads for this transport's context.
  int ioThreads = 2;
  // SO_SNDBUF and SO_RCVBUF in bytes; 0 keeps the kernel's (autotuned) size.
  int socketBufferBytes = 0;
  // Messages ZeroMQ queues per peer before send() holds them in the loop;
  // 0 means no limit (the caller's byte credits bound what is in flight).
  int sendHighWaterMark = 0;
  int recvHighWaterMark = 0;
  // Parts this large or larger are sent zero-copy; smaller ones are copied.
  size_t zeroCopyBytes = 8 << 10;
  // How long a peer may take to become reachable: from connect() until the
  // ZMTP handshake completes, or from a send() to a peer that connect() has
  // not named yet. Past it, the error callback fires (and held messages are
  // dropped).
  std::chrono::milliseconds connectTimeout{30000};
  // ZMTP heartbeats on every connection: a ping every `heartbeatInterval`,
  // the connection dropped when nothing comes back within `heartbeatTimeout`.
  // 0 disables them. The scheduler's heartbeats are the primary failure
  // detector; these catch a peer that hangs without closing its sockets.
  std::chrono::milliseconds heartbeatInterval{5000};
  std::chrono::milliseconds heartbeatTimeout{30000};
  // After each wake-up with work, the loop keeps polling its sockets without
  // sleeping for this long (0: it sleeps at once), so that the next message
  // finds it awake. It costs a core while it polls (CORTADO_BUSY_POLL_US).
  std::chrono::microseconds busyPoll{0};
};

std::unique_ptr<Transport> create(const NodeId& self, const ZmqOptions& options = {});

}  // namespace cortado::transport::zmq
