#include "launcher/roles.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "core/backends.h"
#include "core/common/crash.h"
#include "core/common/logging.h"
#include "core/common/memory.h"
#include "core/control/control_client.h"
#include "core/shm/shm_segment.h"
#include "scheduler/replan.h"
#include "scheduler/scheduler.h"
#include "server/server_engine.h"

namespace cortado::launcher {

namespace {

scheduler::Replanner replannerFor(const JobConfig& job) {
  if (job.profileWindow == 0) return {};
  scheduler::ReplanOptions ro;
  ro.codec = job.replanCodec;
  ro.ahead = job.replanAhead;
  ro.threshold = job.replanThreshold;
  ro.minGain = job.replanMinGain;
  ro.confirmWindows = job.replanConfirm;
  ro.cpuCores = int(std::max(1u, std::thread::hardware_concurrency()));
  ro.chunkBytes = double(job.partitionBytes);
  try {
    return scheduler::makeReplanner(ro);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("online re-planning (CORTADO_PROFILE_WINDOW={}): {}", job.profileWindow, e.what()));
  }
}

}  // namespace

scheduler::SchedulerOptions schedulerOptions(const JobConfig& job, const std::string& bindHost) {
  scheduler::SchedulerOptions so;
  so.bindHost = bindHost;
  so.port = job.schedulerPort;
  so.token = job.token;
  so.numWorkers = job.numWorkers;
  so.numServers = job.numServers;
  so.heartbeatTimeout = job.heartbeatTimeout;
  so.declareCheck = job.declareCheck;
  so.registrationTimeout = job.connectTimeout * 2;
  so.replanner = replannerFor(job);
  so.replanAhead = job.replanAhead;
  return so;
}

int runSchedulerRole(const JobConfig& job) {
  installCrashReport("cortado scheduler");
  auto sched = scheduler::Scheduler::create(schedulerOptions(job, "0.0.0.0"));
  CORTADO_LOG_INFO("listening on port {} for {} servers and {} workers", sched->port(),
                   job.numServers, job.numWorkers);
  Status s = sched->run();
  if (!s.ok()) {
    CORTADO_LOG_ERROR("job failed: {}", s.message());
    return 1;
  }
  CORTADO_LOG_INFO("job finished");
  return 0;
}

int runServerRole(const JobConfig& job) {
  const NodeId self{Role::kServer, job.rank};
  installCrashReport(fmt::format("cortado server {}", job.rank));
  auto transport = makeTransport(job, self);
  server::ServerEngineOptions eo;
  eo.numWorkers = job.numWorkers;
  eo.engineThreads = job.serverThreads;
  eo.inlineBytes = job.inlineBytes;
  eo.compactSparse = job.compactSparse;
  eo.async = job.async;
  eo.pushBudget = job.serverPushBytes;
  eo.self = self;
  if (job.sharedMemory) eo.shmPrefix = shm::jobPrefix(job.token);
  TraceOptions to = TraceOptions::fromEnv(fmt::format("server {}", job.rank));
  if (!job.traceDir.empty()) to.dir = job.traceDir;
  if (to.dir.empty() == false) eo.tracer = std::make_shared<Tracer>(to);
  // Stalled rounds go to the scheduler, which names the tensor and the
  // workers; the engine's threads may report from now until the client goes.
  struct StallSink {
    std::mutex mu;
    control::ControlClient* client = nullptr;
  };
  auto sink = std::make_shared<StallSink>();
  eo.stallAfter = job.stallCheck;
  eo.onStall = [sink](const StallReport& r) {
    std::lock_guard<std::mutex> lk(sink->mu);
    if (sink->client) sink->client->reportStall(r);
  };
  MemoryPeaks memory;  // the baseline: before any key
  server::ServerEngine engine(eo, *transport);
  transport->setCallbacks([&](transport::Message&& m) { engine.handle(std::move(m)); },
                          [&](const NodeId& peer, const Status& st) {
                            // The transport logged it; the scheduler decides
                            // whether the peer is dead.
                            CORTADO_LOG_DEBUG("data plane: {}: {}", peer.toString(), st.message());
                          });
  control::ClientOptions co = controlOptions(job, Role::kServer);
  co.dataAddress = transport->listen(dataListenAddress(job));
  co.sharedMemory = !eo.shmPrefix.empty();
  co.pushBudget = eo.pushBudget;
  auto control = control::ControlClient::create(co);
  struct SinkUnset {  // before the client goes, whatever way this returns
    std::shared_ptr<StallSink> s;
    ~SinkUnset() {
      std::lock_guard<std::mutex> lk(s->mu);
      s->client = nullptr;
    }
  } unset{sink};
  {
    std::lock_guard<std::mutex> lk(sink->mu);
    sink->client = control.get();
  }
  int code = 0;
  try {
    auto book = control->connect(Deadline::after(job.connectTimeout));
    CORTADO_ENFORCE(control->self() == self, ErrorCode::kInternal,
                    "the scheduler assigned {} but this transport is {}", control->self().toString(),
                    self.toString());
    for (const auto& w : book.workers) transport->connect(w.id, w.dataAddress);
    CORTADO_LOG_INFO("serving {} workers with {} engine threads ({} mode, transport {})",
                     book.workers.size(), eo.engineThreads, eo.async ? "async" : "sync",
                     transport->name());
    // Wake now and then only to notice a failure that the client recorded
    // (and to sample the memory report's peaks).
    uint64_t peakKeyBytes = 0;
    auto sample = [&] {
      if (!job.reportMemory) return;
      memory.sample();
      peakKeyBytes = std::max(peakKeyBytes, engine.stats().keyBytes);
    };
    while (!control->waitShutdown(Deadline::after(Millis(job.reportMemory ? 200 : 1000)))) {
      Status f = control->failure();
      if (!f.ok()) f.check();
      sample();
    }
    sample();
    if (job.reportMemory)
      printServerMemory(job.rank, memory, peakKeyBytes,
                        eo.shmPrefix.empty() ? 0 : shm::ownedSegmentBytes(eo.shmPrefix, self));
    auto st = engine.stats();
    CORTADO_LOG_INFO(
        "shutdown: {} pushes, {} pulls, {} rounds, {} errors; {} messages of small "
        "keys processed on the transport's thread",
        st.pushes, st.pulls, st.roundsCompleted, st.errors, st.inlined);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kClosed) {
      CORTADO_LOG_INFO("the scheduler ended the job: {}", e.what());
    } else {
      CORTADO_LOG_ERROR("{}", e.what());
      code = 1;
    }
  }
  engine.stop();
  if (eo.tracer) {
    try {
      CORTADO_LOG_INFO("trace written to {}", eo.tracer->flush());
    } catch (const Error& e) {
      CORTADO_LOG_ERROR("{}", e.what());
    }
  }
  transport->close();
  control->close();
  return code;
}

}  // namespace cortado::launcher
