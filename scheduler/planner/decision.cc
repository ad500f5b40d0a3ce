#include "scheduler/planner/decision.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <unordered_map>

#include "core/common/error.h"

namespace cortado::planner {
namespace {

constexpr double kEps = 1e-9;  // improvements smaller than this are float noise
constexpr int64_t kMinRefineBudget = 1200;
constexpr int kScreenWindow = 24;    // tensors simulated past the changed one when screening
constexpr int kFullEvaluations = 4;  // options per tensor simulated in full after screening

bool dominates(const CompiledOption& a, const CompiledOption& b) {
  if (a.pathUs > b.pathUs + kEps) return false;
  for (int k = 0; k < kWorkKinds; ++k)
    if (a.work[k] > b.work[k] + kEps) return false;
  return true;
}

}  // namespace

std::vector<plan::TensorOption> plannerOptions(const Cluster& cluster, const std::string& codecSpec) {
  TreeConfig cfg;
  cfg.codec = codecSpec;
  cfg.hierarchical = cluster.machines > 1;
  cfg.parameterServer = cluster.parameterServer && cluster.machines > 1;
  return enumerateOptions(cfg);
}

Planner::Planner(Simulator& sim) : sim_(sim) {
  const auto& opts = sim_.options();
  const int K = int(opts.size());
  compressed_.resize(K);
  gpuOnly_.resize(K);
  cpuVariant_.assign(K, -1);
  std::unordered_map<std::string, int> index;
  for (int o = 0; o < K; ++o) {
    compressed_[o] = opts[o].compressed();
    gpuOnly_[o] = !usesCpuCodec(opts[o]);
    index.emplace(opts[o].describe(), o);
  }
  for (int o = 0; o < K; ++o) {
    if (!compressed_[o]) continue;
    auto it = index.find(withCodecDevice(opts[o], plan::Device::kCpu).describe());
    if (it != index.end()) cpuVariant_[o] = it->second;
  }
  candidates_.resize(sim_.sizeClasses());
  candidatesReady_.assign(sim_.sizeClasses(), false);
}

const std::vector<int>& Planner::candidates(int cls) {
  if (candidatesReady_[cls]) return candidates_[cls];
  std::vector<int> order;
  for (int o = 0; o < sim_.optionCount(); ++o)
    if (gpuOnly_[o]) order.push_back(o);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return sim_.compiledForClass(cls, a).pathUs < sim_.compiledForClass(cls, b).pathUs;
  });
  auto& front = candidates_[cls];
  for (int o : order) {
    const CompiledOption& c = sim_.compiledForClass(cls, o);
    bool dominated = false;
    for (int f : front)
      if (dominates(sim_.compiledForClass(cls, f), c)) {
        dominated = true;
        break;
      }
    if (!dominated) front.push_back(o);
  }
  candidatesReady_[cls] = true;
  return front;
}

Strategy Planner::noCompression() {
  Strategy best{{}, Simulator::kInf};
  for (int o = 0; o < sim_.optionCount(); ++o) {
    if (compressed_[o]) continue;
    std::vector<int> choice(sim_.tensors(), o);
    double f = sim_.simulate(choice);
    ++stats_.evaluations;
    if (f < best.iterUs - kEps) best = Strategy{std::move(choice), f};
  }
  CORTADO_ENFORCE(!best.choice.empty(), ErrorCode::kInvalidArgument, "no uncompressed option");
  return best;
}

Strategy Planner::compressAllGpu() {
  Strategy best{{}, Simulator::kInf};
  for (int o = 0; o < sim_.optionCount(); ++o) {
    if (!compressed_[o] || !gpuOnly_[o]) continue;
    std::vector<int> choice(sim_.tensors(), o);
    double f = sim_.simulate(choice);
    if (f < best.iterUs - kEps) best = Strategy{std::move(choice), f};
  }
  return best.choice.empty() ? noCompression() : best;
}

Strategy Planner::gpuPass(const Strategy& start) { return sweep(start, false); }

Strategy Planner::refinePass(const Strategy& from) {
  Strategy s = sweep(from, true);
  if (s.iterUs < from.iterUs - kEps) s = offloadPass(s);
  return s.iterUs < from.iterUs - kEps ? s : from;
}

