// The planner's timeline simulator (simulator.h): lanes, steps, batches and
// traces. Its incremental evaluation (setBase, evaluate, screen) is in
// simulator_search.cc.
#include "scheduler/planner/simulator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "core/common/error.h"

namespace cortado::planner {

Simulator::Simulator(Cluster cluster, ResolvedCodec codec, ModelProfile profile,
                     std::vector<plan::TensorOption> options)
    : cluster_(std::move(cluster)),
      codec_(std::move(codec)),
      profile_(std::move(profile)),
      options_(std::move(options)) {
  CORTADO_ENFORCE(cluster_.machines >= 1 && cluster_.gpusPerMachine >= 1,
                  ErrorCode::kInvalidArgument, "cluster needs >= 1 machine and >= 1 GPU, got {}x{}",
                  cluster_.machines, cluster_.gpusPerMachine);
  CORTADO_ENFORCE(cluster_.cpuCores >= 1 && cluster_.cpuCores <= 1024, ErrorCode::kInvalidArgument,
                  "cpu cores must be in [1, 1024], got {}", cluster_.cpuCores);
  cluster_.syncSkew.check("cluster sync skew");
  cluster_.pushSkew.check("cluster sync skew before a push");
  CORTADO_ENFORCE(!profile_.tensors.empty(), ErrorCode::kInvalidArgument, "model has no tensors");
  CORTADO_ENFORCE(!options_.empty(), ErrorCode::kInvalidArgument, "no options to simulate");
  std::map<std::tuple<int64_t, int, Sparsity>, int> classes;
  for (const auto& t : profile_.tensors) {
    const Sparsity sp{t.density, t.overlap};
    auto [it, added] = classes.emplace(std::make_tuple(t.elements, t.dtypeBytes, sp), int(classes.size()));
    if (added) {
      classElements_.push_back(t.elements);
      classDtype_.push_back(t.dtypeBytes);
      classSparsity_.push_back(sp);
    }
    sizeClass_.push_back(it->second);
  }
  cache_.resize(classElements_.size());
  for (auto& v : cache_) v.resize(options_.size());
  for (const auto& o : options_) fusible_.push_back(o.fusible() ? 1 : 0);
}

const CompiledOption& Simulator::compiledForClass(int cls, int option) {
  auto& slot = cache_[cls][option];
  if (!slot)
    slot = std::make_unique<CompiledOption>(
        compileOption(cluster_, codec_, classElements_[cls], classDtype_[cls], options_[option],
                      classSparsity_[cls]));
  return *slot;
}

SimState Simulator::initialState() const {
  SimState st;
  st.begin.assign(lanes() + 1, 0);
  return st;
}

double Simulator::earliestFit(const SimState& st, int lane, double t, double d) const {
  const Interval* a = st.iv.data() + st.begin[lane];
  const Interval* b = st.iv.data() + st.begin[lane + 1];
  // Intervals are sorted and disjoint, so their ends are sorted too: skip
  // every interval that ends by t at once.
  a = std::upper_bound(a, b, t, [](double v, const Interval& x) { return v < x.e; });
  double cand = t;
  for (; a != b; ++a) {
    if (a->e <= cand) continue;
    if (a->s >= cand + d) break;
    cand = a->e;
  }
  return cand;
}

// Back-to-back reservations are merged into one busy interval, so that a
// saturated lane stays a few intervals long; every query only needs the
// union of busy time.
void Simulator::insert(SimState& st, int lane, double s, double e) const {
  auto first = st.iv.begin() + st.begin[lane];
  auto last = st.iv.begin() + st.begin[lane + 1];
  auto pos = std::upper_bound(first, last, s, [](double v, const Interval& x) { return v < x.s; });
  if (e > s) {
    const bool joinPrev = pos != first && (pos - 1)->e == s && (pos - 1)->e > (pos - 1)->s;
    const bool joinNext = pos != last && pos->s == e && pos->e > pos->s;
    if (joinPrev && joinNext) {
      (pos - 1)->e = pos->e;
      st.iv.erase(pos);
      for (size_t l = lane + 1; l < st.begin.size(); ++l) --st.begin[l];
      return;
    }
    if (joinPrev) {
      (pos - 1)->e = e;
      return;
    }
    if (joinNext) {
      pos->s = s;
      return;
    }
  }
  st.iv.insert(pos, Interval{s, e});
  for (size_t l = lane + 1; l < st.begin.size(); ++l) ++st.begin[l];
}

double Simulator::reserve(SimState& st, int lane, double t, double d) const {
  if (d <= 0) return t;
  double s = earliestFit(st, lane, t, d);
  insert(st, lane, s, s + d);
  return s;
}

// Every later operation starts at or after `horizon`, so intervals that end
// before it can no longer matter.
void Simulator::trim(SimState& st, double horizon) const {
  const int L = int(st.begin.size()) - 1;
  // A lane's intervals are disjoint and sorted, so the ones that end by the
  // horizon are its first ones: most steps find none and copy nothing.
  bool any = false;
  for (int l = 0; l < L && !any; ++l)
    any = st.begin[l] != st.begin[l + 1] && st.iv[st.begin[l]].e <= horizon;
  if (!any) return;
  uint32_t w = 0;
  uint32_t readBegin = st.begin[0];
  for (int l = 0; l < L; ++l) {
    uint32_t readEnd = st.begin[l + 1];
    st.begin[l] = w;
    uint32_t r = readBegin;
    while (r < readEnd && st.iv[r].e <= horizon) ++r;
    if (w != r) std::copy(st.iv.begin() + r, st.iv.begin() + readEnd, st.iv.begin() + w);
    w += readEnd - r;
    readBegin = readEnd;
  }
  st.begin[L] = w;
  st.iv.resize(w);
}

// Computation progresses only while the GPU runs no codec kernel (unless
// those steps run elsewhere: Cluster::gpuCodecPausesCompute).
double Simulator::advanceCompute(const SimState& st, double from, double work) const {
  double t = from, rem = work;
  if (rem <= 0 || !cluster_.gpuCodecPausesCompute) return t + std::max(0.0, rem);
  const Interval* a = st.iv.data() + st.begin[kGpuLane];
  const Interval* b = st.iv.data() + st.begin[kGpuLane + 1];
  for (; a != b; ++a) {
    if (a->e <= t) continue;
    if (a->s > t) {
      double avail = a->s - t;
      if (avail >= rem) return t + rem;
      rem -= avail;
    }
    t = a->e;
  }
  return t + rem;
}

void Simulator::traceOp(std::vector<TraceEvent>* trace, const SimOp& op, int lane, int tensor,
                        double s, const std::string* label) const {
  if (!trace || op.us <= 0) return;
  const std::string& name = label ? *label : profile_.tensors[tensor].name;
  std::string what;
  switch (op.kind) {
    case OpKind::kEncode: what = "encode"; break;
    case OpKind::kDecode: what = "decode"; break;
    case OpKind::kCopy:
      what = op.res == Res::kD2H ? "copy d2h" : op.res == Res::kH2D ? "copy h2d" : "group copy";
      break;
    case OpKind::kServer: what = "server"; break;
    case OpKind::kSparse: what = "zen cpu"; break;
    case OpKind::kComm:
      what = fmt::format("{} {}{}", plan::toString(op.scope), plan::toString(op.comm),
                         op.compressed ? "*" : "");
      break;
  }
  trace->push_back(TraceEvent{fmt::format("{} {}", what, name), lane, tensor, s, op.us,
                              label ? *label : std::string(),
                              op.kind == OpKind::kComm ? op.waitUs : 0.0});
}

double Simulator::scheduleOps(SimState& st, const CompiledOption& c, int j, double t,
                              std::vector<TraceEvent>* trace, const std::string* label) {
  bool exchanging = false;
  // With the pipeline the leading local steps may have started while the
  // previous execution still ran; its first communication step waits for it.
  const bool pipe = pipelined();
  for (const SimOp& op : c.ops) {
    const double d = op.us;
    if (!exchanging && op.kind == OpKind::kComm) {
      exchanging = true;
      if (pipe) t = std::max(t, st.maxFinish);
      st.exchangeStart = t;
    }
    t += op.waitUs;  // the workers' skew (Cluster::syncSkew): holds no lane
    if (twinOnCpu(op)) {
      t = scheduleCpu(st, op, j, t, trace, label);
      continue;
    }
    switch (op.res) {
      case Res::kGpu:
      case Res::kIntra:
      case Res::kInter:
      case Res::kD2H:
      case Res::kH2D: {
        int lane = op.res == Res::kGpu     ? kGpuLane
                   : op.res == Res::kIntra ? kIntraLane
                   : op.res == Res::kInter ? kInterLane
                   : op.res == Res::kD2H   ? kD2HLane
                                           : kH2DLane;
        double s = reserve(st, lane, t, d);
        traceOp(trace, op, lane, j, s, label);
        t = s + d;
        break;
      }
      case Res::kFlat: {
        // Needs a gap in both lanes at once.
        double s = t;
        for (;;) {
          double s1 = earliestFit(st, kIntraLane, s, d);
          double s2 = earliestFit(st, kInterLane, s1, d);
          if (s2 == s1) {
            s = s1;
            break;
          }
          s = s2;
        }
        insert(st, kIntraLane, s, s + d);
        insert(st, kInterLane, s, s + d);
        traceOp(trace, op, kInterLane, j, s, label);
        traceOp(trace, op, kIntraLane, j, s, label);
        t = s + d;
        break;
      }
      case Res::kCpu: {
        t = scheduleCpu(st, op, j, t, trace, label);
        break;
      }
    }
  }
  if (!exchanging) st.exchangeStart = pipe ? std::max(t, st.maxFinish) : t;
  return t;
}

const CompiledOption& Simulator::compiledFused(int64_t elements, int dtype, int option) {
  auto& slot = fusedCache_[{elements, dtype, option}];
  if (!slot)
    slot = std::make_unique<CompiledOption>(compileOption(cluster_, codec_, elements, dtype, options_[option]));
  return *slot;
}

const CompiledOption& Simulator::compiledGroup(int64_t elements, int dtype, int option) {
  auto& slot = groupCache_[{elements, dtype, option}];
  if (!slot) {
    slot = std::make_unique<CompiledOption>(compileOption(cluster_, codec_, elements, dtype, options_[option]));
    SimOp copy;
    copy.res = Res::kCpu;
    copy.kind = OpKind::kCopy;
    copy.tasks = 1;
    copy.us = double(elements) * dtype * 8.0 / (cluster_.cpuSumGbps * 1000.0);
    // In place on a flat gradient buffer (ModelProfile::contiguousGradients);
    // an infinite rate: no copies to model either.
    if (!profile_.contiguousGradients && copy.us > 0) {
      slot->ops.insert(slot->ops.begin(), copy);
      slot->ops.push_back(copy);
      slot->pathUs += 2 * copy.us;
      slot->work[kWorkCpu] += 2 * copy.us;
      applySyncSkew(cluster_, *slot);  // the gather is CPU work before the first step
    }
  }
  return *slot;
}

double Simulator::runGroup(int tensor, int64_t elements, int option, std::vector<TraceEvent>* trace,
                           const std::string* label, double* leadUs) {
  SimState st = initialState();
  if (groupCache_.size() > kFusedCacheBound) groupCache_.clear();
  const CompiledOption& c = compiledGroup(elements, profile_.tensors[tensor].dtypeBytes, option);
  const double d = scheduleOps(st, c, tensor, 0, trace, label);
  if (leadUs) *leadUs = st.exchangeStart;
  return d;
}

double Simulator::runAlone(int tensor, int64_t elements, int option, std::vector<TraceEvent>* trace,
                           const std::string* label, double* leadUs) {
  SimState st = initialState();
  const TensorProfile& tp = profile_.tensors[tensor];
  const CompiledOption& c =
      elements == tp.elements ? compiled(tensor, option) : compiledFused(elements, tp.dtypeBytes, option);
  const double d = scheduleOps(st, c, tensor, 0, trace, label);
  if (leadUs) *leadUs = st.exchangeStart;
  return d;
}

void Simulator::truncate(SimState& st, double t) const {
  const int L = int(st.begin.size()) - 1;
  uint32_t w = 0, readBegin = st.begin[0];
  for (int l = 0; l < L; ++l) {
    const uint32_t readEnd = st.begin[l + 1];
    st.begin[l] = w;
    for (uint32_t r = readBegin; r < readEnd; ++r) {
      Interval x = st.iv[r];
      if (x.s >= t) continue;
      x.e = std::min(x.e, t);
      st.iv[w++] = x;
    }
    readBegin = readEnd;
  }
  st.begin[L] = w;
  st.iv.resize(w);
}

void Simulator::setBatchFinish(const SimState& st, int j, const std::vector<int>& choice,
                               TensorTiming* timings) const {
  if (st.pending.empty()) return;
  for (int k = st.batchFirst; k <= j; ++k)
    if (fusible_[choice[k]]) timings[k].finish = st.maxFinish;
}

double Simulator::schedulePending(SimState& st, std::vector<TraceEvent>* trace) {
  truncate(st, st.pendingStart);
  if (trace)
    std::erase_if(*trace, [&](const TraceEvent& e) {
      return e.lane >= 0 && e.tensor >= st.batchFirst && e.start >= st.pendingStart;
    });
  double t = st.pendingStart;
  std::string label;
  for (const SimState::Pending& p : st.pending) {
    for (const SimState::Chunk& c : p.chunks) {
      if (trace)
        label = c.count > 1 ? fmt::format("fused{}:{}..{}", c.count, profile_.tensors[c.first].name,
                                          profile_.tensors[c.last].name)
                            : profile_.tensors[c.last].name;
      t = scheduleOps(st, compiledFused(c.elements, p.dtype, p.option), c.last, t, trace,
                      trace ? &label : nullptr);
    }
  }
  return t;
}

double Simulator::step(SimState& st, int j, int option, std::vector<TraceEvent>* trace,
                       TensorTiming* timing) {
  const CompiledOption& c = compiled(j, option);
  const double b = advanceCompute(st, st.prevReady, profile_.tensors[j].backwardUs);
  if (trace && b > st.prevReady)
    trace->push_back(TraceEvent{"backward " + profile_.tensors[j].name, -1, j, st.prevReady,
                                b - st.prevReady});
  trim(st, b);
  // A runtime that runs one tensor at a time starts a tensor's first step
  // when the previous tensor's last one has ended.
  double t = executionStart(st, b);
  if (fusion()) {
    // Executor::runBatch as bench model calls it: a batch is every tensor
    // ready when the executor becomes free (or, when none is, the next one
    // when it becomes ready); the workers agree on it; its lone executions
    // run first, then its fused groups (per option, packed in order within
    // the threshold).
    const TensorProfile& tp = profile_.tensors[j];
    const bool inBatch = st.batchStart >= 0 && b <= st.batchStart;
    if (!inBatch) {
      st.batchStart = t;
      st.batchFirst = j;
      st.pendingStart = t + cluster_.batchAgreeUs;
      st.pending.clear();
    }
    if (fusible_[option]) {
      auto it = std::find_if(st.pending.begin(), st.pending.end(), [&](const SimState::Pending& p) {
        return p.option == option && p.dtype == tp.dtypeBytes;
      });
      if (it == st.pending.end()) it = st.pending.insert(st.pending.end(), {option, tp.dtypeBytes, {}});
      auto& chunks = it->chunks;
      if (chunks.empty() ||
          double(chunks.back().elements + tp.elements) * tp.dtypeBytes > double(cluster_.fusionBytes)) {
        chunks.push_back({tp.elements, j, j, 1});
      } else {
        chunks.back().elements += tp.elements;
        chunks.back().last = j;
        ++chunks.back().count;
      }
    } else {
      // A lone execution: after the batch's earlier lone ones, before its
      // fused groups.
      truncate(st, st.pendingStart);
      if (trace)
        std::erase_if(*trace, [&](const TraceEvent& e) {
          return e.lane >= 0 && e.tensor >= st.batchFirst && e.tensor < j && e.start >= st.pendingStart;
        });
      st.pendingStart = scheduleOps(st, c, j, st.pendingStart, trace, nullptr);
    }
    t = st.pending.empty() ? st.pendingStart : schedulePending(st, trace);
    st.prevReady = b;
    st.maxFinish = t;  // everything before the batch ended by its start, its lone runs by pendingStart
    if (fusedCache_.size() > kFusedCacheBound) fusedCache_.clear();
    // A lone tensor ends with its own execution; a fused one, for now, with
    // the batch (setBatchFinish() keeps the members' up to date).
    if (timing) *timing = TensorTiming{b, fusible_[option] ? t : st.pendingStart};
    return t;
  }
  t = scheduleOps(st, c, j, t, trace, nullptr);
  st.prevReady = b;
  st.maxFinish = std::max(st.maxFinish, t);
  if (timing) *timing = TensorTiming{b, t};
  return t;
}

double Simulator::readyAfter(const SimState& st, double from, int tensor) const {
  return advanceCompute(st, from, profile_.tensors[tensor].backwardUs);
}

double Simulator::placeGroup(SimState& st, int first, int last, int option, double ready,
                             std::vector<TraceEvent>* trace) {
  const auto& ts = profile_.tensors;
  int64_t elements = 0;
  for (int k = first; k <= last; ++k) elements += ts[k].elements;
  trim(st, ready);
  // As step(): a runtime that runs one execution at a time starts the group
  // when the previous one has ended.
  double t = executionStart(st, ready);
  // Fused sizes differ with every group: bound the cache before taking a
  // reference into it.
  if (groupCache_.size() > kFusedCacheBound) groupCache_.clear();
  const CompiledOption& c =
      first == last ? compiled(last, option) : compiledGroup(elements, ts[last].dtypeBytes, option);
  std::string label;
  if (trace && first != last)
    label = fmt::format("fused{}:{}..{}", last - first + 1, ts[first].name, ts[last].name);
  t = scheduleOps(st, c, last, t, trace, trace && first != last ? &label : nullptr);
  st.prevReady = ready;
  st.maxFinish = std::max(st.maxFinish, t);
  return t;
}

double Simulator::stepGroup(SimState& st, int first, int last, int option,
                            std::vector<TraceEvent>* trace, TensorTiming* timings) {
  CORTADO_ENFORCE(first >= 0 && first <= last && last < tensors(), ErrorCode::kInvalidArgument,
                  "stepGroup: group [{}, {}] is not a range of the model's {} tensors", first, last,
                  tensors());
  CORTADO_ENFORCE(option >= 0 && option < optionCount(), ErrorCode::kInvalidArgument,
                  "stepGroup: option {} of group [{}, {}] is not one of the {} options", option,
                  first, last, optionCount());
  if (first == last) return step(st, first, option, trace, timings);
  CORTADO_ENFORCE(
      !fusion(), ErrorCode::kInvalidArgument,
      "stepGroup: fused group [{}, {}] with the runtime's tensor fusion (fusionBytes {}) on: the "
      "simulator does not model both",
      first, last, cluster_.fusionBytes);
  const auto& ts = profile_.tensors;
  double b = st.prevReady;
  for (int k = first; k <= last; ++k) {
    CORTADO_ENFORCE_EQ(
        ts[k].dtypeBytes, ts[first].dtypeBytes, ErrorCode::kInvalidArgument,
        "stepGroup: group [{}, {}] mixes dtypes ('{}' and '{}'): a group is one buffer", first,
        last, ts[first].name, ts[k].name);
    const double nb = readyAfter(st, b, k);
    if (trace && nb > b) trace->push_back(TraceEvent{"backward " + ts[k].name, -1, k, b, nb - b});
    b = nb;
    if (timings) timings[k - first].ready = b;
  }
  const double t = placeGroup(st, first, last, option, b, trace);
  if (timings)
    for (int k = first; k <= last; ++k) timings[k - first].finish = t;
  return t;
}

double Simulator::simulateGroups(const std::vector<int>& choice,
                                 const std::vector<std::pair<int, int>>& groups,
                                 std::vector<TensorTiming>* timings,
                                 std::vector<TraceEvent>* trace) {
  const int N = tensors();
  CORTADO_ENFORCE_EQ(int(choice.size()), N, ErrorCode::kInvalidArgument,
                     "simulateGroups: one option per tensor");
  if (groups.empty()) return simulate(choice, timings, trace);
  SimState st = initialState();
  if (timings) timings->assign(N, {});
  size_t g = 0;
  for (int j = 0; j < N;) {
    int last = j;
    if (g < groups.size() && groups[g].first == j) {
      last = groups[g].second;
      CORTADO_ENFORCE(last > j && last < N, ErrorCode::kInvalidArgument,
                      "simulateGroups: group {} is [{}, {}]: two or more of the {} tensors", g, j,
                      last, N);
      for (int k = j; k <= last; ++k)
        CORTADO_ENFORCE_EQ(choice[k], choice[j], ErrorCode::kInvalidArgument,
                           "simulateGroups: tensor {} of group [{}, {}] has another option", k, j,
                           last);
      ++g;
    }
    CORTADO_ENFORCE(
        g >= groups.size() || groups[g].first > last, ErrorCode::kInvalidArgument,
        "simulateGroups: group {} starts at tensor {}, inside or before tensor {}: groups must be "
        "ascending and disjoint",
        g, groups[g].first, last);
    stepGroup(st, j, last, choice[j], trace, timings ? timings->data() + j : nullptr);
    j = last + 1;
  }
  return st.maxFinish;
}

// `op.tasks` equal tasks, each on the core where it can start first (ties to
// the lowest core). Tasks that land back to back on a core are kept as one
// interval, so a tensor split into hundreds of partitions costs a few
// intervals, not hundreds.
double Simulator::placeCpu(const SimState& st, const SimOp& op, double t) {
  const double d = op.us;
  const int cores = cluster_.cpuCores;
  heap_.clear();
  bool open = true;  // every core is free for good from its first fit
  for (int c = 0; c < cores; ++c) {
    const int lane = kCpuLane0 + c;
    const double f = earliestFit(st, lane, t, d);
    heap_.push_back({f, c});
    if (st.begin[lane] != st.begin[lane + 1] && st.iv[st.begin[lane + 1] - 1].e > f) open = false;
  }
  auto later = [](const std::pair<double, int>& a, const std::pair<double, int>& b) { return a > b; };
  std::make_heap(heap_.begin(), heap_.end(), later);
  runs_.clear();  // (core, start, end)
  double end = t;
  if (open) {
    // The common case (nothing reserved on the cores later on): each core
    // takes its tasks back to back from its first fit, so no gaps need
    // searching and every core gets one run.
    coreRun_.assign(cores, -1);
    for (int k = 0; k < op.tasks; ++k) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      auto& [s, c] = heap_.back();
      if (coreRun_[c] < 0) {
        coreRun_[c] = int(runs_.size());
        runs_.emplace_back(c, s, s + d);
      } else {
        std::get<2>(runs_[coreRun_[c]]) = s + d;
      }
      end = std::max(end, s + d);
      s += d;
      std::push_heap(heap_.begin(), heap_.end(), later);
    }
  }
  if (!open) coreRun_.assign(cores, -1);
  for (int k = 0; !open && k < op.tasks; ++k) {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    auto [s, c] = heap_.back();
    // A core's runs come in time order, so only its last one can end at s.
    if (coreRun_[c] >= 0 && std::get<2>(runs_[coreRun_[c]]) == s) {
      std::get<2>(runs_[coreRun_[c]]) = s + d;
    } else {
      coreRun_[c] = int(runs_.size());
      runs_.emplace_back(c, s, s + d);
    }
    end = std::max(end, s + d);
    // The core's next fit: nothing before s fits (s was its earliest), and the
    // runs just assigned end at s + d.
    heap_.back() = {earliestFit(st, kCpuLane0 + c, s + d, d), c};
    std::push_heap(heap_.begin(), heap_.end(), later);
  }
  return end;
}

