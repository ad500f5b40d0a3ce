#include "scheduler/planner/decision.h"

#include <algorithm>
#include <chrono>
#include <functional>

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

// The estimated search (docs/planner.md, "Estimated search"); each value was
// chosen by measuring the predicted times against the exact search.
constexpr int kSmallModel = 64;         // models this small are searched exactly
constexpr int kSampledSizes = 64;       // sizes sampled for the candidate options
constexpr size_t kRerank = 3;           // options per tensor re-scored with a window
constexpr int kWindow = 32;             // tensors simulated past the changed one then
constexpr int kWindowChecked = 16;      // ... where the change is then checked exactly
constexpr int kCheckWindow = 64;        // ... and before a change is made
constexpr int kExactTail = kScreenWindow + 1;  // ... and these near the end
constexpr size_t kTailEvaluations = 2;          // ... simulate this many options in full
constexpr int kExactChecks = 512;       // up to this many tensors a change is checked exactly
constexpr int64_t kMinRefineChecks = 64;
constexpr int kLargeModelRefineRounds = 1;
constexpr int kBubbleRecheck = 8;  // lazy base: changes between re-checks of the last idle gap  // refinement sweeps past kExactChecks tensors
constexpr int64_t kExactOffloadCombos = 32;  // offload past kExactChecks tensors: exhaustive over at
                                             // most this many count vectors (256 below)

}  // namespace

std::vector<plan::TensorOption> plannerOptions(const Cluster& cluster, const std::string& codecSpec,
                                               bool zen) {
  TreeConfig cfg;
  cfg.zen = zen;
  cfg.codec = codecSpec;
  cfg.hierarchical = cluster.machines > 1;
  cfg.parameterServer = cluster.parameterServer && cluster.machines > 1;
  return enumerateOptions(cfg);
}

