// Cupcake's fusion search (docs/planner.md, "Fused groups (Cupcake)";
// ../shared/specs/cupcake.md §2-3): cuts the tensors, in gradient-ready
// order, into consecutive groups and gives each group one option, choosing
// the cuts and the options together against the timeline simulator. A group
// runs its option once on the concatenation of its members, from when its
// last member is ready (Simulator::stepGroup): one codec call and one message
// instead of one per tensor, paid for with a later start.
//
// The search is a dynamic program over the position of the next cut: the
// states kept at position i are the simulator's lane states after the groups
// that end before tensor i. It starts from a per-tensor strategy (Espresso's
// decision), whose options are the members' candidates and whose simulated
// time is the first bound, so the result is never predicted slower than it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "scheduler/planner/decision.h"
#include "scheduler/planner/simulator.h"

namespace cortado::planner {

struct FusionConfig {
  // Members of a group at most (the length of the cut's look-back). 12 and
  // a beam of 3 came within the noise of 16 and 4 on the bundled models at
  // 8 x 8 (10 and 25 Gbit/s) in two thirds of the time; a beam of 16 over
  // 32 members gained at most 0.3 points more, in 5 to 10 times the time.
  int maxGroupTensors = 12;
  // Besides the members' own options, the options of the tree (GPU codecs or
  // none) with the shortest sync time alone at the group's size, this many.
  int treeCandidates = 2;
  // Every option for every group instead of the candidates above (the
  // exhaustive oracle's space; small instances only).
  bool allOptions = false;
  // true: only provable pruning (the lower bound, and identical lane states
  // keep the earlier finish), so the result is the optimum over the
  // candidates, at exponential cost where lanes never drain. false: also the
  // heuristic dominance and the beam below (fast; checked against the
  // oracle by the tests).
  bool exact = false;
  // States kept per position in the heuristic search, the best by the
  // simulator's tail estimate of the rest of the iteration.
  int beam = 3;
  // After the search: for each option of the result that a group can take,
  // every tensor on that option alone, its groups searched the same way; the
  // fastest of those replaces a result that mixes options unless the mix is
  // predicted faster by more than this fraction (or the one option slower
  // than the search's start). The choice that is fastest under a cost model
  // is, on average, slower than predicted (the more options it picks among
  // per tensor, the more it gains from the model's errors); one option
  // carries fewer of them. In the model-replay runs AL and AM of 2026-12-01
  // (docs/benchmarks.md) the mixed plans ran 7.7% slower than predicted on
  // average, MergeComp's one-option plans 1.8% faster than predicted.
  // 0: the mixed optimum (kept also with `exact` and `allOptions`).
  double oneOptionMargin = 0.05;
};

struct FusionStats {
  int64_t groupSimulations = 0;  // group executions placed against a state
  int64_t statesKept = 0;        // states that entered a position's frontier
  int64_t boundPruned = 0;       // states cut by the lower bound (rule 1)
  int64_t merged = 0;            // states replaced by one with the same lanes and an earlier finish
  int64_t dominated = 0;         // heuristic: states dominated in every lane's free time
  int64_t beamDropped = 0;       // heuristic: states past the beam
  int maxFrontier = 0;           // the most states any position held
  // The lane state reduced to the latest finish (one execution at a time,
  // codec steps off the computation): one state per position, exact.
  bool finishOnly = false;
  int groups = 0;            // fused groups (two or more members) in the result
  int fusedTensors = 0;      // tensors in them
  double ms = 0, cpuMs = 0;  // wall clock and the searching thread's CPU time
  // FusionConfig::oneOptionMargin as searched with, the mixed search's
  // simulated time, the best one-option grouping's (0: none searched), and
  // that option where it was kept (-1: the mixed plan was).
  double margin = 0, mixedUs = 0, oneOptionUs = 0;
  int oneOption = -1;
};

class FusionSearch {
 public:
  // `sim` is used, not owned.
  explicit FusionSearch(Simulator& sim, FusionConfig config = {});

  // The best grouping found, starting from the per-tensor strategy `from`
  // (its groups ignored). Returns `from` with its simulated time and no
  // groups when no grouping is predicted faster, or when the simulator runs
  // the runtime's own tensor fusion (Cluster::fusionBytes), which the group
  // model does not compose with. A result that mixes options gives way to
  // one option in groups predicted within FusionConfig::oneOptionMargin.
  Strategy search(const Strategy& from);

  // The oracle: every consecutive partition of the tensors and every option
  // (for a group of two or more, every groupable one) for every group,
  // depth first with shared prefixes; only a prefix whose latest finish is
  // already at the best time is cut. K·(K+1)^(N-1) leaves for K options.
  Strategy exhaustive();

  const FusionStats& stats() const { return stats_; }
  const FusionConfig& config() const { return config_; }

  // Whether a group of two or more tensors may take `option`: a codec that
  // needs each tensor's matrix shape (powersgd) cannot encode a
  // concatenation (plan::validate refuses it).
  bool groupable(int option) const { return groupable_[size_t(option)] != 0; }

 private:
  struct Label {
    SimState st;
    int node = -1;  // the last group on its path (nodes_), -1 for none
    double score = 0;
    // Drained: no lane is busy past the next tensor's ready time, so the
    // future is that of idle lanes from then on, shifted in time.
    bool drained = false;
    double nextReady = 0;
  };
  struct Node {
    int parent;
    int first, last, option;
  };

  // The candidate options of group [first, last] of `elements` elements,
  // given its members' options `members` (distinct), into `out`.
  void candidates(int first, int last, int64_t elements, const std::vector<int>& members,
                  std::vector<int>& out);
  const std::vector<int>& treeBest(int64_t elements, int dtype);
  double lowerBound(const SimState& st, int next) const;
  // Heuristic: `a` no later than `b` in its ready time, its latest finish
  // and every lane's last reserved end.
  bool dominates(const std::vector<double>& a, const std::vector<double>& b) const;
  void summary(const SimState& st, std::vector<double>& out) const;
  bool sameLanes(const SimState& a, const SimState& b) const;
  // Keeps the state in scratch_ (just placed), reached by the group
  // `node`, in `into`, or drops it (bound, merged into an equal state,
  // beam).
  void admit(std::vector<Label>& into, int next, const Node& node);
  Strategy strategyOf(int node, double iterUs) const;
  // The dynamic program from `from`, whose iterUs is its simulated time (the
  // bound to beat); `membersOnly`: a group takes only its members' options.
  Strategy searchFrom(const Strategy& from, bool membersOnly);
  void prepare(const Strategy& from);

  Simulator& sim_;
  FusionConfig config_;
  FusionStats stats_;
  std::vector<char> groupable_, treePool_;
  std::vector<int> from_;               // the per-tensor options the search starts from
  std::vector<double> suffixBackward_;  // backward time of tensors >= i
  double minLastSyncUs_ = 0;            // the last tensor's shortest sync alone, CPU work left out
  std::vector<Node> nodes_;
  std::vector<std::pair<int, std::vector<int>>> treeBuckets_;  // (bucket, best options), by bucket
  double bestUs_ = 0;
  bool membersOnly_ = false;
  SimState scratch_;  // the state being placed (its buffers reused)
};

}  // namespace cortado::planner
