// The simulator's incremental evaluation (simulator.h): a base choice with a
// checkpoint before every tensor, evaluate() and screen() of overrides
// against it, the lower bounds and tail estimates that cut them short, and
// lastBubble(). The timeline itself is in simulator.cc.
#include "scheduler/planner/simulator.h"

#include <algorithm>
#include <cmath>

#include "core/common/error.h"

namespace cortado::planner {

namespace {
// Equal states have equal futures.
bool sameState(const SimState& a, const SimState& b, bool pipelined) {
  if (pipelined && (a.maxFinish != b.maxFinish || a.exchangeStart != b.exchangeStart)) return false;
  return a.prevReady == b.prevReady && a.begin == b.begin && a.iv == b.iv &&
         a.batchStart == b.batchStart && a.pending == b.pending &&
         (a.pending.empty() || (a.batchFirst == b.batchFirst && a.pendingStart == b.pendingStart));
}
}  // namespace

void Simulator::setBase(const std::vector<int>& choice) {
  const int N = tensors();
  CORTADO_ENFORCE_EQ(int(choice.size()), N, ErrorCode::kInvalidArgument, "setBase: one option per tensor");
  // Tensor j's timeline depends only on tensors 0..j, so the checkpoints
  // before the first tensor whose option changed are still exact.
  int from = 0;
  if (baseValid_ && !reference_ && int(base_.size()) == N) {
    while (from < N && base_[from] == choice[from]) ++from;
    from = std::min(from, validUpTo_);
    int last = N - 1;
    while (last >= 0 && base_[last] == choice[last]) --last;
    tailStale_ = std::max(tailStale_, last);
  } else {
    tailStale_ = N - 1;
  }
  base_ = choice;
  baseValid_ = true;
  checkpoints_.resize(N + 1);
  baseTimings_.resize(N);
  SimState st = from == 0 ? initialState() : checkpoints_[from];
  for (int j = from; j < N; ++j) {
    checkpoints_[j] = st;
    step(st, j, choice[j], nullptr, &baseTimings_[j]);
    setBatchFinish(st, j, choice, baseTimings_.data());
  }
  checkpoints_[N] = st;
  validUpTo_ = N;
  baseTime_ = st.maxFinish;
  suffixMaxFinish_.assign(N + 1, 0);
  suffixBackward_.assign(N + 1, 0);
  suffixIntra_.assign(N + 1, 0);
  suffixInter_.assign(N + 1, 0);
  for (int j = N - 1; j >= 0; --j) {
    const CompiledOption& c = compiled(j, choice[j]);
    suffixMaxFinish_[j] = std::max(suffixMaxFinish_[j + 1], baseTimings_[j].finish);
    suffixBackward_[j] = suffixBackward_[j + 1] + profile_.tensors[j].backwardUs;
    suffixIntra_[j] = suffixIntra_[j + 1] + c.work[kWorkIntra];
    suffixInter_[j] = suffixInter_[j + 1] + c.work[kWorkInter];
  }
}

// A lower bound on the iteration time given the state before tensor `next`,
// with tensors from `next` on taking their base options: computation still to
// do plus the last tensor's own sync time, and each link's reserved work plus
// the work still to come (none of it can start before the previous ready time).
double Simulator::lowerBound(const SimState& st, int next) const {
  const int N = tensors();
  double lb = st.maxFinish;
  if (next >= N) return lb;
  const double t0 = st.prevReady;
  // With fusion a later tensor may join the open group (which changes its
  // end), and fused tensors take less link time than their sum: only the
  // settled ends and the computation still to do bound the time.
  if (fusion()) return std::max(settledFinish(st), t0 + suffixBackward_[next]);
  lb = std::max(lb, t0 + suffixBackward_[next] + cache_[sizeClass_[N - 1]][base_[N - 1]]->pathUs);
  for (int lane : {kIntraLane, kInterLane}) {
    double busy = 0;
    for (uint32_t i = st.begin[lane]; i < st.begin[lane + 1]; ++i)
      busy += std::max(0.0, st.iv[i].e - std::max(st.iv[i].s, t0));
    lb = std::max(lb, t0 + busy + (lane == kIntraLane ? suffixIntra_[next] : suffixInter_[next]));
  }
  return lb;
}

double Simulator::evaluate(const std::vector<std::pair<int, int>>& overrides, double cutoff) {
  CORTADO_ENFORCE(validUpTo_ == tensors(), ErrorCode::kInternal,
                  "Simulator::evaluate after changeBase needs setBase first");
  if (overrides.empty()) return baseTime_;
  const int N = tensors();
  if (reference_) {
    std::vector<int> choice = base_;
    for (const auto& [j, o] : overrides) choice[j] = o;
    return simulate(choice);
  }
  const size_t n = overrides.size();
  const int j0 = overrides.front().first;
  scratch_ = checkpoints_[j0];
  size_t oi = 0;
  for (int k = j0; k < N; ++k) {
    int opt = base_[k];
    if (oi < n && overrides[oi].first == k) opt = overrides[oi++].second;
    step(scratch_, k, opt);
    if (oi < n || k + 1 == N) continue;
    const SimState& cp = checkpoints_[k + 1];
    if (sameState(scratch_, cp, pipelined()))
      return std::max(scratch_.maxFinish, suffixMaxFinish_[k + 1]);
    if (cutoff < kInf) {
      double lb = lowerBound(scratch_, k + 1);
      if (lb >= cutoff) return lb;
    }
  }
  return scratch_.maxFinish;
}

double Simulator::screen(int j0, int option, int window, double bound) {
  const int N = tensors();
  CORTADO_ENFORCE(validUpTo_ == N, ErrorCode::kInternal,
                  "Simulator::screen after changeBase needs setBase first");
  scratch_ = checkpoints_[j0];
  step(scratch_, j0, option);
  int k = j0 + 1;
  // lowerBound() never decreases from one tensor to the next (each tensor's
  // ready time grows by at least its backward time, and each link's work
  // moves from the suffix sum into the reserved busy time), and every value
  // screen() returns is at or above it. So once it is above `bound`, the
  // score will be too; the margin covers the sums' rounding.
  const double prune = bound < kInf && !reference_ ? bound + 1e-9 * (1.0 + std::abs(bound)) : kInf;
  for (; k < N && k <= j0 + window; ++k) {
    const SimState& cp = checkpoints_[k];
    if (sameState(scratch_, cp, pipelined()))
      return std::max(scratch_.maxFinish, suffixMaxFinish_[k]);
    if (prune < kInf) {
      const double lb = lowerBound(scratch_, k);
      if (lb > prune) return lb;
    }
    step(scratch_, k, base_[k]);
  }
  return k == N ? scratch_.maxFinish : lowerBound(scratch_, k);
}

void Simulator::changeBase(int j, int option) {
  CORTADO_ENFORCE(baseValid_ && j >= 0 && j < tensors() && option >= 0 && option < optionCount(),
                  ErrorCode::kInvalidArgument, "changeBase({}, {}): needs setBase and a valid tensor and option",
                  j, option);
  if (base_[j] == option) return;
  base_[j] = option;
  validUpTo_ = std::min(validUpTo_, j);  // the state before j is unchanged
  tailStale_ = std::max(tailStale_, j);
}

void Simulator::bringUpTo(int t) {
  for (int j = validUpTo_; j < t; ++j) {
    checkpoints_[j + 1] = checkpoints_[j];
    step(checkpoints_[j + 1], j, base_[j], nullptr, &baseTimings_[j]);
    setBatchFinish(checkpoints_[j + 1], j, base_, baseTimings_.data());
  }
  if (t > validUpTo_) validUpTo_ = t;
  if (validUpTo_ == tensors()) baseTime_ = checkpoints_[tensors()].maxFinish;
}

const SimState& Simulator::checkpoint(int j) {
  bringUpTo(j);
  return checkpoints_[j];
}

double Simulator::exactBaseTime() {
  bringUpTo(tensors());
  return baseTime_;
}

double Simulator::simulateFrom(int from, const std::vector<std::pair<int, int>>& overrides) {
  scratch_ = checkpoint(from);
  size_t oi = 0;
  for (int k = from; k < tensors(); ++k) {
    int opt = base_[k];
    if (oi < overrides.size() && overrides[oi].first == k) opt = overrides[oi++].second;
    step(scratch_, k, opt);
  }
  return scratch_.maxFinish;
}

double Simulator::estimate(int lo, int hi, const std::vector<std::pair<int, int>>& overrides) {
  scratch_ = checkpoint(lo);
  size_t oi = 0;
  for (int k = lo; k <= hi; ++k) {
    int opt = base_[k];
    if (oi < overrides.size() && overrides[oi].first == k) opt = overrides[oi++].second;
    step(scratch_, k, opt);
  }
  return tailEstimate(scratch_, hi + 1);
}

// Row j of the chains from row j + 1 and tensor j's base operations, walked
// backwards: an operation's chain is its duration plus the longer of what
// follows it in its tensor and, if it is its tensor's first on a lane, the
// later tensors' chain on that lane. CPU work counts as one lane of the
// pool, its tasks spread over the cores.
void Simulator::updateTail() {
  if (tailStale_ < 0) return;
  const int N = tensors();
  constexpr double kNone = -kInf;
  tail_.resize(size_t(N + 1) * kTailChains);
  std::fill(tail_.begin() + size_t(N) * kTailChains, tail_.end(), kNone);
  auto chainsOf = [](Res r) -> unsigned {
    switch (r) {
      case Res::kGpu: return 1u << 0;
      case Res::kIntra: return 1u << 1;
      case Res::kInter: return 1u << 2;
      case Res::kFlat: return (1u << 1) | (1u << 2);
      case Res::kD2H: return 1u << 3;
      case Res::kH2D: return 1u << 4;
      case Res::kCpu: return 1u << 5;
    }
    return 0;
  };
  std::vector<unsigned> first;
  for (int j = std::min(tailStale_, N - 1); j >= 0; --j) {
    const double* nx = &tail_[size_t(j + 1) * kTailChains];
    double* cur = &tail_[size_t(j) * kTailChains];
    std::copy(nx, nx + kTailChains, cur);
    const CompiledOption& c = compiled(j, base_[j]);
    const int m = int(c.ops.size());
    first.assign(m, 0);
    unsigned seen = 0;
    for (int i = 0; i < m; ++i) {
      if (c.ops[i].us <= 0) continue;
      const unsigned mask = chainsOf(c.ops[i].res);
      first[i] = mask & ~seen;
      seen |= mask;
    }
    double lpNext = 0;
    double work[6] = {};
    for (int i = m - 1; i >= 0; --i) {
      const SimOp& op = c.ops[i];
      if (op.us <= 0) continue;
      double d = op.us;
      const unsigned mask = chainsOf(op.res);
      if (op.res == Res::kCpu) {
        // Its tasks on the whole pool: the latency of one round per `cores`
        // tasks; the pool is free for the later tensors' work once it has
        // done this op's share (its total work over the cores).
        const double share = op.us * op.tasks / cluster_.cpuCores;
        // NOLINTNEXTLINE(bugprone-integer-division): whole rounds, on purpose
        d *= double((op.tasks + cluster_.cpuCores - 1) / cluster_.cpuCores);
        work[5] += share;
        lpNext = std::max(d + lpNext, first[i] ? share + nx[5] : -kInf);
      } else {
        for (int ch = 0; ch < 5; ++ch)
          if (mask >> ch & 1u) work[ch] += d;
        double succ = lpNext;
        for (int ch = 0; ch < 5; ++ch)
          if (first[i] >> ch & 1u) succ = std::max(succ, nx[ch]);
        lpNext = op.waitUs + d + succ;  // the skew before it (Cluster::syncSkew) holds no lane
      }
      for (int ch = 0; ch < 6; ++ch)
        if (first[i] >> ch & 1u) cur[ch] = lpNext;
    }
    // A lane also does all of this tensor's work on it before the later
    // tensors' (the queue-bound case, whatever waits in between).
    for (int ch = 0; ch < 6; ++ch)
      if (work[ch] > 0) cur[ch] = std::max(cur[ch], work[ch] + nx[ch]);
    cur[6] = profile_.tensors[j].backwardUs +
             std::max(lpNext, (cluster_.gpuCodecPausesCompute ? work[0] : 0.0) + nx[6]);
  }
  tailStale_ = -1;
}

// Each lane's frontier is the previous ready time plus the lane's work
// reserved after it (its backlog), so that where a tensor's operations land
// among the gaps matters less than how much work they add.
double Simulator::tailEstimate(const SimState& st, int k) {
  if (k >= tensors()) return st.maxFinish;
  updateTail();
  const double t0 = st.prevReady;
  double busy[kTailChains - 1] = {};
  for (int lane = 0; lane < lanes(); ++lane) {
    double b = 0;
    for (uint32_t i = st.begin[lane]; i < st.begin[lane + 1]; ++i)
      b += std::max(0.0, st.iv[i].e - std::max(st.iv[i].s, t0));
    busy[lane < kCpuLane0 ? lane : 5] += b;  // the chains are in lane order, then the CPU pool
  }
  return tailFrom(k, t0, st.maxFinish, busy);
}

double Simulator::tailFrom(int k, double t0, double maxFinish, const double* busy) const {
  const double* a = &tail_[size_t(k) * kTailChains];
  double est = maxFinish;
  for (int ch = 0; ch < 5; ++ch)
    if (a[ch] > -kInf) est = std::max(est, t0 + busy[ch] + a[ch]);
  if (a[5] > -kInf) est = std::max(est, t0 + busy[5] / cluster_.cpuCores + a[5]);
  // Codec kernels already queued on the GPU delay the computation still to come.
  return std::max(est, t0 + (cluster_.gpuCodecPausesCompute ? busy[0] : 0.0) + a[6]);
}

void Simulator::estimateOptions(int j, const std::vector<int>& options, std::vector<double>& out,
                                double bound) {
  const int N = tensors();
  if (fusion()) {
    // Where the tensor lands depends on the open group: step it exactly.
    const SimState base = checkpoint(j);
    out.resize(options.size());
    for (size_t i = 0; i < options.size(); ++i) {
      scratch_ = base;
      step(scratch_, j, options[i]);
      out[i] = tailEstimate(scratch_, j + 1);
    }
    return;
  }
  const SimState& st = checkpoint(j);
  updateTail();
  const double b = advanceCompute(st, st.prevReady, profile_.tensors[j].backwardUs);
  double busy[kTailChains - 1] = {};
  for (int lane = 0; lane < lanes(); ++lane) {
    double x = 0;
    for (uint32_t i = st.begin[lane]; i < st.begin[lane + 1]; ++i)
      x += std::max(0.0, st.iv[i].e - std::max(st.iv[i].s, b));
    busy[lane < kCpuLane0 ? lane : 5] += x;
  }
  out.resize(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    const CompiledOption& c = compiled(j, options[i]);
    double add[kTailChains - 1];
    add[0] = busy[0] + c.work[kWorkGpu];
    add[1] = busy[1] + c.work[kWorkIntra];
    add[2] = busy[2] + c.work[kWorkInter];
    add[3] = busy[3] + c.work[kWorkD2H];
    add[4] = busy[4] + c.work[kWorkH2D];
    add[5] = busy[5] + c.work[kWorkCpu];
    // The tensor cannot finish before its operations' durations in a row:
    // an estimate sure to be above `bound` needs no placing.
    if (bound < kInf) {
      const double low = std::max(st.maxFinish, executionStart(st, b) + c.pathUs);
      const double lb = j + 1 >= N ? low : tailFrom(j + 1, b, low, add);
      if (lb > bound) {
        out[i] = lb;
        continue;
      }
    }
    // Where the tensor's operations land: each starts after the previous
    // one ends, so none of them can take a gap that an earlier one took,
    // and the checkpoint's state needs no copy.
    double t = executionStart(st, b);  // as step()
    bool exchanging = false;
    for (const SimOp& op : c.ops) {
      const double d = op.us;
      if (!exchanging && op.kind == OpKind::kComm) {
        exchanging = true;
        if (pipelined()) t = std::max(t, st.maxFinish);  // as scheduleOps()
      }
      t += op.waitUs;  // as scheduleOps()
      if (twinOnCpu(op)) {
        t = placeCpu(st, op, t);
        continue;
      }
      switch (op.res) {
        case Res::kGpu: t = earliestFit(st, kGpuLane, t, d) + d; break;
        case Res::kIntra: t = earliestFit(st, kIntraLane, t, d) + d; break;
        case Res::kInter: t = earliestFit(st, kInterLane, t, d) + d; break;
        case Res::kD2H: t = earliestFit(st, kD2HLane, t, d) + d; break;
        case Res::kH2D: t = earliestFit(st, kH2DLane, t, d) + d; break;
        case Res::kFlat: {
          double s = t;
          for (;;) {
            const double s1 = earliestFit(st, kIntraLane, s, d);
            const double s2 = earliestFit(st, kInterLane, s1, d);
            s = s2;
            if (s2 == s1) break;
          }
          t = s + d;
          break;
        }
        case Res::kCpu: t = placeCpu(st, op, t); break;
      }
    }
    out[i] = j + 1 >= N ? std::max(st.maxFinish, t) : tailFrom(j + 1, b, std::max(st.maxFinish, t), add);
  }
}

int Simulator::lastBubble() const {
  const int N = tensors();
  std::vector<double> prefixMax(N, 0);
  double m = 0;
  for (int j = 0; j < N; ++j) {
    prefixMax[j] = m;  // max finish of tensors before j
    m = std::max(m, baseTimings_[j].finish);
  }
  for (int j = N - 1; j >= 1; --j)
    if (baseTimings_[j].ready >= prefixMax[j]) return j;
  return 0;
}

}  // namespace cortado::planner
