// A worker that speaks the data-plane wire format by hand, on the
// in-process transport, for the server tests: it sends hand-built PUSH and
// PULL messages, valid and malformed, and reads the server's answers.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "core/transport/inproc/factory.h"
#include "core/wire/data_message.h"

namespace cortado::test {

using transport::Message;
using wire::DataHeader;
using wire::Op;

// A hand-built data-plane header (bodyBytes is set by RawWorker::send).
inline DataHeader rawHeader(Op op, uint64_t key, uint64_t round, uint64_t n, uint32_t req,
                            uint8_t flags) {
  DataHeader h;
  h.op = op;
  h.flags = flags;
  h.key = key;
  h.round = round;
  h.numElements = n;
  h.requestId = req;
  return h;
}

// A worker that speaks the wire format by hand.
class RawWorker {
 public:
  RawWorker(std::shared_ptr<transport::inproc::Hub> hub, int rank, const std::string& serverAddr)
      : id_{Role::kWorker, rank}, t_(transport::inproc::create(std::move(hub), id_)) {
    t_->setCallbacks(
        [this](Message&& m) {
          {
            std::lock_guard<std::mutex> lk(mu_);
            inbox_.push_back(std::move(m));
          }
          cv_.notify_all();
        },
        [](const NodeId&, const Status&) {});
    address = t_->listen(fmt::format("inproc://raw-worker-{}", rank));
    t_->connect(NodeId{Role::kServer, 0}, serverAddr);
  }
  ~RawWorker() { t_->close(); }

  void send(const DataHeader& h, Buffer body) {
    DataHeader x = h;
    x.bodyBytes = body.size();
    Message m;
    m.parts.push_back(wire::encodeHeader(x));
    m.parts.push_back(std::move(body));
    t_->send(NodeId{Role::kServer, 0}, std::move(m));
  }

  // The next message, or a failed test after 10 s.
  std::pair<DataHeader, Buffer> next() {
    std::unique_lock<std::mutex> lk(mu_);
    bool got = cv_.wait_for(lk, std::chrono::seconds(10), [&] { return !inbox_.empty(); });
    if (!got) throw Error(ErrorCode::kTimeout, fmt::format("{}: no answer", id_.toString()));
    Message m = std::move(inbox_.front());
    inbox_.pop_front();
    return {wire::decodeHeader(m.parts[0], m.parts[1].size()), m.parts[1]};
  }
  std::string nextError() {
    auto [h, b] = next();
    EXPECT_EQ(h.op, Op::kError);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }

  NodeId id_;
  std::string address;

 private:
  std::unique_ptr<transport::Transport> t_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> inbox_;
};

}  // namespace cortado::test
