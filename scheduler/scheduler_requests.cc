// What the nodes ask of the scheduler (scheduler_impl.h): the handshake and
// registration, tensor declarations, profiling reports and their verdicts,
// the key-value rendezvous, barriers, and finishing.
#include "scheduler/scheduler_impl.h"

#include "core/partition.h"

namespace cortado::scheduler::detail {

void SchedulerImpl::onMessage(uint64_t sid, MsgType type, const Json& body) {
  Session* s = find(sid);
  if (!s) return;
  s->lastHeard = Clock::now();
  switch (s->state) {
    case Session::State::kHandshake:
      if (type == MsgType::kHello && s->nodeNonce.empty()) return onHello(*s, body);
      if (type == MsgType::kProof && !s->nodeNonce.empty()) return onProof(*s, body);
      break;
    case Session::State::kAuthenticated:
      if (type == MsgType::kRegister) return onRegister(*s, body);
      if (type == MsgType::kHeartbeat) return;
      break;
    case Session::State::kRegistered:
      switch (type) {
        case MsgType::kHeartbeat: return;
        case MsgType::kDeclare: return onDeclare(*s, body);
        case MsgType::kBarrier: return onBarrier(*s, body);
        case MsgType::kPut: return onPut(*s, body);
        case MsgType::kGet: return onGet(*s, body);
        case MsgType::kProfile: return onProfile(*s, body);
        case MsgType::kFinish: return onFinish(*s);
        case MsgType::kStall: return onStall(*s, body);
        default: break;
      }
      break;
    case Session::State::kClosing:
      return;  // it has been answered for the last time
  }
  // Connection turns this into a close with the reason, which onClosed logs.
  throw Error(ErrorCode::kProtocol,
              fmt::format("unexpected {} in this state of the conversation", msgTypeName(type)));
}

void SchedulerImpl::onHello(Session& s, const Json& body) {
  int64_t version = control::getInt(body, "version");
  if (version != control::kProtocolVersion) {
    return refuse(s, ErrorCode::kProtocol,
                  fmt::format("protocol version {} is not supported (the scheduler speaks {})",
                              version, control::kProtocolVersion));
  }
  auto nonce = control::fromHex(control::getString(body, "nonce"), control::kNonceSize);
  CORTADO_ENFORCE(nonce.has_value(), ErrorCode::kProtocol,
                  "the Hello nonce is not {} hex-encoded bytes", control::kNonceSize);
  s.nodeNonce = *nonce;
  s.schedulerNonce = control::makeNonce();
  s.conn->send(MsgType::kChallenge, Json{{"nonce", control::toHex(s.schedulerNonce)},
                                         {"pingIntervalMs", pingInterval().count()}});
}

void SchedulerImpl::onProof(Session& s, const Json& body) {
  auto mac = control::fromHex(control::getString(body, "mac"), control::kProofSize);
  auto expected =
      control::authProof(opts_.token, control::Prover::kNode, s.nodeNonce, s.schedulerNonce);
  if (!mac || !control::proofMatches(expected, *mac)) {
    return refuse(s, ErrorCode::kProtocol,
                  "job token refused: this node's proof does not match the job token of the "
                  "scheduler (check CORTADO_JOB_TOKEN)");
  }
  s.state = Session::State::kAuthenticated;
  s.conn->setMaxBody(control::kMaxBody);
  s.conn->send(MsgType::kWelcome,
               Json{{"mac", control::toHex(control::authProof(opts_.token,
                                                              control::Prover::kScheduler,
                                                              s.nodeNonce, s.schedulerNonce))}});
  CORTADO_LOG_DEBUG("[scheduler] {} proved the job token", s.label());
}

void SchedulerImpl::onRegister(Session& s, const Json& body) {
  int64_t roleRaw = control::getInt(body, "role");
  CORTADO_ENFORCE(roleRaw == static_cast<int>(Role::kServer) ||
                      roleRaw == static_cast<int>(Role::kWorker),
                  ErrorCode::kProtocol, "role {} is neither server nor worker", roleRaw);
  Role role = static_cast<Role>(roleRaw);
  int64_t requested = control::getInt(body, "requestedRank");
  NodeInfo info;
  info.id = NodeId{role, -1};
  info.dataAddress = control::getString(body, "dataAddress");
  info.hostname = control::getString(body, "hostname");
  info.pid = static_cast<int32_t>(control::getInt(body, "pid"));
  if (auto it = body.find("sharedMemory"); it != body.end() && it->is_boolean())
    info.sharedMemory = it->get<bool>();
  if (auto it = body.find("pushBudget"); it != body.end() && it->is_number_unsigned())
    info.pushBudget = role == Role::kServer ? it->get<uint64_t>() : 0;
  const int total = role == Role::kServer ? opts_.numServers : opts_.numWorkers;
  const char* what = roleName(role);
  std::string who = fmt::format("{} from {} (host {}, pid {})", what, s.conn->remote(),
                                info.hostname, info.pid);

  if (phase_ != Phase::kRegistering) {
    return refuse(s, ErrorCode::kInvalidArgument,
                  fmt::format("registration of {} refused: the job's registration is complete "
                              "({} and {} registered)",
                              who, plural(opts_.numWorkers, "worker"),
                              plural(opts_.numServers, "server")));
  }
  if (requested < -1 || requested >= total) {
    return refuse(s, ErrorCode::kInvalidArgument,
                  fmt::format("registration of {} refused: requested {} rank {} is out of "
                              "range: the job has {}{}",
                              who, what, requested, plural(total, what),
                              total > 0 ? fmt::format(" (ranks 0..{})", total - 1) : ""));
  }
  if (registered_[roleRaw] >= total) {
    return refuse(s, ErrorCode::kInvalidArgument,
                  fmt::format("registration of {} refused: the job already has all {} "
                              "registered",
                              who, plural(total, what)));
  }
  if (requested >= 0) {
    for (const auto& [id, other] : sessions_) {
      if (other->registered && other->info.id.role == role &&
          other->requestedRank == requested) {
        return refuse(s, ErrorCode::kInvalidArgument,
                      fmt::format("registration of {} refused: {} rank {} is already taken by "
                                  "the {} from {} (host {}, pid {})",
                                  who, what, requested, what, other->conn->remote(),
                                  other->info.hostname, other->info.pid));
      }
    }
  }
  s.info = std::move(info);
  s.requestedRank = static_cast<int>(requested);
  s.arrival = nextArrival_++;
  s.state = Session::State::kRegistered;
  s.registered = true;
  s.timer.cancel();
  ++registered_[roleRaw];
  {
    std::lock_guard<std::mutex> lk(processesMu_);
    processes_.emplace_back(s.info.hostname, s.info.pid);
  }
  CORTADO_LOG_INFO("[scheduler] registered {}{}, data address {}; {}/{} workers, {}/{} servers",
                   who, requested >= 0 ? fmt::format(" as rank {}", requested) : "",
                   s.info.dataAddress, registered_[2], opts_.numWorkers, registered_[1],
                   opts_.numServers);
  if (registered_[1] == opts_.numServers && registered_[2] == opts_.numWorkers) {
    completeRegistration();
  }
}

void SchedulerImpl::completeRegistration() {
  std::vector<Session*> all;
  for (auto& [id, s] : sessions_)
    if (s->registered && s->state == Session::State::kRegistered) all.push_back(s.get());
  std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->arrival < b->arrival; });
  servers_.assign(opts_.numServers, 0);
  workers_.assign(opts_.numWorkers, 0);
  for (Session* s : all) {
    auto& slots = s->info.id.role == Role::kServer ? servers_ : workers_;
    if (s->requestedRank >= 0) {
      slots[s->requestedRank] = s->id;
      s->info.id.rank = s->requestedRank;
    }
  }
  for (Session* s : all) {
    if (s->requestedRank >= 0) continue;
    auto& slots = s->info.id.role == Role::kServer ? servers_ : workers_;
    auto free = std::find(slots.begin(), slots.end(), 0);
    *free = s->id;  // counts were checked at registration, so a slot is free
    s->info.id.rank = static_cast<int32_t>(free - slots.begin());
  }
  if (const std::string wrong = misplacedWorkers(all); !wrong.empty()) {
    endJob(Status(ErrorCode::kInvalidArgument, wrong), 0);
    return;
  }
  Json servers = Json::array(), workers = Json::array();
  for (uint64_t sid : servers_) servers.push_back(control::nodeInfoToJson(find(sid)->info));
  for (uint64_t sid : workers_) workers.push_back(control::nodeInfoToJson(find(sid)->info));
  for (Session* s : all) {
    s->conn->send(MsgType::kAddressBook,
                  Json{{"rank", s->info.id.rank}, {"servers", servers}, {"workers", workers}});
  }
  phase_ = Phase::kRunning;
  registrationTimer_.cancel();
  CORTADO_LOG_INFO("[scheduler] all {} and {} registered; address book sent",
                   plural(opts_.numWorkers, "worker"), plural(opts_.numServers, "server"));
  for (Session* s : all) CORTADO_LOG_DEBUG("[scheduler]   {}", s->info.toString());
}

