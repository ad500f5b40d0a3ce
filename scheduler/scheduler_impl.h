// The scheduler's implementation (private to scheduler/): one class, whose
// members are defined in scheduler.cc (its life: listening, sessions,
// liveness, the end of the job) and scheduler_requests.cc (what the nodes
// ask: the handshake, registration, declarations, profiles and verdicts,
// the key-value rendezvous, barriers, finishing).
//
// The scheduler service: one io_context, run on the thread that calls run().
// Every session (one per node connection) and every table is touched only on
// that thread; stop() posts to it. Re-planning decisions run on a thread of
// their own (planner_), which posts each verdict back to the io thread.
#pragma once

#include "scheduler/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>  // before asio: Boost 1.74 needs it in C++20
#include <boost/asio.hpp>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "core/common/dtype.h"
#include "core/common/logging.h"
#include "core/common/node.h"
#include "core/control/auth.h"
#include "core/control/connection.h"
#include "core/control/control_client.h"
#include "core/control/protocol.h"
#include "scheduler/declaration_table.h"

namespace cortado::scheduler::detail {

namespace asio = boost::asio;
using asio::ip::tcp;
using control::Connection;
using control::Json;
using control::MsgType;
using namespace std::chrono_literals;

// How long a closing connection may take to read our last frame and close.
inline constexpr Millis kLinger{2000};

inline std::string plural(int n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

struct Session {
  enum class State { kHandshake, kAuthenticated, kRegistered, kClosing };

  Session(uint64_t id, std::shared_ptr<Connection> c, asio::io_context& io)
      : id(id), conn(std::move(c)), timer(io) {}

  // "127.0.0.1:4242" before registration; "worker 3 at 127.0.0.1:4242" after.
  std::string label() const {
    if (state == State::kRegistered || (state == State::kClosing && registered)) {
      if (info.id.rank >= 0) return fmt::format("{} at {}", info.id.toString(), conn->remote());
      return fmt::format("{} (rank not yet assigned) at {}", roleName(info.id.role),
                         conn->remote());
    }
    return conn->remote();
  }

  uint64_t id;
  std::shared_ptr<Connection> conn;
  asio::steady_timer timer;  // handshake deadline, then the linger on refusal
  State state = State::kHandshake;
  bool registered = false;
  std::string nodeNonce;
  std::string schedulerNonce;
  NodeInfo info;
  int requestedRank = -1;
  uint64_t arrival = 0;
  Clock::time_point lastHeard = Clock::now();
  bool finished = false;
};

class SchedulerImpl final : public Scheduler {
 public:
  explicit SchedulerImpl(SchedulerOptions opts);

  int port() const override { return port_; }

  Status run() override;

  void stop() override;

  void fail(Status reason) override;

  std::vector<std::pair<std::string, int>> registeredProcesses() const override {
    std::lock_guard<std::mutex> lk(processesMu_);
    return processes_;
  }

  std::vector<std::string> stalls() const override {
    std::lock_guard<std::mutex> lk(processesMu_);
    return stallLines_;
  }

 private:
  enum class Phase { kRegistering, kRunning, kEnding };

  struct Waiter {
    uint64_t session;
    uint64_t req;
  };
  struct BarrierState {
    std::set<NodeId> entered;
    std::vector<Waiter> waiters;
  };

  // --- listening ----------------------------------------------------------------

  void listen();

  void accept();

  void onAccepted(tcp::socket socket);

  Session* find(uint64_t sid);

  // Closes and forgets a session (no death semantics: the caller decided).
  void drop(uint64_t sid);

  // --- messages -----------------------------------------------------------------

  void onMessage(uint64_t sid, MsgType type, const Json& body);

  void onHello(Session& s, const Json& body);

  void onProof(Session& s, const Json& body);

  void onRegister(Session& s, const Json& body);

  void completeRegistration();

  // Empty when the workers' hosts match SchedulerOptions::workersPerHost.
  std::string misplacedWorkers(const std::vector<Session*>& all) const;

  void onRegistrationDeadline();

  void onDeclare(Session& s, const Json& body);

  // Called when a declaration is left pending: when every worker now waits
  // in one, arms declareTimer_ (SchedulerOptions::declareCheck), which
  // fails the job if they all still wait and none was agreed meanwhile.
  void checkDeclarations();

  void onDeclareCheck(size_t agreedWhenArmed);

  // --- online re-planning (ControlClient::sendProfile, PlanUpdate) -------------

  // A malformed report is refused to its sender (kProtocol naming the field);
  // the job goes on. When every worker reported a window, the replanner runs
  // and its plan goes to every worker.
  void onProfile(Session& s, const Json& body);

  // The replanner's answer for window `w`, on the io thread: checked, then
  // sent to every worker (the plan, or "keep the current plan").
  void decided(uint64_t w, uint64_t switchAt, uint64_t windowEnd,
               std::optional<control::PlanUpdate> u);

  // The verdict on window `w` (a plan, or "keep the current plan" when `u` is
  // empty) to one worker, or to every registered worker when `to` is null.
  void sendVerdict(Session* to, uint64_t w, const std::optional<control::PlanUpdate>& u);

  // --- key-value rendezvous (ControlClient::put/get) ---------------------------

  // The key of a Put or Get; a malformed one closes the session (kProtocol).
  static std::string kvKey(const Json& body);

  void onPut(Session& s, const Json& body);

  void onGet(Session& s, const Json& body);

  void onBarrier(Session& s, const Json& body);

  void onFinish(Session& s);

  // A server's stall report (ControlClient::reportStall): logged, naming the
  // tensor, its chunk and the workers whose pushes the round waits for.
  void onStall(Session& s, const Json& body);

  void refuse(Session& s, ErrorCode code, const std::string& message);

  void replyFailed(Session& s, uint64_t req, ErrorCode code, const std::string& message);

  // --- liveness -----------------------------------------------------------------

  Millis pingInterval() const;

  void heartbeatTick();

  void onClosed(uint64_t sid, const std::string& reason, bool malformed);

  void nodeDead(Session& s, const std::string& why);

  // Ends the job once: tells every authenticated node (Shutdown when `st` is
  // OK, else Abort with `st`), half-closes, and lets run() return when every
  // connection has closed or the linger passed.
  void endJob(const Status& st, uint64_t deadSid);

  SchedulerOptions opts_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer registrationTimer_;
  asio::steady_timer heartbeatTimer_;
  asio::steady_timer lingerTimer_;
  asio::steady_timer declareTimer_;
  bool declareTimerArmed_ = false;
  int port_ = 0;
  std::string listenAddress_;
  std::atomic<bool> started_{false};
  mutable std::mutex processesMu_;  // registeredProcesses() and stalls(), from any thread
  std::vector<std::pair<std::string, int>> processes_;
  std::vector<std::string> stallLines_;  // the first 16 onStall lines

  // io-thread state
  Phase phase_ = Phase::kRegistering;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_;
  uint64_t nextSession_ = 1;  // 0 means "no session"
  uint64_t nextArrival_ = 0;
  int registered_[3] = {0, 0, 0};  // indexed by Role
  std::vector<uint64_t> servers_;  // session by rank, once registration completed
  std::vector<uint64_t> workers_;
  DeclarationTable decls_;
  // onStall: the (tensor key, round) pairs logged, and whether the first
  // line explained what a stall means.
  std::set<std::pair<uint64_t, uint64_t>> stallsLogged_;
  bool stallExplained_ = false;
  std::map<std::pair<std::string, uint32_t>, std::vector<Waiter>> declWaiters_;  // (name, incarnation)
  // How many of declWaiters_ each worker has (by rank), and how many workers
  // have any: checkDeclarations' test, kept as declarations wait and agree.
  std::vector<int> declarationsWaited_;
  int workersWaiting_ = 0;
  std::map<std::pair<int, std::string>, BarrierState> barriers_;
  static constexpr size_t kMaxPendingGets = 65536;
  std::map<std::string, std::string> kv_;  // key -> value as hex
  std::map<uint64_t, std::vector<std::optional<plan::ProfileReport>>> windows_;  // by window
  uint64_t nextWindow_ = 0;    // windows below it are complete (decided or being decided)
  uint64_t verdictsSent_ = 0;  // windows below it have had their verdict sent
  std::map<std::string, std::vector<Waiter>> kvWaiters_;
  size_t pendingGets_ = 0;
  int finishedWorkers_ = 0;
  Status final_;
  // Last, so that it is joined first: a decision still running when the
  // scheduler is destroyed finishes (its verdict, posted to an io_context
  // that no longer runs, is dropped); one not started is not run.
  asio::thread_pool planner_{1};
};

}  // namespace cortado::scheduler::detail
