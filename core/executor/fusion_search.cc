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
  CORTADO_ENFORCE(o.maxGroups >= 0, ErrorCode::kInvalidArgument,
                  "fusion search: maxGroups {}: give at least 1, or 0 for a quarter of the tensors",
                  o.maxGroups);
  CORTADO_ENFORCE(
      std::isfinite(o.minGain) && o.minGain >= 0 && o.minGain < 1, ErrorCode::kInvalidArgument,
      "fusion search: minGain {} is outside [0, 1): it is a share of the time", o.minGain);
  CORTADO_ENFORCE(o.finalists <= 16, ErrorCode::kInvalidArgument,
                  "fusion search: finalists {} would time each of them twice at the end; give at "
                  "most 16 (0: no final round)",
                  o.finalists);
}

double windowTime(std::vector<double> seconds) {
  CORTADO_ENFORCE(!seconds.empty(), ErrorCode::kInvalidArgument,
                  "fusion search: a window without a timed iteration");
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  return n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
}

FinalRound::FinalRound(size_t finalists) : sums_(finalists, 0.0) {
  CORTADO_ENFORCE(finalists >= 1, ErrorCode::kInvalidArgument,
                  "fusion search: a final round without a finalist");
}

std::optional<size_t> FinalRound::next() const {
  const size_t n = sums_.size();
  if (timed_ >= 2 * n) return std::nullopt;
  return timed_ < n ? timed_ : 2 * n - 1 - timed_;  // forward, then back
}

void FinalRound::measured(double seconds) {
  const auto at = next();
  CORTADO_ENFORCE(at.has_value(), ErrorCode::kInvalidArgument,
                  "fusion search: a time given after the final round ended");
  CORTADO_ENFORCE(std::isfinite(seconds) && seconds >= 0, ErrorCode::kInvalidArgument,
                  "fusion search: measured time {} is not a duration", seconds);
  sums_[*at] += seconds;
  ++timed_;
}

size_t FinalRound::best() const {
  CORTADO_ENFORCE(done(), ErrorCode::kInvalidArgument,
                  "fusion search: the final round has not ended");
  return size_t(std::min_element(sums_.begin(), sums_.end()) - sums_.begin());
}

uint64_t maxGroupsFor(const FusionSearchOptions& o, uint64_t tensors) {
  const uint64_t cap = o.maxGroups > 0 ? uint64_t(o.maxGroups) : std::max<uint64_t>(2, tensors / 4);
  return std::max<uint64_t>(1, std::min(cap, tensors));
}

std::vector<std::pair<uint64_t, uint64_t>> FusionSearch::groupsOf(const Cuts& cuts, uint64_t n) {
  std::vector<std::pair<uint64_t, uint64_t>> groups;
  uint64_t start = 0;
  for (uint64_t c = 1; c <= n; ++c) {
    if (c < n && !cuts.count(c)) continue;
    if (c - start >= 2) groups.emplace_back(start, c);
    start = c;
  }
  return groups;
}

std::optional<FusionSearch::Cuts> FusionSearch::cutsOf(
    const std::vector<std::string>& order, const std::vector<std::vector<std::string>>& groups) {
  std::map<std::string, uint64_t> at;
  for (uint64_t k = 0; k < order.size(); ++k) at.emplace(order[k], k);
  Cuts cuts;
  for (uint64_t c = 1; c < order.size(); ++c) cuts.insert(c);
  std::set<uint64_t> taken;
  for (const auto& g : groups) {
    std::vector<uint64_t> pos;
    for (const auto& name : g) {
      const auto it = at.find(name);
      if (it == at.end() || !taken.insert(it->second).second) return std::nullopt;
      pos.push_back(it->second);
    }
    if (pos.empty()) continue;
    const auto [lo, hi] = std::minmax_element(pos.begin(), pos.end());
    if (*hi - *lo + 1 != pos.size()) return std::nullopt;
    for (uint64_t c = *lo + 1; c <= *hi; ++c) cuts.erase(c);
  }
  return cuts;
}

FusionSearch::Cuts FusionSearch::balanced(const std::vector<uint64_t>& bytes, const Cuts& forced,
                                          uint64_t groups) {
  Cuts c = forced;
  const uint64_t n = bytes.size();
  if (groups <= 1 || n < 2) return c;
  // prefix[i]: the bytes of tensors 0 .. i-1. Compared as prefix * groups
  // against m * total, in integers, so every worker cuts alike.
  std::vector<uint64_t> prefix(n + 1, 0);
  for (uint64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + std::max<uint64_t>(bytes[i], 1);
  const uint64_t total = prefix[n];
  auto gap = [&](uint64_t i, uint64_t m) {
    const uint64_t a = prefix[i] * groups, b = m * total;
    return a > b ? a - b : b - a;
  };
  uint64_t i = 1;
  for (uint64_t m = 1; m < groups; ++m) {
    while (i + 1 < n && prefix[i] * groups < m * total) ++i;
    // i: the first cut at or past the m-th share (or the last cut); i - 1
    // when that one is nearer.
    const uint64_t at = i > 1 && gap(i - 1, m) <= gap(i, m) ? i - 1 : i;
    c.insert(at);
  }
  return c;
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
  // The first timed among equal times (min_element keeps the first).
  auto it = std::min_element(history_.begin(), history_.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; });
  return it->first;
}

