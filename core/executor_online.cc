// Online re-planning on the worker (core/executor.h, "online re-planning"):
// profiling windows and their reports, the scheduler's verdicts, and plan
// switches at an iteration boundary.
#include "core/executor_run.h"

#include <algorithm>

namespace cortado::executor {

void Executor::noteReady(TensorState& t, const BatchItem& item) {
  Profiler* prof = prof_ && prof_->active ? prof_.get() : nullptr;
  if (prof && prof->readyThisIter.insert(t.name).second) {
    // Ready time: compute time since the iteration began; given by a caller
    // that runs gradients beside the computation, else now with the time
    // spent in the executor taken out (as if communication overlapped it).
    auto& [elements, acc] = prof->ready[t.name];
    elements = t.n;
    ++acc.calls;
    const double us =
        item.readyAt
            ? std::chrono::duration<double, std::micro>(*item.readyAt - prof->iterStart).count()
            : Profiler::since(prof->iterStart) - prof->inRunUs;
    acc.us += std::max(0.0, us);
  }
}

// The last iteration before a scheduled switch: the switch retires every
// shard key of this plan (the next plan's keys are new), so the servers
// flush their residuals into this round's answers (Exchange::flushResidual).
bool Executor::lastRound() const {
  return begun_ && scheduled_ && scheduled_->second == iteration_ + 1;
}

OnlineOptions onlineOptions(const JobConfig& job) {
  OnlineOptions o;
  o.window = job.profileWindow;
  o.warmup = 1;
  o.exchange = true;
  return o;
}

void Executor::setOnline(const OnlineOptions& o) {
  online_ = o;
  // Without this the window open last stayed open: every later run() was
  // timed into it, and a window turned on again closed with those runs in it.
  prof_.reset();
}

void Executor::schedulePlan(const plan::Plan& p, uint64_t switchAt) {
  const uint64_t current = plan_ ? plan_->version : 0;
  CORTADO_ENFORCE(!begun_ || switchAt > iteration_, ErrorCode::kMismatch,
                  "worker {}: plan version {} (switch at iteration {}) arrived at iteration {}, "
                  "after its switch iteration; this worker still runs plan version {} while the "
                  "others switched: the plan reached it too late (raise CORTADO_REPLAN_AHEAD)",
                  topo_.rank, p.version, switchAt, iteration_, current);
  CORTADO_ENFORCE(p.version > current, ErrorCode::kInvalidArgument,
                  "worker {}: plan version {} is not newer than the current plan version {}",
                  topo_.rank, p.version, current);
  scheduled_ = std::make_pair(p, switchAt);
}

void Executor::closeWindow(Deadline deadline) {
  Profiler& pr = *prof_;
  plan::ProfileReport r;
  r.rank = topo_.rank;
  r.machines = topo_.numMachines;
  r.localSize = topo_.localSize;
  r.collectives = groups_ != nullptr;
  r.planVersion = plan_ ? plan_->version : 0;
  r.window = windowIndex_++;
  r.firstIteration = pr.firstIteration;
  r.endIteration = iteration_;
  if (iteration_ > pr.firstIteration)
    r.iterationUs = Profiler::since(pr.windowStart) / double(iteration_ - pr.firstIteration);
  r.hostMemory = true;  // this executor's buffers; "gpu" codec steps run the CPU codec
  r.fusionBytes = pr.batched ? fusionBytes_ : 0;
  for (const auto& [name, e] : pr.ready) {
    plan::ReadyTime t{name, e.first, e.second.us / double(std::max<uint64_t>(1, e.second.calls))};
    // The plan it runs, each distinct option once.
    if (auto it = tensors_.find(name); it != tensors_.end() && !it->second->option.steps.empty()) {
      auto o = std::find(r.options.begin(), r.options.end(), it->second->option);
      t.option = int(o - r.options.begin());
      if (o == r.options.end()) r.options.push_back(it->second->option);
    }
    r.ready.push_back(std::move(t));
  }
  for (const auto& [k, a] : pr.codecs)
    r.codecs.push_back({std::get<0>(k), plan::Device::kCpu, std::get<1>(k), std::get<2>(k), a.calls, a.us, a.maxUs});
  for (const auto& [k, a] : pr.comms)
    r.comms.push_back({plan::CommOp(std::get<0>(k)), plan::Scope(std::get<1>(k)), std::get<2>(k),
                       std::get<3>(k), std::get<4>(k), std::get<5>(k), std::get<6>(k), std::get<7>(k),
                       a.calls, a.us});
  lastReport_ = r;
  if (online_.exchange) {
    const uint64_t at = worker_.controlClient().sendProfile(plan::toJsonString(r), deadline);
    if (at > 0) {
      CORTADO_ENFORCE(at > iteration_, ErrorCode::kProtocol,
                      "worker {}: the scheduler says a plan from window {} (ending at iteration "
                      "{}) would take effect at iteration {}, which is not later",
                      topo_.rank, r.window, iteration_, at);
      awaiting_.push_back({r.window, at});
    }
  }
}

void Executor::beginIteration(uint64_t iteration, Deadline deadline) {
  CORTADO_ENFORCE(!begun_ || iteration > iteration_, ErrorCode::kInvalidArgument,
                  "worker {}: beginIteration({}) after iteration {}: iterations must increase",
                  topo_.rank, iteration, iteration_);
  CORTADO_ENFORCE(!begun_ || online_.window == 0 || iteration == iteration_ + 1,
                  ErrorCode::kInvalidArgument,
                  "worker {}: beginIteration({}) after iteration {}: with online re-planning "
                  "(CORTADO_PROFILE_WINDOW) every iteration is begun, one after the other",
                  topo_.rank, iteration, iteration_);
  begun_ = true;
  iteration_ = iteration;
  // 1. Close the window that ends here; open the next.
  if (online_.window > 0) {
    if (!prof_) prof_ = std::make_unique<Profiler>();
    if (prof_->active && iteration >= prof_->firstIteration + online_.window) {
      closeWindow(deadline);
      prof_ = std::make_unique<Profiler>();
    }
    if (!prof_->active && iteration >= online_.warmup) {
      prof_->active = true;
      prof_->firstIteration = iteration;
      prof_->windowStart = Profiler::Clock::now();
    }
  }
  // 2. The scheduler's verdicts on the windows whose plan would take effect
  // at the next iteration: this iteration's runs are the last ones of the
  // current plan then (the servers flush their residuals in them), so every
  // worker must know now. A verdict that is not there yet is waited for.
  if (online_.exchange) {
    while (!awaiting_.empty() && awaiting_.front().second <= iteration + 1) {
      const auto [window, at] = awaiting_.front();
      awaiting_.pop_front();
      control::PlanUpdate u = worker_.controlClient().waitVerdict(window, deadline);
      if (u.version == 0) continue;  // the plan stays
      CORTADO_ENFORCE(u.switchAt == at, ErrorCode::kProtocol,
                      "worker {}: plan version {} from window {} switches at iteration {}, but the "
                      "scheduler acknowledged the window with {}",
                      topo_.rank, u.version, window, u.switchAt, at);
      const uint64_t current = plan_ ? plan_->version : 0;
      CORTADO_ENFORCE(u.version > current && u.version > seenPlanVersion_, ErrorCode::kProtocol,
                      "worker {}: plan version {} from window {} is not newer than version {}",
                      topo_.rank, u.version, window, std::max(current, seenPlanVersion_));
      seenPlanVersion_ = u.version;
      plan::Plan p;
      try {
        p = plan::planFromJsonString(u.planJson);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("worker {}: plan version {} from the scheduler: {}",
                                          topo_.rank, u.version, e.what()));
      }
      p.version = u.version;
      scheduled_ = std::make_pair(std::move(p), u.switchAt);
    }
  }
  // 3. Switch.
  if (scheduled_ && scheduled_->second == iteration) {
    plan::Plan p = std::move(scheduled_->first);
    scheduled_.reset();
    setPlan(p, deadline);
  }
  if (prof_) {
    prof_->iterStart = Profiler::Clock::now();
    prof_->inRunUs = 0;
    prof_->readyThisIter.clear();
  }
}

}  // namespace cortado::executor