std::string SchedulerImpl::misplacedWorkers(const std::vector<Session*>& all) const {
  if (opts_.workersPerHost.empty()) return {};
  std::map<std::string, int> byHost;
  for (const Session* s : all)
    if (s->info.id.role == Role::kWorker) ++byHost[s->info.hostname];
  std::vector<int> got, want = opts_.workersPerHost;
  for (const auto& [host, n] : byHost) got.push_back(n);
  std::erase(want, 0);
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  if (got == want) return {};
  std::vector<std::string> where;
  for (const auto& [host, n] : byHost) where.push_back(fmt::format("{} on {}", plural(n, "worker"), host));
  return fmt::format(
      "the workers are not where the job placed them: {} on {} machines ({}) was asked for, "
      "and they registered from {} ({}). The MPI launcher did not follow the host list: "
      "check OMPI_MCA_plm and any resource manager's settings, and that every host's "
      "hostname is its own",
      plural(opts_.numWorkers, "worker"), want.size(), fmt::join(want, ", "),
      plural(int(byHost.size()), "hostname"), fmt::join(where, ", "));
}

void SchedulerImpl::onRegistrationDeadline() {
  if (phase_ != Phase::kRegistering) return;
  int missingW = opts_.numWorkers - registered_[2];
  int missingS = opts_.numServers - registered_[1];
  std::vector<std::string> missing;
  if (missingW > 0) missing.push_back(plural(missingW, "worker"));
  if (missingS > 0) missing.push_back(plural(missingS, "server"));
  endJob(Status(ErrorCode::kTimeout,
                fmt::format("registration deadline of {} ms passed with {}/{} workers and {}/{} "
                            "servers registered: {} missing (were they started with this "
                            "scheduler's address and job token?)",
                            opts_.registrationTimeout.count(), registered_[2], opts_.numWorkers,
                            registered_[1], opts_.numServers, fmt::join(missing, " and "))),
         0);
}

