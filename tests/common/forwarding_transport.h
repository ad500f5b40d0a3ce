// ForwardingTransport: a Transport that hands every call to another one.
// The tests' wrappers that watch or hold back some calls derive from it and
// override only those, so that each wrapper passes on the rest, the
// optional calls (receiveWhileWaiting, wakeWaiting, setExpecting) included.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/transport/transport.h"

namespace cortado::test {

class ForwardingTransport : public transport::Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name(); }
  NodeId self() const override { return inner_->self(); }
  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override {
    inner_->setCallbacks(std::move(onRecv), std::move(onError));
  }
  std::string listen(const std::string& address) override { return inner_->listen(address); }
  void connect(const NodeId& peer, const std::string& address) override {
    inner_->connect(peer, address);
  }
  void send(const NodeId& peer, transport::Message msg) override {
    inner_->send(peer, std::move(msg));
  }
  void sendAll(const NodeId& peer, std::vector<transport::Message> msgs) override {
    inner_->sendAll(peer, std::move(msgs));
  }
  bool receiveWhileWaiting(const std::function<bool()>& done,
                           std::chrono::steady_clock::time_point until) override {
    return inner_->receiveWhileWaiting(done, until);
  }
  void wakeWaiting() override { inner_->wakeWaiting(); }
  void setExpecting(std::function<bool()> expecting) override {
    inner_->setExpecting(std::move(expecting));
  }
  void disconnect(const NodeId& peer) override { inner_->disconnect(peer); }
  void close() override { inner_->close(); }

 protected:
  transport::Transport& inner() { return *inner_; }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

}  // namespace cortado::test
