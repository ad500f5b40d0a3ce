// The collective conformance suite (see collective_test.h). Every operation
// runs on every group (world, intra-machine, inter-machine), for every dtype
// and for odd and zero sizes, and is compared with a plain summation of the
// inputs, which every rank can regenerate for every other rank.
#include "tests/collective/collective_test.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/common/half.h"

namespace cortado::collective::testing {
namespace {

// Input element i of group rank r: a small integer, so that every sum is exact
// in every dtype (at most 4 ranks: |sum| <= 20, or <= 40 for uint8).
double inputValue(int seed, DType t, int r, size_t i) {
  int v = static_cast<int>((seed * 13 + r * 7 + i * 3) % 11);
  return t == DType::kUInt8 ? v : v - 5;
}

double readAs(DType t, const void* base, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat64: return static_cast<const double*>(base)[i];
    case DType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(base)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kUInt8: return static_cast<const uint8_t*>(base)[i];
    case DType::kInt8: return static_cast<const int8_t*>(base)[i];
  }
  return 0;
}

void writeAs(DType t, void* base, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(base)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = floatToHalf(static_cast<float>(v)); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = floatToBf16(static_cast<float>(v)); break;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    case DType::kInt8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v); break;
  }
}

// Memory of the backend's kind, with host copies in and out.
class Mem {
 public:
  Mem(const Backend& b, DType t, size_t count) : b_(b), t_(t), count_(count) {
    p_ = b_.alloc(bytes());
    // Fill with a marker so that untouched elements are visible.
    std::vector<uint8_t> marker(std::max<size_t>(bytes(), 1), 0x5a);
    b_.upload(p_, marker.data(), bytes());
  }
  ~Mem() { b_.free(p_); }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;

  size_t bytes() const { return count_ * dtypeSize(t_); }
  void* get() const { return p_; }
  void set(const std::vector<double>& v) {
    std::vector<uint8_t> h(bytes());
    for (size_t i = 0; i < count_; ++i) writeAs(t_, h.data(), i, v[i]);
    b_.upload(p_, h.data(), bytes());
  }
  std::vector<double> read() const {
    std::vector<uint8_t> h(bytes());
    b_.download(h.data(), p_, bytes());
    std::vector<double> out(count_);
    for (size_t i = 0; i < count_; ++i) out[i] = readAs(t_, h.data(), i);
    return out;
  }
  std::vector<uint8_t> raw() const {
    std::vector<uint8_t> h(bytes());
    b_.download(h.data(), p_, bytes());
    return h;
  }

 private:
  const Backend& b_;
  DType t_;
  size_t count_;
  void* p_;
};

std::vector<double> inputs(int seed, DType t, int r, size_t n, size_t offset = 0) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = inputValue(seed, t, r, offset + i);
  return v;
}

std::vector<size_t> vCounts(int size, size_t base) {
  std::vector<size_t> c(size);
  for (int r = 0; r < size; ++r) c[r] = (base + r * 5) % 7;  // includes zeros
  return c;
}

}  // namespace

TEST_P(CollectiveTest, TopologyMatchesTheMachines) {
  const Topology& t = groups_.topology;
  const int fake = fakeHostSize();
  EXPECT_EQ(t.size, 4) << "the suite runs under mpirun -np 4";
  if (fake > 0) {
    EXPECT_EQ(t.machine, t.rank / fake);
    EXPECT_EQ(t.localRank, t.rank % fake);
    EXPECT_EQ(t.localSize, std::min(fake, t.size - t.machine * fake));
    EXPECT_EQ(t.numMachines, (t.size + fake - 1) / fake);
  } else {
    // MPI_COMM_TYPE_SHARED: the ranks' host names are the independent
    // reference for which ranks share a machine.
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    Mem mine(backend(), DType::kUInt8, 256), gathered(backend(), DType::kUInt8, 256 * t.size);
    backend().upload(mine.get(), host, 256);
    groups_.world->allgather(mine.get(), 256, gathered.get(), DType::kUInt8, deadline());
    std::vector<uint8_t> raw = gathered.raw();
    std::vector<char> all(raw.begin(), raw.end());
    std::vector<std::string> names;
    for (int r = 0; r < t.size; ++r) names.emplace_back(&all[256 * r]);
    int same = static_cast<int>(std::count(names.begin(), names.end(), names[t.rank]));
    EXPECT_EQ(t.localSize, same);
    std::vector<std::string> distinct = names;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    EXPECT_EQ(t.numMachines, static_cast<int>(distinct.size()));
  }
  EXPECT_EQ(groups_.world->size(), t.size);
  EXPECT_EQ(groups_.world->rank(), t.rank);
  EXPECT_EQ(groups_.intra->size(), t.localSize);
  EXPECT_EQ(groups_.intra->rank(), t.localRank);
  ASSERT_NE(groups_.inter, nullptr);
  EXPECT_EQ(groups_.inter->rank(), t.machine);
  EXPECT_EQ(groups_.world->memory(), groups_.intra->memory());
}