double Simulator::scheduleCpu(SimState& st, const SimOp& op, int j, double t,
                              std::vector<TraceEvent>* trace, const std::string* label) {
  const double end = placeCpu(st, op, t);
  for (const auto& [c, s, e] : runs_) {
    insert(st, kCpuLane0 + c, s, e);
    if (trace) {
      SimOp run = op;
      run.us = e - s;
      traceOp(trace, run, kCpuLane0 + c, j, s, label);
    }
  }
  return end;
}

double Simulator::simulate(const std::vector<int>& choice, std::vector<TensorTiming>* timings,
                           std::vector<TraceEvent>* trace) {
  CORTADO_ENFORCE_EQ(int(choice.size()), tensors(), ErrorCode::kInvalidArgument,
                     "simulate: one option per tensor");
  SimState st = initialState();
  if (timings) timings->assign(tensors(), {});
  for (int j = 0; j < tensors(); ++j) {
    step(st, j, choice[j], trace, timings ? &(*timings)[j] : nullptr);
    if (timings) setBatchFinish(st, j, choice, timings->data());
  }
  return st.maxFinish;
}

std::string Simulator::laneName(int lane) const {
  switch (lane) {
    case -1: return "GPU compute";
    case kGpuLane: return "GPU codec";
    case kIntraLane: return "intra-machine links";
    case kInterLane: return "network";
    case kD2HLane: return "PCIe d2h";
    case kH2DLane: return "PCIe h2d";
    default: return fmt::format("CPU core {}", lane - kCpuLane0);
  }
}

std::string chromeTrace(const Simulator& sim, const std::vector<TraceEvent>& events) {
  using nlohmann::json;
  json out = json::array();
  out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1},
                 {"args", {{"name", "cortado plan (one GPU and its machine)"}}}});
  for (int lane = -1; lane < sim.lanes(); ++lane)
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", lane + 1},
                   {"args", {{"name", sim.laneName(lane)}}}});
  for (const TraceEvent& e : events) {
    json args = {{"tensor", e.label.empty() ? sim.profile().tensors[e.tensor].name : e.label}};
    if (e.waitUs > 0) args["skew_wait_us"] = e.waitUs;
    out.push_back({{"name", e.name},
                   {"ph", "X"},
                   {"pid", 1},
                   {"tid", e.lane + 1},
                   {"ts", e.start},
                   {"dur", e.dur},
                   {"args", std::move(args)}});
  }
  return json{{"traceEvents", std::move(out)}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace cortado::planner
