// MergeComp's search for fused groups by measurement (../shared/specs/
// mergecomp.md): without a model of the system, the cut points of the
// groups are found by timing real iterations under each candidate. This is
// the search's decision logic alone: it names the next candidate to time and
// takes the measured time back, and it knows nothing of executors, plans or
// clocks (Executor::setFusionSearch drives it). Deterministic: workers that
// feed it the same times (agreed across workers) take the same candidates
// and end with the same cuts.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace cortado::executor {

struct FusionSearchOptions {
  // Iterations left out before the first candidate (the first iterations
  // declare keys and warm caches up; MergeComp: scheduler_warmup).
  uint64_t warmup = 3;
  // Iterations left out after each switch of candidate (its first round
  // declares the new keys) besides the switch iteration itself.
  uint64_t settle = 1;
  // Iterations timed per candidate, their mean its time (MergeComp:
  // scheduler_epoch, 20 there; iterations here are usually longer).
  uint64_t window = 5;
  // The binary search's step over the number of groups (MergeComp's
  // scheduler_step, there over cut positions).
  uint64_t step = 1;
  // The number of groups doubles only while a doubling cuts the time by this
  // share of the time before it (MergeComp's beta, read as relative).
  double minGain = 0.02;
  // At most this many byte-balanced groups (MergeComp's Y); 0: a quarter of
  // the tensors, at least 2 (maxGroupsFor()).
  int maxGroups = 0;
  // The final round: each search's (each alternative's) this many fastest
  // candidates are timed again, in two passes in mirrored order (A B C,
  // C B A), and the least sum of those two times stays, so that a load that
  // drifted while the search ran weighs on every finalist alike. The groups
  // the plan had when the search began join them (Executor: where the
  // search can express them), so that a search that timed nothing faster
  // keeps them. 0: no final round (the fastest time measured stays); it
  // runs when there are two finalists or more in all.
  uint64_t finalists = 2;
  // With more alternatives than this (Executor::setFusionSearch), each
  // alternative's first candidate (every tensor on its own) is timed first,
  // one window each, and only this many of the fastest are searched on
  // (their first time kept); the others are left out. 0: every alternative
  // is searched.
  uint64_t searched = 2;
};

// A window's time from its iterations' times: their median (the mean of the
// middle two for an even count), so that one iteration slowed by another job
// on the machine does not move it. Throws kInvalidArgument on no times.
double windowTime(std::vector<double> seconds);

// The final round's order and decision over `finalists` candidates (their
// indices 0 .. finalists-1): two passes, the second in reverse order, and the
// finalist with the least sum of its two times is the answer (the first
// among equal sums). Deterministic: the same times give the same answer on
// every worker.
class FinalRound {
 public:
  explicit FinalRound(size_t finalists);
  // The finalist to time next; nullopt when the round is done.
  std::optional<size_t> next() const;
  void measured(double seconds);
  bool done() const { return !next().has_value(); }
  // The finalist with the least sum (once done).
  size_t best() const;
  size_t finalists() const { return sums_.size(); }
  // Each finalist's sum of its times so far.
  const std::vector<double>& sums() const { return sums_; }

 private:
  std::vector<double> sums_;
  size_t timed_ = 0;  // measurements so far, of 2 * finalists
};

// Checks the options; throws kInvalidArgument naming the bad one.
void validate(const FusionSearchOptions& o);

// The cap on the number of groups for `tensors` tensors: o.maxGroups, or
// with 0 a quarter of the tensors (at least 2, at most the tensors).
uint64_t maxGroupsFor(const FusionSearchOptions& o, uint64_t tensors);

class FusionSearch {
 public:
  // A cut at position c (0 < c < n) starts a new group at tensor c; tensors
  // are in gradient-ready order. `forced`: cuts every candidate has (where
  // consecutive tensors cannot share a group: other options). `bytes`: each
  // tensor's size, to pick which group to split next.
  using Cuts = std::set<uint64_t>;
  FusionSearch(std::vector<uint64_t> bytes, Cuts forced, FusionSearchOptions o);

  // The candidate with `groups` groups: cuts where the running sum of the
  // bytes comes nearest to each multiple of total / groups (cuts that fall
  // together count once, so a tensor larger than total / groups is a group
  // of its own), with the forced cuts added. groups <= 1: the forced cuts.
  static Cuts balanced(const std::vector<uint64_t>& bytes, const Cuts& forced, uint64_t groups);
  // The fused groups that `cuts` make of n tensors: [begin, end) of every run
  // of two or more tensors between cuts, in order (a tensor alone is no
  // group; cuts at 0 or at n and beyond change nothing).
  static std::vector<std::pair<uint64_t, uint64_t>> groupsOf(const Cuts& cuts, uint64_t n);
  // The cuts that make `groups` (each a group's tensor names) of the tensors
  // in `order`: every position but those inside a group (groupsOf's
  // inverse). nullopt where a group's tensors are not consecutive in
  // `order`, a name is not in it or is in two groups: a grouping that cuts
  // cannot express.
  static std::optional<Cuts> cutsOf(const std::vector<std::string>& order,
                                    const std::vector<std::vector<std::string>>& groups);

  // The candidate to time next; nullopt when the search is done.
  const std::optional<Cuts>& next() const { return next_; }
  // The time measured for next() (the same on every worker).
  void measured(double seconds);
  bool done() const { return !next_.has_value(); }
  // The best candidate measured (when done: the search's answer).
  Cuts best() const;
  // Every candidate measured with its time, in the order they were timed.
  const std::vector<std::pair<Cuts, double>>& history() const { return history_; }
  // Up to `k` fastest candidates timed, fastest first (the first timed
  // among equal times), each with its time.
  std::vector<std::pair<Cuts, double>> ranked(size_t k) const;
  // Every candidate timed, in order, as "groups:ms" (e.g. "206:1346.8
  // 1:2033.3 2:1702.5"; the number of groups for each), for the logs.
  std::string timesLine() const;
  // One line: groups, their time, layer-wise's and one group's.
  std::string summary() const;
  const FusionSearchOptions& options() const { return o_; }
  uint64_t tensors() const { return bytes_.size(); }

 private:
  // The search, from the start, over the times measured so far: returns the
  // first candidate it needs that has not been timed, or nullopt once it has
  // finished. Re-running it after each measurement keeps the search a plain
  // sequential procedure instead of a hand-written state machine.
  std::optional<Cuts> replay() const;

  std::vector<uint64_t> bytes_;
  Cuts forced_;
  FusionSearchOptions o_;
  std::map<Cuts, double> times_;
  std::vector<std::pair<Cuts, double>> history_;
  std::optional<Cuts> next_;
};

}  // namespace cortado::executor