Strategy Planner::sweep(const Strategy& start, bool withCpu) {
  const int N = sim_.tensors();
  std::vector<int> choice = start.choice;
  sim_.setBase(choice);
  double F = sim_.baseTime();

  std::vector<int> order(N);
  std::iota(order.begin(), order.end(), 0);
  const auto& tensors = sim_.profile().tensors;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (tensors[a].bytes() != tensors[b].bytes()) return tensors[a].bytes() > tensors[b].bytes();
    return a > b;  // inside a bucket, the later-ready tensor first
  });

  // The GPU pass re-checks the last idle gap after each choice. The
  // refinement keeps the GPU pass's final gap: a CPU codec's long queue (from
  // the offload pass or the refinement itself) erases idle gaps without
  // making the tensors before them worth compressing, and re-checking would
  // then visit every tensor with twice the candidates.
  int bubble = withCpu ? gpuPassBubble_ : sim_.lastBubble();
  std::vector<std::pair<int, int>> one(1);
  std::vector<int> tries;
  std::vector<std::pair<double, int>> scored;
  for (int j : order) {
    // Tensors whose communication ends before the channels' last idle gap
    // gain nothing from compression.
    if (j < bubble && !compressed_[choice[j]]) {
      ++stats_.pruned;
      continue;
    }
    ++stats_.gpuPassVisited;
    double best = F;
    int bestOpt = choice[j];
    auto tryOption = [&](int o) {
      if (o < 0 || o == choice[j]) return;
      if (withCpu && refineBudget_-- <= 0) return;
      one[0] = {j, o};
      double f = sim_.evaluate(one, best);
      ++stats_.evaluations;
      if (f < best - kEps) {
        best = f;
        bestOpt = o;
      }
    };
    tries.clear();
    for (int o : candidates(sim_.sizeClass(j))) {
      tries.push_back(o);
      if (withCpu && compressed_[o] && cpuVariant_[o] >= 0) tries.push_back(cpuVariant_[o]);
    }
    // Far from the end, only the options that look best a few tensors ahead
    // are simulated in full (ours: Espresso simulates every one).
    if (int(tries.size()) > kFullEvaluations && N - j > kScreenWindow + 1) {
      // Only the kFullEvaluations lowest scores matter: once that many are
      // known, a score sure to exceed the highest of them is cut short.
      scored.clear();
      std::vector<double>& low = lowScores_;
      low.clear();
      for (int o : tries) {
        if (o == choice[j]) continue;
        const double bound = int(low.size()) < kFullEvaluations ? Simulator::kInf : low.back();
        const double score = sim_.screen(j, o, kScreenWindow, bound);
        scored.emplace_back(score, o);
        if (score <= bound) {
          low.insert(std::upper_bound(low.begin(), low.end(), score), score);
          if (int(low.size()) > kFullEvaluations) low.pop_back();
        }
      }
      stats_.screened += int(scored.size());
      const size_t keep = std::min<size_t>(kFullEvaluations, scored.size());
      std::partial_sort(scored.begin(), scored.begin() + keep, scored.end());
      tries.clear();
      for (size_t i = 0; i < keep; ++i) tries.push_back(scored[i].second);
    }
    for (int o : tries) tryOption(o);
    if (bestOpt != choice[j]) {
      if (withCpu) ++stats_.refineChanges;
      choice[j] = bestOpt;
      sim_.setBase(choice);
      F = sim_.baseTime();
      if (!withCpu) bubble = sim_.lastBubble();
    }
  }
  if (!withCpu) gpuPassBubble_ = bubble;
  return Strategy{std::move(choice), F};
}

std::vector<Planner::Group> Planner::offloadGroups(const Strategy& s) const {
  std::map<std::pair<int, int>, Group> groups;  // (size class, option) -> group
  for (int j = 0; j < int(s.choice.size()); ++j) {
    int o = s.choice[j];
    if (!compressed_[o] || !gpuOnly_[o] || cpuVariant_[o] < 0) continue;
    Group& g = groups[{sim_.sizeClass(j), o}];
    g.cpuOption = cpuVariant_[o];
    g.tensors.push_back(j);
  }
  std::vector<Group> out;
  for (auto& [k, g] : groups) out.push_back(std::move(g));
  return out;
}

std::vector<std::pair<int, int>> Planner::overridesFor(const std::vector<Group>& groups,
                                                       const std::vector<int>& counts) const {
  std::vector<std::pair<int, int>> ov;
  for (size_t g = 0; g < groups.size(); ++g)
    for (int q = 0; q < counts[g]; ++q) ov.emplace_back(groups[g].tensors[q], groups[g].cpuOption);
  std::sort(ov.begin(), ov.end());
  return ov;
}