std::vector<plan::TensorOption> pushPullOptions(const std::vector<plan::TensorOption>& options) {
  std::vector<plan::TensorOption> out;
  for (const auto& o : options) {
    bool runs = true;
    for (const plan::Step& s : o.steps)
      if (s.kind == plan::StepKind::kComm &&
          (s.scope == plan::Scope::kFlat ||
           (s.scope == plan::Scope::kInter && s.op != plan::CommOp::kPush &&
            s.op != plan::CommOp::kPull)))
        runs = false;
    if (runs) out.push_back(o);
  }
  return out;
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

// The options not dominated (in their own sync time and in every kind of
// work) among `pool` for one tensor size, cheapest sync time first.
std::vector<int> Planner::front(const std::vector<int>& pool, int64_t elements, int dtypeBytes,
                                const Sparsity& sparsity) const {
  struct Cost {
    double path;
    double work[kWorkKinds];
    int option;
  };
  std::vector<Cost> costs;
  costs.reserve(pool.size());
  for (int o : pool) {
    const CompiledOption c = compileOption(sim_.cluster(), sim_.codec(), elements, dtypeBytes,
                                           sim_.options()[o], sparsity);
    Cost x{c.pathUs, {}, o};
    std::copy(c.work, c.work + kWorkKinds, x.work);
    costs.push_back(x);
  }
  std::stable_sort(costs.begin(), costs.end(), [](const Cost& a, const Cost& b) { return a.path < b.path; });
  std::vector<const Cost*> kept;
  std::vector<int> out;
  for (const Cost& c : costs) {
    bool dominated = false;
    for (const Cost* f : kept) {
      bool all = f->path <= c.path + kEps;
      for (int k = 0; all && k < kWorkKinds; ++k) all = f->work[k] <= c.work[k] + kEps;
      if (all) {
        dominated = true;
        break;
      }
    }
    if (!dominated) {
      kept.push_back(&c);
      out.push_back(c.option);
    }
  }
  return out;
}

const std::vector<int>& Planner::candidates(int cls) {
  if (candidatesReady_[cls]) return candidates_[cls];
  if (pool_.empty()) {
    for (int o = 0; o < sim_.optionCount(); ++o)
      if (gpuOnly_[o]) pool_.push_back(o);
    // Ours, in the estimated search of a model with many tensor sizes: the
    // options on the front at any of a few sizes spread over the model's
    // range (log-spaced), rather than every GPU option compiled for every
    // size. An option on the front only between two of these sizes is missed.
    if (!exact_ && sim_.sizeClasses() > kSampledSizes) {
      const auto& t = sim_.profile().tensors;
      int64_t lo = t[0].elements, hi = t[0].elements;
      for (const auto& x : t) {
        lo = std::min(lo, x.elements);
        hi = std::max(hi, x.elements);
      }
      std::vector<bool> on(sim_.optionCount(), false);
      for (int i = 0; i < kSampledSizes; ++i) {
        const double f = double(i) / (kSampledSizes - 1);
        const auto e = int64_t(std::llround(std::exp(std::log(double(lo)) * (1 - f) + std::log(double(hi)) * f)));
        for (int o : front(pool_, e, t[0].dtypeBytes)) on[o] = true;
      }
      std::vector<int> sampled;
      // Zen's options are priced by each tensor's density, which the sampled
      // sizes do not have: they stay in the pool.
      for (int o : pool_)
        if (on[o] || sim_.options()[size_t(o)].zen()) sampled.push_back(o);
      pool_ = std::move(sampled);
    }
  }
  // Zen's options are candidates only where the profile gives a density.
  std::vector<int> pool;
  for (int o : pool_)
    if (sim_.classSparsity(cls).density > 0 || !sim_.options()[size_t(o)].zen()) pool.push_back(o);
  candidates_[cls] =
      front(pool, sim_.classElements(cls), sim_.classDtype(cls), sim_.classSparsity(cls));
  if (sim_.fusion()) {
    // A fusible option is worth more than its cost alone says: fused with
    // its neighbours it pays one latency for many tensors. The options on
    // the front at the fused size (the threshold) are candidates too.
    std::vector<int> fusible;
    for (int o : pool_)
      if (sim_.options()[o].fusible()) fusible.push_back(o);
    const int dtype = sim_.classDtype(cls);
    const auto fused = int64_t(std::max<uint64_t>(1, sim_.cluster().fusionBytes / uint64_t(dtype)));
    for (int o : front(fusible, fused, dtype))
      if (std::find(candidates_[cls].begin(), candidates_[cls].end(), o) == candidates_[cls].end())
        candidates_[cls].push_back(o);
  }
  candidatesReady_[cls] = true;
  return candidates_[cls];
}

Strategy Planner::noCompression() {
  Strategy best{{}, Simulator::kInf};
  for (int o = 0; o < sim_.optionCount(); ++o) {
    // Zen is an option for the tensors with a density only (candidates()).
    if (compressed_[o] || sim_.options()[size_t(o)].zen()) continue;
    std::vector<int> choice(sim_.tensors(), o);
    double f = sim_.simulate(choice);
    ++stats_.evaluations;
    if (f < best.iterUs - kEps) best = Strategy{std::move(choice), f};
  }
  CORTADO_ENFORCE(!best.choice.empty(), ErrorCode::kInvalidArgument, "no uncompressed option");
  return best;
}

Strategy Planner::bestUniform(const std::function<bool(int)>& keep, bool count,
                               const UniformPrice& price) {
  Strategy best{{}, Simulator::kInf};
  for (int o = 0; o < sim_.optionCount(); ++o) {
    if (!keep(o)) continue;
    std::vector<int> choice(sim_.tensors(), o);
    const double f = price ? price(choice) : sim_.simulate(choice);
    if (count) ++stats_.evaluations;
    if (f < best.iterUs - kEps) best = Strategy{std::move(choice), f};
  }
  return best;
}

Strategy Planner::compressAllGpu() {
  Strategy best = bestUniform([&](int o) { return compressed_[o] && gpuOnly_[o]; }, false);
  return best.choice.empty() ? noCompression() : best;
}

Strategy Planner::compressAllCpu() {
  return bestUniform(
      [&](int o) { return compressed_[o] && !usesGpuCodec(sim_.options()[size_t(o)]); }, true);
}

std::vector<Strategy> Planner::compressAllByPath(const UniformPrice& price) {
  // The path an option takes between machines: the servers (a push), or
  // collectives, flat or hierarchical. With one GPU per machine a
  // hierarchical option's intra-machine steps have nothing to do, and its
  // collectives are the flat path's: that kind is left out rather than
  // timed twice.
  enum class Path { kFlat, kHierarchical, kServers };
  auto pathOf = [](const plan::TensorOption& opt) {
    for (const plan::Step& s : opt.steps)
      if (s.kind == plan::StepKind::kComm && s.op == plan::CommOp::kPush) return Path::kServers;
    return opt.hierarchical ? Path::kHierarchical : Path::kFlat;
  };
  const bool oneGpu = sim_.cluster().gpusPerMachine <= 1;
  std::vector<Strategy> out;
  for (const bool cpu : {false, true})
    for (const Path path : {Path::kFlat, Path::kHierarchical, Path::kServers}) {
      if (path == Path::kHierarchical && oneGpu) continue;
      Strategy best = bestUniform(
          [&](int o) {
            const plan::TensorOption& opt = sim_.options()[size_t(o)];
            // Codec steps on the GPU only or on the CPU only (not on both),
            // on the path of this kind.
            const bool onGpu = gpuOnly_[o], onCpu = !usesGpuCodec(opt);
            return compressed_[o] && pathOf(opt) == path && onGpu != onCpu && onCpu == cpu;
          },
          true, price);
      if (!best.choice.empty()) out.push_back(std::move(best));
    }
  std::stable_sort(out.begin(), out.end(),
                   [](const Strategy& a, const Strategy& b) { return a.iterUs < b.iterUs; });
  return out;
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
    g.gpuOption = o;
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

// With tensor fusion the sweeps' one-tensor moves cannot leave a small
// tensor uncompressed: alone, its collective pays a latency that its
// compression saved; only with the other small tensors in one fused
// collective does it gain. So the start also tries, for each fusible
// uncompressed option run uniformly and each size threshold (up to
// kThresholds of the tensors' distinct sizes), "below the threshold that
// option, the rest as compress-everything". Seen on 4 emulated hosts (cortado
// bench model, resnet101/DGC): the sweep kept all 314 tensors compressed at
// 531 ms while the scheduler's re-plan, 104 compressed, ran 431 ms, and the
// benchmark's own model put them at 479 and 429 ms.
void Planner::fusedSmallStart(const Strategy& all, Strategy& best) {
  constexpr size_t kThresholds = 32;
  const int N = sim_.tensors();
  const auto& tensors = sim_.profile().tensors;
  std::vector<double> sizes;
  for (const auto& t : tensors) sizes.push_back(double(t.bytes()));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<double> thresholds;  // "below": strictly smaller tensors take the fused option
  const size_t step = std::max<size_t>(1, sizes.size() / kThresholds);
  for (size_t i = 1; i < sizes.size(); i += step) thresholds.push_back(sizes[i]);
  thresholds.push_back(sizes.back() + 1);
  for (int o = 0; o < sim_.optionCount(); ++o) {
    if (compressed_[o] || !sim_.options()[size_t(o)].fusible()) continue;
    for (double th : thresholds) {
      std::vector<int> choice = all.choice;
      for (int j = 0; j < N; ++j)
        if (double(tensors[size_t(j)].bytes()) < th) choice[size_t(j)] = o;
      const double f = sim_.simulate(choice);
      ++stats_.evaluations;
      if (f < best.iterUs - kEps) best = Strategy{std::move(choice), f};
    }
  }
}

Strategy Planner::decide(bool refine) {
  stats_ = DecisionStats{};
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  auto t0 = Clock::now();
  // The sweeps only accept improvements, from a start. When tensors run one
  // at a time (Cluster::oneTensorAtATime) the start is the best of no
  // compression and compressing every tensor on the GPU or on the CPU, so
  // that the decision is never worse than any: from no compression alone
  // the greedy sweep ended 6% above compress-everything for resnet101 with
  // DGC, and from the GPU one 11% above compress-everything on the CPU for
  // bert-base with EFSignSGD on 16 cores (634 against 569 ms; cortado bench
  // model, docs/benchmarks.md). The overlapped model keeps starting from no
  // compression (not re-examined).
  Strategy start = noCompression();
  if (sim_.cluster().oneTensorAtATime) {
    for (Strategy all : {compressAllGpu(), compressAllCpu()}) {
      if (all.choice.empty()) continue;
      if (sim_.fusion()) fusedSmallStart(all, start);
      if (all.iterUs < start.iterUs - kEps) start = std::move(all);
    }
  }
  Strategy s = exact_ ? gpuPass(start) : sweepEstimated(start, false);
  auto t1 = Clock::now();
  stats_.gpuPassEvaluations = stats_.evaluations;
  stats_.gpuPassMs = ms(t0, t1);
  s = exact_ ? offloadPass(s) : offload(s);
  auto t2 = Clock::now();
  stats_.offloadEvaluations = stats_.evaluations - stats_.gpuPassEvaluations;
  stats_.offloadMs = ms(t1, t2);
  // Each sweep only accepts improvements; a few are enough in practice.
  // The refinement's simulations are capped so that its cost stays in
  // proportion to the GPU pass's on big models; small instances (6 tensors
  // with 60 candidates each need at most 1080 in three rounds) never reach it.
  refineBudget_ = exact_ || sim_.tensors() <= kSmallModel
                      ? std::max<int64_t>(kMinRefineBudget, stats_.gpuPassEvaluations)
                      : std::max<int64_t>(kMinRefineChecks, stats_.gpuPassEvaluations);
  // The estimated search on a model past kExactChecks tensors sweeps once:
  // each sweep estimates every tensor's options again.
  const int rounds = !exact_ && sim_.tensors() > kExactChecks ? kLargeModelRefineRounds : 3;
  for (int round = 0; refine && round < rounds && refineBudget_ > 0; ++round) {
    Strategy r;
    if (exact_) {
      r = refinePass(s);
    } else {
      r = sweepEstimated(s, true);
      if (r.iterUs < s.iterUs - kEps) r = offload(r);
    }
    if (r.iterUs >= s.iterUs - kEps) break;
    s = std::move(r);
  }
  stats_.refineEvaluations = stats_.evaluations - stats_.gpuPassEvaluations - stats_.offloadEvaluations;
  stats_.refineMs = ms(t2, Clock::now());
  return s;
}

std::vector<int> Planner::visitOrder() const {
  std::vector<int> order(sim_.tensors());
  std::iota(order.begin(), order.end(), 0);
  const auto& tensors = sim_.profile().tensors;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (tensors[a].bytes() != tensors[b].bytes()) return tensors[a].bytes() > tensors[b].bytes();
    return a > b;  // inside a bucket, the later-ready tensor first
  });
  return order;
}

