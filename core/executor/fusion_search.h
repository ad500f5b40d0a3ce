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
  // The binary search's step over cut positions (MergeComp: scheduler_step).
  uint64_t step = 2;
  // A further group is kept only when it cuts the time by this share of the
  // time with one group fewer (MergeComp's beta, read as relative).
  double minGain = 0.02;
  // At most this many groups beyond the forced ones (MergeComp's Y).
  int maxGroups = 4;
};

// Checks the options; throws kInvalidArgument naming the bad one.
void validate(const FusionSearchOptions& o);

class FusionSearch {
 public:
  // A cut at position c (0 < c < n) starts a new group at tensor c; tensors
  // are in gradient-ready order. `forced`: cuts every candidate has (where
  // consecutive tensors cannot share a group: other options). `bytes`: each
  // tensor's size, to pick which group to split next.
  using Cuts = std::set<uint64_t>;
  FusionSearch(std::vector<uint64_t> bytes, Cuts forced, FusionSearchOptions o);

  // The candidate to time next; nullopt when the search is done.
  const std::optional<Cuts>& next() const { return next_; }
  // The time measured for next() (the same on every worker).
  void measured(double seconds);
  bool done() const { return !next_.has_value(); }
  // The best candidate measured (when done: the search's answer).
  Cuts best() const;
  // Every candidate measured with its time, in the order they were timed.
  const std::vector<std::pair<Cuts, double>>& history() const { return history_; }
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