Strategy Planner::offloadPass(const Strategy& from, int64_t maxCombos) {
  std::vector<Group> groups = offloadGroups(from);
  stats_.offloadGroups = int(groups.size());
  if (groups.empty()) return from;
  sim_.setBase(from.choice);
  double best = sim_.baseTime();
  std::vector<int> bestCounts(groups.size(), 0);

  int64_t combos = 1;
  for (const Group& g : groups) {
    combos *= int64_t(g.tensors.size()) + 1;
    if (combos > maxCombos) break;
  }
  stats_.offloadExhaustive = combos <= maxCombos;
  if (stats_.offloadExhaustive) {
    // Every vector of counts, as a mixed-radix counter.
    std::vector<int> counts(groups.size(), 0);
    for (;;) {
      size_t g = 0;
      while (g < groups.size() && counts[g] == int(groups[g].tensors.size())) counts[g++] = 0;
      if (g == groups.size()) break;
      ++counts[g];
      double f = sim_.evaluate(overridesFor(groups, counts), best);
      ++stats_.evaluations;
      if (f < best - kEps) {
        best = f;
        bestCounts = counts;
      }
    }
  } else {
    // Coordinate descent: the best count of one group given the others.
    bool changed = true;
    for (int round = 0; changed && round < 8; ++round) {
      changed = false;
      for (size_t g = 0; g < groups.size(); ++g) {
        std::vector<int> counts = bestCounts;
        for (int q = 0; q <= int(groups[g].tensors.size()); ++q) {
          if (q == bestCounts[g]) continue;
          counts[g] = q;
          double f = sim_.evaluate(overridesFor(groups, counts), best);
          ++stats_.evaluations;
          if (f < best - kEps) {
            best = f;
            bestCounts = counts;
            changed = true;
          }
        }
      }
    }
  }
  Strategy out = from;
  for (const auto& [j, o] : overridesFor(groups, bestCounts)) out.choice[j] = o;
  out.iterUs = best;
  return out;
}

Strategy Planner::decide(bool refine) {
  stats_ = DecisionStats{};
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  auto t0 = Clock::now();
  Strategy s = gpuPass(noCompression());
  auto t1 = Clock::now();
  stats_.gpuPassEvaluations = stats_.evaluations;
  stats_.gpuPassMs = ms(t0, t1);
  s = offloadPass(s);
  auto t2 = Clock::now();
  stats_.offloadEvaluations = stats_.evaluations - stats_.gpuPassEvaluations;
  stats_.offloadMs = ms(t1, t2);
  // Each sweep only accepts improvements; a few are enough in practice.
  // The refinement's simulations are capped so that its cost stays in
  // proportion to the GPU pass's on big models; small instances (6 tensors
  // with 60 candidates each need at most 1080 in three rounds) never reach it.
  refineBudget_ = std::max<int64_t>(kMinRefineBudget, stats_.gpuPassEvaluations);
  for (int round = 0; refine && round < 3 && refineBudget_ > 0; ++round) {
    Strategy r = refinePass(s);
    if (r.iterUs >= s.iterUs - kEps) break;
    s = std::move(r);
  }
  stats_.refineEvaluations = stats_.evaluations - stats_.gpuPassEvaluations - stats_.offloadEvaluations;
  stats_.refineMs = ms(t2, Clock::now());
  return s;
}

Strategy Planner::exhaustive() {
  const int N = sim_.tensors(), K = sim_.optionCount();
  std::vector<SimState> states(N + 1);
  states[0] = sim_.initialState();
  std::vector<int> choice(N, 0);
  Strategy best{{}, Simulator::kInf};
  // Depth-first over tensors; the prefix's latest finish only grows, so a
  // prefix already at the best time cannot lead to a better strategy.
  auto dfs = [&](auto&& self, int j) -> void {
    if (j == N) {
      if (states[N].maxFinish < best.iterUs - kEps) best = Strategy{choice, states[N].maxFinish};
      return;
    }
    for (int o = 0; o < K; ++o) {
      states[j + 1] = states[j];
      sim_.step(states[j + 1], j, o);
      if (states[j + 1].maxFinish >= best.iterUs - kEps) continue;
      choice[j] = o;
      self(self, j + 1);
    }
  };
  dfs(dfs, 0);
  return best;
}

Strategy Planner::exhaustiveOffload(const Strategy& from) {
  std::vector<Group> groups = offloadGroups(from);
  Strategy best = from;
  best.iterUs = sim_.simulate(from.choice);
  std::vector<int> counts(groups.size(), 0);
  for (;;) {
    size_t g = 0;
    while (g < groups.size() && counts[g] == int(groups[g].tensors.size())) counts[g++] = 0;
    if (g == groups.size()) break;
    ++counts[g];
    std::vector<int> choice = from.choice;
    for (const auto& [j, o] : overridesFor(groups, counts)) choice[j] = o;
    double f = sim_.simulate(choice);
    if (f < best.iterUs - kEps) best = Strategy{std::move(choice), f};
  }
  return best;
}

}  // namespace cortado::planner
