// The data-plane transport interface. Workers and servers exchange Messages
// through a Transport and never know which backend carries them (ZeroMQ, UCX
// or the in-process one used by tests).
//
// Contract
// - Identity: every Transport belongs to one node (NodeId). A received
//   Message names its sender in `from`. Messages from one sender to one
//   receiver arrive in the order they were sent.
// - Ownership: send() takes the Message; the transport keeps each part's
//   Buffer alive until the bytes have left (zero-copy where the backend can).
//   A received Message owns its parts; the receiver may keep them.
// - Threads: all methods are thread-safe. The receive and error callbacks run
//   on the transport's own threads (its loop thread; the shared-memory ring
//   transport's ring thread too), or on a thread inside
//   receiveWhileWaiting(), one at a time, never while the transport holds a
//   lock that a method takes, so a callback may call send(). A callback must
//   not block for long: it delays every other message.
// - Errors: listen() throws cortado::Error (kUnavailable, naming the address,
//   e.g. a port in use). send() never blocks on the network and never throws
//   for a peer fault: when a message cannot be delivered, or a connected peer
//   goes away, the error callback receives the peer and a Status whose
//   message names the peer and its address. send() after close() throws
//   Error(kClosed). Zero-length parts and zero-part messages are allowed.
// - Lifetime: close() stops the loop thread; no callback runs after it
//   returns. The destructor calls close().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/common/buffer.h"
#include "core/common/error.h"
#include "core/common/node.h"

namespace cortado::transport {

struct Message {
  NodeId from;                // filled in on receive
  std::vector<Buffer> parts;  // each part arrives as one Buffer

  size_t totalBytes() const {
    size_t n = 0;
    for (const auto& p : parts) n += p.size();
    return n;
  }
};

class Transport {
 public:
  using RecvCallback = std::function<void(Message&&)>;
  using ErrorCallback = std::function<void(const NodeId& peer, const Status& status)>;

  virtual ~Transport() = default;

  // "zmq", "ucx" or "inproc".
  virtual std::string name() const = 0;
  virtual NodeId self() const = 0;

  // Callbacks must be set before listen()/connect().
  virtual void setCallbacks(RecvCallback onRecv, ErrorCallback onError) = 0;

  // Binds and starts receiving. `address` is backend-specific, e.g.
  // "tcp://127.0.0.1:0" (port 0: pick a free one). Returns the address that
  // peers pass to connect(), with the real port.
  virtual std::string listen(const std::string& address) = 0;

  // Makes `peer` reachable at `address` (as returned by its listen()).
  // Asynchronous: messages sent before the connection is up are queued.
  virtual void connect(const NodeId& peer, const std::string& address) = 0;

  virtual void send(const NodeId& peer, Message msg) = 0;

  // send() of each message in turn, which a backend may hand to its loop
  // thread at once: one wake-up for all of them (a worker's push and pull).
  virtual void sendAll(const NodeId& peer, std::vector<Message> msgs) {
    for (auto& m : msgs) send(peer, std::move(m));
  }

  // Receiving on a waiting thread (optional; the shared-memory ring
  // transport does it, the others do not). A thread that waits for a reply
  // may take incoming messages itself while it waits, so that the reply
  // wakes it directly instead of waking the transport's thread, which would
  // then have to wake it. receiveWhileWaiting() runs the receive and error
  // callbacks on the calling thread until done() returns true, `until`
  // passes, or the transport closes, and returns true. done() is called
  // often, from this thread, with no lock held: it must be cheap and must
  // not block. One thread receives at a time; another one that calls it
  // meanwhile waits for its turn or for its done(). Returns false at once,
  // having done nothing, where the backend does not do this, where it is
  // closed, or when called from one of its callbacks.
  virtual bool receiveWhileWaiting(const std::function<bool()>& done,
                                   std::chrono::steady_clock::time_point until) {
    (void)done;
    (void)until;
    return false;
  }
  // Makes the threads in receiveWhileWaiting() look at their done() again:
  // call it after turning one's done() true from another thread. Any
  // thread; cheap when no thread receives.
  virtual void wakeWaiting() {}

  // Says when the receiver expects messages soon (optional; the shared-
  // memory ring transport uses it, the others ignore it). While
  // expecting() returns true, the transport's thread that has just handed
  // a message over may poll for the next one for a bounded time instead of
  // sleeping at once: a server whose round waits for the other workers'
  // pushes (CORTADO_SHM_SERVER_POLL_US). expecting() is called on the
  // transport's thread, often, with no lock of the transport held: it must
  // be cheap, must not block, and must stay callable until close()
  // returns. Set it before listen().
  virtual void setExpecting(std::function<bool()> expecting) { (void)expecting; }

  // Forgets `peer`: pending sends to it are dropped without an error.
  virtual void disconnect(const NodeId& peer) = 0;

  virtual void close() = 0;
};

}  // namespace cortado::transport
