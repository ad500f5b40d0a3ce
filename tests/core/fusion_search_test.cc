// MergeComp's fusion search (core/executor/fusion_search.h) on synthetic
// iteration times whose best grouping is known.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

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

// Two groups pay, best cut at 17 of 40 tensors (V-shaped in the cut); a
// third group does not pay: the search stops at two and has timed only a
// logarithmic number of candidates.
TEST(FusionSearch, FindsTheBestCutOfTwoGroupsByBinarySearch) {
  const uint64_t n = 40;
  FusionSearch s(std::vector<uint64_t>(n, 1000), {}, FusionSearchOptions{});
  auto time = [&](const Cuts& c) {
    if (c == everyCut(n)) return 100.0;
    if (c.empty()) return 50.0;
    if (c.size() == 1) return 30.0 + 0.5 * std::abs(double(*c.begin()) - 17.0);
    return 45.0;  // three or more groups: worse than two
  };
  int timed = 0;
  const Cuts best = runSearch(s, time, &timed);
  ASSERT_EQ(best.size(), 1u);
  EXPECT_LE(std::abs(double(*best.begin()) - 17.0), 1.0) << s.summary();
  // Layer-wise, one group, about 2 log2(39) probes, then the third group's.
  EXPECT_LE(timed, 2 + 2 * 6 + 2 + 2 * 6 + 2) << s.summary();
  EXPECT_NE(s.summary().find("2 groups of 40 tensors"), std::string::npos) << s.summary();
}

// A third group pays: the largest group after the first cut is split where
// its own binary search finds the best second cut.
TEST(FusionSearch, AddsAGroupWhileItPays) {
  const uint64_t n = 40;
  FusionSearch s(std::vector<uint64_t>(n, 1000), {}, FusionSearchOptions{});
  auto time = [&](const Cuts& c) {
    if (c == everyCut(n)) return 100.0;
    if (c.empty()) return 50.0;
    const double first = std::abs(double(*c.begin()) - 10.0);
    if (c.size() == 1) return 30.0 + first;
    if (c.size() == 2) return 20.0 + first + std::abs(double(*c.rbegin()) - 29.0);
    return 25.0;  // a fourth group no longer pays
  };
  const Cuts best = runSearch(s, time);
  ASSERT_EQ(best.size(), 2u) << s.summary();
  EXPECT_LE(std::abs(double(*best.begin()) - 10.0), 1.0) << s.summary();
  EXPECT_LE(std::abs(double(*best.rbegin()) - 29.0), 1.0) << s.summary();
}

// Layer-wise is fastest (no codec, a fast network): it is kept. A group
// more that gains less than minGain ends the search there (no third group is
// tried), and the fastest grouping timed is the answer.
TEST(FusionSearch, KeepsLayerWiseAndStopsWhenAGroupMoreGainsTooLittle) {
  const uint64_t n = 12;
  FusionSearch a(std::vector<uint64_t>(n, 10), {}, FusionSearchOptions{});
  EXPECT_EQ(
      runSearch(a, [&](const Cuts& c) { return c == everyCut(n) ? 1.0 : 5.0 + double(c.size()); }),
      everyCut(n));
  FusionSearch b(std::vector<uint64_t>(n, 10), {}, FusionSearchOptions{});
  runSearch(b, [&](const Cuts& c) { return c.empty() ? 10.0 : c == everyCut(n) ? 30.0 : 9.95; });
  EXPECT_EQ(b.best().size(), 1u) << b.summary();
  for (const auto& [c, t] : b.history()) EXPECT_TRUE(c.size() <= 1 || c == everyCut(n)) << t;
}

// Forced cuts (tensors on other options) are in every candidate; the group
// split is the one of the most bytes.
TEST(FusionSearch, ForcedCutsStayAndTheLargestGroupIsSplit) {
  // Tensors 0..5 small, 6..19 large: the forced cut at 6 leaves the large
  // group as the one to split.
  std::vector<uint64_t> bytes(20, 10);
  for (size_t i = 6; i < 20; ++i) bytes[i] = 1000;
  FusionSearch s(bytes, {6}, FusionSearchOptions{});
  std::vector<Cuts> seen;
  runSearch(s, [&](const Cuts& c) {
    seen.push_back(c);
    if (c.size() == 19) return 100.0;
    if (c.size() == 1) return 50.0;
    return 30.0 + std::abs(double(*c.rbegin()) - 12.0);
  });
  for (const Cuts& c : seen) EXPECT_TRUE(c.count(6)) << "a candidate without the forced cut";
  const Cuts best = s.best();
  ASSERT_EQ(best.size(), 2u) << s.summary();
  EXPECT_TRUE(best.count(6));
  EXPECT_LE(std::abs(double(*best.rbegin()) - 12.0), 1.0) << s.summary();
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

}  // namespace
}  // namespace cortado::executor
