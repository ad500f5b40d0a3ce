// The scheduler's life (scheduler_impl.h): construction, run/stop/fail,
// listening and accepting, sessions, liveness, and the end of the job.
#include "scheduler/scheduler_impl.h"

namespace cortado::scheduler {
namespace detail {

SchedulerImpl::SchedulerImpl(SchedulerOptions opts)
    : opts_(std::move(opts)),
      acceptor_(io_),
      registrationTimer_(io_),
      heartbeatTimer_(io_),
      lingerTimer_(io_),
      declareTimer_(io_),
      decls_(std::max(opts_.numWorkers, 1)),
      declarationsWaited_(std::max(opts_.numWorkers, 1), 0) {
  CORTADO_ENFORCE(!opts_.token.empty(), ErrorCode::kInvalidArgument,
                  "scheduler: the job token is empty (set CORTADO_JOB_TOKEN)");
  CORTADO_ENFORCE(opts_.numWorkers >= 1, ErrorCode::kInvalidArgument,
                  "scheduler: the job needs at least 1 worker, got {} (CORTADO_NUM_WORKERS)",
                  opts_.numWorkers);
  CORTADO_ENFORCE(opts_.numServers >= 0, ErrorCode::kInvalidArgument,
                  "scheduler: negative number of servers {} (CORTADO_NUM_SERVERS)",
                  opts_.numServers);
  CORTADO_ENFORCE(opts_.replanAhead >= 1, ErrorCode::kInvalidArgument,
                  "scheduler: CORTADO_REPLAN_AHEAD {} must be at least 1", opts_.replanAhead);
  CORTADO_ENFORCE(opts_.port >= 0 && opts_.port < 65536, ErrorCode::kInvalidArgument,
                  "scheduler: port {} is out of range 0..65535 (CORTADO_SCHEDULER_PORT)",
                  opts_.port);
  CORTADO_ENFORCE(opts_.heartbeatTimeout.count() > 0 && opts_.registrationTimeout.count() > 0 &&
                      opts_.handshakeTimeout.count() > 0,
                  ErrorCode::kInvalidArgument,
                  "scheduler: timeouts must be positive (heartbeat {} ms, registration {} ms, "
                  "handshake {} ms)",
                  opts_.heartbeatTimeout.count(), opts_.registrationTimeout.count(),
                  opts_.handshakeTimeout.count());
  listen();
}

Status SchedulerImpl::run() {
  CORTADO_ENFORCE(!started_.exchange(true), ErrorCode::kInvalidArgument,
                  "Scheduler::run() called twice");
  CORTADO_LOG_INFO("[scheduler] listening on {} for {} and {}", listenAddress_,
                   plural(opts_.numWorkers, "worker"), plural(opts_.numServers, "server"));
  accept();
  registrationTimer_.expires_after(opts_.registrationTimeout);
  registrationTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) onRegistrationDeadline();
  });
  heartbeatTick();
  for (;;) {
    try {
      io_.run();
      break;
    } catch (const std::exception& e) {
      CORTADO_LOG_ERROR("[scheduler] unexpected exception on the io thread: {}", e.what());
    }
  }
  return final_;
}

void SchedulerImpl::stop() {
  asio::post(io_, [this] {
    endJob(Status(ErrorCode::kClosed, "the scheduler was stopped"), 0);
  });
}

void SchedulerImpl::fail(Status reason) {
  asio::post(io_, [this, reason = std::move(reason)] { endJob(reason, 0); });
}