std::vector<std::pair<FusionSearch::Cuts, double>> FusionSearch::ranked(size_t k) const {
  // history_ holds each candidate once (replay() never asks for a timed
  // one); a stable sort keeps the first timed among equal times first.
  std::vector<std::pair<Cuts, double>> r = history_;
  std::stable_sort(r.begin(), r.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  if (r.size() > k) r.resize(k);
  return r;
}

std::string FusionSearch::timesLine() const {
  std::string out;
  for (const auto& [c, t] : history_)
    out += fmt::format("{}{}:{:.1f}", out.empty() ? "" : " ", c.size() + 1, t * 1e3);
  return out;
}

namespace {

// Doublings in a row without a gain of minGain that end them.
constexpr int kMisses = 2;

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
  const uint64_t cap = maxGroupsFor(o_, n);
  auto groups = [&](uint64_t k) { return time(balanced(bytes_, forced_, k)); };
  try {
    // The two ends: every tensor on its own (layer-wise), and one group per
    // run of tensors that may share one.
    Cuts layerWise;
    for (uint64_t c = 1; c < n; ++c) layerWise.insert(c);
    time(layerWise);
    // The number of groups doubles (byte-balanced groups), up to the cap,
    // until two doublings in a row have not gained minGain of the best time
    // so far: k is the count of that best. (Two, not one: two groups barely
    // overlap more than one, and one window's noise can hide a gain.)
    // When layer-wise beat the best so far by minGain, the far end says
    // more groups pay: the doublings go on to the cap.
    const double lw = time(layerWise);
    uint64_t k = 1, j = 1;
    double t = groups(1);
    auto farEndPays = [&] { return lw <= t * (1.0 - o_.minGain); };
    for (int misses = 0; 2 * j <= cap && (misses < kMisses || farEndPays());) {
      j *= 2;
      const double tj = groups(j);
      if (tj <= t * (1.0 - o_.minGain))
        k = j, t = tj, misses = 0;
      else
        ++misses;  // twice the groups do not pay (yet)
    }
    if (k == 1) return std::nullopt;  // one group (or layer-wise) it is
    // The best number lies between k / 2 and 2k (if the time is unimodal in
    // it): MergeComp's binary search, comparing the time at a count and
    // `step` further and moving towards the faster. Its axis is the number
    // of groups the candidates have: where a tensor larger than the share
    // stands alone, several counts give as many groups (the first is taken).
    std::vector<Cuts> among;
    for (uint64_t j = k / 2; j <= std::min(2 * k, cap); ++j) {
      Cuts c = balanced(bytes_, forced_, j);
      if (among.empty() || c.size() > among.back().size()) among.push_back(std::move(c));
    }
    uint64_t lo = 0, hi = among.size() - 1;
    while (hi > lo + 1) {
      const uint64_t mid = (lo + hi) / 2;
      const uint64_t ahead = std::min(mid + o_.step, hi);
      if (time(among[mid]) > time(among[ahead]))
        lo = ahead;  // still descending
      else
        hi = mid;
    }
    time(among[lo]);
    time(among[hi]);
    return std::nullopt;
  } catch (const Untimed& u) {
    return u.cuts;
  }
}

std::string FusionSearch::summary() const {
  if (times_.empty()) return "fusion search: nothing timed yet";
  const Cuts b = best();
  Cuts layerWise;
  for (uint64_t c = 1; c < bytes_.size(); ++c) layerWise.insert(c);
  // Every cut up to a dozen; beyond, the first and last few (a layer-wise
  // answer of resnet101 would list 313).
  std::string cuts;
  if (b == layerWise && b.size() > 1) {
    cuts = "every tensor";
  } else {
    size_t i = 0;
    for (uint64_t c : b) {
      if (b.size() <= 12 || i < 6 || i + 3 >= b.size())
        cuts += (cuts.empty() ? "" : ", ") + std::to_string(c);
      else if (i == 6)
        cuts += fmt::format(", ... {} more ...", b.size() - 9);
      ++i;
    }
  }
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
