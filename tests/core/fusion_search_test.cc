// MergeComp's fusion search (core/executor/fusion_search.h) on synthetic
// iteration times whose best grouping is known (by brute force).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/executor/fusion_search.h"

namespace cortado::executor {
namespace {

using Cuts = FusionSearch::Cuts;

// Runs the search to its end on `time`, counting the candidates it timed.
Cuts runSearch(FusionSearch& s, const std::function<double(const Cuts&)>& time,
               int* timed = nullptr) {
  int n = 0;
  while (const auto& next = s.next()) {
    s.measured(time(*next));
    if (++n > 1000) ADD_FAILURE() << "the search does not end";
    if (n > 1000) break;
  }
  if (timed) *timed = n;
  EXPECT_TRUE(s.done());
  return s.best();
}

Cuts everyCut(uint64_t n) {
  Cuts c;
  for (uint64_t i = 1; i < n; ++i) c.insert(i);
  return c;
}

// The groups of a candidate: its cuts plus one.
uint64_t groupsOf(const Cuts& c) { return c.size() + 1; }

// Each group's bytes under cuts `c`.
std::vector<uint64_t> groupBytes(const std::vector<uint64_t>& bytes, const Cuts& c) {
  std::vector<uint64_t> g{0};
  for (uint64_t i = 0; i < bytes.size(); ++i) {
    if (i > 0 && c.count(i)) g.push_back(0);
    g.back() += bytes[i];
  }
  return g;
}

// balanced(): each cut is, by brute force over every position, the one whose
// running sum of bytes is nearest the m-th share of the total (the lower on
// a tie), and the forced cuts are kept.
TEST(FusionSearch, BalancedCutsAreTheNearestToEachShareOfTheBytes) {
  uint64_t seed = 12345;
  auto next = [&] { return seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; };
  for (int trial = 0; trial < 20; ++trial) {
    const uint64_t n = 2 + next() % 60;
    std::vector<uint64_t> bytes(n);
    for (auto& b : bytes) b = 1 + (next() >> 33) % (trial % 2 ? 5000 : 4000000);
    const uint64_t total = std::accumulate(bytes.begin(), bytes.end(), uint64_t(0));
    for (uint64_t k = 1; k <= n + 3; ++k) {
      Cuts ref;
      for (uint64_t m = 1; m < k; ++m) {
        uint64_t bestAt = 0, bestGap = 0, prefix = 0;
        for (uint64_t i = 1; i < n; ++i) {
          prefix += bytes[i - 1];
          const uint64_t a = prefix * k, b = m * total, gap = a > b ? a - b : b - a;
          if (bestAt == 0 || gap < bestGap) bestAt = i, bestGap = gap;
        }
        ref.insert(bestAt);
      }
      EXPECT_EQ(FusionSearch::balanced(bytes, {}, k), ref) << "n " << n << ", k " << k;
    }
    Cuts forced{n / 2 == 0 ? 1 : n / 2};
    const Cuts withForced = FusionSearch::balanced(bytes, forced, 3);
    EXPECT_TRUE(withForced.count(*forced.begin()));
  }
  // Equal tensors: group sizes differ by at most one tensor.
  std::vector<uint64_t> equal(30, 8);
  for (uint64_t k = 1; k <= 30; ++k) {
    const auto g = groupBytes(equal, FusionSearch::balanced(equal, {}, k));
    ASSERT_EQ(g.size(), k);
    EXPECT_LE(*std::max_element(g.begin(), g.end()) - *std::min_element(g.begin(), g.end()), 8u);
  }
}

// Runs of two or more tensors between cuts, by hand; lone tensors, a cut at
// 0 and cuts at n or beyond make no group.
TEST(FusionSearch, GroupsOfCutsAreTheRunsOfTwoOrMore) {
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(FusionSearch::groupsOf({}, 5), (Ranges{{0, 5}}));
  EXPECT_EQ(FusionSearch::groupsOf({2, 3}, 7), (Ranges{{0, 2}, {3, 7}}));  // [2, 3) alone
  EXPECT_EQ(FusionSearch::groupsOf({0, 1, 2, 3}, 4), Ranges{});            // every tensor alone
  EXPECT_EQ(FusionSearch::groupsOf({0, 4, 6, 9}, 6), (Ranges{{0, 4}, {4, 6}}));  // 0, 6, 9: no cut
  EXPECT_EQ(FusionSearch::groupsOf({}, 1), Ranges{});
  EXPECT_EQ(FusionSearch::groupsOf({}, 0), Ranges{});
}

// A convex cost over cuts: a fixed cost per group plus the sum of squared
// group bytes (which, for a given number of groups, balanced groups make
// least). With minGain 0 the search ends at the exhaustive optimum over all
// 2^(n-1) partitions, whatever the cost per group moves it to.
// cutsOf is groupsOf's inverse: random cuts over n named tensors, their
// groups as names (members shuffled), back to the same cuts; and the
// groupings cuts cannot express are refused.
TEST(FusionSearch, CutsOfNamedGroupsInvertGroupsOf) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 500; ++trial) {
    const uint64_t n = 1 + rng() % 20;
    std::vector<std::string> order;
    for (uint64_t k = 0; k < n; ++k) order.push_back(fmt::format("t{}", k));
    Cuts cuts;
    for (uint64_t c = 1; c < n; ++c)
      if (rng() % 2) cuts.insert(c);
    std::vector<std::vector<std::string>> groups;
    for (auto [b, e] : FusionSearch::groupsOf(cuts, n)) {
      groups.emplace_back(order.begin() + int64_t(b), order.begin() + int64_t(e));
      std::shuffle(groups.back().begin(), groups.back().end(), rng);
    }
    const auto back = FusionSearch::cutsOf(order, groups);
    ASSERT_TRUE(back.has_value()) << "trial " << trial;
    EXPECT_EQ(*back, cuts) << "trial " << trial;
  }
  const std::vector<std::string> order = {"a", "b", "c", "d"};
  EXPECT_EQ(FusionSearch::cutsOf(order, {}), everyCut(4));
  EXPECT_EQ(FusionSearch::cutsOf(order, {{"b", "c"}}), (Cuts{1, 3}));
  EXPECT_FALSE(FusionSearch::cutsOf(order, {{"a", "c"}}));              // not consecutive
  EXPECT_FALSE(FusionSearch::cutsOf(order, {{"a", "x"}}));              // not in the order
  EXPECT_FALSE(FusionSearch::cutsOf(order, {{"a", "b"}, {"b", "c"}}));  // in two groups
}

