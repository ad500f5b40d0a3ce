// Zen over a collective group (core/zen_collective.h), on the MPI backend
// under mpirun (2, 3 and 4 ranks): every rank draws every rank's pairs from
// the same seeds, so it holds the dense reference (a plain sum) and checks
// its own result against it exactly (the values are small integers, exact
// in any order of addition).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "compressor/zen/zen_payload.h"
#include "core/collective/mpi/factory.h"
#include "core/zen_collective.h"

namespace cortado {
namespace {

namespace zen = compressor::zen;
using zen::Scheme;

collective::mpi::Runtime* runtime = nullptr;

Deadline soon() { return Deadline::after(Millis(60000)); }

collective::Groups& groups() {
  static collective::Groups g =
      collective::mpi::createGroups(*runtime, collective::mpi::Options{}, soon());
  return g;
}
collective::Collectives& world() { return *groups().world; }

struct Pairs {
  std::vector<uint32_t> index;
  std::vector<float> value;
};

enum class Pattern { kZipf, kUniform, kDisjoint, kIdentical };

// Rank r's pairs: kZipf draws index i with probability ~ c / (i + 1) (a
// shared head, a mostly private tail), kUniform uniformly, kDisjoint only
// indices i with i % size == r, kIdentical the same set on every rank.
// Index 0 and the last index are always in (on rank 0, or every rank for
// kIdentical), and rank 0 lists one index twice (the values add up).
Pairs draw(uint64_t n, double density, Pattern pat, int r, int size, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + uint64_t(pat == Pattern::kIdentical ? 0 : r));
  std::uniform_real_distribution<double> u(0, 1);
  Pairs p;
  const double c = density * double(n) / std::log(double(n));  // sum of c/(i+1) ~ c ln n
  for (uint64_t i = 0; i < n; ++i) {
    bool take = false;
    switch (pat) {
      case Pattern::kZipf: take = u(rng) < c / double(i + 1); break;
      case Pattern::kUniform:
      case Pattern::kIdentical: take = u(rng) < density; break;
      case Pattern::kDisjoint:
        take = int(i % uint64_t(size)) == r && u(rng) < density * size;
        break;
    }
    const bool isEdge = i == 0 || i == n - 1;
    if (isEdge && pat == Pattern::kDisjoint && r != 0) take = false;  // rank 0's
    if (take || (isEdge && (r == 0 || pat == Pattern::kIdentical))) {
      p.index.push_back(uint32_t(i));
      p.value.push_back(float(int(rng() % 7) + 1));
    }
  }
  if (r == 0 && !p.index.empty()) {
    p.index.push_back(p.index[p.index.size() / 2]);
    p.value.push_back(2.0f);
  }
  // Not ascending: the placement's table, not its ascending shortcut.
  std::shuffle(p.index.begin(), p.index.end(), std::mt19937_64(seed));
  std::shuffle(p.value.begin(), p.value.end(), std::mt19937_64(seed));
  return p;
}

std::vector<float> reference(uint64_t n, double density, Pattern pat, int size, uint64_t seed) {
  std::vector<float> ref(n, 0.0f);
  for (int r = 0; r < size; ++r) {
    const Pairs p = draw(n, density, pat, r, size, seed);
    for (size_t i = 0; i < p.index.size(); ++i) ref[p.index[i]] += p.value[i];
  }
  return ref;
}

const char* patternName(Pattern p) {
  switch (p) {
    case Pattern::kZipf: return "zipf";
    case Pattern::kUniform: return "uniform";
    case Pattern::kDisjoint: return "disjoint";
    case Pattern::kIdentical: return "identical";
  }
  return "?";
}

// Exact sums for both schemes and the measured choice, overlapping and
// disjoint, skewed and uniform, 0.01% to 50%, on sizes that are no power
// of two; pairs and dense input; sum and average.
TEST(ZenCollective, ExactSumsAgainstDenseReference) {
  auto& g = world();
  const int size = g.size(), rank = g.rank();
  std::vector<std::optional<Scheme>> schemes = {Scheme::kBalancedParallelism,
                                                Scheme::kHierarchicalCentralization, std::nullopt};
  uint64_t seed = 1;
  for (uint64_t n : {uint64_t(100003), uint64_t(4099)}) {
    for (const auto& scheme : schemes) {
      ZenCollectiveOptions o;
      o.scheme = scheme;
      o.profileRounds = 2;
      ZenCollective z(g, "t" + std::to_string(n), n, o);
      for (Pattern pat : {Pattern::kZipf, Pattern::kUniform, Pattern::kDisjoint}) {
        for (double d : {0.0001, 0.01, 0.5}) {
          ++seed;
          const Pairs mine = draw(n, d, pat, rank, size, seed);
          const std::vector<float> ref = reference(n, d, pat, size, seed);
          const std::string what =
              fmt::format("n {} scheme {} {} density {} round {} (ran {})", n,
                          scheme ? zen::schemeName(*scheme) : "measured", patternName(pat), d,
                          z.rounds(), zen::schemeName(z.nextScheme()));
          std::vector<float> out(n, -1.0f);
          z.allreduce(mine.index, mine.value, out.data(), ReduceOp::kSum, soon());
          ASSERT_EQ(out, ref) << what;
          uint64_t nnz = 0;
          for (float x : ref) nnz += x != 0.0f;
          EXPECT_EQ(z.lastRound().sumNonzeros, nnz) << what;
          // The same through a dense buffer (summed in place), averaged.
          std::vector<float> dense(n, 0.0f);
          for (size_t i = 0; i < mine.index.size(); ++i) dense[mine.index[i]] += mine.value[i];
          z.allreduceDense(dense.data(), dense.data(), ReduceOp::kAverage, soon());
          for (uint64_t i = 0; i < n; ++i)
            ASSERT_EQ(dense[i], ref[i] / float(size)) << what << " (dense, average) at " << i;
        }
      }
      if (!scheme) {
        EXPECT_TRUE(z.choice().has_value());
      }
    }
  }
}

// Balanced parallelism's lists delta-coded (the default) and as COO: the
// same exact sums, and the delta-coded round sends fewer bytes wherever the
// lists are sparse enough for gaps to be shorter than 4-byte indices.
TEST(ZenCollective, DeltaCodedListsSumAsCooAndSendFewerBytes) {
  auto& g = world();
  const int size = g.size(), rank = g.rank();
  if (size < 2) GTEST_SKIP() << "one rank: nothing is sent";
  const uint64_t n = 100003;
  uint64_t seed = 500;
  for (Pattern pat : {Pattern::kZipf, Pattern::kUniform, Pattern::kDisjoint}) {
    for (double d : {0.001, 0.01, 0.5}) {
      ++seed;
      const Pairs mine = draw(n, d, pat, rank, size, seed);
      const std::vector<float> ref = reference(n, d, pat, size, seed);
      uint64_t sent[2] = {0, 0};
      for (bool compact : {true, false}) {
        ZenCollectiveOptions o;
        o.scheme = Scheme::kBalancedParallelism;
        o.compact = compact;
        ZenCollective z(g, "delta" + std::to_string(seed), n, o);
        std::vector<float> out(n, -1.0f);
        z.allreduce(mine.index, mine.value, out.data(), ReduceOp::kSum, soon());
        ASSERT_EQ(out, ref) << patternName(pat) << " density " << d << " compact " << compact;
        sent[compact ? 0 : 1] = z.lastRound().bytesSent;
      }
      const std::string what = fmt::format("{} density {}: {} bytes delta-coded, {} as COO",
                                           patternName(pat), d, sent[0], sent[1]);
      if (d <= 0.01 && mine.index.size() > 100)
        EXPECT_LT(sent[0], sent[1]) << what;
      else
        EXPECT_LE(sent[0], sent[1]) << what;
    }
  }
}

// The measured choice: identical index sets (gamma = 1 at every stage)
// make balanced parallelism the smaller of equations (1) and (2); disjoint
// ones (gamma(k) = k) hierarchical centralization where n is a power of
// two. Every rank takes the same.
TEST(ZenCollective, ChoiceFromMeasuredSparsityAgreesOnEveryRank) {
  auto& g = world();
  const int size = g.size(), rank = g.rank();
  if (size < 2) GTEST_SKIP() << "one rank";
  const uint64_t n = 50021;
  for (Pattern pat : {Pattern::kIdentical, Pattern::kDisjoint}) {
    ZenCollectiveOptions o;
    o.profileRounds = 2;
    ZenCollective z(g, std::string("choice.") + patternName(pat), n, o);
    for (int round = 0; round < 3; ++round) {
      const Pairs mine = draw(n, 0.02, pat, rank, size, 77 + round);
      std::vector<float> out(n);
      z.allreduce(mine.index, mine.value, out.data(), ReduceOp::kSum, soon());
      ASSERT_EQ(out, reference(n, 0.02, pat, size, 77 + round));
      if (round < 1) {
        EXPECT_FALSE(z.choice().has_value());
      }
    }
    ASSERT_TRUE(z.choice().has_value());
    EXPECT_EQ(z.lastRound().scheme, z.choice()->scheme);
    int64_t mine = int64_t(z.choice()->scheme), all[64] = {};
    g.allgather(&mine, 1, all, DType::kInt64, soon());
    for (int r = 0; r < size; ++r) EXPECT_EQ(all[r], mine) << "rank " << r;
    const bool pow2 = (size & (size - 1)) == 0;
    if (pat == Pattern::kIdentical) {
      EXPECT_EQ(z.choice()->scheme, Scheme::kBalancedParallelism) << z.choice()->figures;
    } else if (pow2) {
      EXPECT_EQ(z.choice()->scheme, Scheme::kHierarchicalCentralization) << z.choice()->figures;
    }
    EXPECT_NE(z.choice()->figures.find("T_bp="), std::string::npos);
  }
}

// An index past the tensor on one rank: every rank throws (none waits for
// it), the rank with the bad index naming the tensor and the position, the
// others naming that rank; the next round works.
TEST(ZenCollective, OutOfRangeIndexFailsEveryRankAndNamesIt) {
  auto& g = world();
  const int size = g.size(), rank = g.rank();
  const int bad = size - 1;
  const uint64_t n = 1001;
  for (Scheme s : {Scheme::kBalancedParallelism, Scheme::kHierarchicalCentralization}) {
    ZenCollectiveOptions o;
    o.scheme = s;
    ZenCollective z(g, "emb.oob", n, o);
    std::vector<uint32_t> idx = {0, 5, 1000};
    std::vector<float> val = {1, 2, 3};
    if (rank == bad) idx[1] = 1001;
    std::vector<float> out(n);
    try {
      z.allreduce(idx, val, out.data(), ReduceOp::kSum, soon());
      ADD_FAILURE() << "no error on rank " << rank << " with " << zen::schemeName(s);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << m;
      EXPECT_NE(m.find("emb.oob"), std::string::npos) << m;
      if (rank == bad) {
        EXPECT_NE(m.find("index #1 is 1001, out of range"), std::string::npos) << m;
      } else {
        EXPECT_NE(m.find(fmt::format("rank {}", bad)), std::string::npos) << m;
      }
    }
    // Lengths that differ are refused the same way.
    std::vector<float> shortVal = {1, 2};
    const std::vector<uint32_t> two = {0, 5};
    EXPECT_THROW(z.allreduce(rank == bad ? std::span<const uint32_t>(idx) : two, shortVal,
                             out.data(), ReduceOp::kSum, soon()),
                 Error);
    idx[1] = 5;
    z.allreduce(idx, val, out.data(), ReduceOp::kSum, soon());
    EXPECT_EQ(out[0], float(size));
    EXPECT_EQ(out[5], 2.0f * float(size));
    EXPECT_EQ(out[1000], 3.0f * float(size));
  }
}

// Settings that cannot work are refused before any communication.
TEST(ZenCollective, BadSettingsAreRefused) {
  auto& g = world();
  ZenCollectiveOptions o;
  o.profileRounds = 0;
  try {
    ZenCollective z(g, "emb.settings", 100, o);
    ADD_FAILURE() << "profileRounds 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("profileRounds 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ZenCollective(g, "emb.huge", zen::kMaxElements + 1), Error);
  // A null buffer on one member fails every member (none waits for it).
  ZenCollective z(g, "emb.null", 10);
  std::vector<uint32_t> idx = {1};
  std::vector<float> val = {1}, out(10), dense(10, 1.0f);
  const bool bad = g.rank() == 0;
  try {
    z.allreduce(idx, val, bad ? nullptr : out.data(), ReduceOp::kSum, soon());
    ADD_FAILURE() << "null output accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad ? "null output" : "rank 0"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(z.allreduceDense(bad ? nullptr : dense.data(), out.data(), ReduceOp::kSum, soon()),
               Error);
  z.allreduceDense(dense.data(), out.data(), ReduceOp::kSum, soon());
  EXPECT_EQ(out, std::vector<float>(10, float(g.size())));
}

// Members running different tensors fail with kMismatch (the call label)
// instead of summing one into the other.
TEST(ZenCollective, DifferentTensorsOnTheMembersAreRefused) {
  auto& g = world();
  if (g.size() < 2 || !g.checksArguments()) GTEST_SKIP() << "needs 2 ranks and argument checks";
  ZenCollective z(g, g.rank() == 0 ? "emb.a" : "emb.b", 100);
  std::vector<uint32_t> idx = {1};
  std::vector<float> val = {1}, out(100);
  try {
    z.allreduce(idx, val, out.data(), ReduceOp::kSum, soon());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
    EXPECT_NE(std::string(e.what()).find("zen:emb.a"), std::string::npos) << e.what();
  }
}

// A peer's list that is malformed is refused naming the tensor and the
// sender: a duplicated index, an index owned by another rank, a truncated
// list (balanced parallelism's sum step); a duplicate, an index out of
// order or past the end, a truncated list (a centralization stage).
TEST(ZenCollective, MalformedListsFromPeersAreRefusedNamingTheSender) {
  const uint64_t n = 5000;
  const zen::Ownership own(n, 3, 99);
  std::vector<uint32_t> mineIdx, otherIdx;
  for (uint32_t i = 0; i < n && (mineIdx.size() < 3 || otherIdx.empty()); ++i)
    (own.owner(i) == 1 ? mineIdx : otherIdx).push_back(i);
  const std::vector<float> v = {1, 2, 3};
  zen::ServerSum sum(own, 1);
  const auto good = zen::encodeCoo(own, 1, {mineIdx.data(), 2}, {v.data(), 2});
  const std::vector<uint32_t> dupIdx = {mineIdx[0], mineIdx[1], mineIdx[0]};
  const auto dup = zen::encodeCoo(own, 1, dupIdx, v);
  const std::vector<uint32_t> foreignIdx = {mineIdx[0], otherIdx[0]};
  const auto foreign = zen::encodeCoo(own, 1, foreignIdx, {v.data(), 2});
  auto truncated = good;
  truncated.pop_back();
  using Bytes = std::vector<std::byte>;
  for (const Bytes* badList : std::vector<const Bytes*>{&dup, &foreign, &truncated}) {
    std::vector<std::span<const std::byte>> from = {good, good, *badList};
    try {
      sumShares(sum, from, "emb.peer");
      ADD_FAILURE() << "accepted a malformed list";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kProtocol) << e.what();
      EXPECT_NE(std::string(e.what()).find("tensor 'emb.peer': the list from rank 2"),
                std::string::npos)
          << e.what();
    }
  }
  // The sum starts clean after a refused list: two good lists, then the answer.
  std::vector<std::span<const std::byte>> from = {good, good};
  std::vector<float> out(n, 0.0f);
  const auto answer = sumShares(sum, from, "emb.peer");
  const zen::IndexLists lists(own);
  zen::decodeAnswerInto(answer, own, 1, lists.of(1), out.data());
  EXPECT_EQ(out[mineIdx[0]], 2.0f);
  EXPECT_EQ(out[mineIdx[1]], 4.0f);

