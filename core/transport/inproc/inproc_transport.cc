// The in-process transport (see factory.h). Each Transport owns a Mailbox, a
// queue of events that its loop thread handles in order: its own send(),
// connect() and disconnect() calls, messages from other Transports, and
// notices that a peer closed or that a name it waits for is now listened on.
// Other Transports hold a Mailbox only weakly, so a closed Transport is gone
// for them at once, and a push into a closed Mailbox fails instead of queueing.
#include "core/transport/inproc/factory.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>

#include "core/common/deadline.h"
#include "core/common/logging.h"

namespace cortado::transport::inproc {

namespace detail {

constexpr std::string_view kScheme = "inproc://";

class Mailbox;

struct SendOp {
  NodeId peer;
  Message msg;
};
struct ConnectOp {
  NodeId peer;
  std::string address;
};
struct DisconnectOp {
  NodeId peer;
};
struct CallbacksOp {
  Transport::RecvCallback onRecv;
  Transport::ErrorCallback onError;
};
struct Incoming {
  Message msg;
};
// A Transport that this one reaches at `address` closed.
struct PeerClosed {
  std::string address;
};
// A name that this Transport waits for is now listened on.
struct NameUp {
  std::string address;
};
using Event = std::variant<SendOp, ConnectOp, DisconnectOp, CallbacksOp, Incoming, PeerClosed, NameUp>;

class Mailbox {
 public:
  // False when the owner has closed: the event is dropped.
  bool push(Event e) {
    {
      std::lock_guard g(mu_);
      if (closed_) return false;
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
    return true;
  }

  // Waits until there are events, the mailbox closes, or `until`. Returns
  // false once closed.
  bool take(std::deque<Event>& out, Clock::time_point until) {
    std::unique_lock lk(mu_);
    cv_.wait_until(lk, until, [&] { return closed_ || !q_.empty(); });
    if (closed_) return false;
    out.swap(q_);
    return true;
  }

  bool closed() const {
    std::lock_guard g(mu_);
    return closed_;
  }

  // `watcher` is told (PeerClosed) when this mailbox closes. False when it is
  // closed already.
  bool addWatcher(std::weak_ptr<Mailbox> watcher, std::string address) {
    std::lock_guard g(mu_);
    if (closed_) return false;
    watchers_.emplace_back(std::move(watcher), std::move(address));
    return true;
  }

  // Closes and tells the watchers. False when it was closed already.
  bool close() {
    std::vector<std::pair<std::weak_ptr<Mailbox>, std::string>> watchers;
    {
      std::lock_guard g(mu_);
      if (closed_) return false;
      closed_ = true;
      q_.clear();
      watchers.swap(watchers_);
    }
    cv_.notify_all();
    for (auto& [w, address] : watchers) {
      if (auto m = w.lock()) m->push(PeerClosed{address});
    }
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
  bool closed_ = false;
  std::vector<std::pair<std::weak_ptr<Mailbox>, std::string>> watchers_;
};

}  // namespace detail

using detail::Mailbox;

class Hub {
 public:
  // Registers `address` for `mailbox`; "inproc://*" picks a fresh name.
  // Returns the address that peers connect to.
  std::string bind(const std::string& address, const std::shared_ptr<Mailbox>& mailbox,
                   const NodeId& who) {
    std::vector<std::weak_ptr<Mailbox>> waiters;
    std::string bound;
    {
      std::lock_guard g(mu_);
      bound = address;
      if (address == "inproc://*") {
        do {
          bound = fmt::format("inproc://auto-{}", nextAuto_++);
        } while (names_.count(bound));
      }
      auto it = names_.find(bound);
      auto holder = it == names_.end() ? nullptr : it->second.mailbox.lock();
      if (holder && !holder->closed()) {
        throw Error(ErrorCode::kUnavailable,
                    fmt::format("inproc {}: cannot listen on {}: {} already listens there; "
                                "choose another name, or inproc://* for a fresh one",
                                who, bound, it->second.owner));
      }
      names_[bound] = Entry{mailbox, who};
      auto w = waiters_.find(bound);
      if (w != waiters_.end()) {
        waiters.swap(w->second);
        waiters_.erase(w);
      }
    }
    for (auto& w : waiters) {
      if (auto m = w.lock()) m->push(detail::NameUp{bound});
    }
    return bound;
  }

  void unbind(const std::string& address, const std::shared_ptr<Mailbox>& mailbox) {
    std::lock_guard g(mu_);
    auto it = names_.find(address);
    if (it != names_.end() && it->second.mailbox.lock() == mailbox) names_.erase(it);
  }

  // The mailbox listening on `address`, or null after registering `waiter` to
  // be told (NameUp) when one binds it.
  std::shared_ptr<Mailbox> resolveOrWait(const std::string& address,
                                         const std::weak_ptr<Mailbox>& waiter) {
    std::lock_guard g(mu_);
    auto it = names_.find(address);
    if (it != names_.end()) {
      if (auto m = it->second.mailbox.lock()) return m;
    }
    waiters_[address].push_back(waiter);
    return nullptr;
  }