TEST(FusionSearch, EndsAtTheExhaustiveOptimumOfAConvexCost) {
  const uint64_t n = 12;
  const std::vector<uint64_t> bytes(n, 1);
  FusionSearchOptions o;
  o.minGain = 0;
  o.maxGroups = int(n);
  for (double perGroup : {0.3, 1.0, 2.5, 4.0, 7.0, 11.0, 15.0, 25.0, 40.0, 80.0, 200.0}) {
    auto time = [&](const Cuts& c) {
      double t = perGroup * double(groupsOf(c));
      for (uint64_t g : groupBytes(bytes, c)) t += double(g) * double(g);
      return t;
    };
    double brute = 1e300;
    uint64_t bruteGroups = 0;
    for (uint64_t mask = 0; mask < (1u << (n - 1)); ++mask) {
      Cuts c;
      for (uint64_t i = 1; i < n; ++i)
        if (mask >> (i - 1) & 1) c.insert(i);
      if (time(c) < brute) brute = time(c), bruteGroups = groupsOf(c);
    }
    FusionSearch s(bytes, {}, o);
    int timed = 0;
    const Cuts best = runSearch(s, time, &timed);
    EXPECT_DOUBLE_EQ(time(best), brute) << "cost per group " << perGroup << ": brute force has "
                                        << bruteGroups << " groups; " << s.summary();
    EXPECT_LE(timed, 14) << s.summary();
  }
}

