// One framed control-plane connection over a TCP socket (private to
// core/control and the scheduler).
//
// Threads: every method and every callback runs on the io thread of the
// socket's io_context; the owner (ControlClient, Scheduler) has exactly one.
// Callbacks are invoked with no lock held.
//
// Reading: start() reads frames until the connection ends. Each header is
// checked (magic, version, type, length <= the current limit) before the body
// is allocated; the body must be a JSON object. When the message handler
// throws (a missing field, a protocol violation), the connection is closed as
// malformed. The close handler runs at most once, when the peer closed, the
// socket failed, or the peer sent something malformed (`malformed` true, with
// `reason` saying what); it does not run after close().
#pragma once

// <utility> first: Boost 1.74 asio/awaitable.hpp uses std::exchange without it in C++20.
#include <utility>

#include <boost/asio.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "core/control/protocol.h"

namespace cortado::control {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using MessageHandler = std::function<void(MsgType, const Json&)>;
  using CloseHandler = std::function<void(const std::string& reason, bool malformed)>;

  static std::shared_ptr<Connection> create(boost::asio::ip::tcp::socket socket);
  Connection(boost::asio::ip::tcp::socket socket, std::string remote);

  // "host:port" of the peer, fixed at creation.
  const std::string& remote() const { return remote_; }
  void setMaxBody(size_t bytes) { maxBody_ = bytes; }

  void start(MessageHandler onMessage, CloseHandler onClose);
  // Queues a frame. A no-op once the connection is closed or half-closed.
  void send(MsgType type, const Json& body);
  // Writes what is queued, then half-closes (FIN). Reading goes on, so the
  // peer's close still reaches the close handler.
  void finishSending();
  // Closes now; queued frames are dropped and no handler runs again.
  void close();
  bool isOpen() const { return !closed_; }

 private:
  void readHeader();
  void readBody(MsgType type, uint32_t length);
  void deliver(MsgType type, const std::string& text);
  void writeNext();
  void fail(const std::string& reason, bool malformed);

  boost::asio::ip::tcp::socket socket_;
  std::string remote_;
  size_t maxBody_ = kMaxBodyBeforeAuth;
  MessageHandler onMessage_;
  CloseHandler onClose_;
  uint8_t header_[kFrameHeaderSize] = {};
  std::string body_;
  std::deque<std::string> outbox_;
  bool writing_ = false;
  bool sendingFinished_ = false;
  bool closed_ = false;
};

}  // namespace cortado::control
