#include "core/executor/fusion_search.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/common/error.h"

namespace cortado::executor {

void validate(const FusionSearchOptions& o) {
  CORTADO_ENFORCE(o.window >= 1, ErrorCode::kInvalidArgument,
                  "fusion search: window {} times no iteration; give at least 1", o.window);
  CORTADO_ENFORCE(o.step >= 1, ErrorCode::kInvalidArgument,
                  "fusion search: step {} does not move; give at least 1", o.step);
  CORTADO_ENFORCE(o.maxGroups >= 1, ErrorCode::kInvalidArgument,
                  "fusion search: maxGroups {}: give at least 1", o.maxGroups);
  CORTADO_ENFORCE(
      std::isfinite(o.minGain) && o.minGain >= 0 && o.minGain < 1, ErrorCode::kInvalidArgument,
      "fusion search: minGain {} is outside [0, 1): it is a share of the time", o.minGain);
}

FusionSearch::FusionSearch(std::vector<uint64_t> bytes, Cuts forced, FusionSearchOptions o)
    : bytes_(std::move(bytes)), forced_(std::move(forced)), o_(o) {
  validate(o_);
  CORTADO_ENFORCE(!bytes_.empty(), ErrorCode::kInvalidArgument,
                  "fusion search over no tensors: run an iteration's tensors first");
  for (uint64_t c : forced_)
    CORTADO_ENFORCE(c > 0 && c < bytes_.size(), ErrorCode::kInvalidArgument,
                    "fusion search: forced cut {} is outside (0, {})", c, bytes_.size());
  next_ = replay();
}

void FusionSearch::measured(double seconds) {
  CORTADO_ENFORCE(next_.has_value(), ErrorCode::kInvalidArgument,
                  "fusion search: a time given after the search ended");
  CORTADO_ENFORCE(std::isfinite(seconds) && seconds >= 0, ErrorCode::kInvalidArgument,
                  "fusion search: measured time {} is not a duration", seconds);
  times_[*next_] = seconds;
  history_.emplace_back(*next_, seconds);
  next_ = replay();
}

FusionSearch::Cuts FusionSearch::best() const {
  CORTADO_ENFORCE(!times_.empty(), ErrorCode::kInvalidArgument,
                  "fusion search: no candidate has been timed yet");
  auto it = std::min_element(times_.begin(), times_.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; });
  return it->first;
}

namespace {

// Thrown inside replay() when the search needs a time it does not have:
// the candidate to time next. Never leaves replay().
struct Untimed {
  FusionSearch::Cuts cuts;
};

}  // namespace

std::optional<FusionSearch::Cuts> FusionSearch::replay() const {
  auto time = [&](const Cuts& c) {
    auto it = times_.find(c);
    if (it == times_.end()) throw Untimed{c};
    return it->second;
  };
  const uint64_t n = bytes_.size();
  try {
    // The two ends: every tensor on its own (layer-wise), and one group per
    // run of tensors that may share one.
    Cuts layerWise;
    for (uint64_t c = 1; c < n; ++c) layerWise.insert(c);
    time(layerWise);
    Cuts cur = forced_;
    double prev = time(cur);
    // One group more at a time (MergeComp, y = 2, 3, ...): the group of the
    // most bytes is split where a binary search over its cut points, which
    // assumes the time unimodal in the cut, finds the fastest.
    for (int groups = 2; groups <= o_.maxGroups; ++groups) {
      std::vector<uint64_t> bounds{0};
      bounds.insert(bounds.end(), cur.begin(), cur.end());
      bounds.push_back(n);
      uint64_t a = 0, b = 0, most = 0;
      for (size_t k = 0; k + 1 < bounds.size(); ++k) {
        const uint64_t s = bounds[k], e = bounds[k + 1];
        if (e - s < 2) continue;
        uint64_t sum = 0;
        for (uint64_t i = s; i < e; ++i) sum += bytes_[i];
        if (b == 0 || sum > most) a = s, b = e, most = sum;
      }
      if (b == 0) break;  // nothing left to split
      // Candidate cuts a+1 .. b-1, by index 0 .. m-1.
      const uint64_t m = b - a - 1;
      auto with = [&](uint64_t i) {
        Cuts c = cur;
        c.insert(a + 1 + i);
        return c;
      };
      uint64_t lo = 0, hi = m - 1;
      while (hi > lo + 1) {
        const uint64_t mid = (lo + hi) / 2;
        const uint64_t ahead = std::min(mid + o_.step, hi);
        if (time(with(mid)) > time(with(ahead)))
          lo = ahead;  // still descending
        else
          hi = mid;
      }
      time(with(lo));
      time(with(hi));
      Cuts bestHere;
      double t = 0;
      for (uint64_t i = 0; i < m; ++i) {
        auto it = times_.find(with(i));
        if (it != times_.end() && (bestHere.empty() || it->second < t))
          bestHere = it->first, t = it->second;
      }
      if (t > prev * (1.0 - o_.minGain)) break;  // one group more does not pay
      cur = std::move(bestHere);
      prev = t;
    }
    return std::nullopt;
  } catch (const Untimed& u) {
    return u.cuts;
  }
}

std::string FusionSearch::summary() const {
  if (times_.empty()) return "fusion search: nothing timed yet";
  const Cuts b = best();
  std::string cuts;
  for (uint64_t c : b) cuts += (cuts.empty() ? "" : ", ") + std::to_string(c);
  Cuts layerWise;
  for (uint64_t c = 1; c < bytes_.size(); ++c) layerWise.insert(c);
  auto ms = [&](const Cuts& c) {
    auto it = times_.find(c);
    return it == times_.end() ? std::string("not timed")
                              : fmt::format("{:.2f} ms", it->second * 1e3);
  };
  return fmt::format(
      "fusion search{}: {} groups of {} tensors (cuts at {}), {} an iteration; one "
      "group {}, layer-wise {}; {} candidates timed",
      done() ? "" : " (so far)", b.size() + 1, bytes_.size(), cuts.empty() ? "none" : cuts, ms(b),
      ms(forced_), ms(layerWise), times_.size());
}

}  // namespace cortado::executor