void SchedulerImpl::onDeclare(Session& s, const Json& body) {
  uint64_t req = control::getUInt(body, "req");
  if (s.info.id.role != Role::kWorker) {
    return replyFailed(s, req, ErrorCode::kInvalidArgument,
                       fmt::format("{}: only workers declare tensors", s.info.id.toString()));
  }
  control::TensorDecl d;
  d.name = control::getString(body, "name");
  int64_t dt = control::getInt(body, "dtype");
  CORTADO_ENFORCE(dt >= 0 && dt < 256 && isValidDType(static_cast<uint8_t>(dt)),
                  ErrorCode::kProtocol, "unknown dtype {} for tensor '{}'", dt, d.name);
  d.dtype = static_cast<DType>(dt);
  d.numElements = control::getUInt(body, "numElements");
  d.codec = control::getString(body, "codec");
  // Absent from older workers: no error feedback.
  auto ef = body.find("errorFeedback");
  CORTADO_ENFORCE(ef == body.end() || ef->is_boolean(), ErrorCode::kProtocol,
                  "field 'errorFeedback' of the declaration of tensor '{}' is not a boolean",
                  d.name);
  d.errorFeedback = ef != body.end() && ef->get<bool>();
  // A count that older workers leave out: 0 then.
  auto optionalCount = [&](const char* field) -> uint32_t {
    auto it = body.find(field);
    if (it == body.end()) return 0;
    const bool count = it->is_number_unsigned() ||
                       (it->is_number_integer() && it->get<int64_t>() >= 0);
    CORTADO_ENFORCE(count && it->get<uint64_t>() <= UINT32_MAX,
                    ErrorCode::kProtocol,
                    "field '{}' of the declaration of tensor '{}' is not a count", field, d.name);
    return it->get<uint32_t>();
  };
  d.contributors = optionalCount("contributors");  // 0: every worker pushes
  d.incarnation = optionalCount("incarnation");    // 0: the name's first declaration
  auto out = decls_.declare(s.info.id.rank, d);
  const auto waitKey = std::make_pair(d.name, d.incarnation);
  using Kind = DeclarationTable::Outcome::Kind;
  switch (out.kind) {
    case Kind::kPending:
      declWaiters_[waitKey].push_back({s.id, req});
      if (declarationsWaited_[s.info.id.rank]++ == 0) ++workersWaiting_;
      checkDeclarations();
      return;
    case Kind::kAgreed: {
      auto waiters = std::move(declWaiters_[waitKey]);
      declWaiters_.erase(waitKey);
      for (const auto& w : waiters) {
        Session* ws = find(w.session);
        if (!ws) continue;  // a closed session: the job is ending
        if (--declarationsWaited_[ws->info.id.rank] == 0) --workersWaiting_;
        ws->conn->send(MsgType::kDeclared, Json{{"req", w.req}, {"key", out.key}});
      }
      s.conn->send(MsgType::kDeclared, Json{{"req", req}, {"key", out.key}});
      CORTADO_LOG_DEBUG("[scheduler] tensor {} ({}) has key {}", DeclarationTable::label(d),
                        DeclarationTable::describe(d), out.key);
      return;
    }
    case Kind::kRejected:
      return replyFailed(s, req, out.status.code(), out.status.message());
    case Kind::kMismatch:
      return endJob(out.status, 0);
  }
}

