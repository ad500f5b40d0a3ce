// Cupcake's fusion search (fusion_search.h): the dynamic program over cut
// positions, its candidates and pruning, and the exhaustive oracle.
#include "scheduler/planner/fusion_search.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>

#include "core/common/error.h"
#include "scheduler/planner/compile.h"

namespace cortado::planner {
namespace {

constexpr double kEps = 1e-9;         // improvements smaller than this are float noise
constexpr int kBucketsPerOctave = 2;  // tree candidates are chosen per half octave of group bytes

double threadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

}  // namespace

FusionSearch::FusionSearch(Simulator& sim, FusionConfig config) : sim_(sim), config_(config) {
  CORTADO_ENFORCE(config_.maxGroupTensors >= 1, ErrorCode::kInvalidArgument,
                  "fusion search: maxGroupTensors must be >= 1, got {}", config_.maxGroupTensors);
  CORTADO_ENFORCE(config_.beam >= 1, ErrorCode::kInvalidArgument,
                  "fusion search: beam must be >= 1, got {}", config_.beam);
  CORTADO_ENFORCE(config_.treeCandidates >= 0, ErrorCode::kInvalidArgument,
                  "fusion search: treeCandidates must be >= 0, got {}", config_.treeCandidates);
  for (const plan::TensorOption& o : sim_.options()) {
    // As plan::validate: powersgd needs each tensor's matrix shape.
    // Nor Zen: its cost is each tensor's own density (plan::validate).
    const bool groupable = o.codec.rfind("powersgd", 0) != 0 && !o.zen();
    groupable_.push_back(groupable ? 1 : 0);
    // The tree's candidates come from the options Espresso's GPU pass
    // chooses among (no CPU codec): its offload to the CPU is per tensor.
    treePool_.push_back(groupable && !usesCpuCodec(o) ? 1 : 0);
  }
}

void FusionSearch::prepare(const Strategy& from) {
  const int N = sim_.tensors();
  from_ = from.choice;
  suffixBackward_.assign(size_t(N) + 1, 0);
  for (int j = N - 1; j >= 0; --j)
    suffixBackward_[size_t(j)] =
        suffixBackward_[size_t(j) + 1] + sim_.profile().tensors[size_t(j)].backwardUs;
  treeBuckets_.clear();
  // Rule 1's bound needs the last group's shortest possible sync, over the
  // options a group holding the last tensor can take (the search's
  // candidates for every such group). Every operation but a CPU task grows
  // with the bytes it carries (alpha-beta links and copies, GPU codecs,
  // non-decreasing measured curves), and such a group is at least the last
  // tensor; a CPU task's size is a partition's, which can shrink when the
  // buffer grows past a partition boundary, so CPU work is left out.
  std::vector<char> possible(size_t(sim_.optionCount()), config_.allOptions ? 1 : 0);
  if (!config_.allOptions) {
    const auto& ts = sim_.profile().tensors;
    int64_t elements = 0;
    for (int i = N - 1; i >= 0 && N - i <= config_.maxGroupTensors; --i) {
      if (ts[size_t(i)].dtypeBytes != ts[size_t(N) - 1].dtypeBytes) break;
      elements += ts[size_t(i)].elements;
      possible[size_t(from_[size_t(i)])] = 1;
      for (int o : treeBest(elements, ts[size_t(N) - 1].dtypeBytes)) possible[size_t(o)] = 1;
    }
  }
  minLastSyncUs_ = Simulator::kInf;
  for (int o = 0; o < sim_.optionCount(); ++o) {
    if (!possible[size_t(o)]) continue;
    double us = 0;
    for (const SimOp& op : sim_.compiled(N - 1, o).ops)
      if (op.res != Res::kCpu) us += op.us;
    minLastSyncUs_ = std::min(minLastSyncUs_, us);
  }
  nodes_.clear();
}

// A lower bound on the iteration time of every completion of a prefix that
// ends in `st` before tensor `next`: the latest finish so far, and the last
// tensor's ready time (the backward still to run, paused by the GPU codec
// work already reserved; later work only pauses it more) plus the shortest
// sync of a group holding it.
double FusionSearch::lowerBound(const SimState& st, int next) const {
  const double lastReady = sim_.backwardEnd(st, st.prevReady, suffixBackward_[size_t(next)]);
  return std::max(st.maxFinish, lastReady + minLastSyncUs_);
}

const std::vector<int>& FusionSearch::treeBest(int64_t elements, int dtype) {
  const double bytes = std::max(1.0, double(elements) * dtype);
  const int bucket = int(std::floor(std::log2(bytes) * kBucketsPerOctave));
  const int key = bucket * 64 + dtype;  // dtypes are a few bytes
  auto it = std::lower_bound(treeBuckets_.begin(), treeBuckets_.end(), key,
                             [](const auto& a, int k) { return a.first < k; });
  if (it != treeBuckets_.end() && it->first == key) return it->second;
  // The bucket's middle size, compiled for every option of the pool: a few
  // dozen buckets per model instead of one compile per group and option.
  const double mid = std::exp2((bucket + 0.5) / kBucketsPerOctave) / dtype;
  const auto e = std::max<int64_t>(1, int64_t(std::llround(mid)));
  std::vector<std::pair<double, int>> scored;
  for (int o = 0; o < sim_.optionCount(); ++o)
    if (treePool_[size_t(o)])
      scored.emplace_back(
          compileOption(sim_.cluster(), sim_.codec(), e, dtype, sim_.options()[size_t(o)]).pathUs,
          o);
  const size_t keep = std::min<size_t>(size_t(config_.treeCandidates), scored.size());
  std::partial_sort(scored.begin(), scored.begin() + ptrdiff_t(keep), scored.end());
  std::vector<int> best;
  for (size_t i = 0; i < keep; ++i) best.push_back(scored[i].second);
  return treeBuckets_.insert(it, {key, std::move(best)})->second;
}

void FusionSearch::candidates(int first, int last, int64_t elements,
                              const std::vector<int>& members, std::vector<int>& out) {
  out.clear();
  const bool multi = last > first;
  if (config_.allOptions) {
    for (int o = 0; o < sim_.optionCount(); ++o)
      if (!multi || groupable(o)) out.push_back(o);
    return;
  }
  for (int o : members)
    if (!multi || groupable(o)) out.push_back(o);
  if (membersOnly_) return;
  for (int o : treeBest(elements, sim_.profile().tensors[size_t(first)].dtypeBytes))
    if (std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
}

void FusionSearch::summary(const SimState& st, std::vector<double>& out) const {
  const int lanes = sim_.lanes();
  const int cpu0 = lanes - sim_.cluster().cpuCores;
  out.clear();
  out.push_back(st.prevReady);
  out.push_back(st.maxFinish);
  // With the pipeline the next execution's encode may start from here.
  out.push_back(sim_.pipelined() ? st.exchangeStart : 0.0);
  for (int l = 0; l < lanes; ++l)
    out.push_back(
        st.begin[size_t(l) + 1] > st.begin[size_t(l)] ? st.iv[st.begin[size_t(l) + 1] - 1].e : 0.0);
  // The cores are alike: compare their free times in order.
  std::sort(out.begin() + 3 + cpu0, out.end());
}

bool FusionSearch::dominates(const std::vector<double>& a, const std::vector<double>& b) const {
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k] > b[k] + kEps) return false;
  return true;
}

