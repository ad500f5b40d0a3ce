// Online re-planning on the worker (core/executor/executor.h, "online re-planning"):
// profiling windows and their reports, the scheduler's verdicts, and plan
// switches at an iteration boundary.
#include <algorithm>
#include <chrono>

#include "core/common/logging.h"
#include "core/executor/run.h"

namespace cortado::executor {

void Executor::noteReady(TensorState& t, const BatchItem& item) {
  if (searchRecording_ &&
      std::find(searchOrder_.begin(), searchOrder_.end(), t.name) == searchOrder_.end()) {
    searchOrder_.push_back(t.name);
    searchAddress_[t.name] = reinterpret_cast<std::uintptr_t>(item.output);
  }
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
  // GraVAC's re-plan switches at its next iteration (gravacFlush_).
  return forceFlush_ || gravacFlush_ || (begun_ && scheduled_ && scheduled_->second == iteration_ + 1);
}

OnlineOptions onlineOptions(const JobConfig& job) {
  OnlineOptions o;
  o.window = job.profileWindow;
  o.warmup = 1;
  o.exchange = true;
  return o;
}

void Executor::setOnline(const OnlineOptions& o) {
  CORTADO_ENFORCE(o.window == 0 || !searchOptions_, ErrorCode::kInvalidArgument,
                  "online re-planning (CORTADO_PROFILE_WINDOW) and the fusion search both change "
                  "the plan while the job runs; turn one off (setFusionSearch(std::nullopt))");
  CORTADO_ENFORCE(o.window == 0 || !gravac_, ErrorCode::kInvalidArgument,
                  "online re-planning (CORTADO_PROFILE_WINDOW) and GraVAC both change the plan "
                  "while the job runs; turn one off (setGravac(std::nullopt))");
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
  if (plan_) r.groups = plan_->groups;
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
  const bool consecutive = begun_ && iteration == iteration_ + 1;
  CORTADO_ENFORCE(!begun_ || !searchOptions_ || consecutive, ErrorCode::kInvalidArgument,
                  "worker {}: beginIteration({}) after iteration {}: the fusion search times "
                  "every iteration, one after the other",
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
  // The fusion search's next candidate, scheduled for the next iteration.
  if (searchOptions_) stepFusionSearch(deadline);
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

void Executor::setFusionSearch(std::optional<FusionSearchOptions> o,
                               std::vector<plan::Plan> alternatives) {
  if (o) {
    validate(*o);
    CORTADO_ENFORCE(online_.window == 0, ErrorCode::kInvalidArgument,
                    "the fusion search and online re-planning (CORTADO_PROFILE_WINDOW) both change "
                    "the plan while the job runs; turn one off");
    CORTADO_ENFORCE(!gravac_, ErrorCode::kInvalidArgument,
                    "the fusion search and GraVAC both change the plan while the job runs; "
                    "turn one off (setGravac(std::nullopt))");
    for (size_t a = 0; a < alternatives.size(); ++a) {
      try {
        checkPlan(alternatives[a]);
      } catch (const Error& e) {
        throw Error(e.code(), fmt::format("fusion search, alternative {} of {}: {}", a + 1,
                                          alternatives.size(), e.what()));
      }
      alternatives[a].groups.clear();  // the search's candidates replace them
    }
  } else {
    alternatives.clear();
  }
  searchOptions_ = o;
  searchAlternatives_ = std::move(alternatives);
  searchAlt_ = 0;
  screened_.clear();
  searchQueue_.clear();
  searchPos_ = 0;
  searched_.clear();
  searchKept_.reset();
  searchKeptCuts_.clear();
  finalists_.clear();
  final_.reset();
  finalTimes_.clear();
  lastCandidate_ = {};
  searchStart_.reset();
  search_.reset();
  searchOrder_.clear();
  searchAddress_.clear();
  searchPlace_.clear();
  searchAdjacent_.clear();
  searchRecording_ = false;
  searchTimes_.clear();
  searchFrom_ = begun_ ? iteration_ + 1 : 0;
}

const plan::Plan* Executor::searchBase(size_t alt) const {
  return searchAlternatives_.empty() ? nullptr : &searchAlternatives_[alt];
}

void Executor::scheduleCandidate(const FusionSearch::Cuts& cuts, const plan::Plan* base) {
  plan::Plan p = base ? *base : scheduled_ ? scheduled_->first : currentPlan();
  p.version = std::max({p.version, plan_ ? plan_->version : 0,
                        scheduled_ ? scheduled_->first.version : 0}) +
              1;
  p.groups.clear();
  for (auto [begin, end] : FusionSearch::groupsOf(cuts, searchOrder_.size())) {
    std::vector<std::string> g(searchOrder_.begin() + int64_t(begin),
                               searchOrder_.begin() + int64_t(end));
    inBufferOrder(g);
    p.groups.push_back(std::move(g));
  }
  scheduled_ = std::make_pair(std::move(p), iteration_ + 1);
  candidateAt_ = iteration_ + 1;
  searchTimes_.clear();
}

void Executor::scheduleFor(size_t alt, const FusionSearch::Cuts& cuts) {
  scheduleCandidate(cuts, searchBase(alt));
  lastCandidate_ = {alt, cuts};
}

std::unique_ptr<FusionSearch> Executor::makeSearch(size_t alt) const {
  // Consecutive tensors on different options (or on PowerSGD) never share a
  // group: forced cuts, from the options this search runs on.
  const plan::Plan* base = searchBase(alt);
  auto optionOf = [&](const std::string& name) -> const plan::TensorOption& {
    return base ? base->tensors.at(name) : tensors_.at(name)->option;
  };
  std::vector<uint64_t> bytes;
  FusionSearch::Cuts forced;
  for (size_t k = 0; k < searchOrder_.size(); ++k) {
    bytes.push_back(tensors_.at(searchOrder_[k])->n * sizeof(float));
    const plan::TensorOption& opt = optionOf(searchOrder_[k]);
    const bool apart = opt.codec.rfind("powersgd", 0) == 0;
    if (k > 0 && (apart || !(opt == optionOf(searchOrder_[k - 1])))) forced.insert(k);
  }
  return std::make_unique<FusionSearch>(std::move(bytes), std::move(forced), *searchOptions_);
}

void Executor::startSearch() {
  search_ = searchAlt_ < screened_.size() && screened_[searchAlt_] ? std::move(screened_[searchAlt_])
                                                                     : makeSearch(searchAlt_);
  if (const auto& next = search_->next()) {
    scheduleFor(searchAlt_, *next);
    return;
  }
  finishAlternative();  // its screening window was all it needed (one tensor, say)
}

void Executor::finishAlternative() {
  // This alternative's search has ended: its fastest grouping is its time.
  SearchedAlternative done;
  done.cuts = search_->best();
  for (const auto& [cuts, secs] : search_->history())
    if (cuts == done.cuts) {
      done.seconds = secs;
      break;
    }
  done.summary = search_->summary();
  done.times = search_->timesLine();
  done.top = search_->ranked(searchOptions_->finalists);
  searched_[searchAlt_] = std::move(done);
  if (++searchPos_ < searchQueue_.size()) {
    searchAlt_ = searchQueue_[searchPos_];
    startSearch();
    return;
  }
  startFinalRound();
}

// At beginIteration(iteration_): the iteration before it just ended.
void Executor::stepFusionSearch(Deadline deadline) {
  const auto now = std::chrono::steady_clock::now();
  const double last = std::chrono::duration<double>(now - lastBegin_).count();
  lastBegin_ = now;
  const FusionSearchOptions& o = *searchOptions_;
  if (!search_ && !screening()) {
    // Warm-up; then one iteration whose batches give the order.
    const uint64_t orderAt = searchFrom_ + std::max<uint64_t>(o.warmup, 1);
    if (iteration_ == orderAt) {
      searchRecording_ = true;
      return;
    }
    if (iteration_ < orderAt + 1) return;
    searchRecording_ = false;
    CORTADO_ENFORCE(!searchOrder_.empty(), ErrorCode::kInvalidArgument,
                    "worker {}: the fusion search saw no tensor run in iteration {}: run the "
                    "training's tensors between beginIteration() calls",
                    topo_.rank, orderAt);
    searchAgreedLayout(deadline);
    searchStart_ = startingGrouping();
    const size_t alts = std::max<size_t>(1, searchAlternatives_.size());
    searchAlt_ = 0;
    searchPos_ = 0;
    if (o.searched > 0 && alts > o.searched) {
      // Screening: every alternative's first candidate, one window each.
      for (size_t a = 0; a < alts; ++a) screened_.push_back(makeSearch(a));
      scheduleFor(0, *screened_[0]->next());
      return;
    }
    for (size_t a = 0; a < alts; ++a) searchQueue_.push_back(a);
    startSearch();
    return;
  }
  if (searchKept_) return;
  // The candidate took effect at candidateAt_ (that iteration and `settle`
  // more are left out); iteration_ - 1 just ended.
  const uint64_t ended = iteration_ - 1;
  if (ended < candidateAt_ + o.settle) return;
  searchTimes_.push_back(last);
  if (searchTimes_.size() < o.window) return;
  // The window's median on each worker, averaged over the workers: the same
  // time on every worker, so every worker takes the same next step.
  const double time = agreedMean(windowTime(searchTimes_), deadline);
  if (final_) {
    const auto& [alt, cuts] = finalists_[*final_->next()];
    finalTimes_ += fmt::format("{}{}/{}:{:.1f}", finalTimes_.empty() ? "" : " ", alt + 1,
                               cuts.size() + 1, time * 1e3);
    final_->measured(time);
    if (const auto at = final_->next()) {
      scheduleFor(finalists_[*at].first, finalists_[*at].second);
      return;
    }
    const auto& [keptAlt, keptCuts] = finalists_[final_->best()];
    keepCandidate(keptAlt, keptCuts);
    return;
  }
  if (screening()) {
    screened_[searchAlt_]->measured(time);
    if (searchAlt_ + 1 < screened_.size()) {
      ++searchAlt_;
      scheduleFor(searchAlt_, *screened_[searchAlt_]->next());
      return;
    }
    // The `searched` fastest (the first among equal times), searched on in
    // the alternatives' order.
    std::vector<size_t> order(screened_.size());
    for (size_t a = 0; a < order.size(); ++a) order[a] = a;
    auto first = [&](size_t a) { return screened_[a]->history().front().second; };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return first(a) < first(b); });
    order.resize(size_t(o.searched));
    std::sort(order.begin(), order.end());
    searchQueue_ = std::move(order);
    searchAlt_ = searchQueue_.front();
    startSearch();
    return;
  }
  search_->measured(time);
  if (const auto& next = search_->next()) {
    scheduleFor(searchAlt_, *next);
    return;
  }
  finishAlternative();
}

std::optional<std::pair<size_t, FusionSearch::Cuts>> Executor::startingGrouping() const {
  const plan::Plan& p = currentPlan();
  if (p.groups.empty()) return std::nullopt;
  const auto cuts = FusionSearch::cutsOf(searchOrder_, p.groups);
  if (!cuts) return std::nullopt;
  if (searchAlternatives_.empty()) return std::make_pair(size_t(0), *cuts);
  // With alternatives, the one whose options the plan runs (for every
  // tensor of the search), if any.
  for (size_t a = 0; a < searchAlternatives_.size(); ++a) {
    const auto& alt = searchAlternatives_[a].tensors;
    const bool same = std::all_of(searchOrder_.begin(), searchOrder_.end(), [&](const auto& name) {
      const auto i = alt.find(name), j = p.tensors.find(name);
      return i != alt.end() && j != p.tensors.end() && i->second == j->second;
    });
    if (same) return std::make_pair(a, *cuts);
  }
  return std::nullopt;
}

void Executor::startFinalRound() {
  finalists_.clear();
  for (const auto& [a, done] : searched_)
    for (const auto& [cuts, secs] : done.top) finalists_.emplace_back(a, cuts);
  // The groups the job started with are timed beside them (unless the
  // search found them too): the search keeps them unless something it
  // timed runs faster in the same round.
  if (searchStart_ && searchOptions_->finalists > 0 &&
      std::find(finalists_.begin(), finalists_.end(), *searchStart_) == finalists_.end())
    finalists_.push_back(*searchStart_);
  if (finalists_.size() >= 2) {
    // Each finalist timed twice more, the second pass in reverse order.
    final_ = std::make_unique<FinalRound>(finalists_.size());
    scheduleFor(finalists_[0].first, finalists_[0].second);
    return;
  }
  // No final round: the fastest timed (the first among equal times) stays.
  auto kept = searched_.begin();
  for (auto it = searched_.begin(); it != searched_.end(); ++it)
    if (it->second.seconds < kept->second.seconds) kept = it;
  keepCandidate(kept->first, kept->second.cuts);
}

void Executor::keepCandidate(size_t alt, const FusionSearch::Cuts& cuts) {
  searchKept_ = alt;
  searchKeptCuts_ = cuts;
  // Switched to at an iteration boundary unless it runs already.
  if (!(lastCandidate_.first == alt && lastCandidate_.second == cuts)) scheduleFor(alt, cuts);
  if (topo_.rank == 0) CORTADO_LOG_INFO("{}", fusionSearchSummary());
}

std::optional<std::pair<size_t, FusionSearch::Cuts>> Executor::fusionSearchResult() const {
  if (!searchKept_) return std::nullopt;
  return std::make_pair(*searchKept_, searchKeptCuts_);
}

std::string Executor::fusionSearchSummary() const {
  const bool several = searchAlternatives_.size() > 1;
  // The final round: "final round over N (two passes, summed): 1/29 groups
  // 2631.2 ms, ...", each finalist's alternative (with several) and groups.
  std::string fin;
  if (final_) {
    fin = fmt::format("; final round over {} (two passes, summed{}):", finalists_.size(),
                      final_->done() ? "" : ", so far");
    for (size_t f = 0; f < finalists_.size(); ++f)
      fin +=
          fmt::format("{} {}{} groups{} {:.1f} ms", f ? "," : "",
                      several ? fmt::format("{}/", finalists_[f].first + 1) : std::string(),
                      finalists_[f].second.size() + 1,
                      searchStart_ && finalists_[f] == *searchStart_ ? " (the starting ones)" : "",
                      final_->sums()[f] * 1e3);
  }
  if (!several) {
    std::string out = search_ ? search_->summary() : "fusion search: not started";
    out += fin;
    if (final_ && searchKept_) out += fmt::format("; kept {} groups", searchKeptCuts_.size() + 1);
    return out;
  }
  // "fusion search over N option sets: 1 (option): <summary less its
  // "fusion search" head>; 2 (...): ...; final round ...; kept K (G groups)".
  auto body = [](const std::string& line) {
    const std::string head = "fusion search";
    return line.rfind(head, 0) == 0 ? line.substr(head.size()) : ": " + line;
  };
  std::string out = fmt::format("fusion search over {} option sets", searchAlternatives_.size());
  if (!screened_.empty())
    out += fmt::format(" (each tensor on its own timed first, the {} fastest searched)",
                       searchOptions_->searched);
  // Left out after screening: its search object stays in screened_.
  const bool screenedAll = !screened_.empty() && !screening();
  for (size_t a = 0; a < searchAlternatives_.size(); ++a) {
    const bool leftOut = screenedAll && a < screened_.size() && screened_[a] &&
                         std::find(searchQueue_.begin(), searchQueue_.end(), a) == searchQueue_.end();
    const std::string line =
        searched_.count(a)         ? body(searched_.at(a).summary)
        : a == searchAlt_ && search_ ? body(search_->summary())
        : leftOut ? fmt::format(": left out, each tensor on its own {:.1f} ms",
                                screened_[a]->history().front().second * 1e3)
                  : std::string(": not searched yet");
    out += fmt::format("{} {} ({}){}", a ? ";" : ":", a + 1,
                       searchAlternatives_[a].tensors.begin()->second.describe(), line);
  }
  out += fin;
  if (searchKept_)
    out += fmt::format("; kept {} ({} groups)", *searchKept_ + 1, searchKeptCuts_.size() + 1);
  return out;
}

std::string Executor::fusionSearchTimes() const {
  std::string out;
  const size_t alts = std::max<size_t>(1, searchAlternatives_.size());
  for (size_t a = 0; a < alts; ++a) {
    const std::string line = searched_.count(a)           ? searched_.at(a).times
                             : a == searchAlt_ && search_ ? search_->timesLine()
                             : a < screened_.size() && screened_[a] && !screened_[a]->history().empty()
                                 ? screened_[a]->timesLine()
                                 : std::string();
    if (line.empty()) continue;
    out += fmt::format("{}{}", out.empty() ? "" : "; ",
                       alts > 1 ? fmt::format("{}: {}", a + 1, line) : line);
  }
  if (!finalTimes_.empty()) out += fmt::format("{}final: {}", out.empty() ? "" : "; ", finalTimes_);
  return out;
}

void Executor::searchAgreedLayout(Deadline deadline) {
  // The recorded tensors in their buffers' order (ties in ready order), and
  // for each whether the next one starts where it ends; both hashed
  // (FNV-1a): equal on every worker when their buffers lie alike.
  std::vector<size_t> byAddress(searchOrder_.size());
  for (size_t k = 0; k < byAddress.size(); ++k) byAddress[k] = k;
  auto addressOf = [&](size_t k) { return searchAddress_.at(searchOrder_[k]); };
  std::stable_sort(byAddress.begin(), byAddress.end(),
                   [&](size_t a, size_t b) { return addressOf(a) < addressOf(b); });
  std::vector<bool> adjacent(byAddress.size(), false);
  uint64_t h = 1469598103934665603ull;
  for (size_t p = 0; p < byAddress.size(); ++p) {
    const size_t k = byAddress[p];
    if (p + 1 < byAddress.size())
      adjacent[p] =
          addressOf(k) != 0 && addressOf(k) + tensors_.at(searchOrder_[k])->n * sizeof(float) ==
                                   addressOf(byAddress[p + 1]);
    h = (h ^ (uint64_t(k) << 1 | uint64_t(adjacent[p]))) * 1099511628211ull;
  }
  bool same = true;
  if (groups_) {
    std::vector<int64_t> all(size_t(topo_.size));
    const int64_t mine = int64_t(h);
    collective::CallLabel scope(*groups_->world, "fusion search: the gradients' buffer order");
    groups_->world->allgather(&mine, 1, all.data(), DType::kInt64, deadline);
    same = std::all_of(all.begin(), all.end(), [&](int64_t v) { return v == mine; });
  } else {
    // Through the servers (a sum): the hash's 8 bytes and their squares;
    // for each, W times the sum of the squares equals the square of the sum
    // only when every worker sent the same byte (exact in doubles up to
    // 2^18 workers).
    std::array<double, 16> local{}, sum{};
    for (size_t b = 0; b < 8; ++b) {
      const double x = double((h >> (8 * b)) & 0xff);
      local[2 * b] = x;
      local[2 * b + 1] = x * x;
    }
    sumThroughServers("cortado.fusion_search.layout", local.data(), sum.data(), local.size(),
                      deadline);
    const double w = double(topo_.size);
    for (size_t b = 0; b < 8 && same; ++b) same = w * sum[2 * b + 1] == sum[2 * b] * sum[2 * b];
  }
  if (!same) return;
  for (size_t p = 0; p < byAddress.size(); ++p) searchPlace_[searchOrder_[byAddress[p]]] = p;
  searchAdjacent_ = std::move(adjacent);
}

void Executor::inBufferOrder(std::vector<std::string>& group) const {
  if (searchPlace_.empty() || group.size() < 2) return;
  std::vector<std::string> sorted = group;
  std::sort(sorted.begin(), sorted.end(), [&](const std::string& a, const std::string& b) {
    return searchPlace_.at(a) < searchPlace_.at(b);
  });
  for (size_t i = 0; i + 1 < sorted.size(); ++i) {
    const size_t p = searchPlace_.at(sorted[i]);
    if (searchPlace_.at(sorted[i + 1]) != p + 1 || !searchAdjacent_[p]) return;
  }
  group = std::move(sorted);
}

double Executor::agreedMean(double seconds, Deadline deadline) {
  double sum = 0;
  if (groups_) {
    collective::CallLabel scope(*groups_->world, "fusion search: an iteration's time");
    groups_->world->allreduce(&seconds, &sum, 1, DType::kFloat64, deadline);
  } else {
    sumThroughServers("cortado.fusion_search.time", &seconds, &sum, 1, deadline);
  }
  return sum / double(topo_.size);
}

void Executor::sumThroughServers(const std::string& key, const double* in, double* out, size_t n,
                                 Deadline deadline) {
  if (!serverSumKeys_.count(key)) {
    worker_.declare(key, DType::kFloat64, n, deadline);
    serverSumKeys_.insert(key);
  }
  Status st = worker_.pushPull(key, DType::kFloat64, n, in, out, ReduceOp::kSum, 0).wait(deadline);
  st.check();
}

}  // namespace cortado::executor
