// Zen's sparse synchronization as a library (compressor/zen/): ownership and
// index lists, hierarchical-hash placement, the servers' sums and bitmap
// answers, malformed payloads, the scheme choice and hierarchical
// centralization. Sums are checked against a dense reference computed by
// plain addition; values are small integers so that every sum is exact in
// any order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "compressor/zen/zen_hash.h"
#include "compressor/zen/zen_payload.h"
#include "compressor/zen/zen_scheme.h"
#include "compressor/zen/zen_sum.h"
#include "core/common/error.h"
#include "tests/compressor/expect_protocol.h"

namespace cortado::compressor::zen {
namespace {

struct Pairs {
  std::vector<uint32_t> index;
  std::vector<float> value;
};

// Indices with P(i) = min(1, c / (i + 1)^skew), c chosen for `density`:
// skew 0 is uniform, skew 1 Zipf-like (most non-zeros among the first
// indices). Values: non-zero integers in [-8, 8].
Pairs drawPairs(uint64_t n, double density, double skew, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // The expected count, from every step-th index (enough for the bisection).
  const uint64_t step = std::max<uint64_t>(1, n / 20000);
  auto expected = [&](double c) {
    double s = 0;
    for (uint64_t i = 0; i < n; i += step)
      s += double(step) * std::min(1.0, c / std::pow(double(i + 1), skew));
    return s;
  };
  double lo = 0, hi = double(n) * 2;
  const double want = density * double(n);
  if (skew > 0) {
    for (int it = 0; it < 50; ++it) {
      const double mid = (lo + hi) / 2;
      (expected(mid) < want ? lo : hi) = mid;
    }
  }
  const double c = skew > 0 ? hi : density;
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> val(1, 8);
  Pairs p;
  for (uint64_t i = 0; i < n; ++i) {
    if (u(rng) < std::min(1.0, c / std::pow(double(i + 1), skew))) {
      p.index.push_back(uint32_t(i));
      p.value.push_back(float(val(rng) * (u(rng) < 0.5 ? -1 : 1)));
    }
  }
  return p;
}

// One round of Zen over W workers and S servers in memory: placement,
// pushes (COO, or with `compact` delta-coded where smaller, as the worker
// engine sends them), servers' sums, answers decoded into each worker's
// output. Returns worker 0's output and checks that every worker decodes
// the same.
std::vector<float> zenRound(const Ownership& own, const std::vector<Pairs>& in,
                            std::vector<ServerSum>& servers, ThreadPool* pool = nullptr,
                            ServerSum::Form form = ServerSum::Form::kSmaller,
                            bool compact = false) {
  const uint32_t S = own.numServers();
  for (size_t w = 0; w < in.size(); ++w) {
    PlacementOptions po;
    po.probeSeed = 1000 + w;                // level-2 hashes may differ between workers
    po.directWhenAscending = (w % 2) == 0;  // odd workers through the table
    po.ascendingLists = compact;
    HierarchicalHash hh(own, po);
    Partitioned parts;
    hh.place(in[w].index, in[w].value, parts, pool);
    for (uint32_t p = 0; p < S; ++p) {
      const auto& idx = parts.indices[p];
      const PushForm form = choosePushForm(idx, compact);
      if (compact) {
        EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end())) << "worker " << w << " server " << p;
        // The delta form wherever it is the smaller (it always is here:
        // no gap of 2^28 or more).
        EXPECT_EQ(form, PushForm::kDelta);
      } else {
        EXPECT_EQ(form, PushForm::kCoo);
      }
      std::vector<std::byte> push(pushBytes(idx, form));
      EXPECT_EQ(writePush(own, p, idx, parts.values[p], form, push), push.size());
      servers[p].add(push);
    }
  }
  IndexLists lists(own);
  std::vector<float> out(own.numElements(), 0.0f);
  std::vector<std::vector<std::byte>> answers;
  for (uint32_t p = 0; p < S; ++p) {
    answers.push_back(servers[p].answer(form));
    decodeAnswerInto(answers.back(), own, p, lists.of(p), out.data());
  }
  // The worker's way: checked, then every answer written in one pass over
  // an output that held something else.
  std::vector<CheckedAnswer> checked(S);
  for (uint32_t p = 0; p < S; ++p)
    EXPECT_NO_THROW(checkAnswer(answers[p], own, p, lists.of(p), checked[p]));
  std::vector<float> assembled(own.numElements(), -7.0f);
  assembleDense(checked, own.numElements(), 1.0f, assembled.data());
  EXPECT_EQ(assembled, out);
  return out;
}

std::vector<float> denseSum(uint64_t n, const std::vector<Pairs>& in) {
  std::vector<float> ref(n, 0.0f);
  for (const auto& p : in)
    for (size_t i = 0; i < p.index.size(); ++i) ref[p.index[i]] += p.value[i];
  return ref;
}

std::vector<ServerSum> makeServers(const Ownership& own) {
  std::vector<ServerSum> s;
  for (uint32_t p = 0; p < own.numServers(); ++p) s.emplace_back(own, p);
  return s;
}