void SchedulerImpl::listen() {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(opts_.bindHost, ec);
  if (ec) {
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(opts_.bindHost, std::to_string(opts_.port), ec);
    CORTADO_ENFORCE(!ec && !results.empty(), ErrorCode::kInvalidArgument,
                    "scheduler: cannot resolve bind host '{}': {}", opts_.bindHost,
                    ec ? ec.message() : "no address");
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(addr, static_cast<uint16_t>(opts_.port));
  std::string where = fmt::format("{}:{}", opts_.bindHost, opts_.port);
  acceptor_.open(ep.protocol(), ec);
  CORTADO_ENFORCE(!ec, ErrorCode::kUnavailable, "scheduler: cannot open a socket for {}: {}",
                  where, ec.message());
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor_.bind(ep, ec);
  CORTADO_ENFORCE(!ec, ErrorCode::kUnavailable,
                  "scheduler: cannot listen on {}: {} (is another scheduler or program using "
                  "this port? choose another CORTADO_SCHEDULER_PORT)",
                  where, ec.message());
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  CORTADO_ENFORCE(!ec, ErrorCode::kUnavailable, "scheduler: cannot listen on {}: {}", where,
                  ec.message());
  port_ = acceptor_.local_endpoint().port();
  listenAddress_ = fmt::format("{}:{}", opts_.bindHost, port_);
}

void SchedulerImpl::accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (phase_ == Phase::kEnding || !acceptor_.is_open()) return;
    if (ec) {
      CORTADO_LOG_WARN("[scheduler] accept failed: {}", ec.message());
    } else {
      onAccepted(std::move(socket));
    }
    accept();
  });
}

void SchedulerImpl::onAccepted(tcp::socket socket) {
  uint64_t sid = nextSession_++;
  auto conn = Connection::create(std::move(socket));
  auto s = std::make_unique<Session>(sid, conn, io_);
  CORTADO_LOG_DEBUG("[scheduler] connection from {}", conn->remote());
  s->timer.expires_after(opts_.handshakeTimeout);
  s->timer.async_wait([this, sid](const boost::system::error_code& ec) {
    if (ec) return;
    Session* s = find(sid);
    if (!s || s->state == Session::State::kRegistered) return;
    if (s->state != Session::State::kClosing) {
      CORTADO_LOG_WARN("[scheduler] closing the connection from {}: it did not authenticate "
                       "and register within {} ms",
                       s->label(), opts_.handshakeTimeout.count());
    }
    drop(sid);
  });
  sessions_[sid] = std::move(s);
  conn->start([this, sid](MsgType t, const Json& b) { onMessage(sid, t, b); },
              [this, sid](const std::string& reason, bool malformed) {
                onClosed(sid, reason, malformed);
              });
}

Session* SchedulerImpl::find(uint64_t sid) {
  auto it = sessions_.find(sid);
  return it == sessions_.end() ? nullptr : it->second.get();
}

void SchedulerImpl::drop(uint64_t sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  it->second->conn->close();
  it->second->timer.cancel();
  if (it->second->registered && phase_ == Phase::kRegistering) {
    --registered_[static_cast<int>(it->second->info.id.role)];
  }
  sessions_.erase(it);
  if (phase_ == Phase::kEnding && sessions_.empty()) lingerTimer_.cancel();
}

Millis SchedulerImpl::pingInterval() const {
  return std::max(Millis(1), opts_.heartbeatTimeout / 4);
}

void SchedulerImpl::heartbeatTick() {
  auto now = Clock::now();
  std::vector<uint64_t> silentBeforeStart;
  for (auto& [sid, s] : sessions_) {
    if (s->state != Session::State::kRegistered && s->state != Session::State::kAuthenticated)
      continue;
    s->conn->send(MsgType::kPing, Json::object());
    if (s->state != Session::State::kRegistered || s->finished) continue;
    auto silent = std::chrono::duration_cast<Millis>(now - s->lastHeard);
    if (silent <= opts_.heartbeatTimeout) continue;
    if (phase_ == Phase::kRegistering) {
      silentBeforeStart.push_back(sid);
      continue;
    }
    return nodeDead(*s, fmt::format("no heartbeat for {} ms (heartbeat timeout {} ms)",
                                    silent.count(), opts_.heartbeatTimeout.count()));
  }
  for (uint64_t sid : silentBeforeStart) {
    CORTADO_LOG_WARN("[scheduler] {} went silent before registration completed; dropping it "
                     "and freeing its slot",
                     find(sid)->label());
    drop(sid);
  }
  heartbeatTimer_.expires_after(pingInterval());
  heartbeatTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && phase_ != Phase::kEnding) heartbeatTick();
  });
}

