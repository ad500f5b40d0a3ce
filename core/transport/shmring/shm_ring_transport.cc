// The shared-memory ring transport (factory.h says what it does).
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/common/error.h"
#include "core/common/logging.h"
#include "core/common/net.h"
#include "core/transport/shmring/factory.h"

namespace cortado::transport::shmring {
namespace {

using Clock = std::chrono::steady_clock;

class RingTransport final : public Transport {
 public:
  RingTransport(std::unique_ptr<Transport> inner, RingOptions o)
      : inner_(std::move(inner)), opts_(std::move(o)), self_(inner_->self()) {
    if (opts_.host.empty()) opts_.host = net::localHostname();
    mailbox_ = shm::Mailbox::create(shm::segmentName(opts_.prefix, self_, shm::kMailboxIndex),
                                    opts_.host, opts_.shape);
  }
  ~RingTransport() override { close(); }

  std::string name() const override { return inner_->name(); }
  NodeId self() const override { return self_; }

  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override {
    onRecv_ = std::move(onRecv);
    onError_ = std::move(onError);
    inner_->setCallbacks([this](Message&& m) { onInnerMessage(std::move(m)); },
                         [this](const NodeId& peer, const Status& s) {
                           if (onError_) onError_(peer, s);
                         });
  }

  std::string listen(const std::string& address) override {
    std::string real = inner_->listen(address);
    startThread();
    return real;
  }

  void connect(const NodeId& peer, const std::string& address) override {
    inner_->connect(peer, address);
    startThread();  // a node that only connects still takes answers
  }

  void send(const NodeId& peer, Message msg) override {
    checkOpen(peer);
    Out& o = out(peer);
    std::lock_guard<std::mutex> lk(o.mu);
    if (trySendLocked(o, peer, msg)) return;
    inner_->send(peer, std::move(msg));
    ++o.innerSent;
  }

  void sendAll(const NodeId& peer, std::vector<Message> msgs) override {
    checkOpen(peer);
    Out& o = out(peer);
    std::lock_guard<std::mutex> lk(o.mu);
    std::vector<Message> rest;
    for (auto& m : msgs) {
      if (trySendLocked(o, peer, m)) continue;
      rest.push_back(std::move(m));
      ++o.innerSent;  // a later record waits for it, however late it is sent
    }
    if (!rest.empty()) inner_->sendAll(peer, std::move(rest));
  }

  void disconnect(const NodeId& peer) override { inner_->disconnect(peer); }

  void close() override {
    if (closed_.exchange(true)) return;
    stop_.store(true, std::memory_order_release);
    mailbox_->shut();
    if (thread_.joinable()) thread_.join();
    inner_->close();
    CORTADO_LOG_DEBUG("{}: shared-memory ring messages: {} in, ring thread slept {} times",
                      self_.toString(), ringDelivered_, mailbox_->sleeps());
  }

 private:
  struct Out {
    std::mutex mu;
    bool tried = false;
    std::unique_ptr<shm::MailboxSender> sender;
    uint64_t innerSent = 0;  // messages to this peer over the inner transport
  };
  struct In {
    uint64_t innerReceived = 0;
    bool reportedGone = false;
  };

  void checkOpen(const NodeId& peer) const {
    if (closed_.load(std::memory_order_acquire))
      throw Error(ErrorCode::kClosed, fmt::format("{}: send to {} after close()", self_.toString(),
                                                  peer.toString()));
  }

  // Under o.mu: true when `msg` went into the peer's ring.
  bool trySendLocked(Out& o, const NodeId& peer, const Message& msg) {
    if (!o.tried) {
      o.tried = true;
      o.sender = shm::MailboxSender::open(shm::segmentName(opts_.prefix, peer, shm::kMailboxIndex),
                                          self_, opts_.host);
      if (o.sender)
        CORTADO_LOG_DEBUG("{}: messages to {} go through its shared-memory ring", self_.toString(),
                          peer.toString());
    }
    if (!o.sender) return false;
    switch (o.sender->trySend(msg.parts, o.innerSent)) {
      case shm::MailboxSender::Result::kSent:
        return true;
      case shm::MailboxSender::Result::kTooBig:
        return false;
      case shm::MailboxSender::Result::kFull:
        if (!o.sender->consumerAlive()) {
          CORTADO_LOG_WARN("{}: the process of {} (pid {}) is gone; its shared-memory ring is no "
                           "longer used",
                           self_.toString(), peer.toString(), o.sender->consumerPid());
          o.sender.reset();
        }
        return false;
      case shm::MailboxSender::Result::kRefused:
        if (!o.sender->consumerOpen()) {
          CORTADO_LOG_DEBUG("{}: {} closed its shared-memory ring", self_.toString(),
                            peer.toString());
          o.sender.reset();
          return false;
        }
        CORTADO_LOG_WARN("{}: {} refused its shared-memory ring; messages to it go through the {} "
                         "transport",
                         self_.toString(), peer.toString(), inner_->name());
        o.sender.reset();
        return false;
    }
    return false;
  }

  Out& out(const NodeId& peer) {
    std::lock_guard<std::mutex> lk(outMu_);
    auto& p = outs_[peer];
    if (!p) p = std::make_unique<Out>();
    return *p;
  }

