// The ZeroMQ transport (see factory.h for the design). Wire format of one
// Message, as the receiving ROUTER sees it:
//   [routing id = sender's NodeId::toWire()] [header "CT" 1 0] [part 0] ... [part n-1]
// The header frame lets a zero-part Message exist and marks Cortado traffic;
// anything else is logged and dropped.
//
// Threads: every socket belongs to the loop thread, which holds loopMu_ while
// it works and lets it go while it polls. Methods called from other threads
// append an Op to a queue and write to an eventfd that the loop polls next to
// its sockets; listen() waits for its Op's result with a deadline. A send
// from another thread that finds loopMu_ free (the loop asleep) and nothing
// queued before it writes to the peer's DEALER itself (sendDirect).
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/common/deadline.h"
#include "core/common/logging.h"
#include "core/transport/held_sends.h"
#include "core/transport/op_queue.h"
#include "core/transport/zmq/factory.h"

namespace cortado::transport::zmq {
namespace {

constexpr uint8_t kHeader[4] = {'C', 'T', 1, 0};
// Messages received per wake-up before the loop looks at its queue again.
constexpr int kRecvBatch = 256;
// How long listen() waits for the loop thread.
constexpr Millis kLoopCallTimeout{10000};

// A routing id for a log line: printable as is, hex otherwise.
std::string printable(std::string_view s) {
  bool ok = !s.empty();
  for (unsigned char c : s) ok = ok && c >= 0x20 && c < 0x7f;
  if (ok) return std::string(s);
  std::string hex = "0x";
  for (unsigned char c : s) hex += fmt::format("{:02x}", c);
  return hex;
}

// ZeroMQ's ipc:// bind removes a socket file that is in the way, even one that
// a live process still accepts on; this tells the two apart.
bool unixSocketInUse(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_un sa{};
  if (path.size() >= sizeof(sa.sun_path)) return false;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.data(), path.size());
  bool inUse = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  ::close(fd);
  return inUse;
}

void releaseBuffer(void* /*data*/, void* hint) { delete static_cast<Buffer*>(hint); }

// A received frame as a Buffer that owns it: no copy.
Buffer wrapFrame(zmq_msg_t* m) {
  size_t size = zmq_msg_size(m);
  if (size == 0) {
    zmq_msg_close(m);
    delete m;
    return Buffer();
  }
  std::shared_ptr<void> owner(m, [](void* p) {
    auto* msg = static_cast<zmq_msg_t*>(p);
    zmq_msg_close(msg);
    delete msg;
  });
  return Buffer::wrap(zmq_msg_data(m), size, std::move(owner));
}

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(NodeId self, ZmqOptions options)
      : self_(self), options_(options), queue_("zmq " + self_.toString()) {
    CORTADO_ENFORCE(options_.ioThreads >= 1, ErrorCode::kInvalidArgument,
                    "zmq {}: ioThreads must be at least 1, got {}", self_, options_.ioThreads);
    ctx_ = zmq_ctx_new();
    CORTADO_ENFORCE(ctx_ != nullptr, ErrorCode::kUnavailable, "zmq {}: zmq_ctx_new failed: {}",
                    self_, zmq_strerror(errno));
    try {
      zmq_ctx_set(ctx_, ZMQ_IO_THREADS, options_.ioThreads);
      zmq_ctx_set(ctx_, ZMQ_MAX_SOCKETS, 8192);
      efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      CORTADO_ENFORCE(efd_ >= 0, ErrorCode::kUnavailable, "zmq {}: eventfd failed: {}", self_,
                      std::strerror(errno));
      queue_.setWakeFd(efd_);
      router_ = zmq_socket(ctx_, ZMQ_ROUTER);
      CORTADO_ENFORCE(router_ != nullptr, ErrorCode::kUnavailable,
                      "zmq {}: cannot create the ROUTER socket: {}", self_, zmq_strerror(errno));
      setOpt(router_, ZMQ_LINGER, 0, "ZMQ_LINGER");
      setOpt(router_, ZMQ_RCVHWM, options_.recvHighWaterMark, "ZMQ_RCVHWM");
      setOpt(router_, ZMQ_ROUTER_HANDOVER, 1, "ZMQ_ROUTER_HANDOVER");
      setCommonOpts(router_);
      routerFd_ = socketFd(router_, "ROUTER");
    } catch (...) {
      if (router_) zmq_close(router_);
      if (efd_ >= 0) ::close(efd_);
      zmq_ctx_term(ctx_);
      throw;
    }
    // The sockets made above pass to the loop thread; starting it is the
    // memory barrier that ZeroMQ asks for when a socket changes threads.
    thread_ = std::thread([this] { loop(); });
    loopId_ = thread_.get_id();
  }