bool FusionSearch::sameLanes(const SimState& a, const SimState& b) const {
  return a.prevReady == b.prevReady && a.begin == b.begin && a.iv == b.iv &&
         (!sim_.pipelined() || a.exchangeStart == b.exchangeStart);
}

void FusionSearch::admit(std::vector<Label>& into, int next, const Node& node) {
  const SimState& added = scratch_;
  if (lowerBound(added, next) >= bestUs_ - kEps) {
    ++stats_.boundPruned;
    return;
  }
  const bool heuristic = !config_.exact && !stats_.finishOnly;
  const double score = heuristic ? sim_.tailEstimate(added, next) : 0.0;
  const double nextReady = sim_.readyAfter(added, added.prevReady, next);
  bool drained = true;
  for (size_t l = 0; drained && l + 1 < added.begin.size(); ++l)
    drained =
        added.begin[l + 1] == added.begin[l] || added.iv[added.begin[l + 1] - 1].e <= nextReady;
  // Into `slot` (a new one when null), reusing its buffers.
  auto keep = [&](Label* slot) {
    nodes_.push_back(node);
    if (!slot) {
      into.push_back(Label{added, 0, 0, false, 0});
      slot = &into.back();
      ++stats_.statesKept;
    } else {
      slot->st = added;
    }
    slot->node = int(nodes_.size()) - 1;
    slot->score = score;
    slot->drained = drained;
    slot->nextReady = nextReady;
  };
  if (stats_.finishOnly) {
    // The future depends on the state only through its latest finish, and
    // is not earlier for a later one: one state per position.
    if (into.empty()) {
      keep(nullptr);
    } else {
      ++stats_.merged;
      if (added.maxFinish < into.front().st.maxFinish - kEps) keep(&into.front());
    }
    return;
  }
  // Equal lanes and ready time: the futures are equal but for the latest
  // finish, of which overlapping lanes only take the maximum. One execution
  // at a time also starts from it, and there only an equal finish is
  // merged: a GPU codec call started earlier can pause the backward at a
  // worse moment.
  const bool byFinish = !sim_.cluster().oneTensorAtATime;
  if (drained) {
    // Between drained states, no later in the next ready time and the
    // latest finish is no worse: the futures are the same idle-lane
    // timeline shifted by the ready times (one execution at a time starts
    // at the ready time, past every finish so far).
    for (Label& other : into) {
      if (!other.drained) continue;
      if (other.nextReady <= nextReady && other.st.maxFinish <= added.maxFinish) {
        ++stats_.merged;
        return;
      }
      if (nextReady <= other.nextReady && added.maxFinish <= other.st.maxFinish) {
        ++stats_.merged;
        keep(&other);
        // Others it dominates stay: the bound and the beam drop them.
        return;
      }
    }
  }
  for (Label& other : into) {
    if (!sameLanes(other.st, added)) continue;
    if (!byFinish && other.st.maxFinish != added.maxFinish) continue;
    ++stats_.merged;
    if (added.maxFinish < other.st.maxFinish) keep(&other);
    return;
  }
  if (!heuristic || int(into.size()) < 2 * config_.beam) {
    keep(nullptr);
    return;
  }
  // The heuristic beam, kept as states arrive: twice the beam by score
  // (the dominance filter at the position then keeps the beam).
  Label* worst = &into.front();
  for (Label& l : into)
    if (l.score > worst->score) worst = &l;
  ++stats_.beamDropped;
  if (score < worst->score) keep(worst);
}

