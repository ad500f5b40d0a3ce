// A job in one process for the engine tests: a real scheduler, S servers and
// W workers as threads, connected by the in-process transport (STYLE.md §10).
#pragma once

#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/shm/shm_segment.h"
#include "core/transport/inproc/factory.h"
#include "core/worker.h"
#include "scheduler/scheduler.h"
#include "server/server_engine.h"

namespace cortado::test {

using transport::Message;

inline const std::string kToken = "engine-test-token";

struct ServerNode {
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<server::ServerEngine> engine;
  std::unique_ptr<control::ControlClient> control;
};

// A job of W workers and S servers in this process.
class Job {
 public:
  // Given worker (or server) w's transport, returns the one it uses (a
  // test's wrapper that watches what it sends, or the shared-memory rings).
  using WrapTransport = std::function<std::unique_ptr<transport::Transport>(
      int w, std::unique_ptr<transport::Transport>)>;

  // shm: servers serve same-host shared memory (every node here shares the
  // host), so pushes and results travel as descriptors, not bytes.
  // serverInlineBytes: ServerEngineOptions::inlineBytes (keys summed on the
  // transport's thread). serverCompact: ServerEngineOptions::compactSparse.
  // serverPushBudget: ServerEngineOptions::pushBudget, advertised to the
  // workers as the server role does.
  Job(int W, int S, const WorkerOptions& wo = {}, bool async = false, bool shm = false,
      uint64_t serverInlineBytes = server::ServerEngineOptions{}.inlineBytes,
      bool serverCompact = true, WrapTransport wrapWorker = nullptr,
      uint64_t serverPushBudget = 0, WrapTransport wrapServer = nullptr)
      : hub_(transport::inproc::createHub()), async_(async) {
    // A token per job: the shared-memory segments are named after it.
    static int jobs = 0;
    token_ = fmt::format("{}-{}-{}", kToken, getpid(), jobs++);
    const std::string shmPrefix = shm::jobPrefix(token_);
    scheduler::SchedulerOptions so;
    so.bindHost = "127.0.0.1";
    so.token = token_;
    so.numWorkers = W;
    so.numServers = S;
    so.heartbeatTimeout = Millis(5000);
    so.registrationTimeout = Millis(20000);
    sched_ = scheduler::Scheduler::create(so);
    schedRun_ = std::async(std::launch::async, [this] { return sched_->run(); });
    std::vector<std::future<void>> serverUp;
    for (int s = 0; s < S; ++s) {
      auto n = std::make_unique<ServerNode>();
      NodeId id{Role::kServer, s};
      n->transport = transport::inproc::create(hub_, id);
      if (wrapServer) n->transport = wrapServer(s, std::move(n->transport));
      server::ServerEngineOptions eo;
      eo.numWorkers = W;
      eo.engineThreads = 2;
      eo.inlineBytes = serverInlineBytes;
      eo.compactSparse = serverCompact;
      eo.async = async;
      eo.pushBudget = serverPushBudget;
      eo.self = id;
      if (shm) eo.shmPrefix = shmPrefix;
      n->engine = std::make_unique<server::ServerEngine>(eo, *n->transport);
      auto* eng = n->engine.get();
      n->transport->setCallbacks([eng](Message&& m) { eng->handle(std::move(m)); },
                                 [](const NodeId&, const Status&) {});
      control::ClientOptions co = clientOptions(Role::kServer, s);
      co.dataAddress = n->transport->listen(fmt::format("inproc://server-{}", s));
      co.sharedMemory = shm;
      co.pushBudget = serverPushBudget;
      n->control = control::ControlClient::create(co);
      auto* raw = n.get();
      serverUp.push_back(std::async(std::launch::async, [raw] {
        auto book = raw->control->connect(Deadline::after(Millis(20000)));
        for (auto& w : book.workers) raw->transport->connect(w.id, w.dataAddress);
      }));
      servers_.push_back(std::move(n));
    }
    std::vector<std::future<std::unique_ptr<Worker>>> up;
    for (int w = 0; w < W; ++w) {
      up.push_back(std::async(std::launch::async, [this, w, wo, wrapWorker] {
        WorkerOptions o = wo;
        o.async = async_;
        o.sharedMemory = true;  // used where a server offers it
        o.listenAddress = fmt::format("inproc://worker-{}", w);
        auto t = transport::inproc::create(hub_, NodeId{Role::kWorker, w});
        if (wrapWorker) t = wrapWorker(w, std::move(t));
        return Worker::start(o, clientOptions(Role::kWorker, w), std::move(t),
                             Deadline::after(Millis(20000)));
      }));
    }
    for (auto& f : up) workers.push_back(f.get());
    for (auto& f : serverUp) f.get();
  }

  ~Job() {
    std::vector<std::future<void>> down;
    for (auto& w : workers)
      down.push_back(std::async(std::launch::async, [&w] { w->shutdown(Deadline::after(Millis(10000))); }));
    // After a failed job, shutdown() may rethrow the job's failure (when it
    // reaches the worker after its declare already threw); the test checked
    // that failure already, and a destructor must not throw.
    for (auto& d : down) {
      try {
        d.get();
      } catch (const Error&) {
      }
    }
    sched_->stop();
    schedRun_.wait_for(std::chrono::seconds(10));
    for (auto& s : servers_) {
      s->engine->stop();
      s->transport->close();
      s->control->close();
    }
  }

  control::ClientOptions clientOptions(Role role, int rank) {
    control::ClientOptions co;
    co.schedulerHost = "127.0.0.1";
    co.schedulerPort = sched_->port();
    co.token = token_;
    co.role = role;
    co.requestedRank = rank;
    co.connectTimeout = Millis(20000);
    co.heartbeatInterval = Millis(200);
    return co;
  }

  // Every server's counters, summed.
  server::ServerStats serverStats() const {
    server::ServerStats t;
    for (const auto& s : servers_) t += s->engine->stats();
    return t;
  }

  // Server s's counters.
  server::ServerStats serverStats(int s) const { return servers_.at(s)->engine->stats(); }

  // Polls serverStats() until `done` holds or 10 s passed; returns the last.
  server::ServerStats waitServers(const std::function<bool(const server::ServerStats&)>& done) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    server::ServerStats s = serverStats();
    while (!done(s) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      s = serverStats();
    }
    return s;
  }

  // Runs f(rank) on every worker at once and waits.
  void onEveryWorker(const std::function<void(int)>& f) {
    std::vector<std::future<void>> fs;
    for (int r = 0; r < int(workers.size()); ++r) fs.push_back(std::async(std::launch::async, f, r));
    for (auto& x : fs) x.get();
  }

  // Shared-memory segments of this job in /dev/shm now.
  int segments() const {
    const std::string stem = shm::jobPrefix(token_).substr(1);
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      n += e.path().filename().string().rfind(stem, 0) == 0;
    return n;
  }

  // The pages the segments of `owner` hold now (shm::ownedSegmentBytes).
  uint64_t ownedSegmentBytes(const NodeId& owner) const {
    return shm::ownedSegmentBytes(shm::jobPrefix(token_), owner);
  }

  std::vector<std::unique_ptr<Worker>> workers;

 private:
  std::shared_ptr<transport::inproc::Hub> hub_;
  std::unique_ptr<scheduler::Scheduler> sched_;
  std::future<Status> schedRun_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
  bool async_ = false;
  std::string token_;
};

}  // namespace cortado::test
