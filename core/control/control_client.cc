// ControlClient over Boost.Asio: one io thread per client owns the socket, the
// timers and the protocol state; the public methods post work to it and wait
// on a future or a condition variable, always up to a deadline.
#include "core/control/control_client.h"

#include <unistd.h>

#include <algorithm>
#include <utility>  // before asio: Boost 1.74 needs it in C++20
#include <boost/asio.hpp>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "core/common/logging.h"
#include "core/common/net.h"
#include "core/control/auth.h"
#include "core/control/connection.h"
#include "core/control/protocol.h"
#include "core/plan/profile_report.h"

namespace cortado::control {

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;

// Timers and waits are clamped here so that "never" does not overflow.
constexpr Millis kLongest = std::chrono::duration_cast<Millis>(24h);

Millis clampDuration(Millis d) { return std::clamp(d, Millis(1), kLongest); }

Clock::time_point earlierOf(Deadline d, Millis fromNow) {
  auto bound = Clock::now() + clampDuration(fromNow);
  return std::min(d.at(), bound);
}

long long msSince(Clock::time_point t) {
  return std::chrono::duration_cast<Millis>(Clock::now() - t).count();
}

template <typename T>
bool waitUntil(std::future<T>& f, Deadline d) {
  if (d.at() == Clock::time_point::max()) {
    f.wait();
    return true;
  }
  return f.wait_until(d.at()) == std::future_status::ready;
}

void checkKvKey(const std::string& key) {
  CORTADO_ENFORCE(!key.empty() && key.size() <= kMaxKvKey, ErrorCode::kInvalidArgument,
                  "key-value rendezvous: a key must have 1 to {} bytes, got {}", kMaxKvKey,
                  key.size());
}

const char* groupName(Group g) {
  switch (g) {
    case Group::kAll: return "all";
    case Group::kWorkers: return "workers";
    case Group::kServers: return "servers";
  }
  return "unknown";
}

class ControlClientImpl final : public ControlClient {
 public:
  explicit ControlClientImpl(ClientOptions opts)
      : opts_(std::move(opts)),
        work_(asio::make_work_guard(io_)),
        resolver_(io_),
        retryTimer_(io_),
        deadlineTimer_(io_),
        heartbeatTimer_(io_),
        watchdogTimer_(io_) {
    CORTADO_ENFORCE(!opts_.token.empty(), ErrorCode::kInvalidArgument,
                    "control client: the job token is empty (set CORTADO_JOB_TOKEN)");
    CORTADO_ENFORCE(opts_.role == Role::kWorker || opts_.role == Role::kServer,
                    ErrorCode::kInvalidArgument,
                    "control client: role must be worker or server, not {}", roleName(opts_.role));
    CORTADO_ENFORCE(opts_.schedulerPort > 0 && opts_.schedulerPort < 65536,
                    ErrorCode::kInvalidArgument,
                    "control client: scheduler port {} is out of range 1..65535 "
                    "(CORTADO_SCHEDULER_PORT)",
                    opts_.schedulerPort);
    CORTADO_ENFORCE(!opts_.schedulerHost.empty(), ErrorCode::kInvalidArgument,
                    "control client: empty scheduler host (CORTADO_SCHEDULER_HOST)");
    CORTADO_ENFORCE(opts_.heartbeatInterval.count() > 0, ErrorCode::kInvalidArgument,
                    "control client: heartbeat interval must be positive, got {} ms",
                    opts_.heartbeatInterval.count());
    CORTADO_ENFORCE(opts_.requestedRank >= -1, ErrorCode::kInvalidArgument,
                    "control client: requested rank {} is negative (use -1 for any)",
                    opts_.requestedRank);
    if (opts_.hostname.empty()) opts_.hostname = net::localHostname();
    scheduler_ = fmt::format("{}:{}", opts_.schedulerHost, opts_.schedulerPort);
    logId_ = fmt::format("[control {}]", roleName(opts_.role));
    thread_ = std::thread([this] { runLoop(); });
  }