void SchedulerImpl::checkDeclarations() {
  if (opts_.declareCheck.count() <= 0 || declareTimerArmed_ || phase_ == Phase::kEnding) return;
  if (workersWaiting_ < opts_.numWorkers) return;
  declareTimerArmed_ = true;
  declareTimer_.expires_after(opts_.declareCheck);
  declareTimer_.async_wait(
      [this, agreed = decls_.numAgreed()](const boost::system::error_code& ec) {
        declareTimerArmed_ = false;
        if (!ec) onDeclareCheck(agreed);
      });
}

void SchedulerImpl::onDeclareCheck(size_t agreedWhenArmed) {
  if (phase_ == Phase::kEnding) return;
  if (workersWaiting_ < opts_.numWorkers) return;
  if (decls_.numAgreed() != agreedWhenArmed) return checkDeclarations();  // they moved on
  // Every worker waits in a declaration that another worker has not made,
  // and has for declareCheck: none can go on. Name each worker's wait.
  std::map<int, std::string> waits;
  for (const auto& [key, waiters] : declWaiters_) {
    for (const auto& w : waiters) {
      Session* ws = find(w.session);
      if (!ws || waits.count(ws->info.id.rank)) continue;
      waits[ws->info.id.rank] = decls_.describePending(key.first, key.second, ws->info.id.rank);
    }
  }
  std::vector<std::string> lines;
  for (const auto& [rank, what] : waits) {
    if (lines.size() == 8) {
      lines.push_back(
          fmt::format("and {} more", plural(static_cast<int>(waits.size()) - 8, "worker")));
      break;
    }
    lines.push_back(fmt::format("worker {} waits in its declaration of {}", rank, what));
  }
  endJob(Status(ErrorCode::kMismatch,
                fmt::format("the workers declare different tensors: {} (for {:.1f} s, every "
                            "worker waiting in a declaration that another has not made). Every "
                            "worker must declare the same tensors, under the same names: the "
                            "same model and name prefixes, and the same fusion settings "
                            "(fusion_bytes, CORTADO_FUSION_BYTES), which decide the fused "
                            "groups' names",
                            fmt::join(lines, "; "), opts_.declareCheck.count() / 1000.0)),
         0);
}