  ~ZmqTransport() override {
    close();
    // Destroyed from its own callback: the loop cannot be joined from itself.
    if (thread_.joinable()) thread_.detach();
  }

  std::string name() const override { return "zmq"; }
  NodeId self() const override { return self_; }

  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override {
    queue_.postTask([this, onRecv = std::move(onRecv), onError = std::move(onError)]() mutable {
      onRecv_ = std::move(onRecv);
      onError_ = std::move(onError);
    });
  }

  std::string listen(const std::string& address) override {
    checkAddress(address, "listen");
    return callOnLoop([this, address] { return bind(address); }, "listen(" + address + ")");
  }

  void connect(const NodeId& peer, const std::string& address) override {
    CORTADO_ENFORCE(!address.starts_with("ucx://"), ErrorCode::kInvalidArgument,
                    "zmq {}: {} is at {}, a UCX address: every node of a job must use the same "
                    "transport (CORTADO_TRANSPORT / --transport)",
                    self_, peer, address);
    checkAddress(address, "connect");
    CORTADO_ENFORCE(queue_.postTask([this, peer, address] { connectPeer(peer, address); }),
                    ErrorCode::kClosed, "zmq {}: connect({}, {}) after close()", self_, peer,
                    address);
  }

  // A receive callback's answer (the server's sums of small keys) goes out
  // from the loop thread at once, without the round trip through the queue
  // and the eventfd.
  // Another thread's send goes to ZeroMQ from that thread while the loop
  // sleeps (sendDirect), without waking the loop.
  void send(const NodeId& peer, Message msg) override {
    const bool onLoop = onLoopThread();
    if (!onLoop && sendDirect(peer, &msg, 1)) return;
    queue_.send(onLoop, peer, std::move(msg),
                [this](const NodeId& p, Message& m) { return sendFromLoop(p, m); });
  }

  void sendAll(const NodeId& peer, std::vector<Message> msgs) override {
    const bool onLoop = onLoopThread();
    if (!onLoop && sendDirect(peer, msgs.data(), msgs.size())) return;
    queue_.sendAll(onLoop, peer, std::move(msgs),
                   [this](const NodeId& p, Message& m) { return sendFromLoop(p, m); });
  }

  void disconnect(const NodeId& peer) override {
    queue_.postTask([this, peer] {
      held_.forget(peer);
      auto it = peers_.find(peer);
      if (it == peers_.end()) return;
      closePeer(it->second);
      peers_.erase(it);
      CORTADO_LOG_DEBUG("zmq {}: disconnected from {}", self_, peer);
    });
  }

  void close() override {
    // Set before the wake-up, so that the loop sees it once woken.
    stop_ = true;
    queue_.close();
    std::lock_guard g(closeMu_);
    // close() from a callback: the loop stops once the callback returns, and
    // a later close() or the destructor joins it.
    if (!thread_.joinable() || loopId_ == std::this_thread::get_id()) return;
    thread_.join();
  }

 private:
  using Op = OpQueue::Op;

  struct Peer {
    std::string address;
    void* dealer = nullptr;
    void* monitor = nullptr;  // PAIR socket receiving the DEALER's events
    int monitorFd = -1;       // its ZMQ_FD
    bool up = false;          // ZMTP handshake done
    bool reported = false;    // a failure was reported since it was last up
    Clock::time_point deadline;
    std::deque<Message> backlog;  // ZeroMQ would not take them yet (high-water mark)
  };