TEST(ZenOwnership, IndexListsPartitionTheTensorAndAgreeEverywhere) {
  for (uint32_t S : {1u, 3u, 4u, 16u}) {
    const uint64_t n = 10007;
    Ownership a(n, S, 42), b(n, S, 42);
    IndexLists lists(a);
    std::vector<int> hits(n, 0);
    for (uint32_t p = 0; p < S; ++p) {
      auto l = lists.of(p);
      EXPECT_TRUE(std::is_sorted(l.begin(), l.end()));
      auto alone = ownedIndices(b, p);  // another node, computing alone
      ASSERT_EQ(std::vector<uint32_t>(l.begin(), l.end()), alone) << "server " << p;
      for (uint32_t i : l) {
        ++hits[i];
        EXPECT_EQ(b.owner(i), p);
      }
    }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  }
  // Another seed: another map (tensors are spread independently).
  Ownership a(1000, 8, 1), c(1000, 8, 2);
  int differ = 0;
  for (uint64_t i = 0; i < 1000; ++i) differ += a.owner(i) != c.owner(i);
  EXPECT_GT(differ, 700);
  EXPECT_THROW(Ownership(kMaxElements + 1, 4, 0), Error);
  EXPECT_THROW(Ownership(100, 0, 0), Error);
}

// No pair lost, none sent twice: every input index reaches its owner once
// with the sum of its values, also when the probe slots are far too few
// (overflow area) and when the overflow area is full too (spill), with
// index 0 and the last index among them and duplicates in the input.
TEST(ZenPlacement, EveryPairLandsOnceOnItsOwnerUnderForcedCollisions) {
  const uint64_t n = 50000;
  Ownership own(n, 4, 7);
  ThreadPool pool(3);
  struct Case {
    const char* name;
    PlacementOptions opts;
    bool threads;
  };
  PlacementOptions roomy;
  PlacementOptions tight;  // r1 a tenth of the pairs per server: most overflow
  tight.slotFactor = 0.1;
  PlacementOptions full;  // r2 minimal: the spill list takes the rest
  full.slotFactor = 0.05;
  full.serialFactor = 0;
  PlacementOptions oneProbe;
  oneProbe.probes = 1;
  for (const Case& c : {Case{"roomy", roomy, false}, Case{"tight", tight, false},
                        Case{"full", full, false}, Case{"tight-threads", tight, true},
                        Case{"full-threads", full, true}, Case{"one-probe", oneProbe, true}}) {
    Pairs in = drawPairs(n, 0.2, 0, 11);
    in.index.insert(in.index.end(), {0u, uint32_t(n - 1), 0u, 17u, 17u});
    in.value.insert(in.value.end(), {5.0f, 3.0f, 2.0f, 1.0f, 1.0f});
    std::map<uint32_t, float> want;
    for (size_t i = 0; i < in.index.size(); ++i) want[in.index[i]] += in.value[i];
    HierarchicalHash hh(own, c.opts);
    Partitioned parts;
    hh.place(in.index, in.value, parts, c.threads ? &pool : nullptr);
    std::map<uint32_t, float> got;
    for (uint32_t p = 0; p < 4; ++p) {
      ASSERT_EQ(parts.indices[p].size(), parts.values[p].size());
      for (size_t i = 0; i < parts.indices[p].size(); ++i) {
        const uint32_t idx = parts.indices[p][i];
        EXPECT_EQ(own.owner(idx), p) << c.name;
        EXPECT_EQ(got.count(idx), 0u) << c.name << ": index " << idx << " sent twice";
        got[idx] = parts.values[p][i];
      }
    }
    EXPECT_EQ(got, want) << c.name;
    EXPECT_EQ(parts.pairs(), want.size()) << c.name;
    EXPECT_EQ(parts.merged, in.index.size() - want.size()) << c.name;
    // Probe slots hold each index once; the overflow and spill counts
    // include duplicates, merged afterwards.
    EXPECT_GE(parts.probed + parts.overflowed + parts.spilled, parts.pairs()) << c.name;
    EXPECT_LE(parts.probed + parts.overflowed + parts.spilled, in.index.size()) << c.name;
    if (std::string(c.name).rfind("full", 0) == 0) {
      EXPECT_GT(parts.spilled, 0u) << c.name;
    }
    if (std::string(c.name).rfind("tight", 0) == 0) {
      EXPECT_GT(parts.overflowed, 0u) << c.name;
    }
  }
  // With the paper's settings collisions are rare (< 1% with 3-4 hashes).
  Pairs in = drawPairs(n, 0.1, 0, 12);
  PlacementOptions paper;
  paper.directWhenAscending = false;
  HierarchicalHash hh(own, paper);
  Partitioned parts;
  hh.place(in.index, in.value, parts);
  EXPECT_FALSE(parts.direct);
  EXPECT_LT(double(parts.overflowed + parts.spilled), 0.03 * double(in.index.size()));
  EXPECT_EQ(parts.spilled, 0u);
}