TEST_P(CollectiveTest, Allreduce) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    Mem in(backend(), t, n), out(backend(), t, n);
    in.set(inputs(seed_, t, g.rank(), n));
    g.allreduce(in.get(), out.get(), n, t, deadline());
    auto got = out.read();
    for (size_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < g.size(); ++r) ref += inputValue(seed_, t, r, i);
      ASSERT_EQ(got[i], ref) << "element " << i;
    }
  });
}

TEST_P(CollectiveTest, AllreduceInPlace) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    Mem buf(backend(), t, n);
    buf.set(inputs(seed_, t, g.rank(), n));
    g.allreduce(buf.get(), buf.get(), n, t, deadline());
    auto got = buf.read();
    for (size_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < g.size(); ++r) ref += inputValue(seed_, t, r, i);
      ASSERT_EQ(got[i], ref) << "element " << i;
    }
  });
}

TEST_P(CollectiveTest, ReduceScatter) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    Mem in(backend(), t, n * g.size()), out(backend(), t, n);
    in.set(inputs(seed_, t, g.rank(), n * g.size()));
    g.reduceScatter(in.get(), out.get(), n, t, deadline());
    auto got = out.read();
    for (size_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < g.size(); ++r) ref += inputValue(seed_, t, r, g.rank() * n + i);
      ASSERT_EQ(got[i], ref) << "element " << i;
    }
  });
}

TEST_P(CollectiveTest, Allgather) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    Mem in(backend(), t, n), out(backend(), t, n * g.size());
    in.set(inputs(seed_, t, g.rank(), n));
    g.allgather(in.get(), n, out.get(), t, deadline());
    auto got = out.read();
    for (int r = 0; r < g.size(); ++r)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[r * n + i], inputValue(seed_, t, r, i)) << "from rank " << r;
  });
}

TEST_P(CollectiveTest, Allgatherv) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    auto counts = vCounts(g.size(), n);
    size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    Mem in(backend(), t, counts[g.rank()]), out(backend(), t, total);
    in.set(inputs(seed_, t, g.rank(), counts[g.rank()]));
    g.allgatherv(in.get(), counts[g.rank()], out.get(), counts, t, deadline());
    auto got = out.read();
    size_t off = 0;
    for (int r = 0; r < g.size(); ++r) {
      for (size_t i = 0; i < counts[r]; ++i) ASSERT_EQ(got[off + i], inputValue(seed_, t, r, i)) << "from " << r;
      off += counts[r];
    }
  });
}

TEST_P(CollectiveTest, Alltoall) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    Mem in(backend(), t, n * g.size()), out(backend(), t, n * g.size());
    in.set(inputs(seed_, t, g.rank(), n * g.size()));
    g.alltoall(in.get(), out.get(), n, t, deadline());
    auto got = out.read();
    for (int r = 0; r < g.size(); ++r)
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(got[r * n + i], inputValue(seed_, t, r, g.rank() * n + i)) << "from rank " << r;
  });
}

TEST_P(CollectiveTest, Alltoallv) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    // Rank s sends (n + s + 2 d) % 5 elements to rank d.
    auto cnt = [&](int s, int d) { return static_cast<size_t>((n + s + 2 * d) % 5); };
    std::vector<size_t> sendCounts(g.size()), recvCounts(g.size());
    for (int p = 0; p < g.size(); ++p) {
      sendCounts[p] = cnt(g.rank(), p);
      recvCounts[p] = cnt(p, g.rank());
    }
    size_t st = std::accumulate(sendCounts.begin(), sendCounts.end(), size_t{0});
    size_t rt = std::accumulate(recvCounts.begin(), recvCounts.end(), size_t{0});
    Mem in(backend(), t, st), out(backend(), t, rt);
    in.set(inputs(seed_, t, g.rank(), st));
    g.alltoallv(in.get(), sendCounts, out.get(), recvCounts, t, deadline());
    auto got = out.read();
    size_t off = 0;
    for (int s = 0; s < g.size(); ++s) {
      size_t srcOff = 0;  // where rank s's block for us starts in its send buffer
      for (int d = 0; d < g.rank(); ++d) srcOff += cnt(s, d);
      for (size_t i = 0; i < recvCounts[s]; ++i)
        ASSERT_EQ(got[off + i], inputValue(seed_, t, s, srcOff + i)) << "from rank " << s;
      off += recvCounts[s];
    }
  });
}