  enum class SendResult { kSent, kWouldBlock, kFailed };

  // ---- any thread ----

  void checkAddress(const std::string& address, const char* what) const {
    CORTADO_ENFORCE(address.starts_with("tcp://") || address.starts_with("ipc://"),
                    ErrorCode::kInvalidArgument,
                    "zmq {}: bad address '{}' for {}: expected tcp://host:port or ipc:///path",
                    self_, address, what);
  }

  bool onLoopThread() const { return std::this_thread::get_id() == loopId_; }

  // On the loop thread: writes `msg` now when nothing that other threads sent
  // earlier is still queued or in the batch being run (order per sender is
  // the contract), and returns true; false leaves `msg` untouched for the
  // queue.
  bool sendFromLoop(const NodeId& peer, Message& msg) {
    if (!queue_.mayWriteNow(peer) || inBatch_) return false;
    sendTo(peer, std::move(msg));
    return true;
  }

  // Off the loop thread: hands `msgs` to ZeroMQ on the calling thread, in
  // order, when the loop is asleep (loopMu_ free, which is also the memory
  // barrier ZeroMQ asks for when a socket changes threads), nothing sent
  // earlier waits in the queue or the peer's backlog, and the peer is
  // connected; returns true. The peer's DEALER is then in no poll of the
  // loop (only a backlog puts it there). False leaves every message for the
  // queue.
  bool sendDirect(const NodeId& peer, Message* msgs, size_t n) {
    std::unique_lock<std::mutex> lk(loopMu_, std::try_to_lock);
    if (!lk.owns_lock() || stop_ || inBatch_ || !queue_.idle()) return false;
    auto it = peers_.find(peer);
    if (it == peers_.end() || !it->second.backlog.empty()) return false;
    for (size_t i = 0; i < n; ++i) sendTo(peer, std::move(msgs[i]));
    // ZeroMQ would not take all of it: the loop waits for the DEALER.
    if (!it->second.backlog.empty()) queue_.wakeLoop();
    return true;
  }

  // Runs `fn` on the loop and waits for it (core/transport/loop_call.h).
  std::string callOnLoop(std::function<std::string()> fn, const std::string& what) {
    if (onLoopThread()) return fn();
    return queue_.call(std::move(fn), what, kLoopCallTimeout);
  }

  void setOpt(void* socket, int option, int value, const char* name) const {
    if (zmq_setsockopt(socket, option, &value, sizeof(value)) != 0) {
      throw Error(ErrorCode::kInternal, fmt::format("zmq {}: zmq_setsockopt({}, {}) failed: {}",
                                                    self_, name, value, zmq_strerror(errno)));
    }
  }

  // A socket's ZMQ_FD, which the loop polls (see loop()).
  int socketFd(void* socket, const char* what) const {
    int fd = -1;
    size_t len = sizeof(fd);
    if (zmq_getsockopt(socket, ZMQ_FD, &fd, &len) != 0) {
      throw Error(ErrorCode::kInternal, fmt::format("zmq {}: no ZMQ_FD for the {} socket: {}",
                                                    self_, what, zmq_strerror(errno)));
    }
    return fd;
  }

  void setCommonOpts(void* socket) const {
    if (options_.socketBufferBytes > 0) {
      setOpt(socket, ZMQ_SNDBUF, options_.socketBufferBytes, "ZMQ_SNDBUF");
      setOpt(socket, ZMQ_RCVBUF, options_.socketBufferBytes, "ZMQ_RCVBUF");
    }
    if (options_.heartbeatInterval.count() > 0) {
      setOpt(socket, ZMQ_HEARTBEAT_IVL, static_cast<int>(options_.heartbeatInterval.count()),
             "ZMQ_HEARTBEAT_IVL");
      setOpt(socket, ZMQ_HEARTBEAT_TIMEOUT, static_cast<int>(options_.heartbeatTimeout.count()),
             "ZMQ_HEARTBEAT_TIMEOUT");
      // The peer drops the connection too when our pings stop (100 ms units).
      int ttl = static_cast<int>(std::min<int64_t>(options_.heartbeatTimeout.count(), 6553500));
      setOpt(socket, ZMQ_HEARTBEAT_TTL, ttl - ttl % 100, "ZMQ_HEARTBEAT_TTL");
    }
  }