void SchedulerImpl::onProfile(Session& s, const Json& body) {
  uint64_t req = control::getUInt(body, "req");
  std::string text = control::getString(body, "report");
  plan::ProfileReport r;
  try {
    r = plan::profileFromJsonString(text);
    CORTADO_ENFORCE(s.info.id.role == Role::kWorker && r.rank == s.info.id.rank, ErrorCode::kProtocol,
                    "profile report: rank {} sent by {} (a worker reports its own rank)", r.rank,
                    s.info.id.toString());
  } catch (const Error& e) {
    CORTADO_LOG_WARN("[scheduler] refused a profile report from {}: {}", s.label(), e.what());
    return replyFailed(s, req, e.code(), fmt::format("{} sent a report the scheduler refused: {}",
                                                     s.info.id.toString(), e.what()));
  }
  if (!opts_.replanner) {
    s.conn->send(MsgType::kProfileAck, Json{{"req", req}, {"switchAt", 0}});
    return;
  }
  const uint64_t windowEnd = r.endIteration;
  const uint64_t switchAt = windowEnd + opts_.replanAhead;
  s.conn->send(MsgType::kProfileAck, Json{{"req", req}, {"switchAt", switchAt}});
  const uint64_t w = r.window;
  // A window whose verdict went out already (it cannot complete again):
  // this worker still waits for one. One still being decided: the verdict
  // goes to every worker when it is.
  if (w < nextWindow_) {
    if (w < verdictsSent_) sendVerdict(&s, w, std::nullopt);
    return;
  }
  const int rank = r.rank;
  auto& got = windows_[w];
  got.resize(opts_.numWorkers);
  got[rank] = std::move(r);
  for (const auto& x : got)
    if (!x) return;
  std::vector<plan::ProfileReport> reports;
  for (auto& x : got) reports.push_back(std::move(*x));
  windows_.erase(windows_.begin(), windows_.upper_bound(w));
  nextWindow_ = w + 1;
  // The decision (a planner search: 0.1-0.6 s on the benchmarks' models)
  // runs off the io thread, so that heartbeats, barriers and the
  // key-value store are served meanwhile; one window at a time, in order.
  asio::post(planner_, [this, w, switchAt, windowEnd, reports = std::move(reports)] {
    std::optional<control::PlanUpdate> u;
    try {
      u = opts_.replanner(reports);
    } catch (const std::exception& e) {
      CORTADO_LOG_ERROR("[scheduler] re-planning after window {} failed, the current plan "
                        "stays: {}",
                        w, e.what());
      u.reset();
    }
    asio::post(io_, [this, w, switchAt, windowEnd, u = std::move(u)]() mutable {
      decided(w, switchAt, windowEnd, std::move(u));
    });
  });
}