Strategy FusionSearch::strategyOf(int node, double iterUs) const {
  Strategy s{from_, iterUs};
  for (int n = node; n >= 0; n = nodes_[size_t(n)].parent) {
    const Node& x = nodes_[size_t(n)];
    for (int k = x.first; k <= x.last; ++k) s.choice[size_t(k)] = x.option;
    if (x.last > x.first) s.groups.emplace_back(x.first, x.last);
  }
  std::reverse(s.groups.begin(), s.groups.end());
  return s;
}

Strategy FusionSearch::search(const Strategy& from) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const double c0 = threadCpuMs();
  stats_ = FusionStats{};
  const int N = sim_.tensors();
  CORTADO_ENFORCE_EQ(int(from.choice.size()), N, ErrorCode::kInvalidArgument,
                     "fusion search: the starting strategy needs one option per tensor");
  CORTADO_ENFORCE(std::isfinite(config_.oneOptionMargin) && config_.oneOptionMargin >= 0,
                  ErrorCode::kInvalidArgument,
                  "fusion search: oneOptionMargin must be a fraction >= 0 (0.05: one option "
                  "wherever it is predicted within 5% of the mixed plan), got {}",
                  config_.oneOptionMargin);
  const double startUs = sim_.simulate(from.choice);  // its groups ignored
  Strategy best = searchFrom(Strategy{from.choice, startUs}, false);
  stats_.margin = config_.oneOptionMargin;
  stats_.mixedUs = best.iterUs;
  // One option in groups, for each option of the mixed plan that a group
  // can take, kept where it is predicted within the margin (FusionConfig::
  // oneOptionMargin) and no slower than the start. The exact and exhaustive
  // settings keep the optimum.
  std::vector<int> options;
  for (int o : best.choice)
    if (groupable(o) && std::find(options.begin(), options.end(), o) == options.end())
      options.push_back(o);
  if (config_.oneOptionMargin > 0 && !config_.exact && !config_.allOptions && options.size() > 1 &&
      !sim_.fusion() && N >= 2) {
    Strategy one;
    for (int o : options) {
      Strategy u{std::vector<int>(size_t(N), o), 0};
      u.iterUs = sim_.simulate(u.choice);
      Strategy g = searchFrom(u, true);
      if (one.choice.empty() || g.iterUs < one.iterUs) one = std::move(g);
    }
    stats_.oneOptionUs = one.iterUs;
    // Never predicted slower than the start, as the mixed search.
    if (one.iterUs <= best.iterUs * (1 + config_.oneOptionMargin) && one.iterUs <= startUs) {
      stats_.oneOption = one.choice.front();
      best = std::move(one);
    }
    sim_.setBase(from.choice);  // as the mixed search left it
  }
  stats_.groups = int(best.groups.size());
  for (const auto& [a, b] : best.groups) stats_.fusedTensors += b - a + 1;
  stats_.cpuMs = threadCpuMs() - c0;
  stats_.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return best;
}