TEST_P(CollectiveTest, ReduceToEveryRoot) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    for (int root = 0; root < g.size(); ++root) {
      Mem in(backend(), t, n), out(backend(), t, n);
      in.set(inputs(seed_ + root, t, g.rank(), n));
      auto before = out.raw();
      g.reduce(in.get(), out.get(), n, t, root, deadline());
      if (g.rank() != root) {
        ASSERT_EQ(out.raw(), before) << "reduce wrote into a non-root's receive buffer";
        continue;
      }
      auto got = out.read();
      for (size_t i = 0; i < n; ++i) {
        double ref = 0;
        for (int r = 0; r < g.size(); ++r) ref += inputValue(seed_ + root, t, r, i);
        ASSERT_EQ(got[i], ref) << "root " << root << " element " << i;
      }
    }
  });
}

TEST_P(CollectiveTest, GatherToEveryRoot) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    for (int root = 0; root < g.size(); ++root) {
      Mem in(backend(), t, n), out(backend(), t, n * g.size());
      in.set(inputs(seed_ + root, t, g.rank(), n));
      g.gather(in.get(), n, out.get(), t, root, deadline());
      if (g.rank() != root) continue;
      auto got = out.read();
      for (int r = 0; r < g.size(); ++r)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[r * n + i], inputValue(seed_ + root, t, r, i));
    }
  });
}

TEST_P(CollectiveTest, GathervToEveryRoot) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    auto counts = vCounts(g.size(), n);
    size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    for (int root = 0; root < g.size(); ++root) {
      Mem in(backend(), t, counts[g.rank()]), out(backend(), t, total);
      in.set(inputs(seed_ + root, t, g.rank(), counts[g.rank()]));
      // Non-roots pass no counts: they are read on the root only.
      std::span<const size_t> mine = g.rank() == root ? std::span<const size_t>(counts) : std::span<const size_t>();
      g.gatherv(in.get(), counts[g.rank()], out.get(), mine, t, root, deadline());
      if (g.rank() != root) continue;
      auto got = out.read();
      size_t off = 0;
      for (int r = 0; r < g.size(); ++r) {
        for (size_t i = 0; i < counts[r]; ++i) ASSERT_EQ(got[off + i], inputValue(seed_ + root, t, r, i));
        off += counts[r];
      }
    }
  });
}

TEST_P(CollectiveTest, BroadcastFromEveryRoot) {
  everyCase([&](Collectives& g, DType t, size_t n) {
    for (int root = 0; root < g.size(); ++root) {
      Mem buf(backend(), t, n);
      buf.set(inputs(seed_ + root, t, g.rank(), n));
      g.broadcast(buf.get(), n, t, root, deadline());
      auto got = buf.read();
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], inputValue(seed_ + root, t, root, i)) << "root " << root;
    }
  });
}

// 2048 + 1 + 1 + 1 in float16: summed in float16 it stays 2048 (each +1 is a
// tie that rounds to even); summed in float32 it is 2051, which rounds once
// to 2052. Likewise 256 + 1 + 1 + 1 in bfloat16 (260 vs 256).
TEST_P(CollectiveTest, HalfPrecisionSumsAccumulateInFloat32) {
  Collectives& g = *groups_.world;
  ASSERT_GE(g.size(), 3);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    const double big = t == DType::kFloat16 ? 2048 : 256;
    const double ref = t == DType::kFloat16 ? halfToFloat(floatToHalf(static_cast<float>(big + g.size() - 1)))
                                            : bf16ToFloat(floatToBf16(static_cast<float>(big + g.size() - 1)));
    ASSERT_NE(ref, big) << "the values must tell float16 from float32 accumulation";
    Mem in(backend(), t, 3), out(backend(), t, 3 * g.size());
    in.set(std::vector<double>(3, g.rank() == 0 ? big : 1.0));
    g.allreduce(in.get(), out.get(), 3, t, deadline());
    EXPECT_EQ(out.read()[0], ref) << dtypeName(t) << " allreduce";
    g.reduce(in.get(), out.get(), 3, t, 0, deadline());
    if (g.rank() == 0) {
      EXPECT_EQ(out.read()[1], ref) << dtypeName(t) << " reduce";
    }
    Mem rsIn(backend(), t, 3 * g.size());
    rsIn.set(std::vector<double>(3 * g.size(), g.rank() == 0 ? big : 1.0));
    g.reduceScatter(rsIn.get(), out.get(), 3, t, deadline());
    EXPECT_EQ(out.read()[2], ref) << dtypeName(t) << " reduce-scatter";
  }
}