// Tensors of uneven sizes (resnet-like: a few large ones first, many small):
// the time depends on the number of groups only, convexly; the search ends
// at the brute-force best over every number of byte-balanced groups up to
// the cap, with a logarithmic number of candidates.
TEST(FusionSearch, EndsAtTheBestNumberOfBalancedGroups) {
  uint64_t seed = 99;
  auto next = [&] { return seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; };
  std::vector<uint64_t> bytes(161);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = (i < 20 ? 1000000 : 20000) + (next() >> 33) % 200000;
  FusionSearchOptions o;
  o.minGain = 0;
  for (double optimum : {2.0, 3.0, 6.0, 11.0, 17.0, 23.0, 30.0, 38.0}) {
    auto time = [&](const Cuts& c) {
      const double g = double(groupsOf(c));
      return c.size() + 1 == bytes.size() ? 1e9 : 50.0 + (g - optimum) * (g - optimum);
    };
    const uint64_t cap = maxGroupsFor(o, bytes.size());
    ASSERT_EQ(cap, 40u);
    double brute = 1e300;
    for (uint64_t k = 1; k <= cap; ++k)
      brute = std::min(brute, time(FusionSearch::balanced(bytes, {}, k)));
    FusionSearch s(bytes, {}, o);
    int timed = 0;
    const Cuts best = runSearch(s, time, &timed);
    EXPECT_DOUBLE_EQ(time(best), brute) << "optimum " << optimum << ": " << s.summary();
    EXPECT_LE(timed, 2 + 6 + 2 * 5 + 2) << s.summary();
    for (const auto& [c, t] : s.history())
      EXPECT_TRUE(groupsOf(c) <= cap || c.size() + 1 == bytes.size()) << "over the cap: " << t;
  }
}

// More groups pay only a little past 8 (each doubling gains 0.7%, under
// minGain's 2%): the doublings go on for two more (16 and 32 groups, in case
// noise hid a gain) and stop; the binary search stays between 4 and 16, and
// no candidate of more than 32 groups is timed; the fastest timed stays.
TEST(FusionSearch, StopsDoublingWhenTheGainIsBelowMinGainAndAtTheCap) {
  const uint64_t n = 256;
  const std::vector<uint64_t> bytes(n, 100);
  auto time = [&](const Cuts& c) {
    if (groupsOf(c) == n) return 200.0;  // layer-wise
    const double g = double(groupsOf(c));
    return g <= 8 ? 100.0 - 10.0 * std::log2(g) : 70.0 - 0.5 * std::log2(g / 8);
  };
  FusionSearch s(bytes, {}, FusionSearchOptions{});
  const Cuts best = runSearch(s, time);
  uint64_t most = 0;
  for (const auto& [c, t] : s.history())
    if (groupsOf(c) != n) most = std::max(most, groupsOf(c));
  EXPECT_EQ(most, 32u) << s.summary();
  EXPECT_EQ(groupsOf(best), 32u) << s.summary();  // the fastest timed stays
  // Doublings that keep paying stop at the cap: maxGroups 6 (explicit), or a
  // quarter of the tensors (16 here) by default.
  FusionSearchOptions six;
  six.maxGroups = 6;
  const std::vector<uint64_t> bytes64(64, 100);
  auto faster = [&](const Cuts& c) {
    return groupsOf(c) == 64 ? 1e3 : 100.0 / double(groupsOf(c));
  };
  FusionSearch a(bytes64, {}, six);
  EXPECT_EQ(groupsOf(runSearch(a, faster)), 6u) << a.summary();
  FusionSearch b(bytes64, {}, FusionSearchOptions{});
  EXPECT_EQ(groupsOf(runSearch(b, faster)), 16u) << b.summary();
  for (const auto& [c, t] : b.history()) EXPECT_TRUE(groupsOf(c) <= 16 || groupsOf(c) == 64) << t;
}