  auto stage = [](std::vector<uint32_t> idx) {
    std::vector<std::byte> b(8 * idx.size());
    std::memcpy(b.data(), idx.data(), 4 * idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      const float f = 1.0f;
      std::memcpy(b.data() + 4 * idx.size() + 4 * i, &f, 4);
    }
    return b;
  };
  EXPECT_EQ(parseStageList(stage({0, 7, 4999}), n, "emb.peer", 3).index.size(), 3u);
  for (auto bad : {stage({3, 3}), stage({7, 4}), stage({0, 5000})}) {
    try {
      parseStageList(bad, n, "emb.peer", 3);
      ADD_FAILURE() << "accepted a malformed stage list";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kProtocol) << e.what();
      EXPECT_NE(std::string(e.what()).find("tensor 'emb.peer': the list from rank 3"),
                std::string::npos)
          << e.what();
    }
  }
  auto cut = stage({1, 2});
  cut.resize(cut.size() - 3);
  EXPECT_THROW(parseStageList(cut, n, "emb.peer", 3), Error);
}

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace cortado

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  cortado::collective::mpi::Runtime rt;
  cortado::runtime = &rt;
  if (rt.worldRank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new cortado::FailurePrinter(rt.worldRank()));
  }
  const int rc = RUN_ALL_TESTS();
  cortado::groups() = {};
  cortado::runtime = nullptr;
  return rc;
}