Strategy FusionSearch::searchFrom(const Strategy& from, bool membersOnly) {
  const int N = sim_.tensors();
  const Strategy seed{from.choice, from.iterUs};
  if (sim_.fusion() || N < 2) return seed;
  membersOnly_ = membersOnly;
  prepare(from);
  bestUs_ = seed.iterUs;
  int bestNode = -1;  // -1: the seed
  const Cluster& c = sim_.cluster();
  // With the encode pipeline the next execution may start before the
  // latest finish (SimState::exchangeStart): the lanes count too.
  stats_.finishOnly = c.oneTensorAtATime && !c.gpuCodecPausesCompute && !sim_.pipelined();
  const bool heuristic = !config_.exact && !stats_.finishOnly;
  if (heuristic) sim_.setBase(from_);  // the tail estimates that rank the states follow it

  const auto& tensors = sim_.profile().tensors;
  std::vector<std::vector<Label>> frontier(static_cast<size_t>(N));
  frontier[0].push_back(Label{sim_.initialState(), -1, 0, false, 0});
  std::vector<int> members, cands;
  std::vector<size_t> order;
  std::vector<std::vector<double>> keptSummaries;
  std::vector<double> sum;
  for (int i = 0; i < N; ++i) {
    std::vector<Label>& F = frontier[size_t(i)];
    if (heuristic && F.size() > 1) {
      // The beam: states in the order of their estimated iteration time,
      // each kept unless an earlier kept one is no later in every lane.
      order.resize(F.size());
      std::iota(order.begin(), order.end(), size_t(0));
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (F[a].score != F[b].score) return F[a].score < F[b].score;
        return F[a].st.maxFinish < F[b].st.maxFinish;
      });
      std::vector<Label> kept;
      keptSummaries.clear();
      for (size_t r = 0; r < order.size(); ++r) {
        if (int(kept.size()) == config_.beam) {
          stats_.beamDropped += int64_t(order.size() - r);
          break;
        }
        summary(F[order[r]].st, sum);
        bool dominated = false;
        for (const auto& k : keptSummaries) dominated = dominated || dominates(k, sum);
        if (dominated) {
          ++stats_.dominated;
          continue;
        }
        keptSummaries.push_back(sum);
        kept.push_back(std::move(F[order[r]]));
      }
      F = std::move(kept);
    }
    stats_.maxFrontier = std::max(stats_.maxFrontier, int(F.size()));
    for (const Label& lab : F) {
      // The best time may have dropped since the state was admitted.
      if (lowerBound(lab.st, i) >= bestUs_ - kEps) {
        ++stats_.boundPruned;
        continue;
      }
      double ready = lab.st.prevReady;
      int64_t elements = 0;
      members.clear();
      const int dtype = tensors[size_t(i)].dtypeBytes;
      for (int j = i; j < N && j - i < config_.maxGroupTensors; ++j) {
        if (tensors[size_t(j)].dtypeBytes != dtype) break;  // a group is one buffer
        // The members' backward runs with nothing of theirs reserved yet.
        ready = sim_.readyAfter(lab.st, ready, j);
        elements += tensors[size_t(j)].elements;
        if (std::find(members.begin(), members.end(), from_[size_t(j)]) == members.end())
          members.push_back(from_[size_t(j)]);
        candidates(i, j, elements, members, cands);
        for (int o : cands) {
          ++stats_.groupSimulations;
          scratch_ = lab.st;
          sim_.placeGroup(scratch_, i, j, o, ready);
          if (j == N - 1) {
            if (scratch_.maxFinish < bestUs_ - kEps) {
              bestUs_ = scratch_.maxFinish;
              nodes_.push_back(Node{lab.node, i, j, o});
              bestNode = int(nodes_.size()) - 1;
            }
            continue;
          }
          admit(frontier[size_t(j) + 1], j + 1, Node{lab.node, i, j, o});
        }
      }
    }
    std::vector<Label>().swap(F);
  }
  if (bestNode < 0) return seed;
  return strategyOf(bestNode, bestUs_);
}