void Planner::tries(int j, int current, bool withCpu, std::vector<int>& out) {
  out.clear();
  for (int o : candidates(sim_.sizeClass(j))) {
    if (o != current) out.push_back(o);
    if (withCpu && compressed_[o] && cpuVariant_[o] >= 0 && cpuVariant_[o] != current)
      out.push_back(cpuVariant_[o]);
  }
}

// The estimated sweep: Espresso's order and candidates, but instead of
// simulating every candidate to the end:
//  1. every candidate is scored by Simulator::estimateOptions() (its tensor
//     placed against the base's checkpoint, the rest of the iteration
//     estimated from the base's later work);
//  2. the kRerank best that beat the current option are scored again with
//     the next kWindow tensors simulated;
//  3. the best of those, if it still beats the current option, is checked:
//     on models of up to kExactChecks tensors by simulating it to the end
//     (made only if better, as in the exact search); on larger ones with a
//     kCheckWindow window, made without re-simulating the base (the base
//     catches up lazily) and the sweep as a whole is simulated at its end
//     and kept only if better.
// Models of up to kSmallModel tensors are searched exactly (every candidate
// simulated to the end); on models of up to kExactChecks tensors, the last
// kExactTail tensors simulate their kTailEvaluations best-estimated
// candidates in full in the GPU pass.
Strategy Planner::sweepEstimated(const Strategy& start, bool withCpu) {
  const int N = sim_.tensors();
  std::vector<int> choice = start.choice;
  sim_.setBase(choice);
  double F = sim_.baseTime();
  int bubble = withCpu ? gpuPassBubble_ : sim_.lastBubble();
  const bool lazy = N > kExactChecks;
  bool lazyChanged = false;
  int lazyChanges = 0;
  std::vector<int> opts;
  std::vector<std::pair<double, int>> scored;
  std::vector<double> est;
  std::vector<std::pair<int, int>> one(1);
  const std::vector<std::pair<int, int>> none;
  auto take = [&](int j, int o) {
    choice[j] = o;
    if (withCpu) ++stats_.refineChanges;
    if (lazy) {
      sim_.changeBase(j, o);
      lazyChanged = true;
      // Every few changes the base catches up and the last idle gap is
      // checked again (each catch-up is one simulation from the earliest
      // change on).
      if (!withCpu && ++lazyChanges % kBubbleRecheck == 0) {
        sim_.setBase(choice);
        bubble = sim_.lastBubble();
      }
      return;
    }
    sim_.setBase(choice);
    F = sim_.baseTime();
    if (!withCpu) bubble = sim_.lastBubble();
  };
  for (int j : visitOrder()) {
    // Tensors whose communication ends before the channels' last idle gap
    // gain nothing from compression (with a lazy base, the gap is the
    // sweep's first one).
    if (j < bubble && !compressed_[choice[j]]) {
      ++stats_.pruned;
      continue;
    }
    ++stats_.gpuPassVisited;
    tries(j, choice[j], withCpu, opts);
    if (opts.empty()) continue;
    const bool tail = !lazy && !withCpu && N - j <= kExactTail;
    if (tail && N > kSmallModel) {
      // Near the end the full simulations are short: the kFullEvaluations
      // options with the best estimates are simulated in full.
      sim_.estimateOptions(j, opts, est);
      stats_.estimates += int(opts.size());
      scored.clear();
      for (size_t i = 0; i < opts.size(); ++i) scored.emplace_back(est[i], opts[i]);
      const size_t keep = std::min<size_t>(kTailEvaluations, scored.size());
      std::partial_sort(scored.begin(), scored.begin() + keep, scored.end());
      opts.clear();
      for (size_t i = 0; i < keep; ++i) opts.push_back(scored[i].second);
    }
    if (N <= kSmallModel || tail) {
      double best = F;
      int bestOpt = choice[j];
      for (int o : opts) {
        if (withCpu && refineBudget_-- <= 0) break;
        one[0] = {j, o};
        const double f = sim_.evaluate(one, best);
        ++stats_.evaluations;
        if (f < best - kEps) {
          best = f;
          bestOpt = o;
        }
      }
      if (bestOpt != choice[j]) take(j, bestOpt);
      continue;
    }
    // 1.
    sim_.estimateOptions(j, {choice[j]}, est);
    const double cur = est[0];
    sim_.estimateOptions(j, opts, est, cur - kEps);
    stats_.estimates += int(opts.size()) + 1;
    scored.clear();
    for (size_t i = 0; i < opts.size(); ++i)
      if (est[i] < cur - kEps) scored.emplace_back(est[i], opts[i]);
    if (scored.empty()) continue;
    // 2.
    const size_t keep = std::min(kRerank, scored.size());
    std::partial_sort(scored.begin(), scored.begin() + keep, scored.end());
    const int hi = std::min(N - 1, j + (lazy ? kWindow : kWindowChecked));
    const double cur2 = sim_.estimate(j, hi, none);
    size_t n = 0;
    for (size_t i = 0; i < keep; ++i) {
      one[0] = {j, scored[i].second};
      const double f = sim_.estimate(j, hi, one);
      if (f < cur2 - kEps) scored[n++] = {f, scored[i].second};
    }
    stats_.windowed += int(keep) + 1;
    if (n == 0) continue;
    std::sort(scored.begin(), scored.begin() + n);
    const int bestOpt = scored[0].second;
    // 3.
    if (withCpu && refineBudget_-- <= 0) continue;
    one[0] = {j, bestOpt};
    bool better;
    if (lazy) {
      const int hi2 = std::min(N - 1, j + kCheckWindow);
      better = sim_.estimate(j, hi2, one) < sim_.estimate(j, hi2, none) - kEps;
      stats_.windowed += 2;
    } else {
      better = sim_.evaluate(one, F) < F - kEps;
      ++stats_.evaluations;
    }
    if (better) {
      take(j, bestOpt);
    } else {
      ++stats_.rejected;
    }
  }
  if (lazyChanged) {
    F = sim_.exactBaseTime();
    ++stats_.evaluations;
    sim_.setBase(choice);
    if (!withCpu) bubble = sim_.lastBubble();
  }
  if (!withCpu) gpuPassBubble_ = bubble;
  if (F >= start.iterUs - kEps) return start;
  return Strategy{std::move(choice), F};
}