// ---- error paths ----------------------------------------------------------

namespace {

template <typename F>
Error expectError(ErrorCode code, F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected an Error(" << errorCodeName(code) << ")";
  return Error(ErrorCode::kOk, "");
}

void expectMentions(const Error& e, std::initializer_list<std::string> words) {
  for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << "\n(wanted: " << w << ")";
}

}  // namespace

TEST_P(CollectiveTest, LocalMisuseIsRefusedBeforeAnyCommunication) {
  Collectives& g = *groups_.world;
  const DType t = DType::kFloat32;
  Mem a(backend(), t, 16), b(backend(), t, 64);
  auto e = expectError(ErrorCode::kInvalidArgument,
                       [&] { g.broadcast(a.get(), 4, t, g.size(), deadline()); });
  expectMentions(e, {"broadcast", "root 4", "world"});
  e = expectError(ErrorCode::kInvalidArgument, [&] { g.reduce(a.get(), b.get(), 4, t, -1, deadline()); });
  expectMentions(e, {"reduce", "root -1"});
  std::vector<size_t> shortCounts(g.size() - 1, 1);
  e = expectError(ErrorCode::kInvalidArgument,
                  [&] { g.allgatherv(a.get(), 1, b.get(), shortCounts, t, deadline()); });
  expectMentions(e, {"allgatherv", "counts has 3 entries", "4 ranks"});
  std::vector<size_t> counts(g.size(), 2);
  e = expectError(ErrorCode::kInvalidArgument, [&] { g.allgatherv(a.get(), 3, b.get(), counts, t, deadline()); });
  expectMentions(e, {"sends 3 elements", "counts["});
  e = expectError(ErrorCode::kInvalidArgument,
                  [&] { g.allreduce(a.get(), b.get(), size_t{1} << 33, t, deadline()); });
  expectMentions(e, {"allreduce", "8589934592", "chunks"});
  e = expectError(ErrorCode::kInvalidArgument, [&] { g.allreduce(nullptr, b.get(), 4, t, deadline()); });
  expectMentions(e, {"send buffer is null"});
  e = expectError(ErrorCode::kInvalidArgument,
                  [&] { g.allgather(a.get(), 4, static_cast<float*>(a.get()) + 2, t, deadline()); });
  expectMentions(e, {"overlap"});
  e = expectError(ErrorCode::kInvalidArgument,
                  [&] { g.allreduce(a.get(), b.get(), 4, static_cast<DType>(99), deadline()); });
  expectMentions(e, {"dtype"});
  // Nothing was sent: the group still works.
  a.set(std::vector<double>(16, 1.0));
  g.allreduce(a.get(), b.get(), 16, t, deadline());
  EXPECT_EQ(b.read()[15], g.size());
}