  // ---- loop thread ----

  void loop() {
    std::vector<zmq_pollitem_t> items;
    std::vector<std::pair<NodeId, short>> owners;  // for items[2...]: peer and event
    std::deque<Op> batch;
    // Held while the loop works; let go while it polls (sendDirect).
    std::unique_lock<std::mutex> lk(loopMu_);
    while (!stop_) {
      items.clear();
      owners.clear();
      // The ROUTER and the monitors by their ZMQ_FD, as plain fds: each
      // ZeroMQ socket that zmq_poll() is given is asked for its events
      // before and after the poll (for each, a getpid() system call inside
      // ZeroMQ), on every turn. The fd is readable when the socket has
      // news, and reading the socket until EAGAIN settles it (receive(),
      // readMonitor()), so nothing is missed.
      items.push_back({nullptr, efd_, ZMQ_POLLIN, 0});
      items.push_back({nullptr, routerFd_, ZMQ_POLLIN, 0});
      for (auto& [id, p] : peers_) {
        items.push_back({nullptr, p.monitorFd, ZMQ_POLLIN, 0});
        owners.emplace_back(id, ZMQ_POLLIN);
        if (!p.backlog.empty()) {
          items.push_back({p.dealer, 0, ZMQ_POLLOUT, 0});
          owners.emplace_back(id, ZMQ_POLLOUT);
        }
      }
      // Busy polling: right after work, look again without sleeping.
      const bool polling = options_.busyPoll.count() > 0 && Clock::now() < pollUntil_;
      const long timeoutMs = polling || routerMore_ ? 0 : pollTimeoutMs();
      lk.unlock();
      const int ready = zmq_poll(items.data(), static_cast<int>(items.size()), timeoutMs);
      // Polling and nothing came: let a thread that shares this core run.
      if (polling && ready == 0) std::this_thread::yield();
      lk.lock();
      if (ready < 0) {
        if (errno == EINTR) continue;
        CORTADO_LOG_ERROR("zmq {}: zmq_poll failed, the transport stops: {}", self_,
                          zmq_strerror(errno));
        break;
      }
      // Callbacks only post Ops, so peers_ does not change until the Ops run.
      if (routerMore_ || (items[1].revents & ZMQ_POLLIN)) receive();
      for (size_t i = 0; i < owners.size() && !stop_; ++i) {
        if (!(items[i + 2].revents & owners[i].second)) continue;
        auto it = peers_.find(owners[i].first);
        if (it == peers_.end()) continue;
        if (owners[i].second == ZMQ_POLLIN) {
          readMonitor(it->first, it->second);
        } else {
          flushBacklog(it->first, it->second);
        }
      }
      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t count;
        ssize_t n = ::read(efd_, &count, sizeof(count));
        (void)n;
      }
      queue_.takeAll(batch);
      // A callback that a task runs (an error report) must not send ahead
      // of the batch's sends: sendFromLoop() queues while this is set.
      inBatch_ = !batch.empty();
      if (options_.busyPoll.count() > 0 && (ready > 0 || !batch.empty()))
        pollUntil_ = Clock::now() + options_.busyPoll;
      for (auto& op : batch) {
        if (stop_) break;
        if (op.task) {
          op.task();
        } else {
          sendTo(op.peer, std::move(op.msg));
        }
      }
      batch.clear();
      inBatch_ = false;
      expireTimers();
    }
    shutdown();
  }

  void shutdown() {
    for (auto& [id, p] : peers_) closePeer(p);
    peers_.clear();
    held_.clear();
    zmq_close(router_);
    queue_.closeAndClear();  // breaks the promise of a pending listen()
    // Every socket has ZMQ_LINGER 0, so this returns at once and drops (and
    // releases) what was not sent.
    zmq_ctx_term(ctx_);
    ::close(efd_);
    CORTADO_LOG_DEBUG("zmq {}: closed", self_);
  }

  long pollTimeoutMs() const {
    auto next = Clock::time_point::max();
    for (const auto& [id, p] : peers_) {
      if (!p.up && !p.reported) next = std::min(next, p.deadline);
    }
    next = std::min(next, held_.nextDeadline());
    if (next == Clock::time_point::max()) return -1;
    auto now = Clock::now();
    if (next <= now) return 0;
    return std::chrono::duration_cast<Millis>(next - now).count() + 1;
  }

  std::string bind(const std::string& address) {
    if (address.starts_with("ipc://")) {
      std::string path = address.substr(6);
      if (path != "*" && unixSocketInUse(path)) {
        throw Error(ErrorCode::kUnavailable,
                    fmt::format("zmq {}: cannot listen on {}: another process accepts connections "
                                "on {}; choose another path",
                                self_, address, path));
      }
    }
    if (zmq_bind(router_, address.c_str()) != 0) {
      int err = errno;
      std::string hint;
      if (err == EADDRINUSE) {
        hint = "the address is in use (by another process or another node of this job); pick a "
               "free port, or port 0 to let the system choose one";
      } else if (err == EADDRNOTAVAIL || err == ENODEV) {
        hint = "this host has no such interface or address";
      } else {
        hint = zmq_strerror(err);
      }
      throw Error(err == EINVAL || err == EPROTONOSUPPORT ? ErrorCode::kInvalidArgument
                                                          : ErrorCode::kUnavailable,
                  fmt::format("zmq {}: cannot listen on {}: {}", self_, address, hint));
    }
    char endpoint[1024];
    size_t len = sizeof(endpoint);
    if (zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0) {
      throw Error(ErrorCode::kInternal, fmt::format("zmq {}: no ZMQ_LAST_ENDPOINT after binding {}: {}",
                                                    self_, address, zmq_strerror(errno)));
    }
    std::string bound(endpoint);
    CORTADO_LOG_DEBUG("zmq {}: listening on {}", self_, bound);
    return bound;
  }

  void connectPeer(const NodeId& peer, const std::string& address) {
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
      if (it->second.address == address) return;
      CORTADO_LOG_INFO("zmq {}: {} moves from {} to {}", self_, peer, it->second.address, address);
      closePeer(it->second);
      peers_.erase(it);
    }
    Peer p;
    p.address = address;
    p.deadline = Clock::now() + options_.connectTimeout;
    try {
      p.dealer = zmq_socket(ctx_, ZMQ_DEALER);
      CORTADO_ENFORCE(p.dealer != nullptr, ErrorCode::kUnavailable,
                      "cannot create a DEALER socket: {}", zmq_strerror(errno));
      std::string id = self_.toWire();
      CORTADO_ENFORCE(zmq_setsockopt(p.dealer, ZMQ_ROUTING_ID, id.data(), id.size()) == 0,
                      ErrorCode::kInternal, "cannot set the routing id '{}': {}", id,
                      zmq_strerror(errno));
      setOpt(p.dealer, ZMQ_LINGER, 0, "ZMQ_LINGER");
      setOpt(p.dealer, ZMQ_SNDHWM, options_.sendHighWaterMark, "ZMQ_SNDHWM");
      setOpt(p.dealer, ZMQ_RECONNECT_IVL, 100, "ZMQ_RECONNECT_IVL");
      setOpt(p.dealer, ZMQ_RECONNECT_IVL_MAX, 2000, "ZMQ_RECONNECT_IVL_MAX");
      setCommonOpts(p.dealer);
      std::string monitorAt = fmt::format("inproc://monitor-{}", nextMonitor_++);
      int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
      CORTADO_ENFORCE(zmq_socket_monitor(p.dealer, monitorAt.c_str(), events) == 0,
                      ErrorCode::kInternal, "cannot monitor the DEALER: {}", zmq_strerror(errno));
      p.monitor = zmq_socket(ctx_, ZMQ_PAIR);
      CORTADO_ENFORCE(p.monitor != nullptr, ErrorCode::kUnavailable,
                      "cannot create a PAIR socket: {}", zmq_strerror(errno));
      setOpt(p.monitor, ZMQ_LINGER, 0, "ZMQ_LINGER");
      CORTADO_ENFORCE(zmq_connect(p.monitor, monitorAt.c_str()) == 0, ErrorCode::kInternal,
                      "cannot connect the monitor: {}", zmq_strerror(errno));
      p.monitorFd = socketFd(p.monitor, "monitor");
      CORTADO_ENFORCE(zmq_connect(p.dealer, address.c_str()) == 0, ErrorCode::kInvalidArgument,
                      "{}", zmq_strerror(errno));
    } catch (const Error& e) {
      closePeer(p);
      held_.forget(peer);
      report(peer, e.code(),
             fmt::format("zmq {}: cannot connect to {} at {}: {}", self_, peer, address, e.what()));
      return;
    }
    CORTADO_LOG_DEBUG("zmq {}: connecting to {} at {}", self_, peer, address);
    auto added = peers_.emplace(peer, std::move(p)).first;
    // A first read: ZeroMQ signals a socket's fd for a message only once
    // its reader has found the pipe empty, and nothing signals the fd of a
    // freshly connected PAIR socket before that.
    readMonitor(added->first, added->second);
    for (auto& m : held_.release(peer)) sendTo(peer, std::move(m));
  }

  void closePeer(Peer& p) {
    if (p.dealer) {
      zmq_socket_monitor(p.dealer, nullptr, 0);
      zmq_close(p.dealer);
      p.dealer = nullptr;
    }
    if (p.monitor) {
      zmq_close(p.monitor);
      p.monitor = nullptr;
    }
    p.backlog.clear();
  }

  void sendTo(const NodeId& peer, Message msg) {
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      if (!held_.hold(peer, std::move(msg), options_.connectTimeout))
        CORTADO_LOG_DEBUG("zmq {}: dropping a message to {}: connect() never named it", self_,
                          peer);
      return;
    }
    Peer& p = it->second;
    if (!p.backlog.empty()) {
      p.backlog.push_back(std::move(msg));
      return;
    }
    if (write(peer, p, msg) == SendResult::kWouldBlock) p.backlog.push_back(std::move(msg));
  }

  void flushBacklog(const NodeId& peer, Peer& p) {
    while (!p.backlog.empty()) {
      if (write(peer, p, p.backlog.front()) == SendResult::kWouldBlock) return;
      p.backlog.pop_front();
    }
  }

  // Hands `msg` to ZeroMQ; its parts are moved out unless it would block.
  SendResult write(const NodeId& peer, Peer& p, Message& msg) {
    zmq_msg_t frame;
    zmq_msg_init_size(&frame, sizeof(kHeader));
    std::memcpy(zmq_msg_data(&frame), kHeader, sizeof(kHeader));
    const size_t n = msg.parts.size();
    if (zmq_msg_send(&frame, p.dealer, ZMQ_DONTWAIT | (n ? ZMQ_SNDMORE : 0)) < 0) {
      int err = errno;
      zmq_msg_close(&frame);
      if (err == EAGAIN) return SendResult::kWouldBlock;
      CORTADO_LOG_ERROR("zmq {}: cannot send to {} at {}: {}", self_, peer, p.address,
                        zmq_strerror(err));
      return SendResult::kFailed;
    }
    // Once the first frame is in, ZeroMQ takes the rest of the message.
    for (size_t i = 0; i < n; ++i) {
      Buffer& b = msg.parts[i];
      if (b.empty()) {
        zmq_msg_init(&frame);
      } else if (b.size() >= options_.zeroCopyBytes) {
        auto* keep = new Buffer(std::move(b));
        zmq_msg_init_data(&frame, keep->data(), keep->size(), releaseBuffer, keep);
      } else {
        zmq_msg_init_size(&frame, b.size());
        std::memcpy(zmq_msg_data(&frame), b.data(), b.size());
        b = Buffer();
      }
      if (zmq_msg_send(&frame, p.dealer, ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0) {
        int err = errno;
        zmq_msg_close(&frame);
        CORTADO_LOG_ERROR("zmq {}: a message to {} at {} was cut short after {} of {} parts: {}",
                          self_, peer, p.address, i, n, zmq_strerror(err));
        return SendResult::kFailed;
      }
    }
    return SendResult::kSent;
  }

  // Receives until EAGAIN, or kRecvBatch messages; then routerMore_ says
  // that the loop must look again before it sleeps (the ROUTER's fd does
  // not signal what is already there).
  void receive() {
    routerMore_ = true;
    for (int count = 0; count < kRecvBatch && !stop_; ++count) {
      zmq_msg_t idFrame;
      zmq_msg_init(&idFrame);
      if (zmq_msg_recv(&idFrame, router_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&idFrame);
        routerMore_ = false;
        return;
      }
      std::string wireId(static_cast<const char*>(zmq_msg_data(&idFrame)), zmq_msg_size(&idFrame));
      bool more = zmq_msg_more(&idFrame);
      zmq_msg_close(&idFrame);

      Message msg;
      bool header = false;
      bool first = true;
      // The rest of a multi-part message is already here: these do not block.
      while (more) {
        auto* m = new zmq_msg_t;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, router_, 0) < 0) {
          CORTADO_LOG_ERROR("zmq {}: receiving from '{}' failed: {}", self_, printable(wireId),
                            zmq_strerror(errno));
          zmq_msg_close(m);
          delete m;
          break;
        }
        more = zmq_msg_more(m);
        if (first) {
          first = false;
          header = zmq_msg_size(m) == sizeof(kHeader) &&
                   std::memcmp(zmq_msg_data(m), kHeader, sizeof(kHeader)) == 0;
          zmq_msg_close(m);
          delete m;
          continue;
        }
        msg.parts.push_back(wrapFrame(m));
      }
      auto from = NodeId::fromWire(wireId);
      if (!from || !header) {
        CORTADO_LOG_WARN("zmq {}: dropped a message from '{}': {}", self_, printable(wireId),
                         !from ? "its routing id is not a Cortado node id"
                               : "it lacks the Cortado header frame (another protocol or version)");
        continue;
      }
      msg.from = *from;
      if (!onRecv_) {
        CORTADO_LOG_WARN("zmq {}: dropped a message from {}: no receive callback set", self_, *from);
        continue;
      }
      try {
        onRecv_(std::move(msg));
      } catch (const std::exception& e) {
        CORTADO_LOG_ERROR("zmq {}: the receive callback threw on a message from {}: {}", self_,
                          *from, e.what());
      }
    }
  }

  void readMonitor(const NodeId& peer, Peer& p) {
    for (;;) {
      zmq_msg_t frame;
      zmq_msg_init(&frame);
      if (zmq_msg_recv(&frame, p.monitor, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&frame);
        return;
      }
      uint16_t event = 0;
      uint32_t value = 0;
      if (zmq_msg_size(&frame) >= 6) {
        std::memcpy(&event, zmq_msg_data(&frame), 2);
        std::memcpy(&value, static_cast<uint8_t*>(zmq_msg_data(&frame)) + 2, 4);
      }
      bool more = zmq_msg_more(&frame);
      zmq_msg_close(&frame);
      while (more) {  // the endpoint; we know it already
        zmq_msg_init(&frame);
        if (zmq_msg_recv(&frame, p.monitor, 0) < 0) more = false;
        else more = zmq_msg_more(&frame);
        zmq_msg_close(&frame);
      }
      onEvent(peer, p, event, value);
      if (stop_) return;
    }
  }

  void onEvent(const NodeId& peer, Peer& p, uint16_t event, uint32_t value) {
    switch (event) {
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        if (p.reported) CORTADO_LOG_INFO("zmq {}: reconnected to {} at {}", self_, peer, p.address);
        CORTADO_LOG_DEBUG("zmq {}: connected to {} at {}", self_, peer, p.address);
        p.up = true;
        p.reported = false;
        break;
      case ZMQ_EVENT_DISCONNECTED:
        if (!p.up) break;
        p.up = false;
        p.reported = true;
        report(peer, ErrorCode::kPeerDead,
               fmt::format("zmq {}: lost the connection to {} at {} (it closed, died, or missed "
                           "heartbeats for {} ms); messages to it stay queued until it is back or "
                           "disconnect() is called",
                           self_, peer, p.address, options_.heartbeatTimeout.count()));
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        if (p.reported) break;
        p.reported = true;
        report(peer, ErrorCode::kProtocol,
               fmt::format("zmq {}: the ZMTP handshake with {} at {} failed (event {:#x}, code "
                           "{}): is a Cortado ZeroMQ transport listening there?",
                           self_, peer, p.address, event, value));
        break;
      default:
        break;
    }
  }

  void expireTimers() {
    auto now = Clock::now();
    for (auto& [id, p] : peers_) {
      if (p.up || p.reported || p.deadline > now) continue;
      p.reported = true;
      report(id, ErrorCode::kUnavailable,
             fmt::format("zmq {}: cannot reach {} at {}: no connection within {} ms (is it "
                         "running and listening there?); messages to it stay queued until it "
                         "answers or disconnect() is called",
                         self_, id, p.address, options_.connectTimeout.count()));
    }
    held_.expire(now, [&](const NodeId& id, size_t dropped) {
      report(id, ErrorCode::kUnavailable,
             fmt::format("zmq {}: cannot send to {}: connect() did not name its address within "
                         "{} ms ({} messages dropped)",
                         self_, id, options_.connectTimeout.count(), dropped));
    });
  }

  // The owner's error callback decides what a lost peer means (a server
  // closing at the end of a job is no news); the transport only logs it.
  void report(const NodeId& peer, ErrorCode code, std::string message) {
    CORTADO_LOG_DEBUG("{}", message);
    if (stop_ || !onError_) return;
    try {
      onError_(peer, Status(code, std::move(message)));
    } catch (const std::exception& e) {
      CORTADO_LOG_ERROR("zmq {}: the error callback threw: {}", self_, e.what());
    }
  }

  const NodeId self_;
  const ZmqOptions options_;
  void* ctx_ = nullptr;
  int efd_ = -1;
  void* router_ = nullptr;
  int routerFd_ = -1;  // its ZMQ_FD

  OpQueue queue_;
  // The loop's state (the sockets, peers_, inBatch_) belongs to the holder:
  // the loop thread, except while it polls, when sendDirect may take it.
  std::mutex loopMu_;
  bool inBatch_ = false;  // the loop runs a batch of the queue (loop thread only)
  // Set once by close(); the loop checks it between callbacks.
  std::atomic<bool> stop_{false};

  std::mutex closeMu_;
  std::thread thread_;
  std::thread::id loopId_;

  // Loop thread only.
  RecvCallback onRecv_;
  ErrorCallback onError_;
  std::unordered_map<NodeId, Peer> peers_;
  HeldSends held_;  // sends to peers that connect() has not named yet
  uint64_t nextMonitor_ = 0;
  bool routerMore_ = true;       // the ROUTER may hold messages (receive()); true: look at start
  Clock::time_point pollUntil_;  // busy polling goes on until then
};

}  // namespace

std::unique_ptr<Transport> create(const NodeId& self, const ZmqOptions& options) {
  return std::make_unique<ZmqTransport>(self, options);
}

}  // namespace cortado::transport::zmq