// Layer-wise is fastest (no codec, a fast network): it is kept. Doublings
// that gain less than minGain end the search after two (no more than 4
// groups are tried), and the fastest grouping timed is the answer (the
// first timed among equal times).
TEST(FusionSearch, KeepsLayerWiseAndStopsWhenAGroupMoreGainsTooLittle) {
  const uint64_t n = 12;
  FusionSearch a(std::vector<uint64_t>(n, 10), {}, FusionSearchOptions{});
  EXPECT_EQ(
      runSearch(a, [&](const Cuts& c) { return c == everyCut(n) ? 1.0 : 5.0 + double(c.size()); }),
      everyCut(n));
  FusionSearchOptions upTo12;
  upTo12.maxGroups = int(n);  // the default cap (a quarter of 12) would stop at 3 groups
  FusionSearch b(std::vector<uint64_t>(n, 10), {}, upTo12);
  runSearch(b, [&](const Cuts& c) { return c.empty() ? 10.0 : c == everyCut(n) ? 30.0 : 9.95; });
  EXPECT_EQ(b.best().size(), 1u) << b.summary();  // 2 groups: timed first among the equal
  // Two doublings (2 and 4 groups) without the gain end it.
  for (const auto& [c, t] : b.history()) EXPECT_TRUE(c.size() <= 3 || c == everyCut(n)) << t;
  EXPECT_EQ(b.history().size(), 4u) << b.summary();
}

// Layer-wise faster than one group and than every doubling so far: the far
// end says more groups pay, so two doublings without a gain (2 and 4 groups
// flat) do not end the search; it doubles on to the cap and finds the best
// count near it, which brute force over the counts confirms.
TEST(FusionSearch, DoublesOnWhileLayerWiseIsFaster) {
  const uint64_t n = 128;
  const std::vector<uint64_t> bytes(n, 100);
  auto time = [&](const Cuts& c) {
    const double g = double(groupsOf(c));
    if (groupsOf(c) == n) return 85.0;      // layer-wise
    if (g <= 4) return 100.0;               // flat at first
    return 100.0 - 2.0 * g + 0.05 * g * g;  // best at 20 groups: 80
  };
  FusionSearch s(bytes, {}, FusionSearchOptions{});
  const Cuts best = runSearch(s, time);
  double brute = time(everyCut(n));
  for (uint64_t k = 1; k <= maxGroupsFor(FusionSearchOptions{}, n); ++k)
    brute = std::min(brute, time(FusionSearch::balanced(bytes, {}, k)));
  EXPECT_DOUBLE_EQ(time(best), brute) << s.summary();
  EXPECT_EQ(groupsOf(best), 20u) << s.summary();
  // Without the faster far end, the same flat start ends the search at one group.
  FusionSearch t(bytes, {}, FusionSearchOptions{});
  runSearch(t, [&](const Cuts& c) { return groupsOf(c) == n ? 200.0 : time(c); });
  EXPECT_EQ(t.best().size(), 0u) << t.summary();
}

// Forced cuts (tensors on other options) are in every candidate, and the
// balanced cuts come on top of them.
TEST(FusionSearch, ForcedCutsStayInEveryCandidate) {
  std::vector<uint64_t> bytes(20, 10);
  for (size_t i = 6; i < 20; ++i) bytes[i] = 1000;
  FusionSearch s(bytes, {6}, FusionSearchOptions{});
  std::vector<Cuts> seen;
  runSearch(s, [&](const Cuts& c) {
    seen.push_back(c);
    if (c.size() == 19) return 100.0;
    // Best with 4 groups (3 cuts), the forced one included.
    const double cuts = double(c.size());
    return 50.0 - 5.0 * std::min(cuts, 3.0) + 0.5 * std::max(cuts - 3.0, 0.0);
  });
  ASSERT_GE(seen.size(), 4u);
  for (const Cuts& c : seen) EXPECT_TRUE(c.count(6)) << "a candidate without the forced cut";
  EXPECT_EQ(s.best().size(), 3u) << s.summary();
  EXPECT_TRUE(s.best().count(6));
}

// The same times give the same candidates: what keeps every worker on the
// same plan when each feeds the agreed (averaged) time.
TEST(FusionSearch, SameTimesSameSequence) {
  auto time = [](const Cuts& c) {
    return 10.0 + double((c.size() * 7919 + (c.empty() ? 0 : *c.begin())) % 13);
  };
  FusionSearch a(std::vector<uint64_t>(30, 4), {}, FusionSearchOptions{});
  FusionSearch b(std::vector<uint64_t>(30, 4), {}, FusionSearchOptions{});
  runSearch(a, time);
  runSearch(b, time);
  ASSERT_EQ(a.history().size(), b.history().size());
  for (size_t i = 0; i < a.history().size(); ++i)
    EXPECT_EQ(a.history()[i].first, b.history()[i].first);
  EXPECT_EQ(a.best(), b.best());
}

