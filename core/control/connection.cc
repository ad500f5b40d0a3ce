#include "core/control/connection.h"

#include <fmt/format.h>

#include "core/common/logging.h"

namespace cortado::control {

namespace asio = boost::asio;
using asio::ip::tcp;

std::shared_ptr<Connection> Connection::create(tcp::socket socket) {
  boost::system::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  std::string remote = ec ? std::string("unknown peer")
                          : fmt::format("{}:{}", ep.address().to_string(), ep.port());
  socket.set_option(tcp::no_delay(true), ec);
  return std::make_shared<Connection>(std::move(socket), std::move(remote));
}

Connection::Connection(tcp::socket socket, std::string remote)
    : socket_(std::move(socket)), remote_(std::move(remote)) {}

void Connection::start(MessageHandler onMessage, CloseHandler onClose) {
  onMessage_ = std::move(onMessage);
  onClose_ = std::move(onClose);
  readHeader();
}

void Connection::readHeader() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(header_, kFrameHeaderSize),
                   [this, self](const boost::system::error_code& ec, size_t) {
                     if (closed_) return;
                     if (ec) {
                       fail(ec == asio::error::eof ? "end of file" : ec.message(), false);
                       return;
                     }
                     FrameHeader h = decodeHeader(header_);
                     std::string bad = checkHeader(h, maxBody_);
                     if (!bad.empty()) {
                       fail("malformed frame: " + bad, true);
                       return;
                     }
                     readBody(static_cast<MsgType>(h.type), h.bodyLength);
                   });
}

void Connection::readBody(MsgType type, uint32_t length) {
  // The length was checked against maxBody_ before this allocation.
  body_.assign(length, '\0');
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(body_.data(), body_.size()),
                   [this, self, type](const boost::system::error_code& ec, size_t) {
                     if (closed_) return;
                     if (ec) {
                       fail(fmt::format("{} in the middle of a {} frame",
                                        ec == asio::error::eof ? "end of file" : ec.message(),
                                        msgTypeName(type)),
                            false);
                       return;
                     }
                     deliver(type, body_);
                     if (!closed_) readHeader();
                   });
}

void Connection::deliver(MsgType type, const std::string& text) {
  Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    fail(fmt::format("malformed frame: the body of a {} frame ({} bytes) is not a JSON object",
                     msgTypeName(type), text.size()),
         true);
    return;
  }
  try {
    onMessage_(type, body);
  } catch (const std::exception& e) {
    fail(fmt::format("bad {} message: {}", msgTypeName(type), e.what()), true);
  }
}

void Connection::send(MsgType type, const Json& body) {
  if (closed_ || sendingFinished_) return;
  outbox_.push_back(encodeFrame(type, body));
  if (!writing_) writeNext();
}

void Connection::finishSending() {
  if (closed_ || sendingFinished_) return;
  sendingFinished_ = true;
  if (!writing_) writeNext();
}

void Connection::writeNext() {
  if (closed_) return;
  if (outbox_.empty()) {
    writing_ = false;
    if (sendingFinished_) {
      boost::system::error_code ec;
      socket_.shutdown(tcp::socket::shutdown_send, ec);
    }
    return;
  }
  writing_ = true;
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(outbox_.front()),
                    [this, self](const boost::system::error_code& ec, size_t) {
                      if (closed_) return;
                      if (ec) {
                        fail("write failed: " + ec.message(), false);
                        return;
                      }
                      outbox_.pop_front();
                      writeNext();
                    });
}

void Connection::fail(const std::string& reason, bool malformed) {
  if (closed_) return;
  close();
  if (onClose_) {
    auto cb = std::move(onClose_);
    onClose_ = nullptr;
    cb(reason, malformed);
  }
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  outbox_.clear();
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
}

}  // namespace cortado::control
