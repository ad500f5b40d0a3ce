// The scheduler role: the job's control-plane service (Boost.Asio, one io
// thread). It authenticates every connection with the job token, registers
// nodes and assigns ranks, sends the address book, runs barriers, checks
// tensor declarations across workers, watches heartbeats, and tells everyone
// when a node dies or when the job is over.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/control/control_client.h"
#include "core/plan/profile_report.h"

#include "core/common/deadline.h"
#include "core/common/error.h"

namespace cortado::scheduler {

// Online re-planning (docs/planner.md): called on the scheduler's planner
// thread (not its io thread: the control plane is served while it runs), one
// window at a time in window order, with every worker's report of one
// profiling window (index = worker rank);
// returns a plan to hand out to every worker (PlanUpdate), or nothing to keep
// the current one. An exception is logged and the current plan kept.
using Replanner =
    std::function<std::optional<control::PlanUpdate>(const std::vector<plan::ProfileReport>&)>;

struct SchedulerOptions {
  std::string bindHost = "0.0.0.0";
  int port = 0;  // 0: pick a free port (see Scheduler::port())
  std::string token;
  int numWorkers = 1;
  int numServers = 1;
  Millis heartbeatTimeout{10000};     // a node silent this long is dead
  Millis registrationTimeout{60000};  // every node must register within this
  // A connection must prove the job token and register within this.
  Millis handshakeTimeout{10000};
  // When every worker waits in a declaration that some other worker has not
  // made (each waits for the others, none can go on: workers that declare
  // different tensors) and no declaration is agreed for this long, the job
  // fails naming what each worker waits for (CORTADO_DECLARE_CHECK_MS;
  // 0: never, the workers' declarations then fail at their deadline).
  Millis declareCheck{10000};
  // Empty: profile reports are acknowledged and dropped (no re-planning).
  Replanner replanner;
  // A plan made from a window that ends at iteration e takes effect at
  // iteration e + replanAhead (CORTADO_REPLAN_AHEAD): the acknowledgement of
  // every report says so, and the workers wait for the verdict on the window
  // before they run iteration e + replanAhead - 1. At least 1.
  uint64_t replanAhead = 10;
  // How many workers each machine runs, when the launcher placed them
  // (cortado launch --hosts: -w per host). Empty: not checked. Otherwise the
  // workers' hostnames, counted, must give the same numbers (names are not
  // compared: a host list may hold addresses); a job whose workers landed
  // elsewhere (an MPI launcher that ignored the host list) fails at
  // registration, naming where they are.
  std::vector<int> workersPerHost;
};

class Scheduler {
 public:
  // Binds the port; throws Error(kUnavailable) naming the address when it is
  // in use, Error(kInvalidArgument) for bad options (e.g. an empty token).
  static std::unique_ptr<Scheduler> create(SchedulerOptions opts);
  virtual ~Scheduler() = default;

  virtual int port() const = 0;

  // Serves until the job ends. OK when every worker finished and every node
  // was told to shut down; otherwise the reason (a dead node, a registration
  // deadline, a declaration mismatch), after every live node was told.
  virtual Status run() = 0;

  // Thread-safe: ends run() early with Status kClosed; nodes are told.
  // Destroy the Scheduler only after run() returned (or if it never ran).
  virtual void stop() = 0;

  // Thread-safe: fails the job with `reason` (run() returns it), and every
  // node is told it, unless the job already ended. The launcher uses it when
  // a role's process dies, so that the others hear which one even when the
  // process exit is noticed before its control connection closes.
  virtual void fail(Status reason) = 0;

  // Thread-safe: (host name, pid) of every node that registered so far, as
  // the nodes reported them. The launcher stops at once, when the job fails,
  // a role of its own that never registered: it cannot hear the job's end.
  virtual std::vector<std::pair<std::string, int>> registeredProcesses() const = 0;

  // Thread-safe: the stalled rounds the servers reported, as logged ("stall:
  // tensor 't2' (chunk 0, on server 0): round 1 has ..."), the first 16. The
  // launcher repeats the first when the job fails.
  virtual std::vector<std::string> stalls() const = 0;
};

}  // namespace cortado::scheduler