  void startThread() {
    std::lock_guard<std::mutex> lk(threadMu_);
    if (thread_.joinable() || closed_.load()) return;
    thread_ = std::thread([this] { ringLoop(); });
  }

  // Under deliverMu_: hands over the records of `peer`'s ring that its
  // inner messages received so far allow. Returns how many.
  size_t drain(uint32_t r, const NodeId& peer) {
    size_t n = 0;
    In& in = ins_[peer];
    while (true) {
      std::optional<shm::Mailbox::Record> rec;
      try {
        rec = mailbox_->front(r);
      } catch (const Error& e) {
        CORTADO_LOG_ERROR("{}: {}", self_.toString(), e.what());
        if (onError_) onError_(peer, Status(e.code(), e.what()));
        return n;
      }
      if (!rec || rec->afterInner > in.innerReceived) return n;
      mailbox_->pop(r);
      Message m;
      m.from = rec->producer;
      m.parts = std::move(rec->parts);
      ++ringDelivered_;
      ++n;
      if (onRecv_) onRecv_(std::move(m));
    }
  }

  void drainPeer(const NodeId& peer) {
    auto it = ringOf_.find(peer);
    if (it != ringOf_.end()) drain(it->second, peer);
  }

  // Learns the rings claimed since the last look (under deliverMu_).
  void refreshRings() {
    for (uint32_t r : mailbox_->rings()) {
      if (known_.count(r)) continue;
      const NodeId p = mailbox_->producer(r);
      if ((p.role != Role::kWorker && p.role != Role::kServer) || p.rank < 0) {
        CORTADO_LOG_WARN("{}: shared-memory ring {} names no data-plane node (role {}, rank {}); "
                         "ignored",
                         self_.toString(), r, static_cast<int>(p.role), p.rank);
        known_.insert(r);
        continue;
      }
      known_.insert(r);
      ringOf_[p] = r;
      // Its process is alive now, having just claimed the ring: a pid that
      // this process cannot see (another pid namespace) is never checked.
      if (!shm::processAlive(mailbox_->producerPid(r))) {
        CORTADO_LOG_DEBUG("{}: the pid of {} ({}) is not visible here; its end is left to the "
                          "transport and the scheduler",
                          self_.toString(), p.toString(), mailbox_->producerPid(r));
        ins_[p].reportedGone = true;
      }
    }
  }

  void onInnerMessage(Message&& m) {
    std::lock_guard<std::mutex> lk(deliverMu_);
    refreshRings();  // a ring its sender claimed since the ring thread looked
    // Records written before this message was sent go first.
    drainPeer(m.from);
    const NodeId from = m.from;
    ++ins_[from].innerReceived;
    if (onRecv_) onRecv_(std::move(m));
    drainPeer(from);  // and those it held back
  }

  void ringLoop() {
    auto lastCheck = Clock::now();
    while (!stop_.load(std::memory_order_acquire)) {
      size_t n = 0;
      {
        std::lock_guard<std::mutex> lk(deliverMu_);
        refreshRings();
        for (const auto& [peer, r] : ringOf_) n += drain(r, peer);
      }
      if (n) continue;
      const auto now = Clock::now();
      if (now - lastCheck >= opts_.checkEvery) {
        lastCheck = now;
        checkProducers();
      }
      mailbox_->wait(opts_.spin, now + opts_.checkEvery);
    }
  }

  // A producer whose process is gone is reported once (its records were
  // handed over; the scheduler's heartbeats report it too).
  void checkProducers() {
    std::vector<std::pair<NodeId, int32_t>> gone;
    {
      std::lock_guard<std::mutex> lk(deliverMu_);
      for (const auto& [peer, r] : ringOf_) {
        In& in = ins_[peer];
        const int32_t pid = mailbox_->producerPid(r);
        if (!in.reportedGone && !shm::processAlive(pid)) {
          in.reportedGone = true;
          gone.emplace_back(peer, pid);
        }
      }
    }
    for (const auto& [peer, pid] : gone) {
      const std::string why = fmt::format(
          "{}: the process of {} (pid {}) that wrote to this node's shared-memory ring is gone",
          self_.toString(), peer.toString(), pid);
      CORTADO_LOG_WARN("{}", why);
      if (onError_) onError_(peer, Status(ErrorCode::kPeerDead, why));
    }
  }

  std::unique_ptr<Transport> inner_;
  RingOptions opts_;
  NodeId self_;
  std::unique_ptr<shm::Mailbox> mailbox_;
  RecvCallback onRecv_;
  ErrorCallback onError_;

  std::mutex outMu_;
  std::map<NodeId, std::unique_ptr<Out>> outs_;

  std::mutex deliverMu_;  // one delivery at a time, in order per peer
  std::map<NodeId, In> ins_;
  std::map<NodeId, uint32_t> ringOf_;
  std::set<uint32_t> known_;
  uint64_t ringDelivered_ = 0;

  std::mutex threadMu_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> closed_{false};
};

}  // namespace

std::unique_ptr<Transport> create(std::unique_ptr<Transport> inner, const RingOptions& options) {
  CORTADO_ENFORCE(inner != nullptr, ErrorCode::kInvalidArgument,
                  "shmring::create: no inner transport");
  return std::make_unique<RingTransport>(std::move(inner), options);
}

}  // namespace cortado::transport::shmring