Strategy FusionSearch::exhaustive() {
  const int N = sim_.tensors(), K = sim_.optionCount();
  CORTADO_ENFORCE(
      !sim_.fusion(), ErrorCode::kInvalidArgument,
      "fusion exhaustive: the simulator runs the runtime's tensor fusion (fusionBytes {}), which "
      "groups do not compose with",
      sim_.cluster().fusionBytes);
  const auto& tensors = sim_.profile().tensors;
  std::vector<SimState> states(size_t(N) + 1);
  states[0] = sim_.initialState();
  std::vector<Node> path, bestPath;
  double best = Simulator::kInf;
  auto dfs = [&](auto&& self, int i) -> void {
    if (i == N) {
      if (states[size_t(N)].maxFinish < best - kEps) {
        best = states[size_t(N)].maxFinish;
        bestPath = path;
      }
      return;
    }
    double ready = states[size_t(i)].prevReady;
    for (int j = i; j < N; ++j) {
      if (tensors[size_t(j)].dtypeBytes != tensors[size_t(i)].dtypeBytes) break;
      ready = sim_.readyAfter(states[size_t(i)], ready, j);
      for (int o = 0; o < K; ++o) {
        if (j > i && !groupable(o)) continue;
        states[size_t(j) + 1] = states[size_t(i)];
        sim_.placeGroup(states[size_t(j) + 1], i, j, o, ready);
        // The latest finish never decreases along a prefix.
        if (states[size_t(j) + 1].maxFinish >= best - kEps) continue;
        path.push_back(Node{-1, i, j, o});
        self(self, j + 1);
        path.pop_back();
      }
    }
  };
  dfs(dfs, 0);
  Strategy s{std::vector<int>(size_t(N), 0), best};
  for (const Node& x : bestPath) {
    for (int k = x.first; k <= x.last; ++k) s.choice[size_t(k)] = x.option;
    if (x.last > x.first) s.groups.emplace_back(x.first, x.last);
  }
  return s;
}

}  // namespace cortado::planner