Strategy Planner::offload(const Strategy& from) {
  // Small models, or few vectors of counts: the exact search over them.
  if (sim_.tensors() <= kSmallModel) return offloadPass(from);
  int64_t combos = 1;
  for (const Group& g : offloadGroups(from)) {
    combos *= int64_t(g.tensors.size()) + 1;
    if (combos > (sim_.tensors() <= kExactChecks ? 256 : kExactOffloadCombos)) return offloadEstimated(from);
  }
  return offloadPass(from);
}

// Coordinate descent over the groups' counts as in offloadPass(), each count
// scored by an estimate of the change from the current counts: the tensors
// that move are simulated exactly, the rest estimated.
Strategy Planner::offloadEstimated(const Strategy& from) {
  std::vector<Group> groups = offloadGroups(from);
  stats_.offloadGroups = int(groups.size());
  stats_.offloadExhaustive = false;
  if (groups.empty()) return from;
  sim_.setBase(from.choice);
  std::vector<int> choice = from.choice;
  std::vector<int> counts(groups.size(), 0);
  std::vector<std::pair<int, int>> ov;
  const std::vector<std::pair<int, int>> none;
  bool changed = true;
  for (int round = 0; changed && round < 8; ++round) {
    changed = false;
    for (size_t g = 0; g < groups.size(); ++g) {
      const Group& G = groups[g];
      const int cur = counts[g];
      double bestGain = -kEps;
      int bestQ = cur;
      for (int q = 0; q <= int(G.tensors.size()); ++q) {
        if (q == cur) continue;
        // The tensors between the two counts switch device.
        ov.clear();
        for (int i = std::min(q, cur); i < std::max(q, cur); ++i)
          ov.emplace_back(G.tensors[i], q > cur ? G.cpuOption : G.gpuOption);
        const int lo = ov.front().first, hi = ov.back().first;
        const double gain = sim_.estimate(lo, hi, ov) - sim_.estimate(lo, hi, none);
        stats_.estimates += 2;
        if (gain < bestGain) {
          bestGain = gain;
          bestQ = q;
        }
      }
      if (bestQ != cur) {
        for (int i = std::min(bestQ, cur); i < std::max(bestQ, cur); ++i) {
          const int j = G.tensors[i];
          choice[j] = bestQ > cur ? G.cpuOption : G.gpuOption;
          sim_.changeBase(j, choice[j]);
        }
        counts[g] = bestQ;
        changed = true;
      }
    }
  }
  const double F = sim_.exactBaseTime();
  ++stats_.evaluations;
  sim_.setBase(choice);
  if (F >= from.iterUs - kEps) return from;
  return Strategy{std::move(choice), F};
}

Strategy Planner::exhaustive() {
  const int N = sim_.tensors(), K = sim_.optionCount();
  std::vector<SimState> states(N + 1);
  states[0] = sim_.initialState();
  std::vector<int> choice(N, 0);
  Strategy best{{}, Simulator::kInf};
  // Depth-first over tensors; the prefix's settled finish (its latest one,
  // less an open fused group's) only grows, so a prefix already at the best
  // time cannot lead to a better strategy.
  auto dfs = [&](auto&& self, int j) -> void {
    if (j == N) {
      if (states[N].maxFinish < best.iterUs - kEps) best = Strategy{choice, states[N].maxFinish};
      return;
    }
    for (int o = 0; o < K; ++o) {
      states[j + 1] = states[j];
      sim_.step(states[j + 1], j, o);
      if (sim_.settledFinish(states[j + 1]) >= best.iterUs - kEps) continue;
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