// Ascending input (a coalesced gradient, a dense scan) takes the direct
// pass; it must split the pairs as the table does.
TEST(ZenPlacement, AscendingInputSplitsAsTheTableDoes) {
  const uint64_t n = 100000;
  Ownership own(n, 5, 21);
  Pairs in = drawPairs(n, 0.05, 1.0, 33);
  in.index.insert(in.index.begin(), 0u);  // index 0 first, still ascending
  in.value.insert(in.value.begin(), 9.0f);
  if (in.index[1] == 0) in.index.erase(in.index.begin() + 1), in.value.erase(in.value.begin() + 1);
  PlacementOptions tableOnly;
  tableOnly.directWhenAscending = false;
  HierarchicalHash direct(own), table(own, tableOnly);
  Partitioned a, b;
  direct.place(in.index, in.value, a);
  table.place(in.index, in.value, b);
  EXPECT_TRUE(a.direct);
  EXPECT_FALSE(b.direct);
  for (uint32_t p = 0; p < 5; ++p) {
    std::map<uint32_t, float> ma, mb;
    for (size_t i = 0; i < a.indices[p].size(); ++i) ma[a.indices[p][i]] = a.values[p][i];
    for (size_t i = 0; i < b.indices[p].size(); ++i) mb[b.indices[p][i]] = b.values[p][i];
    EXPECT_EQ(ma, mb) << "server " << p;
    EXPECT_EQ(ma.size(), a.indices[p].size());  // none twice
  }
  EXPECT_EQ(a.pairs(), in.index.size());
}

// The table's lists read out ascending (for delta-coded pushes) hold what
// the direct path's hold, under forced collisions (overflow and spill) too.
TEST(ZenPlacement, AscendingListsFromTheTable) {
  const uint64_t n = 100000;
  Ownership own(n, 5, 21);
  Pairs in = drawPairs(n, 0.05, 1.0, 34);
  HierarchicalHash direct(own);
  Partitioned want;
  direct.place(in.index, in.value, want);
  // Out of order, with every pair twice (duplicates add up).
  Pairs shuffled = in;
  std::mt19937 rng(5);
  std::vector<size_t> order(in.index.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t k = 0; k < order.size(); ++k) {
    shuffled.index[k] = in.index[order[k]];
    shuffled.value[k] = in.value[order[k]];
  }
  shuffled.index.insert(shuffled.index.end(), in.index.begin(), in.index.end());
  shuffled.value.insert(shuffled.value.end(), in.value.begin(), in.value.end());
  for (double slots : {2.0, 0.05}) {
    PlacementOptions po;
    po.ascendingLists = true;
    po.slotFactor = slots;
    HierarchicalHash table(own, po);
    Partitioned got;
    table.place(shuffled.index, shuffled.value, got);
    EXPECT_FALSE(got.direct);
    if (slots < 1) EXPECT_GT(got.spilled, 0u);
    for (uint32_t p = 0; p < 5; ++p) {
      EXPECT_EQ(got.indices[p], want.indices[p]) << "server " << p << ", slot factor " << slots;
      std::vector<float> twice(want.values[p]);
      for (float& v : twice) v *= 2;
      EXPECT_EQ(got.values[p], twice) << "server " << p;
    }
  }
}

TEST(ZenPlacement, RadixSortMatchesASort) {
  std::mt19937_64 rng(3);
  for (uint64_t numel : {1ull, 200ull, 5000ull, 3000000ull, 0xffffffffull}) {
    for (size_t count : {0ul, 1ul, 255ul, 256ul, 5000ul}) {
      if (count > numel) continue;
      std::set<uint32_t> pick;
      while (pick.size() < count) pick.insert(uint32_t(rng() % numel));
      std::vector<uint32_t> idx(pick.begin(), pick.end());
      std::shuffle(idx.begin(), idx.end(), rng);
      std::vector<float> val;
      for (uint32_t i : idx) val.push_back(float(i % 1000) - 500.0f);
      std::vector<uint64_t> a, b;
      sortPairsByIndex(idx, val, numel, a, b);
      EXPECT_EQ(idx, std::vector<uint32_t>(pick.begin(), pick.end())) << numel << " " << count;
      for (size_t i = 0; i < idx.size(); ++i) ASSERT_EQ(val[i], float(idx[i] % 1000) - 500.0f);
    }
  }
}

TEST(ZenPlacement, BadInputPlacesNothing) {
  Ownership own(100, 2, 1);
  HierarchicalHash hh(own);
  Partitioned parts;
  std::vector<uint32_t> idx{1, 2, 100};
  std::vector<float> val{1, 1, 1};
  try {
    hh.place(idx, val, parts);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("index #2 is 100"), std::string::npos) << e.what();
  }
  std::vector<float> short_{1};
  EXPECT_THROW(hh.place(idx, short_, parts), Error);
  // A dense buffer's non-zeros.
  std::vector<float> dense(100, 0.0f);
  dense[0] = 1, dense[99] = -2, dense[50] = 3;
  hh.placeDense(dense.data(), parts);
  EXPECT_EQ(parts.pairs(), 3u);
}