 private:
  struct Entry {
    std::weak_ptr<Mailbox> mailbox;
    NodeId owner;
  };
  std::mutex mu_;
  std::map<std::string, Entry> names_;
  std::map<std::string, std::vector<std::weak_ptr<Mailbox>>> waiters_;
  uint64_t nextAuto_ = 0;
};

std::shared_ptr<Hub> createHub() { return std::make_shared<Hub>(); }

namespace {

void checkAddress(const NodeId& self, const std::string& address) {
  CORTADO_ENFORCE(address.starts_with(detail::kScheme) && address.size() > detail::kScheme.size(),
                  ErrorCode::kInvalidArgument,
                  "inproc {}: bad address '{}': expected inproc://<name>", self, address);
}

class InprocTransport final : public Transport {
 public:
  InprocTransport(std::shared_ptr<Hub> hub, NodeId self, InprocOptions options)
      : hub_(std::move(hub)), self_(self), options_(options), mailbox_(std::make_shared<Mailbox>()) {
    CORTADO_ENFORCE(hub_ != nullptr, ErrorCode::kInvalidArgument, "inproc {}: no Hub given", self_);
    thread_ = std::thread([this] { loop(); });
    loopId_ = thread_.get_id();
  }

  ~InprocTransport() override {
    close();
    // Destroyed from its own callback: the loop cannot be joined from itself.
    if (thread_.joinable()) thread_.detach();
  }

  std::string name() const override { return "inproc"; }
  NodeId self() const override { return self_; }

  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override {
    mailbox_->push(detail::CallbacksOp{std::move(onRecv), std::move(onError)});
  }

  std::string listen(const std::string& address) override {
    checkAddress(self_, address);
    std::lock_guard g(namesMu_);
    CORTADO_ENFORCE(!mailbox_->closed(), ErrorCode::kClosed, "inproc {}: listen({}) after close()",
                    self_, address);
    auto bound = hub_->bind(address, mailbox_, self_);
    names_.push_back(bound);
    CORTADO_LOG_DEBUG("inproc {}: listening on {}", self_, bound);
    return bound;
  }

  void connect(const NodeId& peer, const std::string& address) override {
    checkAddress(self_, address);
    CORTADO_ENFORCE(mailbox_->push(detail::ConnectOp{peer, address}), ErrorCode::kClosed,
                    "inproc {}: connect({}, {}) after close()", self_, peer, address);
  }

  void send(const NodeId& peer, Message msg) override {
    CORTADO_ENFORCE(mailbox_->push(detail::SendOp{peer, std::move(msg)}), ErrorCode::kClosed,
                    "inproc {}: send to {} after close()", self_, peer);
  }

  void disconnect(const NodeId& peer) override { mailbox_->push(detail::DisconnectOp{peer}); }

  void close() override {
    std::lock_guard g(closeMu_);
    if (mailbox_->close()) {
      std::lock_guard n(namesMu_);
      for (const auto& a : names_) hub_->unbind(a, mailbox_);
      CORTADO_LOG_DEBUG("inproc {}: closed", self_);
    }
    // close() from a callback: the loop stops once the callback returns, and
    // a later close() or the destructor joins it.
    if (!thread_.joinable() || loopId_ == std::this_thread::get_id()) return;
    thread_.join();
  }

 private:
  struct Peer {
    std::string address;  // empty until connect() names it
    std::shared_ptr<Mailbox> target;
    bool failed = false;  // reported; messages are dropped until connect() again
    Clock::time_point deadline;
    std::deque<Message> held;  // sent before the peer was reachable
  };

  void loop() {
    std::deque<detail::Event> batch;
    while (mailbox_->take(batch, nextDeadline())) {
      for (auto& e : batch) {
        if (mailbox_->closed()) break;
        std::visit([this](auto& ev) { handle(ev); }, e);
      }
      batch.clear();
      expireTimers();
    }
    // Lets go of held messages (the senders' buffers) before close() returns.
    peers_.clear();
  }

  Clock::time_point nextDeadline() const {
    auto next = Clock::time_point::max();
    for (const auto& [id, p] : peers_) {
      if (!p.target && !p.failed) next = std::min(next, p.deadline);
    }
    return next;
  }

  void handle(detail::CallbacksOp& op) {
    onRecv_ = std::move(op.onRecv);
    onError_ = std::move(op.onError);
  }

  void handle(detail::ConnectOp& op) {
    Peer& p = peerFor(op.peer);
    if (p.address == op.address && p.target) return;
    p.address = op.address;
    p.target.reset();
    p.failed = false;
    p.deadline = Clock::now() + options_.connectTimeout;
    resolve(op.peer, p);
  }

  void handle(detail::DisconnectOp& op) { peers_.erase(op.peer); }