void SchedulerImpl::decided(uint64_t w, uint64_t switchAt, uint64_t windowEnd,
                            std::optional<control::PlanUpdate> u) {
  verdictsSent_ = w + 1;
  if (phase_ == Phase::kEnding) return;
  if (u && u->planJson.size() > control::kMaxPlanBytes) {
    CORTADO_LOG_ERROR("[scheduler] the new plan has {} bytes, over the limit {}; not sent",
                      u->planJson.size(), control::kMaxPlanBytes);
    u.reset();
  }
  if (u && (u->version == 0 || u->switchAt != switchAt)) {
    CORTADO_LOG_ERROR("[scheduler] the re-planner's plan version {} switches at iteration {}, "
                      "not at {} (window end {} + CORTADO_REPLAN_AHEAD {}); not sent",
                      u->version, u->switchAt, switchAt, windowEnd, opts_.replanAhead);
    u.reset();
  }
  if (u)
    CORTADO_LOG_INFO("[scheduler] plan version {} after window {}: every worker switches at "
                     "iteration {}",
                     u->version, w, u->switchAt);
  sendVerdict(nullptr, w, u);
}

void SchedulerImpl::sendVerdict(Session* to, uint64_t w,
                                const std::optional<control::PlanUpdate>& u) {
  Json body = u ? Json{{"window", w}, {"version", u->version}, {"switchAt", u->switchAt}, {"plan", u->planJson}}
                : Json{{"window", w}, {"version", 0}, {"switchAt", 0}, {"plan", ""}};
  if (to) return to->conn->send(MsgType::kPlanUpdate, body);
  for (auto& [id, ws] : sessions_) {
    if (ws->info.id.role != Role::kWorker || ws->state != Session::State::kRegistered) continue;
    ws->conn->send(MsgType::kPlanUpdate, body);
  }
}

std::string SchedulerImpl::kvKey(const Json& body) {
  std::string key = control::getString(body, "key");
  CORTADO_ENFORCE(!key.empty() && key.size() <= control::kMaxKvKey, ErrorCode::kProtocol,
                  "key-value key of {} bytes (limit {})", key.size(), control::kMaxKvKey);
  return key;
}

void SchedulerImpl::onPut(Session& s, const Json& body) {
  uint64_t req = control::getUInt(body, "req");
  std::string key = kvKey(body);
  std::string hex = control::getString(body, "value");
  CORTADO_ENFORCE(hex.size() % 2 == 0 && hex.size() <= 2 * control::kMaxKvValue &&
                      control::fromHex(hex, hex.size() / 2).has_value(),
                  ErrorCode::kProtocol, "the value put under key '{}' is not hex of at most {} bytes",
                  key, control::kMaxKvValue);
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    if (it->second != hex) {
      return replyFailed(s, req, ErrorCode::kInvalidArgument,
                         fmt::format("{} put key '{}' with another value than the one already "
                                     "there (a key is written once per job; use a new key)",
                                     s.info.id.toString(), key));
    }
    return s.conn->send(MsgType::kValue, Json{{"req", req}, {"value", hex}});
  }
  if (kv_.size() >= control::kMaxKvEntries) {
    return replyFailed(s, req, ErrorCode::kInvalidArgument,
                       fmt::format("{} cannot put key '{}': the job already holds {} keys, the "
                                   "limit",
                                   s.info.id.toString(), key, control::kMaxKvEntries));
  }
  kv_.emplace(key, hex);
  s.conn->send(MsgType::kValue, Json{{"req", req}, {"value", hex}});
  auto waiters = kvWaiters_.extract(key);
  if (waiters.empty()) return;
  pendingGets_ -= waiters.mapped().size();
  for (const auto& w : waiters.mapped()) {
    if (Session* ws = find(w.session)) ws->conn->send(MsgType::kValue, Json{{"req", w.req}, {"value", hex}});
  }
}