TEST_P(CollectiveTest, MismatchedArgumentsFailOnEveryRank) {
  Collectives& g = *groups_.world;
  const DType t = DType::kInt32;
  Mem a(backend(), t, 64), b(backend(), t, 256);
  // Rank 1 passes one element more.
  auto e = expectError(ErrorCode::kMismatch, [&] {
    g.allreduce(a.get(), b.get(), g.rank() == 1 ? 11 : 10, t, deadline());
  });
  expectMentions(e, {"allreduce", "world", "count", "rank 0: 10", "rank 1: 11"});
  e = expectError(ErrorCode::kMismatch, [&] {
    g.broadcast(a.get(), 8, g.rank() == 2 ? DType::kFloat32 : t, 0, deadline());
  });
  expectMentions(e, {"dtype", "rank 2: float32"});
  e = expectError(ErrorCode::kMismatch, [&] { g.broadcast(a.get(), 8, t, g.rank() == 3 ? 1 : 0, deadline()); });
  expectMentions(e, {"root", "rank 3: 1"});
  // allgatherv: rank 0 believes rank 2 sends 3, rank 2 sends 2.
  std::vector<size_t> counts(g.size(), 2);
  if (g.rank() == 0) counts[2] = 3;
  e = expectError(ErrorCode::kMismatch, [&] { g.allgatherv(a.get(), 2, b.get(), counts, t, deadline()); });
  expectMentions(e, {"allgatherv", "counts list", "rank 1: differs from rank 0"});
  // gatherv: the root expects 2 from everyone; rank 3 sends 1 (and passes no
  // counts, so only the root can tell).
  std::vector<size_t> rootCounts(g.size(), 2);
  e = expectError(ErrorCode::kMismatch, [&] {
    std::span<const size_t> mine = g.rank() == 0 ? std::span<const size_t>(rootCounts) : std::span<const size_t>();
    g.gatherv(a.get(), g.rank() == 3 ? 1 : 2, b.get(), mine, t, 0, deadline());
  });
  expectMentions(e, {"gatherv", "rank 3's count: it sends 1 but the root's (rank 0) counts[3] = 2"});
  // alltoallv: rank 1 sends 3 to rank 0, which expects 2.
  std::vector<size_t> sc(g.size(), 2), rc(g.size(), 2);
  if (g.rank() == 1) sc[0] = 3;
  e = expectError(ErrorCode::kMismatch, [&] { g.alltoallv(a.get(), sc, b.get(), rc, t, deadline()); });
  expectMentions(e, {"alltoallv", "rank 1 sends 3 elements to rank 0", "recvCounts[1] = 2"});
  // Different operations on different ranks.
  e = expectError(ErrorCode::kMismatch, [&] {
    if (g.rank() == 0)
      g.allreduce(a.get(), b.get(), 8, t, deadline());
    else
      g.broadcast(a.get(), 8, t, 0, deadline());
  });
  expectMentions(e, {"operation", "rank 0: allreduce", "rank 1: broadcast"});
  // The checks moved no data: the group still works.
  a.set(std::vector<double>(64, 2.0));
  g.allreduce(a.get(), b.get(), 64, t, deadline());
  EXPECT_EQ(b.read()[63], 2.0 * g.size());
}

TEST_P(CollectiveTest, MembersRunningDifferentThingsFailNamingEachLabel) {
  Collectives& g = *groups_.world;
  const DType t = DType::kInt32;
  Mem a(backend(), t, 64), b(backend(), t, 64);
  a.set(std::vector<double>(64, 3.0));
  // Same operation, count and dtype: without the labels rank 1's call would
  // sum into the others'.
  auto e = expectError(ErrorCode::kMismatch, [&] {
    CallLabel label(g, g.rank() == 1 ? "tensor 'b' run 0" : "tensor 'a' run 0");
    g.allreduce(a.get(), b.get(), 64, t, deadline());
  });
  expectMentions(e, {"allreduce", "world", "not running the same thing", "rank 0: tensor 'a' run 0",
                     "rank 1: tensor 'b' run 0", "rank 2: tensor 'a' run 0",
                     "same tensors in the same order"});
  // A labelled call against unlabelled ones.
  e = expectError(ErrorCode::kMismatch, [&] {
    std::optional<CallLabel> label;
    if (g.rank() == 2) label.emplace(g, "tensor 'c' run 4");
    g.broadcast(a.get(), 8, t, 0, deadline());
  });
  expectMentions(e, {"broadcast", "rank 1: an unlabeled call", "rank 2: tensor 'c' run 4"});
  // Labels past the shown length are compared whole: these differ only at
  // the end, and are shown cut.
  const std::string prefix(200, 'x');
  e = expectError(ErrorCode::kMismatch, [&] {
    CallLabel label(g, prefix + (g.rank() == 3 ? "3" : "0"));
    g.allreduce(a.get(), b.get(), 64, t, deadline());
  });
  expectMentions(e, {"rank 3: " + std::string(Collectives::kShownLabelBytes - 3, 'x') + "..."});
  // Nested labels: the inner one counts, and the outer one is back after it.
  {
    CallLabel outer(g, "outer");
    {
      CallLabel inner(groups_, "inner");  // every group
      EXPECT_EQ(g.callLabel(), "inner");
      EXPECT_EQ(groups_.intra->callLabel(), "inner");
      g.allreduce(a.get(), b.get(), 64, t, deadline());
    }
    EXPECT_EQ(g.callLabel(), "outer");
    EXPECT_EQ(groups_.intra->callLabel(), "");
    e = expectError(ErrorCode::kMismatch, [&] {
      std::optional<CallLabel> inner;
      if (g.rank() == 0) inner.emplace(g, "inner");
      g.allreduce(a.get(), b.get(), 64, t, deadline());
    });
    expectMentions(e, {"rank 0: inner", "rank 1: outer"});
  }
  EXPECT_EQ(g.callLabel(), "");
  // Nothing moved: equal labels run, and the sums are right.
  CallLabel same(g, "tensor 'a' run 1");
  g.allreduce(a.get(), b.get(), 64, t, deadline());
  EXPECT_EQ(b.read()[63], 3.0 * g.size());
}