TEST(FusionSearch, BadInputIsRefusedNamingIt) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return e.what();
    }
    return "accepted";
  };
  FusionSearchOptions o;
  o.window = 0;
  EXPECT_NE(message([&] { validate(o); }).find("window 0"), std::string::npos);
  o = {};
  o.minGain = 1.5;
  EXPECT_NE(message([&] { validate(o); }).find("minGain"), std::string::npos);
  o = {};
  o.maxGroups = -1;
  EXPECT_NE(message([&] { validate(o); }).find("maxGroups -1"), std::string::npos);
  o = {};
  o.step = 0;
  EXPECT_NE(message([&] { validate(o); }).find("step"), std::string::npos);
  EXPECT_NE(message([] { FusionSearch({}, {}, FusionSearchOptions{}); }).find("no tensors"),
            std::string::npos);
  EXPECT_NE(message([] {
              FusionSearch({1, 2}, {2}, FusionSearchOptions{});
            }).find("forced cut 2"),
            std::string::npos);
  FusionSearch s({1}, {}, FusionSearchOptions{});
  EXPECT_NE(message([&] { s.measured(-1); }).find("not a duration"), std::string::npos);
  s.measured(1.0);  // one tensor: one candidate
  EXPECT_TRUE(s.done());
  EXPECT_NE(message([&] { s.measured(1.0); }).find("after the search ended"), std::string::npos);
}

// The summary names layer-wise as such and shortens long cut lists.
TEST(FusionSearch, SummaryShortensLongCutLists) {
  const std::vector<uint64_t> bytes(40, 1000);
  FusionSearch lw(bytes, {}, FusionSearchOptions{});
  runSearch(lw, [](const Cuts& c) { return 1.0 / double(c.size() + 1); });  // more groups pay
  ASSERT_EQ(lw.best(), everyCut(40));
  EXPECT_NE(lw.summary().find("40 groups of 40 tensors (cuts at every tensor)"), std::string::npos)
      << lw.summary();
  // 20 balanced groups best: 19 cuts, 6 shown first, 3 last, 10 counted.
  FusionSearchOptions upTo40;
  upTo40.maxGroups = 40;
  FusionSearch twenty(bytes, {}, upTo40);
  const Cuts best =
      runSearch(twenty, [](const Cuts& c) { return std::abs(double(c.size() + 1) - 20.0) + 1.0; });
  ASSERT_EQ(best.size(), 19u) << twenty.summary();
  std::vector<uint64_t> v(best.begin(), best.end());
  const std::string want =
      fmt::format("(cuts at {}, {}, {}, {}, {}, {}, ... 10 more ..., {}, {}, {})", v[0], v[1], v[2],
                  v[3], v[4], v[5], v[16], v[17], v[18]);
  EXPECT_NE(twenty.summary().find(want), std::string::npos) << twenty.summary() << " / " << want;
}

// windowTime() is the median (the mean of the middle two for an even
// count), against a sorted copy; one slow iteration does not move it, where
// it moves the mean.
TEST(FusionSearch, WindowTimeIsTheMedian) {
  uint64_t seed = 7;
  auto next = [&] { return seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; };
  for (size_t n = 1; n <= 9; ++n)
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<double> v(n);
      for (double& x : v) x = 0.1 + double((next() >> 33) % 100000) * 1e-6;
      std::vector<double> sorted = v;
      std::sort(sorted.begin(), sorted.end());
      const double want = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
      EXPECT_DOUBLE_EQ(windowTime(v), want) << n << " times";
    }
  EXPECT_DOUBLE_EQ(windowTime({1.0, 1.1, 5.0}), 1.1);  // the mean would be 2.37
  EXPECT_THROW(windowTime({}), Error);
}