void SchedulerImpl::onGet(Session& s, const Json& body) {
  uint64_t req = control::getUInt(body, "req");
  std::string key = kvKey(body);
  if (auto it = kv_.find(key); it != kv_.end())
    return s.conn->send(MsgType::kValue, Json{{"req", req}, {"value", it->second}});
  // A waiter whose caller gave up is answered later and ignored there; the
  // bound keeps a node that polls absent keys from growing this forever.
  if (pendingGets_ >= kMaxPendingGets) {
    return replyFailed(s, req, ErrorCode::kInvalidArgument,
                       fmt::format("{} cannot wait for key '{}': {} gets are already waiting",
                                   s.info.id.toString(), key, kMaxPendingGets));
  }
  kvWaiters_[key].push_back({s.id, req});
  ++pendingGets_;
}

void SchedulerImpl::onBarrier(Session& s, const Json& body) {
  uint64_t req = control::getUInt(body, "req");
  int64_t g = control::getInt(body, "group");
  CORTADO_ENFORCE(g >= 0 && g <= 2, ErrorCode::kProtocol, "unknown barrier group {}", g);
  auto group = static_cast<control::Group>(g);
  std::string name = control::getString(body, "name");
  const char* groupName = group == control::Group::kAll       ? "all"
                          : group == control::Group::kWorkers ? "workers"
                                                              : "servers";
  Role role = s.info.id.role;
  bool member = group == control::Group::kAll ||
                (group == control::Group::kWorkers && role == Role::kWorker) ||
                (group == control::Group::kServers && role == Role::kServer);
  if (!member) {
    return replyFailed(s, req, ErrorCode::kInvalidArgument,
                       fmt::format("{} cannot enter barrier '{}' of group {}: not a member",
                                   s.info.id.toString(), name, groupName));
  }
  size_t size = group == control::Group::kAll ? opts_.numWorkers + opts_.numServers
                : group == control::Group::kWorkers ? opts_.numWorkers
                                                    : opts_.numServers;
  auto& b = barriers_[{static_cast<int>(g), name}];
  if (!b.entered.insert(s.info.id).second) {
    return replyFailed(s, req, ErrorCode::kInvalidArgument,
                       fmt::format("{} entered barrier '{}' (group {}) twice",
                                   s.info.id.toString(), name, groupName));
  }
  b.waiters.push_back({s.id, req});
  if (b.entered.size() < size) return;
  auto waiters = std::move(b.waiters);
  barriers_.erase({static_cast<int>(g), name});
  for (const auto& w : waiters) {
    if (Session* ws = find(w.session))
      ws->conn->send(MsgType::kBarrierDone, Json{{"req", w.req}});
  }
  CORTADO_LOG_DEBUG("[scheduler] barrier '{}' (group {}) of {} nodes passed", name, groupName,
                    size);
}

