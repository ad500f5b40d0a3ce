// The shared-memory ring transport (factory.h says what it does).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "core/common/error.h"
#include "core/common/idle_cpus.h"
#include "core/common/logging.h"
#include "core/common/net.h"
#include "core/shm/job_threads.h"
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
    if (opts_.yieldPolls) jobThreads_ = shm::JobThreads::open(opts_.prefix);
    mailbox_->countThreads(jobThreads_.get());
  }
  ~RingTransport() override { close(); }

  std::string name() const override { return inner_->name(); }
  NodeId self() const override { return self_; }

  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override {
    onRecv_ = std::move(onRecv);
    onError_ = std::move(onError);
    inner_->setCallbacks([this](Message&& m) { onInnerMessage(std::move(m)); },
                         [this](const NodeId& peer, const Status& s) {
                           InCallback in(this);
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

  void setExpecting(std::function<bool()> expecting) override {
    auto p = expecting ? std::make_shared<const std::function<bool()>>(std::move(expecting))
                       : nullptr;
    std::lock_guard<std::mutex> lk(expectMu_);
    expecting_ = std::move(p);
  }

  bool receiveWhileWaiting(const std::function<bool()>& done, Clock::time_point until) override {
    if (!opts_.waiterReceives || tlsConsumer_ == this || tlsInCallback_ == this) return false;
    std::unique_lock<std::mutex> lk(roleMu_);
    if (stop_.load(std::memory_order_acquire)) return false;
    ++inside_;
    // A follower: another caller consumes; wait for the role or for done().
    bool took = false;
    while (!stop_.load(std::memory_order_acquire) && !done() && Clock::now() < until) {
      if (consumer_ != Consumer::kCaller) {
        took = true;
        break;
      }
      followers_.fetch_add(1, std::memory_order_seq_cst);
      asleep();
      roleCv_.wait_until(lk, until);
      awake();
      followers_.fetch_sub(1, std::memory_order_seq_cst);
    }
    if (took) {
      consumer_ = Consumer::kCaller;
      callerConsumes_.store(true, std::memory_order_seq_cst);
      const uint64_t turn = mailbox_->takeTurn();
      lk.unlock();
      tlsConsumer_ = this;
      consume(done, until, turn);
      tlsConsumer_ = nullptr;
      lk.lock();
      callerConsumes_.store(false, std::memory_order_seq_cst);
      ++callerTurns_;
      consumer_ = Consumer::kVacant;
    }
    // A vacant role goes to a follower, or back to the ring thread when
    // none waits (or the transport closes).
    if (consumer_ == Consumer::kVacant) {
      if (followers_.load(std::memory_order_relaxed) > 0 && !stop_.load(std::memory_order_acquire))
        roleCv_.notify_all();
      else
        giveBackLocked();
    }
    if (--inside_ == 0 && stop_.load(std::memory_order_acquire)) roleCv_.notify_all();
    return true;
  }

  void wakeWaiting() override {
    // The consumer delivering an answer looks at its done() by itself.
    if (callerConsumes_.load(std::memory_order_seq_cst) && tlsConsumer_ != this) mailbox_->wake();
    if (followers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(roleMu_);
      roleCv_.notify_all();
    }
  }

  void close() override {
    if (closed_.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lk(roleMu_);
      stop_.store(true, std::memory_order_release);
      roleCv_.notify_all();
    }
    mailbox_->shut();  // wakes the consumer and the parked ring thread
    if (thread_.joinable()) thread_.join();
    {
      // This node leaves its peers' rings in order: its exit is not a
      // dead peer to them (a normal end of the job, workers before servers).
      std::lock_guard<std::mutex> lk(outMu_);
      for (auto& [peer, out] : outs_) {
        std::lock_guard<std::mutex> olk(out->mu);
        if (out->sender) out->sender->leave();
      }
    }
    {
      // A caller in receiveWhileWaiting() sees stop_ at its next look
      // (shut() woke it); none runs a callback after this returns.
      std::unique_lock<std::mutex> lk(roleMu_);
      while (!roleCv_.wait_for(lk, std::chrono::seconds(10), [&] { return inside_ == 0; }))
        CORTADO_LOG_WARN("{}: close() waits for {} thread(s) still taking shared-memory ring "
                         "messages (a receive callback that does not return?)",
                         self_.toString(), inside_);
    }
    inner_->close();
    CORTADO_LOG_DEBUG("{}: shared-memory ring messages: {} in, {} futex sleeps on the doorbell, "
                      "{} turns of waiting threads as the consumer, {} polls while expecting "
                      "messages ({} found one, {} stopped by the gate, {} yielded the CPU to the "
                      "job's threads); the gate's reads: ring thread {} spare, {} the job's only, "
                      "{} closed; waiting threads {}, {}, {}",
                      self_.toString(), ringDelivered_, mailbox_->sleeps(), callerTurns_,
                      mailbox_->polls(), mailbox_->pollHits(), mailbox_->pollsStopped(),
                      mailbox_->yieldingPolls(),
                      idleCpus_.said(IdleCpus::Verdict::kSpare),
                      idleCpus_.said(IdleCpus::Verdict::kJobOnly),
                      idleCpus_.said(IdleCpus::Verdict::kClosed),
                      waiterIdle_.said(IdleCpus::Verdict::kSpare),
                      waiterIdle_.said(IdleCpus::Verdict::kJobOnly),
                      waiterIdle_.said(IdleCpus::Verdict::kClosed));
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
    switch (o.sender->trySend(msg.parts, o.innerSent, jobThreads_.get())) {
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

  // Hands over every record that the inner messages so far allow, on the
  // calling thread (the consumer). Returns how many.
  size_t deliverAll() {
    InCallback in(this);
    std::lock_guard<std::mutex> lk(deliverMu_);
    refreshRings();
    size_t n = 0;
    for (const auto& [peer, r] : ringOf_) n += drain(r, peer);
    return n;
  }

  // A caller's turn as the consumer: the ring thread's loop, until done().
  void consume(const std::function<bool()>& done, Clock::time_point until, uint64_t turn) {
    auto over = [&] { return stop_.load(std::memory_order_acquire) || done(); };
    awake();
    while (!over()) {
      if (deliverAll() > 0) continue;
      const auto now = Clock::now();
      if (now >= until) return;
      // The answer is expected: poll for it while a CPU is spare (the
      // waiting thread is the only consumer, so waiterIdle_ and the
      // back-off are its own). Polls that keep finding nothing (the CPUs
      // wanted by the other roles of a round, more workers than CPUs) back
      // off: after the k-th miss in a row the next 2^k - 1 waits (at most
      // 63) sleep at once; a poll that finds its message starts over.
      if (opts_.waiterPoll.count() > 0 && waiterBackoff_.shouldPoll()) {
        const uint64_t began = mailbox_->polls(), yielding = mailbox_->yieldingPolls();
        if (mailbox_->poll(
                std::min(opts_.waiterPoll,
                         std::chrono::duration_cast<std::chrono::microseconds>(until - now)),
                turn, [&] { return over() ? Poll::kStop : gate(waiterIdle_); })) {
          waiterBackoff_.hit();
          continue;
        }
        // A poll that yielded the CPU to the job's threads took none that
        // they wanted: its miss does not count.
        if (mailbox_->polls() != began && mailbox_->yieldingPolls() == yielding)
          waiterBackoff_.missed();
      }
      mailbox_->wait(opts_.spin, until, turn, over);  // counts this thread asleep and awake
    }
  }

  // Under roleMu_: the role goes back to the ring thread, which the mailbox
  // leaves asleep on the doorbell.
  void giveBackLocked() {
    consumer_ = Consumer::kRing;
    mailbox_->giveBack(ringSlot_.load(std::memory_order_relaxed));
  }

  void onInnerMessage(Message&& m) {
    InCallback in(this);
    std::lock_guard<std::mutex> lk(deliverMu_);
    refreshRings();  // a ring its sender claimed since the ring thread looked
    // Records written before this message was sent go first.
    drainPeer(m.from);
    const NodeId from = m.from;
    ++ins_[from].innerReceived;
    if (onRecv_) onRecv_(std::move(m));
    drainPeer(from);  // and those it held back
  }

  using Poll = shm::Mailbox::PollMode;
  // Whether and how a poll goes on now (IdleCpus's gate, or the test's
  // spareCpu). With the job's threads counted, the polling thread counts
  // itself awake first.
  Poll gate(IdleCpus& probe) {
    if (opts_.spareCpu) return opts_.spareCpu() ? Poll::kSpin : Poll::kStop;
    if (!jobThreads_) return probe.spare() ? Poll::kSpin : Poll::kStop;
    jobThreads_->awake();
    switch (probe.look([this] { return jobThreads_->count(); })) {
      case IdleCpus::Verdict::kSpare:
        return Poll::kSpin;
      case IdleCpus::Verdict::kJobOnly:
        return Poll::kYield;
      case IdleCpus::Verdict::kClosed:
        break;
    }
    return Poll::kStop;
  }
  // The calling thread, one that takes ring messages, is awake (it woke or
  // goes on) or about to sleep, for the job's count (yieldPolls).
  void awake() {
    if (jobThreads_) jobThreads_->awake();
  }
  void asleep() {
    if (jobThreads_) jobThreads_->asleep();
  }

  // After the ring thread handed messages over: polls for the next one
  // while the receiver expects it and a CPU is spare (RingOptions::
  // pollWhileExpecting). True when one came.
  bool pollWhileExpecting(uint64_t turn) {
    if (opts_.pollWhileExpecting.count() <= 0) return false;
    std::shared_ptr<const std::function<bool()>> expecting;
    {
      std::lock_guard<std::mutex> lk(expectMu_);
      expecting = expecting_;
    }
    if (!expecting) return false;
    // With the job's threads counted, after every batch: in a loop of small
    // push_pulls the next round's pushes come right after the answers.
    auto worthIt = [&] {
      return opts_.yieldPolls || (*expecting)() ? gate(idleCpus_) : Poll::kStop;
    };
    return mailbox_->poll(opts_.pollWhileExpecting, turn, worthIt);
  }

  void ringLoop() {
    auto lastCheck = Clock::now();
    bool delivered = false;  // the last look handed messages over
    if (jobThreads_) ringSlot_.store(jobThreads_->slotIndex(), std::memory_order_relaxed);
    awake();
    while (!stop_.load(std::memory_order_acquire)) {
      // The ticket before the look: a giveBack() after it ends the park.
      const uint32_t ticket = mailbox_->parkTicket();
      std::optional<uint64_t> turn;
      {
        std::lock_guard<std::mutex> lk(roleMu_);
        if (consumer_ == Consumer::kRing) turn = mailbox_->turn();
      }
      if (turn && deliverAll() > 0) {
        delivered = true;
        continue;
      }
      // Once per batch handed over: a poll that found nothing is not
      // repeated until the next message wakes the thread.
      if (turn && std::exchange(delivered, false) && pollWhileExpecting(*turn)) continue;
      const auto now = Clock::now();
      // Dead producers are looked for whoever consumes.
      if (now - lastCheck >= opts_.checkEvery) {
        lastCheck = now;
        checkProducers();
      }
      if (turn) {
        mailbox_->wait(opts_.spin, now + opts_.checkEvery, *turn);  // counts it asleep, awake
      } else {
        asleep();
        mailbox_->park(ticket, now + opts_.checkEvery);
        awake();
      }
    }
  }

  // A producer whose process is gone is reported once (its records were
  // handed over; the scheduler's heartbeats report it too), unless it left
  // in order first (MailboxSender::leave, at its transport's close()).
  void checkProducers() {
    InCallback in(this);
    std::vector<std::pair<NodeId, int32_t>> gone;
    {
      std::lock_guard<std::mutex> lk(deliverMu_);
      for (const auto& [peer, r] : ringOf_) {
        In& in = ins_[peer];
        const int32_t pid = mailbox_->producerPid(r);
        // A producer that left in order (closed its transport) may exit.
        if (!in.reportedGone && !mailbox_->producerLeft(r) && !shm::processAlive(pid)) {
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
  // yieldPolls. Kept until the transport goes (a send racing with close()
  // may still stamp a peer's thread through it); declared before the
  // mailbox, which points at it, so that it outlives it.
  std::unique_ptr<shm::JobThreads> jobThreads_;
  std::unique_ptr<shm::Mailbox> mailbox_;
  std::atomic<int32_t> ringSlot_{-1};            // the ring thread's slot in it
  RecvCallback onRecv_;
  ErrorCallback onError_;

  std::mutex outMu_;
  std::map<NodeId, std::unique_ptr<Out>> outs_;

  std::mutex deliverMu_;  // one delivery at a time, in order per peer
  std::map<NodeId, In> ins_;
  std::map<NodeId, uint32_t> ringOf_;
  std::set<uint32_t> known_;
  uint64_t ringDelivered_ = 0;

  // The mailbox's consumer: the ring thread, a caller in
  // receiveWhileWaiting(), or vacant while a follower takes it up.
  enum class Consumer { kRing, kCaller, kVacant };
  std::mutex roleMu_;
  std::condition_variable roleCv_;  // followers, and close() waiting for inside_
  Consumer consumer_ = Consumer::kRing;
  int inside_ = 0;                 // callers in receiveWhileWaiting()
  uint64_t callerTurns_ = 0;       // for the log
  // Read without roleMu_ by wakeWaiting().
  std::atomic<bool> callerConsumes_{false};
  std::atomic<int> followers_{0};  // callers waiting for the role
  // The transport whose caller-consumer this thread is now (it wakes no one
  // for its own done()), and whose callback it runs now (it may not call
  // receiveWhileWaiting()).
  static thread_local const RingTransport* tlsConsumer_;
  static thread_local const RingTransport* tlsInCallback_;
  struct InCallback {
    const RingTransport* outer;
    explicit InCallback(const RingTransport* t) : outer(tlsInCallback_) { tlsInCallback_ = t; }
    ~InCallback() { tlsInCallback_ = outer; }
  };

  // Transport::setExpecting's predicate (shared: the ring thread calls a
  // copy without the mutex held).
  std::mutex expectMu_;
  std::shared_ptr<const std::function<bool()>> expecting_;
  IdleCpus idleCpus_;   // the ring thread's
  IdleCpus waiterIdle_; // the waiting thread's whose turn it is
  PollBackoff waiterBackoff_;  // its polls' back-off

  std::mutex threadMu_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> closed_{false};
};

thread_local const RingTransport* RingTransport::tlsConsumer_ = nullptr;
thread_local const RingTransport* RingTransport::tlsInCallback_ = nullptr;

}  // namespace

std::unique_ptr<Transport> create(std::unique_ptr<Transport> inner, const RingOptions& options) {
  CORTADO_ENFORCE(inner != nullptr, ErrorCode::kInvalidArgument,
                  "shmring::create: no inner transport");
  return std::make_unique<RingTransport>(std::move(inner), options);
}

}  // namespace cortado::transport::shmring