// ranked(): the k fastest candidates timed, fastest first, the first timed
// among equal times first; against a brute-force sort of the history.
TEST(FusionSearch, RankedGivesTheFastestCandidatesInOrder) {
  const std::vector<uint64_t> bytes(64, 100);
  FusionSearch s(bytes, {}, FusionSearchOptions{});
  // Equal times for 8 and 16 groups: 8 was timed first and ranks first.
  runSearch(s, [](const Cuts& c) {
    const double g = double(c.size() + 1);
    return g == 64 ? 90.0 : g == 8 || g == 16 ? 40.0 : 50.0 + std::abs(g - 12.0);
  });
  const auto& h = s.history();
  ASSERT_GE(h.size(), 4u) << s.summary();
  for (size_t k = 0; k <= h.size() + 1; ++k) {
    const auto r = s.ranked(k);
    ASSERT_EQ(r.size(), std::min(k, h.size()));
    for (size_t i = 0; i < r.size(); ++i) {
      // Brute force: the rank of r[i] is the number of candidates faster,
      // plus those as fast timed before it.
      size_t before = 0, at = h.size();
      for (size_t j = 0; j < h.size(); ++j)
        if (h[j].first == r[i].first) at = j;
      ASSERT_LT(at, h.size());
      EXPECT_EQ(h[at].second, r[i].second);
      for (size_t j = 0; j < h.size(); ++j)
        before += h[j].second < h[at].second || (h[j].second == h[at].second && j < at);
      EXPECT_EQ(before, i) << "candidate of " << r[i].first.size() + 1 << " groups";
    }
  }
  const auto two = s.ranked(2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].first.size() + 1, 8u) << s.summary();
  EXPECT_EQ(two[1].first.size() + 1, 16u) << s.summary();
  // timesLine(): every candidate as groups:ms, in the order timed.
  std::string want;
  for (const auto& [c, t] : h)
    want += fmt::format("{}{}:{:.1f}", want.empty() ? "" : " ", c.size() + 1, t * 1e3);
  EXPECT_EQ(s.timesLine(), want);
}

// The final round times A B C, then C B A, and keeps the least sum. Under a
// load that rises while it runs, each finalist's two times add up to the
// same drift, so it keeps the truly fastest; a single pass in order keeps a
// slower one that happened to run first.
TEST(FusionSearch, FinalRoundCancelsALinearDrift) {
  // True times: finalist 2 is fastest by 2%; the load adds 3% per window.
  const std::vector<double> truth = {1.00, 1.01, 0.98, 1.02};
  FinalRound r(truth.size());
  std::vector<size_t> order;
  int window = 0;
  std::vector<double> firstPass(truth.size());
  while (const auto at = r.next()) {
    order.push_back(*at);
    const double t = truth[*at] * (1.0 + 0.03 * window++);
    if (order.size() <= truth.size()) firstPass[*at] = t;
    r.measured(t);
  }
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 3, 2, 1, 0}));
  const size_t want = size_t(std::min_element(truth.begin(), truth.end()) - truth.begin());
  EXPECT_EQ(r.best(), want);
  // One pass alone picks the first finalist (the load rose after it).
  EXPECT_NE(size_t(std::min_element(firstPass.begin(), firstPass.end()) - firstPass.begin()), want);
  // Equal sums: the first finalist.
  FinalRound eq(3);
  while (eq.next()) eq.measured(1.0);
  EXPECT_EQ(eq.best(), 0u);
  // Bad input.
  EXPECT_THROW(FinalRound(0), Error);
  FinalRound one(1);
  EXPECT_THROW(one.best(), Error);  // not done
  EXPECT_THROW(one.measured(-1.0), Error);
  one.measured(1.0);
  one.measured(1.0);
  EXPECT_TRUE(one.done());
  EXPECT_EQ(one.best(), 0u);
  EXPECT_THROW(one.measured(1.0), Error);
  FusionSearchOptions o;
  o.finalists = 17;
  EXPECT_THROW(validate(o), Error);
}

}  // namespace
}  // namespace cortado::executor