void SchedulerImpl::onStall(Session& s, const Json& body) {
  if (s.info.id.role != Role::kServer) {
    CORTADO_LOG_WARN("[scheduler] {} sent Stall, which only servers send; ignored", s.label());
    return;
  }
  const uint64_t key = control::getUInt(body, "key");
  const uint64_t round = control::getUInt(body, "round");
  const int64_t expected = control::getInt(body, "expected");
  const uint64_t waitedMs = control::getUInt(body, "waitedMs");
  const std::string tensor = control::getString(body, "tensor");
  CORTADO_ENFORCE(body.contains("pushed") && body["pushed"].is_array(), ErrorCode::kProtocol,
                  "Stall: field 'pushed' is missing or not an array");
  std::set<int64_t> pushed;
  for (const auto& w : body["pushed"]) {
    CORTADO_ENFORCE(
        w.is_number_integer() && w.get<int64_t>() >= 0 && w.get<int64_t>() < opts_.numWorkers,
        ErrorCode::kProtocol, "Stall: 'pushed' holds {}, not a worker rank of this job", w.dump());
    pushed.insert(w.get<int64_t>());
  }
  const uint64_t tensorKey = tensorKeyOf(key), chunk = chunkIndexOf(key);
  // One line per tensor and round (its other chunks stall with it), decided
  // before the line is built; the explanation comes with the first.
  if (!stallsLogged_.insert({tensorKey, round}).second) return;
  if (stallsLogged_.size() > 4096) stallsLogged_ = {{tensorKey, round}};
  std::string what = decls_.labelOfKey(tensorKey).value_or(
      tensor.empty() ? fmt::format("of key {}", tensorKey) : fmt::format("'{}'", tensor));
  auto ranks = [](const std::vector<int64_t>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i)
      out += fmt::format("{}{}", i == 0 ? "" : i + 1 == v.size() ? " and " : ", ", v[i]);
    return fmt::format("worker{} {}", v.size() == 1 ? "" : "s", out);
  };
  std::vector<int64_t> have(pushed.begin(), pushed.end()), missing;
  std::string waitsFor;
  if (expected == opts_.numWorkers) {
    for (int64_t w = 0; w < opts_.numWorkers; ++w)
      if (!pushed.count(w)) missing.push_back(w);
    waitsFor = ranks(missing);
  } else {
    waitsFor = fmt::format("{} more of the workers that push it ({} per round)",
                           expected - int64_t(have.size()), expected);
  }
  const std::string line = fmt::format(
      "stall: tensor {} (chunk {}, on {}): round {} has the pushes of {} for {:.1f} s "
      "and still waits for {}.",
      what, chunk, s.info.id.toString(), round, have.empty() ? "no worker" : ranks(have),
      double(waitedMs) / 1000.0, waitsFor);
  CORTADO_LOG_WARN("[scheduler] {}{}", line,
                   std::exchange(stallExplained_, true)
                       ? ""
                       : " A worker that never pushes this tensor (a parameter without a gradient "
                         "on that worker, a branch only some workers take), or that pushes its "
                         "tensors in another order than the others, stalls the job: every worker "
                         "must push the same tensors in the same order. The waits fail at their "
                         "deadline (CORTADO_TIMEOUT_MS); CORTADO_STALL_CHECK_MS sets when a round "
                         "is reported (0: never).");
  {
    std::lock_guard<std::mutex> lk(processesMu_);
    if (stallLines_.size() < 16) stallLines_.push_back(line);
  }
  // The workers' waits that time out quote it (ControlClient::stallNotes).
  const Json notice{{"key", tensorKey}, {"round", round}, {"text", line}};
  for (auto& [id, ws] : sessions_)
    if (ws->state == Session::State::kRegistered && ws->info.id.role == Role::kWorker)
      ws->conn->send(MsgType::kStalled, notice);
}

void SchedulerImpl::onFinish(Session& s) {
  if (s.info.id.role != Role::kWorker) {
    CORTADO_LOG_WARN("[scheduler] {} sent Finish, which only workers send; ignored", s.label());
    return;
  }
  if (s.finished) return;
  s.finished = true;
  ++finishedWorkers_;
  CORTADO_LOG_INFO("[scheduler] {} finished ({}/{} workers)", s.info.id.toString(),
                   finishedWorkers_, opts_.numWorkers);
  if (finishedWorkers_ == opts_.numWorkers) endJob(Status(), 0);
}

void SchedulerImpl::refuse(Session& s, ErrorCode code, const std::string& message) {
  CORTADO_LOG_WARN("[scheduler] refused {}: {}", s.label(), message);
  s.conn->send(MsgType::kRefused, Json{{"code", control::errorCodeToWire(code)},
                                       {"message", message}});
  s.conn->finishSending();
  s.state = Session::State::kClosing;
  // The node closes when it reads the refusal; bound the wait if it does not.
  uint64_t sid = s.id;
  s.timer.expires_after(kLinger);
  s.timer.async_wait([this, sid](const boost::system::error_code& ec) {
    if (!ec) drop(sid);
  });
}

void SchedulerImpl::replyFailed(Session& s, uint64_t req, ErrorCode code, const std::string& message) {
  CORTADO_LOG_WARN("[scheduler] {}", message);
  s.conn->send(MsgType::kRequestFailed, Json{{"req", req},
                                             {"code", control::errorCodeToWire(code)},
                                             {"message", message}});
}

}  // namespace cortado::scheduler::detail