  ~ControlClientImpl() override {
    try {
      close();
      if (thread_.joinable()) {
        if (std::this_thread::get_id() == thread_.get_id()) {
          thread_.detach();  // destroyed from its own callback: nothing left to wait for
        } else {
          thread_.join();
        }
      }
    } catch (const std::exception& e) {  // a destructor must not throw (join's system_error)
      CORTADO_LOG_ERROR("{} closing: {}", logId_, e.what());
    }
  }

  void setFailureCallback(FailureCallback cb) override {
    std::lock_guard<std::mutex> lk(mu_);
    callback_ = std::move(cb);
  }

  AddressBook connect(Deadline deadline) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      throwIfUnusableLocked("connect");
      CORTADO_ENFORCE(!connectCalled_, ErrorCode::kInvalidArgument,
                      "{}: connect() called twice", logIdSnapshotLocked());
      connectCalled_ = true;
    }
    auto until = earlierOf(deadline, opts_.connectTimeout);
    auto prom = std::make_shared<std::promise<AddressBook>>();
    auto fut = prom->get_future();
    postUnlessClosed([this, prom, until] { startConnect(prom, until); }, "connect");
    // The io thread fails the promise at `until` with the precise reason; the
    // grace only covers a wedged io thread.
    if (!waitUntil(fut, Deadline(until + 2s))) {
      throw Error(ErrorCode::kTimeout,
                  fmt::format("connect to the scheduler at {}: no answer from the control io "
                              "thread by the deadline",
                              scheduler_));
    }
    return fut.get();
  }

  NodeId self() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return self_;
  }

  uint64_t declare(const TensorDecl& decl, Deadline deadline) override {
    CORTADO_ENFORCE(opts_.role == Role::kWorker, ErrorCode::kInvalidArgument,
                    "declare of tensor '{}': only workers declare tensors, this node is a {}",
                    decl.name, roleName(opts_.role));
    CORTADO_ENFORCE(!decl.name.empty(), ErrorCode::kInvalidArgument,
                    "declare: the tensor name is empty");
    Json body{{"name", decl.name},
              {"dtype", static_cast<int>(decl.dtype)},
              {"numElements", decl.numElements},
              {"codec", decl.codec},
              {"errorFeedback", decl.errorFeedback},
              {"contributors", decl.contributors},
              {"incarnation", decl.incarnation}};
    Json reply = request(MsgType::kDeclare, std::move(body), deadline,
                         fmt::format("declare of tensor '{}'", decl.name));
    return getUInt(reply, "key");
  }

  void barrier(Group group, const std::string& name, Deadline deadline) override {
    Json body{{"group", static_cast<int>(group)}, {"name", name}};
    request(MsgType::kBarrier, std::move(body), deadline,
            fmt::format("barrier '{}' (group {})", name, groupName(group)));
  }

  void put(const std::string& key, const std::string& value, Deadline deadline) override {
    checkKvKey(key);
    CORTADO_ENFORCE(value.size() <= kMaxKvValue, ErrorCode::kInvalidArgument,
                    "put of key '{}': the value has {} bytes, the limit is {}", key, value.size(),
                    kMaxKvValue);
    request(MsgType::kPut, Json{{"key", key}, {"value", toHex(value)}}, deadline,
            fmt::format("put of key '{}'", key));
  }

  uint64_t sendProfile(const std::string& reportJson, Deadline deadline) override {
    CORTADO_ENFORCE(opts_.role == Role::kWorker, ErrorCode::kInvalidArgument,
                    "sendProfile: only workers send profiles, this node is a {}", roleName(opts_.role));
    CORTADO_ENFORCE(reportJson.size() <= plan::kMaxProfileBytes, ErrorCode::kInvalidArgument,
                    "profile report of {} bytes: the limit is {} (fewer tensors or a shorter "
                    "window)",
                    reportJson.size(), plan::kMaxProfileBytes);
    Json ack = request(MsgType::kProfile, Json{{"report", reportJson}}, deadline, "profile report");
    return getUInt(ack, "switchAt");
  }

  PlanUpdate waitVerdict(uint64_t window, Deadline deadline) override {
    CORTADO_ENFORCE(opts_.role == Role::kWorker, ErrorCode::kInvalidArgument,
                    "waitVerdict: only workers get plans, this node is a {}", roleName(opts_.role));
    auto start = Clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    auto done = [&] { return verdicts_.count(window) > 0 || !failure_.ok() || closed_ || shutdown_; };
    if (deadline.at() == Clock::time_point::max()) {
      cv_.wait(lk, done);
    } else if (!cv_.wait_until(lk, deadline.at(), done)) {
      throw Error(ErrorCode::kTimeout,
                  fmt::format("{}: no verdict from the scheduler at {} on profiling window {} after "
                              "{} ms: the scheduler decides once every worker reported the "
                              "window, so a worker that runs fewer iterations than the others, or "
                              "is stuck, holds it back (every worker must run the same "
                              "iterations); otherwise the re-planning itself is slow (a larger "
                              "CORTADO_REPLAN_AHEAD gives it more time)",
                              self_.toString(), scheduler_, window, msSince(start)));
    }
    auto it = verdicts_.find(window);
    if (it == verdicts_.end()) throwIfUnusableLocked(fmt::format("the verdict on window {}", window));
    PlanUpdate u = it->second;
    verdicts_.erase(verdicts_.begin(), std::next(it));
    return u;
  }

  std::string get(const std::string& key, Deadline deadline) override {
    checkKvKey(key);
    Json reply;
    try {
      reply = request(MsgType::kGet, Json{{"key", key}}, deadline, fmt::format("get of key '{}'", key));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
      throw Error(ErrorCode::kTimeout,
                  fmt::format("{} (no node has put that key yet: does every rank run the same "
                              "set-up, and did the one that publishes it start?)",
                              e.what()));
    }
    std::string hex = getString(reply, "value");
    auto value = hex.size() % 2 == 0 ? fromHex(hex, hex.size() / 2) : std::nullopt;
    CORTADO_ENFORCE(value.has_value(), ErrorCode::kProtocol,
                    "the scheduler's value for key '{}' is not hex-encoded bytes", key);
    return *value;
  }

  void finish() override {
    CORTADO_ENFORCE(opts_.role == Role::kWorker, ErrorCode::kInvalidArgument,
                    "finish(): only workers finish, this node is a {}", roleName(opts_.role));
    {
      std::lock_guard<std::mutex> lk(mu_);
      CORTADO_ENFORCE(connected_ || !failure_.ok() || closed_, ErrorCode::kInvalidArgument,
                      "finish() before connect() returned");
      if (!failure_.ok() || closed_ || shutdown_) return;
      asio::post(io_, [this] {
      if (phase_ != Phase::kReady || finishSent_) return;
      finishSent_ = true;
      conn_->send(MsgType::kFinish, Json::object());
      CORTADO_LOG_INFO("{} finished; waiting for the scheduler's shutdown", logId_);
      });
    }
  }

  void reportStall(const StallReport& r) override {
    CORTADO_ENFORCE(opts_.role == Role::kServer, ErrorCode::kInvalidArgument,
                    "reportStall: only servers report stalls, this node is a {}",
                    roleName(opts_.role));
    Json body{{"key", r.key},           {"round", r.round},       {"pushed", r.pushed},
              {"expected", r.expected}, {"waitedMs", r.waitedMs}, {"tensor", r.tensor}};
    std::lock_guard<std::mutex> lk(mu_);
    if (!connected_ || !failure_.ok() || closed_ || shutdown_) return;
    asio::post(io_, [this, body = std::move(body)] {
      if (phase_ == Phase::kReady) conn_->send(MsgType::kStall, body);
    });
  }

  std::shared_ptr<const StallNotes> stallNotes() const override { return stallNotes_; }

  bool waitShutdown(Deadline deadline) override {
    std::unique_lock<std::mutex> lk(mu_);
    auto done = [this] { return shutdown_ || !failure_.ok() || closed_; };
    if (deadline.at() == Clock::time_point::max()) {
      cv_.wait(lk, done);
    } else if (!cv_.wait_until(lk, deadline.at(), done)) {
      return false;
    }
    if (shutdown_) return true;
    throwIfUnusableLocked("waitShutdown");
    return false;
  }

  Status failure() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return failure_;
  }

  void close() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    if (std::this_thread::get_id() == thread_.get_id()) {
      teardown(Error(ErrorCode::kClosed, "the control client was closed"));
      io_.stop();
      return;
    }
    asio::post(io_, [this] {
      teardown(Error(ErrorCode::kClosed, "the control client was closed"));
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

 private:
  enum class Phase { kIdle, kConnecting, kHandshake, kRegistering, kReady, kDone };

  struct Pending {
    std::promise<Json> promise;
    uint64_t id = 0;
    std::string what;
  };

  template <typename F>
  void postUnlessClosed(F&& f, const std::string& what) {
    std::lock_guard<std::mutex> lk(mu_);
    throwIfUnusableLocked(what);
    asio::post(io_, std::forward<F>(f));
  }

  void runLoop() {
    for (;;) {
      try {
        io_.run();
        // close() stopped the loop; run what was posted before it so that
        // every waiter gets its answer (new posts are refused once closed_).
        io_.restart();
        io_.poll();
        return;
      } catch (const std::exception& e) {
        // A handler bug; keep the loop alive so that waits still end.
        CORTADO_LOG_ERROR("{} io thread: unexpected exception: {}", logId_, e.what());
      }
    }
  }

  // --- caller-thread helpers (mu_ held) -------------------------------------

  std::string logIdSnapshotLocked() const {
    return connected_ ? fmt::format("[control {}]", self_.toString())
                      : fmt::format("[control {}]", roleName(opts_.role));
  }

  void throwIfUnusableLocked(const std::string& what) const {
    if (!failure_.ok()) throw Error(failure_.code(), failure_.message());
    if (shutdown_) {
      throw Error(ErrorCode::kClosed,
                  fmt::format("{}: the scheduler at {} already shut the job down", what,
                              scheduler_));
    }
    if (closed_) throw Error(ErrorCode::kClosed, what + ": the control client was closed");
  }

  Json request(MsgType type, Json body, Deadline deadline, const std::string& what) {
    auto start = Clock::now();
    auto p = std::make_shared<Pending>();
    p->what = what;
    auto fut = p->promise.get_future();
    {
      // Checked and posted under mu_: close() posts its teardown after this,
      // so the teardown fails this request if it gets that far.
      std::lock_guard<std::mutex> lk(mu_);
      throwIfUnusableLocked(what);
      CORTADO_ENFORCE(connected_, ErrorCode::kInvalidArgument, "{}: connect() has not returned",
                      what);
      asio::post(io_, [this, p, type, body = std::move(body)]() mutable {
        if (phase_ != Phase::kReady) {
          p->promise.set_exception(std::make_exception_ptr(endError(p->what)));
          return;
        }
        p->id = nextReq_++;
        body["req"] = p->id;
        pending_[p->id] = p;
        conn_->send(type, body);
      });
    }
    if (!waitUntil(fut, deadline)) {
      asio::post(io_, [this, p] { pending_.erase(p->id); });
      NodeId me = self();
      throw Error(ErrorCode::kTimeout,
                  fmt::format("{}: {} timed out after {} ms waiting for the scheduler at {}",
                              me.toString(), what, msSince(start), scheduler_));
    }
    return fut.get();
  }

  // --- io thread --------------------------------------------------------------

  // The error for work that arrives after the client stopped serving.
  Error endError(const std::string& what) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failure_.ok()) return Error(failure_.code(), failure_.message());
    if (shutdown_) {
      return Error(ErrorCode::kClosed,
                   fmt::format("{}: the scheduler at {} already shut the job down", what,
                               scheduler_));
    }
    return Error(ErrorCode::kClosed, what + ": the control client is closed");
  }

  void startConnect(std::shared_ptr<std::promise<AddressBook>> prom, Clock::time_point until) {
    if (phase_ != Phase::kIdle) {
      prom->set_exception(std::make_exception_ptr(endError("connect")));
      return;
    }
    connectPromise_ = std::move(prom);
    connectStart_ = Clock::now();
    connectUntil_ = until;
    deadlineTimer_.expires_at(until);
    deadlineTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) onConnectDeadline();
    });
    attempt();
  }

  void attempt() {
    phase_ = Phase::kConnecting;
    resolver_.async_resolve(
        opts_.schedulerHost, std::to_string(opts_.schedulerPort),
        [this](const boost::system::error_code& ec, const tcp::resolver::results_type& results) {
          if (phase_ != Phase::kConnecting) return;
          if (ec) {
            lastConnectError_ = fmt::format("cannot resolve '{}': {}", opts_.schedulerHost,
                                            ec.message());
            scheduleRetry();
            return;
          }
          auto sock = std::make_shared<tcp::socket>(io_);
          asio::async_connect(*sock, results,
                              [this, sock](const boost::system::error_code& ec2,
                                           const tcp::endpoint&) {
                                if (phase_ != Phase::kConnecting) return;
                                if (ec2) {
                                  lastConnectError_ = ec2.message();
                                  scheduleRetry();
                                  return;
                                }
                                onConnected(std::move(*sock));
                              });
        });
  }

  void scheduleRetry() {
    backoff_ = std::min(backoff_ * 2, Millis(1000));
    if (Clock::now() + backoff_ >= connectUntil_) return;  // the deadline timer ends it
    CORTADO_LOG_DEBUG("{} scheduler at {} not reachable ({}); retrying in {} ms", logId_,
                      scheduler_, lastConnectError_, backoff_.count());
    retryTimer_.expires_after(backoff_);
    retryTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && phase_ == Phase::kConnecting) attempt();
    });
  }

  void onConnected(tcp::socket socket) {
    phase_ = Phase::kHandshake;
    conn_ = Connection::create(std::move(socket));
    conn_->setMaxBody(kMaxBody);
    lastHeard_ = Clock::now();
    conn_->start([this](MsgType t, const Json& b) { onMessage(t, b); },
                 [this](const std::string& reason, bool malformed) { onClosed(reason, malformed); });
    nodeNonce_ = makeNonce();
    conn_->send(MsgType::kHello, Json{{"version", kProtocolVersion},
                                      {"nonce", toHex(nodeNonce_)},
                                      {"role", static_cast<int>(opts_.role)}});
    CORTADO_LOG_DEBUG("{} connected to the scheduler at {}; authenticating", logId_, scheduler_);
  }

  void onConnectDeadline() {
    if (phase_ == Phase::kReady || phase_ == Phase::kDone || phase_ == Phase::kIdle) return;
    long long ms = msSince(connectStart_);
    std::string msg;
    if (phase_ == Phase::kConnecting) {
      msg = fmt::format(
          "could not reach the scheduler at {} within {} ms (last error: {}); check "
          "CORTADO_SCHEDULER_HOST and CORTADO_SCHEDULER_PORT, and that the scheduler is running",
          scheduler_, ms, lastConnectError_.empty() ? "none" : lastConnectError_);
    } else if (phase_ == Phase::kHandshake) {
      msg = fmt::format(
          "the scheduler at {} accepted the connection but did not complete the job-token "
          "handshake within {} ms",
          scheduler_, ms);
    } else {
      msg = fmt::format(
          "timed out after {} ms at the scheduler at {} waiting for every node of the job to "
          "register; check that all workers and servers were started with the same "
          "CORTADO_SCHEDULER_HOST/PORT and CORTADO_JOB_TOKEN",
          ms, scheduler_);
    }
    fail(Status(ErrorCode::kTimeout, msg));
  }

  void onMessage(MsgType type, const Json& body) {
    lastHeard_ = Clock::now();
    switch (type) {
      case MsgType::kRefused: {
        auto code = errorCodeFromWire(getInt(body, "code"));
        fail(Status(code, fmt::format("the scheduler at {} refused this {}: {}", scheduler_,
                                      roleName(opts_.role), getString(body, "message"))));
        return;
      }
      case MsgType::kAbort:
        fail(Status(errorCodeFromWire(getInt(body, "code")), getString(body, "message")));
        return;
      case MsgType::kShutdown:
        onShutdown();
        return;
      case MsgType::kPing:
        return;
      default:
        break;
    }
    switch (phase_) {
      case Phase::kHandshake:
        if (type == MsgType::kChallenge && schedulerNonce_.empty()) {
          auto nonce = fromHex(getString(body, "nonce"), kNonceSize);
          CORTADO_ENFORCE(nonce.has_value(), ErrorCode::kProtocol,
                          "the challenge nonce is not {} hex-encoded bytes", kNonceSize);
          schedulerNonce_ = *nonce;
          pingInterval_ = Millis(std::max<int64_t>(0, getInt(body, "pingIntervalMs")));
          conn_->send(MsgType::kProof,
                      Json{{"mac", toHex(authProof(opts_.token, Prover::kNode, nodeNonce_,
                                                   schedulerNonce_))}});
          return;
        }
        if (type == MsgType::kWelcome && !schedulerNonce_.empty()) {
          onWelcome(body);
          return;
        }
        break;
      case Phase::kRegistering:
        if (type == MsgType::kAddressBook) {
          onAddressBook(body);
          return;
        }
        break;
      case Phase::kReady:
        if (type == MsgType::kPlanUpdate) {
          PlanUpdate u;
          u.window = getUInt(body, "window");
          u.version = getUInt(body, "version");
          u.switchAt = getUInt(body, "switchAt");
          u.planJson = getString(body, "plan");
          CORTADO_ENFORCE(u.planJson.size() <= kMaxPlanBytes, ErrorCode::kProtocol,
                          "plan update of {} bytes (limit {})", u.planJson.size(), kMaxPlanBytes);
          CORTADO_ENFORCE((u.version == 0) == u.planJson.empty(), ErrorCode::kProtocol,
                          "plan update for window {}: version {} with {} bytes of plan (a plan "
                          "has a version above 0, \"no new plan\" has neither)",
                          u.window, u.version, u.planJson.size());
          {
            std::lock_guard<std::mutex> lk(mu_);
            CORTADO_ENFORCE(verdicts_.size() < 1024, ErrorCode::kProtocol,
                            "over 1024 verdicts on profiling windows not taken");
            verdicts_[u.window] = std::move(u);
          }
          cv_.notify_all();
          return;
        }
        if (type == MsgType::kStalled) {
          std::string text = getString(body, "text");
          CORTADO_ENFORCE(text.size() <= 4096, ErrorCode::kProtocol,
                          "stall notice of {} bytes (limit 4096)", text.size());
          stallNotes_->add(getUInt(body, "key"), getUInt(body, "round"), std::move(text));
          return;
        }
        if (type == MsgType::kDeclared || type == MsgType::kBarrierDone || type == MsgType::kValue ||
            type == MsgType::kProfileAck) {
          if (auto p = takePending(getUInt(body, "req"))) p->promise.set_value(body);
          return;
        }
        if (type == MsgType::kRequestFailed) {
          if (auto p = takePending(getUInt(body, "req"))) {
            p->promise.set_exception(std::make_exception_ptr(
                Error(errorCodeFromWire(getInt(body, "code")), getString(body, "message"))));
          }
          return;
        }
        break;
      default:
        break;
    }
    throw Error(ErrorCode::kProtocol, fmt::format("unexpected {} from the scheduler",
                                                  msgTypeName(type)));
  }

  void onWelcome(const Json& body) {
    auto mac = fromHex(getString(body, "mac"), kProofSize);
    auto expected = authProof(opts_.token, Prover::kScheduler, nodeNonce_, schedulerNonce_);
    if (!mac || !proofMatches(expected, *mac)) {
      fail(Status(ErrorCode::kProtocol,
                  fmt::format("the scheduler at {} could not prove that it knows the job token: "
                              "is this another job's scheduler? (check CORTADO_JOB_TOKEN and "
                              "CORTADO_SCHEDULER_PORT)",
                              scheduler_)));
      return;
    }
    phase_ = Phase::kRegistering;
    conn_->send(MsgType::kRegister, Json{{"role", static_cast<int>(opts_.role)},
                                         {"requestedRank", opts_.requestedRank},
                                         {"dataAddress", opts_.dataAddress},
                                         {"hostname", opts_.hostname},
                                         {"pid", static_cast<int>(getpid())},
                                         {"sharedMemory", opts_.sharedMemory},
                                         {"pushBudget", opts_.pushBudget}});
    silenceLimit_ = std::max(opts_.schedulerTimeout, 3 * pingInterval_);
    startHeartbeats();
    startWatchdog();
    CORTADO_LOG_DEBUG("{} authenticated with the scheduler at {}; registering", logId_,
                      scheduler_);
  }

  static std::vector<NodeInfo> readNodes(const Json& body, const char* field, Role role) {
    auto it = body.find(field);
    CORTADO_ENFORCE(it != body.end() && it->is_array(), ErrorCode::kProtocol,
                    "field '{}' is missing or not an array", field);
    std::vector<NodeInfo> out;
    for (const auto& e : *it) {
      NodeInfo n = nodeInfoFromJson(e);
      CORTADO_ENFORCE(n.id.role == role && n.id.rank == static_cast<int>(out.size()),
                      ErrorCode::kProtocol, "entry {} of '{}' is {}", out.size(), field,
                      n.id.toString());
      out.push_back(std::move(n));
    }
    return out;
  }

  void onAddressBook(const Json& body) {
    AddressBook book;
    book.servers = readNodes(body, "servers", Role::kServer);
    book.workers = readNodes(body, "workers", Role::kWorker);
    int64_t rank = getInt(body, "rank");
    const auto& mine = opts_.role == Role::kServer ? book.servers : book.workers;
    CORTADO_ENFORCE(rank >= 0 && rank < static_cast<int64_t>(mine.size()), ErrorCode::kProtocol,
                    "assigned rank {} is not in the address book", rank);
    {
      std::lock_guard<std::mutex> lk(mu_);
      self_ = NodeId{opts_.role, static_cast<int32_t>(rank)};
      connected_ = true;
    }
    phase_ = Phase::kReady;
    deadlineTimer_.cancel();
    logId_ = fmt::format("[control {}]", NodeId{opts_.role, static_cast<int32_t>(rank)}.toString());
    CORTADO_LOG_INFO("{} registered with the scheduler at {}: {} workers, {} servers", logId_,
                     scheduler_, book.workers.size(), book.servers.size());
    if (connectPromise_) {
      connectPromise_->set_value(std::move(book));
      connectPromise_.reset();
    }
  }

  void onShutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (shutdown_ || !failure_.ok()) return;
      shutdown_ = true;
    }
    cv_.notify_all();
    CORTADO_LOG_INFO("{} the scheduler shut the job down", logId_);
    teardown(Error(ErrorCode::kClosed,
                   fmt::format("the scheduler at {} shut the job down", scheduler_)));
  }

  void onClosed(const std::string& reason, bool malformed) {
    if (phase_ == Phase::kDone) return;
    if (malformed) {
      fail(Status(ErrorCode::kProtocol,
                  fmt::format("the scheduler at {} sent a malformed message ({}); closing the "
                              "control connection",
                              scheduler_, reason)));
      return;
    }
    fail(Status(ErrorCode::kPeerDead,
                fmt::format("lost the control connection to the scheduler at {}{}: {}",
                            scheduler_, phase_ == Phase::kReady ? "" : " during registration",
                            reason)));
  }

  void startHeartbeats() {
    heartbeatTimer_.expires_after(clampDuration(opts_.heartbeatInterval));
    heartbeatTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || phase_ == Phase::kDone) return;
      conn_->send(MsgType::kHeartbeat, Json::object());
      startHeartbeats();
    });
  }

  void startWatchdog() {
    watchdogTimer_.expires_after(std::clamp(silenceLimit_ / 4, Millis(5), Millis(1000)));
    watchdogTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || phase_ == Phase::kDone) return;
      auto silent = msSince(lastHeard_);
      if (silent > silenceLimit_.count()) {
        fail(Status(ErrorCode::kPeerDead,
                    fmt::format("the scheduler at {} has been silent for {} ms (limit {} ms): "
                                "declaring it dead",
                                scheduler_, silent, silenceLimit_.count())));
        return;
      }
      startWatchdog();
    });
  }

  std::shared_ptr<Pending> takePending(uint64_t id) {
    auto it = pending_.find(id);
    if (it == pending_.end()) return nullptr;  // its caller timed out and left
    auto p = std::move(it->second);
    pending_.erase(it);
    return p;
  }

  // Records the first failure, ends everything in flight, then tells the owner.
  void fail(const Status& st) {
    FailureCallback cb;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!failure_.ok() || shutdown_ || closed_) return;
      failure_ = st;
      cb = callback_;
    }
    cv_.notify_all();
    CORTADO_LOG_ERROR("{} {}", logId_, st.message());
    teardown(Error(st.code(), st.message()));
    if (cb) cb(st);
  }

  void teardown(const Error& why) {
    phase_ = Phase::kDone;
    if (conn_) conn_->close();
    boost::system::error_code ec;
    resolver_.cancel();
    retryTimer_.cancel();
    deadlineTimer_.cancel();
    heartbeatTimer_.cancel();
    watchdogTimer_.cancel();
    if (connectPromise_) {
      connectPromise_->set_exception(std::make_exception_ptr(why));
      connectPromise_.reset();
    }
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& [id, p] : pending) {
      p->promise.set_exception(std::make_exception_ptr(
          why.code() == ErrorCode::kClosed ? Error(ErrorCode::kClosed,
                                                   fmt::format("{}: {}", p->what, why.what()))
                                           : why));
    }
  }

  ClientOptions opts_;
  std::string scheduler_;  // "host:port", fixed

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;

  // io-thread state
  tcp::resolver resolver_;
  asio::steady_timer retryTimer_;
  asio::steady_timer deadlineTimer_;
  asio::steady_timer heartbeatTimer_;
  asio::steady_timer watchdogTimer_;
  Phase phase_ = Phase::kIdle;
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<std::promise<AddressBook>> connectPromise_;
  Clock::time_point connectStart_;
  Clock::time_point connectUntil_;
  Millis backoff_{25};
  std::string lastConnectError_;
  std::string nodeNonce_;
  std::string schedulerNonce_;
  Millis pingInterval_{0};
  Millis silenceLimit_{30000};
  Clock::time_point lastHeard_;
  uint64_t nextReq_ = 1;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;
  bool finishSent_ = false;
  std::string logId_;

  // shared state
  mutable std::mutex mu_;
  std::condition_variable cv_;
  FailureCallback callback_;
  Status failure_;
  NodeId self_;
  bool connectCalled_ = false;
  bool connected_ = false;
  bool shutdown_ = false;
  bool closed_ = false;
  std::map<uint64_t, PlanUpdate> verdicts_;  // by window, until waitVerdict takes them
  const std::shared_ptr<StallNotes> stallNotes_ = std::make_shared<StallNotes>();  // Stalled
};

}  // namespace

std::unique_ptr<ControlClient> ControlClient::create(ClientOptions opts) {
  return std::make_unique<ControlClientImpl>(std::move(opts));
}

}  // namespace cortado::control