  void handle(detail::SendOp& op) {
    Peer& p = peerFor(op.peer);
    if (p.failed) {
      CORTADO_LOG_DEBUG("inproc {}: dropping a message to {} ({} is unreachable)", self_, op.peer,
                        p.address.empty() ? "never connected" : p.address);
      return;
    }
    if (!p.target) {
      p.held.push_back(std::move(op.msg));
      return;
    }
    deliver(op.peer, p, std::move(op.msg));
  }

  void handle(detail::Incoming& in) {
    // Copies, so that the receiver owns its memory as it would over a network.
    for (auto& part : in.msg.parts) {
      if (!part.empty()) part = Buffer::copyOf(part.data(), part.size());
    }
    if (!onRecv_) {
      CORTADO_LOG_WARN("inproc {}: dropping a message from {}: no receive callback set", self_,
                       in.msg.from);
      return;
    }
    try {
      onRecv_(std::move(in.msg));
    } catch (const std::exception& e) {
      CORTADO_LOG_ERROR("inproc {}: the receive callback threw: {}", self_, e.what());
    }
  }

  void handle(detail::PeerClosed& pc) {
    for (auto& [id, p] : peers_) {
      if (p.address == pc.address && p.target) {
        fail(id, p, ErrorCode::kPeerDead,
             fmt::format("inproc {}: peer {} at {} closed", self_, id, p.address));
      }
    }
  }

  void handle(detail::NameUp& up) {
    for (auto& [id, p] : peers_) {
      if (p.address == up.address && !p.target && !p.failed) resolve(id, p);
    }
  }

  Peer& peerFor(const NodeId& peer) {
    auto [it, inserted] = peers_.try_emplace(peer);
    if (inserted) it->second.deadline = Clock::now() + options_.connectTimeout;
    return it->second;
  }

  void resolve(const NodeId& id, Peer& p) {
    auto target = hub_->resolveOrWait(p.address, mailbox_);
    if (!target) return;  // NameUp comes when it listens, or the deadline passes
    if (!target->addWatcher(mailbox_, p.address)) {
      fail(id, p, ErrorCode::kPeerDead,
           fmt::format("inproc {}: peer {} at {} is closed", self_, id, p.address));
      return;
    }
    p.target = std::move(target);
    CORTADO_LOG_DEBUG("inproc {}: connected to {} at {}", self_, id, p.address);
    while (!p.held.empty() && p.target) {
      Message m = std::move(p.held.front());
      p.held.pop_front();
      deliver(id, p, std::move(m));
    }
  }

  void deliver(const NodeId& id, Peer& p, Message msg) {
    msg.from = self_;
    if (!p.target->push(detail::Incoming{std::move(msg)})) {
      fail(id, p, ErrorCode::kPeerDead,
           fmt::format("inproc {}: cannot deliver to {} at {}: it is closed", self_, id, p.address));
    }
  }

  void expireTimers() {
    auto now = Clock::now();
    for (auto& [id, p] : peers_) {
      if (p.target || p.failed || p.deadline > now) continue;
      auto ms = options_.connectTimeout.count();
      if (p.address.empty()) {
        fail(id, p, ErrorCode::kUnavailable,
             fmt::format("inproc {}: cannot send to {}: connect() did not name its address "
                         "within {} ms",
                         self_, id, ms));
      } else {
        fail(id, p, ErrorCode::kUnavailable,
             fmt::format("inproc {}: cannot reach {} at {}: nothing listened there within {} ms",
                         self_, id, p.address, ms));
      }
    }
  }

  void fail(const NodeId& id, Peer& p, ErrorCode code, std::string message) {
    if (!p.held.empty()) message += fmt::format(" ({} queued messages dropped)", p.held.size());
    p.failed = true;
    p.target.reset();
    p.held.clear();
    CORTADO_LOG_WARN("{}", message);
    if (!onError_ || mailbox_->closed()) return;
    try {
      onError_(id, Status(code, std::move(message)));
    } catch (const std::exception& e) {
      CORTADO_LOG_ERROR("inproc {}: the error callback threw: {}", self_, e.what());
    }
  }

  const std::shared_ptr<Hub> hub_;
  const NodeId self_;
  const InprocOptions options_;
  const std::shared_ptr<Mailbox> mailbox_;

  std::mutex namesMu_;
  std::vector<std::string> names_;  // bound in the Hub

  std::mutex closeMu_;
  std::thread thread_;
  std::thread::id loopId_;

  // Loop thread only.
  RecvCallback onRecv_;
  ErrorCallback onError_;
  std::unordered_map<NodeId, Peer> peers_;
};

}  // namespace

std::unique_ptr<Transport> create(std::shared_ptr<Hub> hub, NodeId self, InprocOptions options) {
  return std::make_unique<InprocTransport>(std::move(hub), self, options);
}

}  // namespace cortado::transport::inproc