struct SumCase {
  double density;
  double skew;
  bool disjoint;
};

class ZenSums : public ::testing::TestWithParam<SumCase> {};

// Exact sums against the dense reference: 4 workers, 4 servers, overlapping
// or disjoint indices, uniform or Zipf-skewed, densities 0.01% to 50%.
TEST_P(ZenSums, MatchTheDenseSum) {
  const SumCase c = GetParam();
  const uint64_t n = 200000;
  const int W = 4;
  Ownership own(n, 4, 99);
  std::vector<Pairs> in;
  for (int w = 0; w < W; ++w) {
    Pairs p = drawPairs(n, c.density * (c.disjoint ? W : 1), c.skew, 100 + w);
    if (c.disjoint) {
      Pairs mine;
      for (size_t i = 0; i < p.index.size(); ++i)
        if (p.index[i] % W == uint32_t(w))
          mine.index.push_back(p.index[i]), mine.value.push_back(p.value[i]);
      p = mine;
    }
    ASSERT_FALSE(p.index.empty());
    in.push_back(std::move(p));
  }
  auto servers = makeServers(own);
  ThreadPool pool(2);
  const auto ref = denseSum(n, in);
  // The sums are cleared between rounds; round 0 answers in the smaller
  // form, round 1 as bitmaps and round 2 as index lists whatever the density.
  const ServerSum::Form forms[] = {ServerSum::Form::kSmaller, ServerSum::Form::kBitmap,
                                   ServerSum::Form::kIndexList};
  // Rounds 3 to 5 again with delta-coded pushes.
  for (int round = 0; round < 6; ++round) {
    auto got =
        zenRound(own, in, servers, round % 3 ? &pool : nullptr, forms[round % 3], round >= 3);
    ASSERT_EQ(got, ref) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Zen, ZenSums,
                         ::testing::Values(SumCase{0.0001, 0, false}, SumCase{0.001, 0, false},
                                           SumCase{0.01, 0, false}, SumCase{0.1, 0, false},
                                           SumCase{0.5, 0, false}, SumCase{0.0001, 1, false},
                                           SumCase{0.01, 1, false}, SumCase{0.1, 1, false},
                                           SumCase{0.5, 1, false}, SumCase{0.001, 0, true},
                                           SumCase{0.01, 1, true}, SumCase{0.1, 0, true}),
                         [](const auto& info) {
                           return fmt::format("d{}_{}_{}", int(info.param.density * 1e4),
                                              info.param.skew > 0 ? "zipf" : "uniform",
                                              info.param.disjoint ? "disjoint" : "overlapping");
                         });

// Values that cancel: the position leaves the answer; a second round
// starts from zero; a server densifies past an eighth of its indices.
TEST(ZenServerSum, CancellationRoundsAndDensifying) {
  Ownership own(1000, 2, 5);
  ServerSum s(own, 1);
  auto list = s.list();
  ASSERT_GT(list.size(), 100u);
  std::vector<uint32_t> idx{list[0], list[1]};
  s.add(encodeCoo(own, 1, idx, std::vector<float>{2, 3}));
  s.add(encodeCoo(own, 1, idx, std::vector<float>{-2, 1}));
  EXPECT_FALSE(s.densified());
  std::map<uint32_t, float> got;
  decodeAnswer(s.answer(), own, 1, list, [&](uint32_t i, float v) { got[i] = v; });
  EXPECT_EQ(got, (std::map<uint32_t, float>{{list[1], 4.0f}}));
  std::vector<uint32_t> many(list.begin(), list.begin() + list.size() / 4);
  s.add(encodeCoo(own, 1, many, std::vector<float>(many.size(), 1.0f)));
  EXPECT_TRUE(s.densified());
  got.clear();
  decodeAnswer(s.answer(), own, 1, list, [&](uint32_t i, float v) { got[i] = v; });
  EXPECT_EQ(got.size(), many.size());
  EXPECT_EQ(got[list[1]], 1.0f);  // not 5: round 2 started from zero
  got.clear();
  decodeAnswer(s.answer(), own, 1, list, [&](uint32_t i, float v) { got[i] = v; });
  EXPECT_TRUE(got.empty());  // an empty round answers an empty bitmap
}

// The sparse sum keeps one run per push, ascending (a push out of order is
// sorted on arrival), and merges them pairwise at the answer: pushes in
// every order, an odd and an even number of them, overlapping and
// disjoint, index 0 and the last index, values that cancel; the sum
// stays sparse and equals the plain sum.
TEST(ZenServerSum, RunsInAnyOrderMergeToThePlainSum) {
  const uint64_t n = 100003;
  Ownership own(n, 1, 5);  // one server: it owns 0 and n - 1
  std::mt19937_64 rng(17);
  for (int pushes : {1, 2, 5, 9}) {
    ServerSum s(own, 0);
    std::map<uint32_t, float> ref;
    for (int k = 0; k < pushes; ++k) {
      std::vector<uint32_t> idx;
      if (k % 4 == 3) {
        idx = {1, 2, 3};  // few, and none of the others' fixed ones
      } else {
        std::set<uint32_t> pick{0, uint32_t(n - 1), 7};
        while (pick.size() < 900) pick.insert(uint32_t(rng() % n));
        idx.assign(pick.begin(), pick.end());
      }
      if (k % 3 == 1) std::reverse(idx.begin(), idx.end());
      if (k % 3 == 2) std::shuffle(idx.begin(), idx.end(), rng);
      std::vector<float> val;
      for (uint32_t i : idx) {
        // Index 7 cancels over pushes 0 and 1 (+3, -3), then comes back.
        val.push_back(i == 7 ? (k == 0 ? 3.0f : k == 1 ? -3.0f : 1.0f) : float(int(rng() % 9) - 4));
        ref[i] += val.back();
      }
      s.add(encodeCoo(own, 0, idx, val));
    }
    EXPECT_FALSE(s.densified());  // under n / 8 pairs
    std::erase_if(ref, [](const auto& kv) { return kv.second == 0.0f; });
    std::map<uint32_t, float> got;
    decodeAnswer(s.answer(), own, 0, s.list(), [&](uint32_t i, float v) { got[i] = v; });
    EXPECT_EQ(got, ref) << pushes << " pushes";
    if (pushes == 2) {
      EXPECT_EQ(got.count(7), 0u);  // cancelled
    }
    EXPECT_EQ(got.count(0), ref.count(0));
    EXPECT_EQ(got.count(uint32_t(n - 1)), ref.count(uint32_t(n - 1)));
  }
}

// Zen's balance: on Zipf-skewed indices, the largest server load over the
// mean stays under 1.1 for pushes (each worker's pairs per server) and for
// pulls (the sum's non-zeros per server), with 4 and 16 servers, where
// contiguous ranges (core/partition.h's placement) are far off.
TEST(ZenBalance, SkewedIndicesStayWithinTenPercent) {
  const uint64_t n = 2000000;
  const int W = 4;
  std::vector<Pairs> in;
  for (int w = 0; w < W; ++w) in.push_back(drawPairs(n, 0.01, 1.0, 500 + w));
  for (uint32_t S : {4u, 16u}) {
    Ownership own(n, S, 1234);
    double worstPush = 0;
    std::vector<uint64_t> rangeLoad(S, 0);
    for (int w = 0; w < W; ++w) {
      HierarchicalHash hh(own);
      Partitioned parts;
      hh.place(in[w].index, in[w].value, parts);
      uint64_t mx = 0;
      for (uint32_t p = 0; p < S; ++p) mx = std::max<uint64_t>(mx, parts.indices[p].size());
      worstPush = std::max(worstPush, double(mx) * S / double(parts.pairs()));
      for (uint32_t i : in[w].index) ++rangeLoad[uint64_t(i) * S / n];
    }
    auto servers = makeServers(own);
    zenRound(own, in, servers);  // sums, to count the pull side below
    std::vector<uint64_t> pull(S, 0);
    std::set<uint32_t> all;
    for (auto& p : in) all.insert(p.index.begin(), p.index.end());
    for (uint32_t i : all) ++pull[own.owner(i)];
    const double pullImb =
        double(*std::max_element(pull.begin(), pull.end())) * S / double(all.size());
    const double rangeImb = double(*std::max_element(rangeLoad.begin(), rangeLoad.end())) * S /
                            double(std::accumulate(rangeLoad.begin(), rangeLoad.end(), 0ull));
    EXPECT_LT(worstPush, 1.1) << S << " servers";
    EXPECT_LT(pullImb, 1.1) << S << " servers";
    EXPECT_GT(rangeImb, 2.0) << S << " servers: the indices should be skewed";
    RecordProperty(fmt::format("push_imbalance_{}", S), fmt::format("{:.3f}", worstPush));
    RecordProperty(fmt::format("pull_imbalance_{}", S), fmt::format("{:.3f}", pullImb));
    RecordProperty(fmt::format("range_imbalance_{}", S), fmt::format("{:.3f}", rangeImb));
  }
}

// The bitmap round trip, at the edges: no bit, every bit, list sizes that
// are no multiple of 8, an empty list.
TEST(ZenBitmap, RoundTrip) {
  for (uint64_t n : {1ull, 7ull, 64ull, 1001ull}) {
    for (uint32_t S : {1u, 3u}) {
      Ownership own(n, S, 77);
      IndexLists lists(own);
      for (int pattern = 0; pattern < 3; ++pattern) {  // none, all, every third
        for (uint32_t p = 0; p < S; ++p) {
          auto list = lists.of(p);
          std::vector<uint64_t> bits((list.size() + 63) / 64, 0);
          std::vector<float> vals;
          std::map<uint32_t, float> want;
          for (size_t t = 0; t < list.size(); ++t) {
            if (pattern == 0 || (pattern == 2 && t % 3)) continue;
            bits[t / 64] |= uint64_t{1} << (t % 64);
            vals.push_back(float(t + 1));
            want[list[t]] = float(t + 1);
          }
          auto payload = encodeBitmap(own, p, list, bits, vals);
          EXPECT_EQ(payload.size(), bitmapBytes(list.size(), vals.size()));
          std::map<uint32_t, float> got;
          uint32_t last = 0;
          bool first = true;
          decodeBitmap(payload, own, p, list, [&](uint32_t i, float v) {
            EXPECT_TRUE(first || i > last);  // ascending
            first = false, last = i;
            got[i] = v;
          });
          EXPECT_EQ(got, want) << "n=" << n << " S=" << S << " pattern " << pattern;
        }
      }
    }
  }
}

using test::expectProtocol;

// Malformed pushes are refused with what is wrong and leave the sum as it
// was; every truncation of a valid payload is refused without reading past
// its end.
TEST(ZenMalformed, PushesAreRefusedAndLeaveTheSum) {
  const uint64_t n = 5000;
  Ownership own(n, 3, 8);
  ServerSum s(own, 2);
  auto list = s.list();
  std::vector<uint32_t> good{list[0], list[5], list[9]};
  std::vector<float> vals{1, 2, 3};
  s.add(encodeCoo(own, 2, good, vals));

  auto withIndex = [&](uint32_t bad) {
    std::vector<uint32_t> idx{list[1], bad};
    return encodeCoo(own, 2, idx, std::vector<float>{100, 100});
  };
  uint32_t notMine = 0;
  while (own.owner(notMine) == 2) ++notMine;
  expectProtocol([&] { s.add(withIndex(uint32_t(n))); }, "out of range");
  expectProtocol([&] { s.add(withIndex(notMine)); }, "does not own");
  expectProtocol([&] { s.add(withIndex(list[1])); }, "listed twice");
  // A push that ascends and then repeats an earlier index, or the one
  // before, or one that never ascended: the first repeat is named, and no
  // mark is left behind (the same indices are accepted next).
  {
    ServerSum t(own, 2);
    auto push = [&](std::vector<size_t> at) {
      std::vector<uint32_t> idx;
      for (size_t k : at) idx.push_back(list[k]);
      return encodeCoo(own, 2, idx, std::vector<float>(idx.size(), 100));
    };
    expectProtocol([&] { t.add(push({1, 2, 3, 1})); }, "listed twice (pair #3)");
    expectProtocol([&] { t.add(push({1, 2, 2})); }, "listed twice (pair #2)");
    expectProtocol([&] { t.add(push({4, 3, 2, 1, 3})); }, "listed twice (pair #4)");
    expectProtocol([&] { t.add(withIndex(uint32_t(n))); }, "out of range");
    t.add(push({3, 1, 2, 4}));
    t.add(push({1, 2, 3, 4}));
    std::map<uint32_t, float> got;
    decodeAnswer(t.answer(), own, 2, list, [&](uint32_t i, float v) { got[i] = v; });
    EXPECT_EQ(got, (std::map<uint32_t, float>{
                       {list[1], 200}, {list[2], 200}, {list[3], 200}, {list[4], 200}}));
  }
  auto p = encodeCoo(own, 2, good, vals);
  p.resize(p.size() - 4);
  expectProtocol([&] { s.add(p); }, "truncated pair list");
  expectProtocol([&] { s.add(encodeCoo(own, 1, {}, {})); }, "expected server 2");
  expectProtocol([&] { s.add(encodeCoo(Ownership(n, 3, 9), 2, {}, {})); }, "seed");
  expectProtocol([&] { s.add(encodeCoo(Ownership(n + 1, 3, 8), 2, {}, {})); }, "elements");
  auto magic = encodeCoo(own, 2, good, vals);
  magic[0] = std::byte{0};
  expectProtocol([&] { s.add(magic); }, "magic");
  auto count = encodeCoo(own, 2, good, vals);
  count[32] = std::byte{0xff}, count[39] = std::byte{0x7f};  // a huge pair count
  expectProtocol([&] { s.add(count); }, "pairs");
  // A bitmap where a push belongs.
  std::vector<uint64_t> none(1, 0);
  expectProtocol(
      [&] { s.add(encodeBitmap(Ownership(10, 1, 8), 0, std::vector<uint32_t>(10, 0), none, {})); },
      "expected a sparse COO push");
  // Every prefix of a good push: refused, never read past (ASan in the fuzzer).
  auto whole = encodeCoo(own, 2, good, vals);
  for (size_t k = 0; k < whole.size(); ++k) {
    std::vector<std::byte> cut(whole.begin(), whole.begin() + k);
    EXPECT_THROW(s.add(cut), Error) << k;
  }
  // The sum is the first push's alone.
  std::map<uint32_t, float> got;
  decodeAnswer(s.answer(), own, 2, list, [&](uint32_t i, float v) { got[i] = v; });
  EXPECT_EQ(got, (std::map<uint32_t, float>{{list[0], 1}, {list[5], 2}, {list[9], 3}}));
}

TEST(ZenMalformed, BitmapAnswersAreRefused) {
  const uint64_t n = 3001;
  Ownership own(n, 2, 4);
  IndexLists lists(own);
  auto list = lists.of(1);
  std::vector<uint64_t> bits((list.size() + 63) / 64, 0);
  bits[0] = 0b1011;
  std::vector<float> vals{1, 2, 3};
  const auto good = encodeBitmap(own, 1, list, bits, vals);
  std::vector<float> out(n, 0.0f);
  decodeBitmapInto(good, own, 1, list, out.data());
  EXPECT_EQ(out[list[3]], 3.0f);

  auto bad = good;
  bad[kZenHeaderBytes] = std::byte{0b0111};  // still 3 bits, other ones: accepted
  decodeBitmapInto(bad, own, 1, list, out.data());
  bad[kZenHeaderBytes] = std::byte{0b1111};  // 4 bits, 3 values
  expectProtocol([&] { decodeBitmapInto(bad, own, 1, list, out.data()); },
                 "4 bits set but 3 values");
  // A bit past the owned indices (list size no multiple of 8 here).
  ASSERT_NE(list.size() % 8, 0u);
  bad = good;
  bad[kZenHeaderBytes] = std::byte{0b0011};
  bad[kZenHeaderBytes + (list.size() + 7) / 8 - 1] |= std::byte{0x80};
  expectProtocol([&] { decodeBitmapInto(bad, own, 1, list, out.data()); }, "past the");
  // Another server's list, another list size, a truncated answer.
  expectProtocol([&] { decodeBitmapInto(good, own, 0, lists.of(0), out.data()); },
                 "expected server 0");
  expectProtocol([&] { decodeBitmapInto(good, own, 1, list.subspan(1), out.data()); }, "owns");
  bad = good;
  bad.pop_back();
  expectProtocol([&] { decodeBitmapInto(bad, own, 1, list, out.data()); }, "body has");
  // A COO push where an answer belongs.
  expectProtocol([&] { decodeBitmapInto(encodeCoo(own, 1, {}, {}), own, 1, list, out.data()); },
                 "expected a sparse bitmap answer");
  for (size_t k = 0; k < good.size(); ++k) {
    std::vector<std::byte> cut(good.begin(), good.begin() + k);
    EXPECT_THROW(decodeBitmapInto(cut, own, 1, list, out.data()), Error) << k;
  }
}

// The scheme choice on synthetic profiles: tensors that overlap much (the
// sum hardly densifies) favour balanced parallelism; disjoint tensors
// (gamma(k) = k) favour hierarchical centralization, as the paper finds
// for NMT at batch 1 on 8 GPUs.
TEST(ZenScheme, EachSchemeWinsWhereItShould) {
  const uint64_t M = 1000000;
  const int n = 8;
  const double b = 125e6;  // 1 Gbit/s
  // Overlapping: every worker the same rows (embedding of a small vocabulary).
  std::vector<std::vector<uint32_t>> same(n), disjoint(n);
  for (int w = 0; w < n; ++w)
    for (uint32_t i = 0; i < 1000; ++i) {
      same[w].push_back(i * 7);
      disjoint[w].push_back(i * n + w);
    }
  auto ps = profileFromIndexSets(M, same);
  EXPECT_DOUBLE_EQ(ps.gammaAt(n), 1.0);
  auto cs = chooseScheme(ps, b);
  EXPECT_EQ(cs.scheme, Scheme::kBalancedParallelism) << cs.figures;
  // eq. (1): 7/8 * 2 * 2Md/b; eq. (2): 3 stages of gamma 1.
  const double base = 2.0 * 1000 / b;  // 2 M d / b with M d = 1000 pairs
  EXPECT_NEAR(cs.bpSeconds, 7.0 / 8 * 2 * base, 1e-12);
  EXPECT_NEAR(cs.hcSeconds, 3 * base, 1e-12);

  auto pd = profileFromIndexSets(M, disjoint);
  EXPECT_EQ(pd.groups, (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(pd.gamma, (std::vector<double>{1, 2, 4, 8}));
  auto cd = chooseScheme(pd, b);
  EXPECT_EQ(cd.scheme, Scheme::kHierarchicalCentralization) << cd.figures;
  EXPECT_NEAR(cd.bpSeconds, 7.0 / 8 * 9 * base, 1e-12);
  EXPECT_NEAR(cd.hcSeconds, 7 * base, 1e-12);
  EXPECT_NE(cd.figures.find("T_bp="), std::string::npos);
  EXPECT_NE(cd.figures.find("g(8)=8.000"), std::string::npos) << cd.figures;

  // Skewed embeddings (Zipf): heavy overlap in the head, balanced parallelism.
  std::vector<std::vector<uint32_t>> zipf;
  for (int w = 0; w < n; ++w) zipf.push_back(drawPairs(100000, 0.02, 1.0, 900 + w).index);
  auto cz = chooseScheme(profileFromIndexSets(100000, zipf), b);
  EXPECT_EQ(cz.scheme, Scheme::kBalancedParallelism) << cz.figures;

  // The model from d and the union density alone reproduces the endpoints
  // and picks the same schemes.
  auto ms = profileFromUnion(M, n, 0.001, 0.001);
  auto md = profileFromUnion(M, n, 0.001, 0.008);
  EXPECT_DOUBLE_EQ(md.gammaAt(1), 1.0);
  EXPECT_DOUBLE_EQ(md.gammaAt(8), 8.0);
  EXPECT_EQ(chooseScheme(ms, b).scheme, Scheme::kBalancedParallelism);
  EXPECT_EQ(chooseScheme(md, b).scheme, Scheme::kHierarchicalCentralization);
  EXPECT_TRUE(md.modelled);
}

// Hierarchical centralization: ranks as threads exchanging through
// mailboxes; every rank ends with the dense reference's non-zeros, also
// for sizes that are no power of two.
// With everyStage every rank makes the same number of exchanges (peer -1
// in the stages it sits out), and the stage sizes are the partial unions.
TEST(ZenScheme, HierarchicalCentralizationSumsOnEveryRank) {
  for (bool everyStage : {false, true}) {
    for (int size : {1, 2, 3, 4, 5, 8}) {
      const uint64_t n = 20000;
      std::vector<Pairs> in;
      for (int r = 0; r < size; ++r) in.push_back(drawPairs(n, 0.02, r % 2 ? 1.0 : 0.0, 40 + r));
      in[0].index.push_back(in[0].index.front());  // a duplicate on rank 0: summed
      in[0].value.push_back(1.0f);
      const auto ref = denseSum(n, in);
      // mailbox[from][to]
      std::mutex mu;
      std::condition_variable cv;
      std::map<std::pair<int, int>, std::vector<CooList>> box;
      std::vector<CooList> results(size);
      std::vector<int> calls(size, 0);
      std::vector<std::vector<uint64_t>> stages(size);
      std::vector<std::thread> ts;
      for (int r = 0; r < size; ++r) {
        ts.emplace_back([&, r] {
          auto ex = [&](int peer, const CooList& mine) {
            ++calls[r];
            if (peer < 0) {
              if (!everyStage) throw Error(ErrorCode::kInternal, "idle call without everyStage");
              return CooList{};
            }
            std::unique_lock<std::mutex> lk(mu);
            box[{r, peer}].push_back(mine);
            cv.notify_all();
            const bool ok = cv.wait_for(lk, std::chrono::seconds(20), [&] {
              return !box[{peer, r}].empty();
            });
            if (!ok) throw Error(ErrorCode::kTimeout, "no message");
            CooList got = std::move(box[{peer, r}].front());
            box[{peer, r}].erase(box[{peer, r}].begin());
            return got;
          };
          HcOptions o;
          o.everyStage = everyStage;
          o.stageSizes = &stages[r];
          results[r] =
              hierarchicalCentralization(r, size, CooList{in[r].index, in[r].value}, ex, o);
        });
      }
      for (auto& t : ts) t.join();
      int p = 1;
      while (p * 2 <= size) p *= 2;
      for (int r = 0; r < size; ++r) {
        if (everyStage) {
          EXPECT_EQ(calls[r], hierarchicalCentralizationStages(size)) << size;
        }
        ASSERT_EQ(stages[r].size(), 1 + (r < p ? size_t(std::log2(p)) : 0u)) << size;
        // After the last doubling stage a rank < p holds the whole sum.
        if (r < p) {
          EXPECT_EQ(stages[r].back(), results[r].index.size());
        }
      }
      for (int r = 0; r < size; ++r) {
        std::vector<float> got(n, 0.0f);
        EXPECT_TRUE(std::is_sorted(results[r].index.begin(), results[r].index.end()));
        for (size_t i = 0; i < results[r].index.size(); ++i)
          got[results[r].index[i]] = results[r].value[i];
        ASSERT_EQ(got, ref) << "size " << size << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace cortado::compressor::zen

namespace cortado::compressor::zen {
namespace {

// A centralization stage's list: the round trip, and every malformed form
// refused with kProtocol before anything is returned.
TEST(ZenScheme, StageListRoundTripAndMalformedLists) {
  CooList l{{0, 7, 4999}, {1.5f, -2.0f, 3.0f}};
  const auto bytes = encodeStageList(l);
  ASSERT_EQ(bytes.size(), 24u);
  const CooList back = parseStageList(bytes, 5000);
  EXPECT_EQ(back.index, l.index);
  EXPECT_EQ(back.value, l.value);
  EXPECT_TRUE(parseStageList({}, 5000).index.empty());
  for (const CooList& bad :
       {CooList{{3, 3}, {1, 1}}, CooList{{7, 4}, {1, 1}}, CooList{{0, 5000}, {1, 1}}}) {
    try {
      parseStageList(encodeStageList(bad), 5000);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kProtocol) << e.what();
    }
  }
  auto cut = bytes;
  cut.pop_back();
  EXPECT_THROW(parseStageList(cut, 5000), Error);
}

}  // namespace
}  // namespace cortado::compressor::zen