TEST_P(CollectiveTest, TimedOutWaitNamesTheOperationAndBreaksTheGroup) {
  // Without the argument check, so that rank 0's allreduce itself is what
  // waits for the peers.
  Groups fresh = backend().makeGroups(GroupOptions{InterGroups::kSameLocalRank, false});
  Collectives& g = *fresh.world;
  const DType t = DType::kFloat64;
  Mem in(backend(), t, 5), out(backend(), t, 5);
  in.set(std::vector<double>(5, 1.0 + g.rank()));
  if (g.rank() == 0) {
    auto e = expectError(ErrorCode::kTimeout,
                         [&] { g.allreduce(in.get(), out.get(), 5, t, Deadline::after(Millis(300))); });
    expectMentions(e, {"allreduce", "group 'world'", "rank 0 of 4", "deadline"});
    e = expectError(ErrorCode::kClosed, [&] { g.broadcast(in.get(), 5, t, 0, deadline()); });
    expectMentions(e, {"broadcast", "unusable", "allreduce did not complete"});
  }
  // Everyone meets on the suite's own world group (rank 0 after its timeout).
  Mem flag(backend(), DType::kInt32, 1);
  flag.set({1});
  groups_.world->allreduce(flag.get(), flag.get(), 1, DType::kInt32, deadline());
  if (backend().lateJoinCompletes) {
    // The peers arrive late; rank 0's request is still posted, so the
    // operation completes for them, with rank 0's contribution.
    if (g.rank() != 0) {
      g.allreduce(in.get(), out.get(), 5, t, deadline());
      EXPECT_EQ(out.read()[4], 1.0 + 2.0 + 3.0 + 4.0);
    }
    groups_.world->allreduce(flag.get(), flag.get(), 1, DType::kInt32, deadline());
  }
}

TEST_P(CollectiveTest, InvalidGroupIsRefused) {
  Groups roots = backend().makeGroups(GroupOptions{InterGroups::kRootsOnly, true});
  const Topology& t = roots.topology;
  if (t.localRank == 0) {
    Collectives& inter = roots.get(GroupKind::kInter);
    EXPECT_EQ(inter.size(), t.numMachines);
    EXPECT_EQ(inter.rank(), t.machine);
    EXPECT_EQ(inter.name(), "inter[machine roots]");
  } else {
    auto e = expectError(ErrorCode::kInvalidArgument, [&] { roots.get(GroupKind::kInter); });
    expectMentions(e, {fmt::format("rank {}", t.rank), "no inter group", "machine roots"});
  }
  auto e = expectError(ErrorCode::kInvalidArgument, [&] { roots.get(static_cast<GroupKind>(7)); });
  expectMentions(e, {"unknown collective group kind 7"});
  // The roots' inter group works (sum of machine indices).
  if (t.localRank == 0) {
    Collectives& inter = roots.get(GroupKind::kInter);
    Mem a(backend(), DType::kInt64, 1);
    a.set({static_cast<double>(t.machine)});
    inter.allreduce(a.get(), a.get(), 1, DType::kInt64, deadline());
    EXPECT_EQ(a.read()[0], t.numMachines * (t.numMachines - 1) / 2.0);
  }
}

void CollectiveTest::SetUp() {
  const Backend& b = GetParam();
  std::string why = b.skipReason();
  if (!why.empty()) GTEST_SKIP() << why;
  groups_ = b.makeGroups(GroupOptions{});
}

}  // namespace cortado::collective::testing