void SchedulerImpl::onClosed(uint64_t sid, const std::string& reason, bool malformed) {
  Session* s = find(sid);
  if (!s) return;
  if (malformed) {
    CORTADO_LOG_WARN("[scheduler] closing the connection from {}: {}", s->label(), reason);
  }
  if (s->state == Session::State::kRegistered) {
    if (phase_ == Phase::kRegistering) {
      CORTADO_LOG_WARN("[scheduler] {} left before registration completed ({}); its slot is "
                       "free again",
                       s->label(), reason);
    } else if (phase_ == Phase::kRunning && !s->finished) {
      nodeDead(*s, fmt::format("its control connection {} before it finished ({})",
                               malformed ? "sent a malformed message" : "closed", reason));
    } else {
      CORTADO_LOG_DEBUG("[scheduler] {} closed its connection ({})", s->label(), reason);
    }
  } else if (!malformed) {
    CORTADO_LOG_DEBUG("[scheduler] connection from {} closed ({})", s->label(), reason);
  }
  drop(sid);
}

void SchedulerImpl::nodeDead(Session& s, const std::string& why) {
  std::string msg = fmt::format("{} is dead: {}", s.info.toString(), why);
  endJob(Status(ErrorCode::kPeerDead, msg), s.id);
}

void SchedulerImpl::endJob(const Status& st, uint64_t deadSid) {
  if (phase_ == Phase::kEnding) return;
  phase_ = Phase::kEnding;
  final_ = st;
  if (st.ok()) {
    CORTADO_LOG_INFO("[scheduler] all {} finished; shutting down {} nodes",
                     plural(opts_.numWorkers, "worker"), opts_.numWorkers + opts_.numServers);
  } else {
    CORTADO_LOG_ERROR("[scheduler] the job failed: {}", st.message());
  }
  boost::system::error_code ec;
  acceptor_.close(ec);
  registrationTimer_.cancel();
  heartbeatTimer_.cancel();
  declareTimer_.cancel();
  Json deadNode;
  if (Session* dead = find(deadSid)) deadNode = control::nodeInfoToJson(dead->info);
  std::vector<uint64_t> toDrop;
  for (auto& [sid, s] : sessions_) {
    bool told = s->state == Session::State::kRegistered ||
                s->state == Session::State::kAuthenticated;
    if (!told || !s->conn->isOpen()) {
      if (s->state != Session::State::kClosing) toDrop.push_back(sid);
      continue;
    }
    if (st.ok()) {
      s->conn->send(MsgType::kShutdown, Json::object());
    } else {
      Json body{{"code", control::errorCodeToWire(st.code())},
                {"message", sid == deadSid ? "this node was declared dead by the scheduler: " +
                                                 st.message()
                                           : st.message()}};
      if (!deadNode.is_null()) body["node"] = deadNode;
      s->conn->send(MsgType::kAbort, body);
    }
    s->conn->finishSending();
    s->state = Session::State::kClosing;
  }
  for (uint64_t sid : toDrop) drop(sid);
  if (sessions_.empty()) return;
  lingerTimer_.expires_after(kLinger);
  lingerTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    for (auto& [sid, s] : sessions_) {
      CORTADO_LOG_WARN("[scheduler] {} did not close within {} ms of the end of the job; "
                       "closing it",
                       s->label(), kLinger.count());
      s->conn->close();
      s->timer.cancel();
    }
    sessions_.clear();
  });
}

}  // namespace detail

std::unique_ptr<Scheduler> Scheduler::create(SchedulerOptions opts) {
  return std::make_unique<detail::SchedulerImpl>(std::move(opts));
}

}  // namespace cortado::scheduler
