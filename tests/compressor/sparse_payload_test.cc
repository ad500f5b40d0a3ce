// Top-k and DGC payloads of tensors with fewer non-zeros than k (an
// embedding's gradient: only the rows of the step's words are non-zero).
// On the wire (compressor/compact.h) they carry k' = min(k, non-zeros)
// entries, not k: checked against a plain reference (each worker's
// brute-force top-k of its non-zeros, summed in a loop), with workers whose
// counts of non-zeros differ, through GraVAC's two levels (top-k of a top-k
// payload still equal to direct top-k at the product CF) and its error
// feedback (residual = compensated minus what went out, exactly).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "compressor/compact.h"
#include "compressor/error_feedback.h"
#include "compressor/format.h"
#include "compressor/gravac_compressor.h"
#include "compressor/multi_level.h"
#include "compressor/payload.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using testing::cpuRegistry;
using testing::encodeToVector;

// A row-sparse tensor of rows x cols: `nzRows` distinct rows (drawn with
// `seed`) hold non-zero values, every other element is 0. Values are
// multiples of 1/64 (non-zero), so that sums compare exactly in any order.
std::vector<float> rowSparse(size_t rows, size_t cols, size_t nzRows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<size_t> chosen;
  while (chosen.size() < nzRows) chosen.insert(rng() % rows);
  std::vector<float> x(rows * cols, 0.0f);
  for (size_t r : chosen)
    for (size_t c = 0; c < cols; ++c) {
      int64_t k = int64_t(rng() % 2001) - 1000;
      if (k == 0) k = 1;
      x[r * cols + c] = float(k) / 64.0f;
    }
  return x;
}

size_t nonzeros(const std::vector<float>& x) {
  return size_t(std::count_if(x.begin(), x.end(), [](float v) { return v != 0.0f; }));
}

// The plain reference: the k largest magnitudes among x's non-zeros (all of
// them when there are fewer), ties to the lower index; a dense vector.
std::vector<float> bruteTopKOfNonzeros(const std::vector<float>& x, size_t k) {
  std::vector<size_t> nz;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != 0.0f) nz.push_back(i);
  std::stable_sort(nz.begin(), nz.end(),
                   [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  if (nz.size() > k) nz.resize(k);
  std::vector<float> out(x.size(), 0.0f);
  for (size_t i : nz) out[i] = x[i];
  return out;
}

// The wire form of a plain payload: what the engine pushes and the
// executor's collectives carry.
std::vector<std::byte> onTheWire(const std::vector<std::byte>& plain) {
  std::vector<std::byte> out(compactedRunBytes(plain));
  EXPECT_EQ(compactRun(plain, out), out.size());
  return out;
}

// What a receiver reads: the wire form expanded.
std::vector<std::byte> received(const std::vector<std::byte>& wire) {
  std::vector<std::byte> scratch;
  auto plain = expandRun(wire, scratch);
  return {plain.begin(), plain.end()};
}

// Bytes of a compact payload listing the non-zero entries of `sent` (dense),
// counted by hand: 48 + 4 per entry + its LEB128 gap.
size_t expectedWireBytes(const std::vector<float>& sent) {
  size_t bytes = kHeaderBytes;
  uint64_t next = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    if (sent[i] == 0.0f) continue;
    const uint64_t gap = i - next;
    bytes += 4 + (gap < (1u << 7) ? 1 : gap < (1u << 14) ? 2 : gap < (1u << 21) ? 3 : 4);
    next = i + 1;
  }
  return bytes;
}

TEST(SparsePayload, WorkersSendTheirNonzerosOnlyAndTheSumIsTheReference) {
  // 4 workers, a 400 x 32 tensor at 10x (k = 1280): worker w has 3, 20, 40
  // and 90 non-zero rows (96, 640, 1280 and 2880 non-zeros), below, at and
  // above k.
  const size_t rows = 400, cols = 32, n = rows * cols;
  const size_t nzRows[] = {3, 20, 40, 90};
  for (const char* spec : {"topk:ratio=0.1", "dgc:ratio=0.1"}) {
    SCOPED_TRACE(spec);
    auto codec = cpuRegistry().create(spec);
    const size_t k = format::kFromRatio(n, 0.1);
    ASSERT_EQ(k, 1280u);
    std::vector<float> sum(n, 0.0f), want(n, 0.0f);
    for (size_t w = 0; w < std::size(nzRows); ++w) {
      SCOPED_TRACE(fmt::format("worker {} ({} non-zero rows)", w, nzRows[w]));
      const auto x = rowSparse(rows, cols, nzRows[w], 100 + w);
      const size_t nnz = nonzeros(x);
      ASSERT_EQ(nnz, nzRows[w] * cols);
      const auto plain = encodeToVector(*codec, x);
      ASSERT_EQ(plain.size(), codec->payloadBytes(n));  // the codec's fixed size: k entries
      const auto wire = onTheWire(plain);
      const PayloadHeader h = parseHeader(wire);
      const auto ref = bruteTopKOfNonzeros(x, k);
      // k' = min(k, non-zeros) entries, and the bytes are those entries'.
      EXPECT_EQ(h.count, std::min(k, nnz));
      EXPECT_EQ(wire.size(), expectedWireBytes(ref));
      if (nnz < k) {
        EXPECT_LT(wire.size(), kHeaderBytes + 5 * k);  // the k-entry form's floor
      }
      // Decoded, what the worker sent is its reference top-k.
      const auto got = received(wire);
      std::vector<float> dense(n, -1.0f);
      codec->decode(got, dense.data(), n);
      ASSERT_EQ(dense, ref);
      // Into the sum, as a server or the executor's decode adds payloads.
      codec->decompressAdd(got, sum.data(), n);
      for (size_t i = 0; i < n; ++i) want[i] += ref[i];
    }
    ASSERT_EQ(sum, want);
  }
}

TEST(SparsePayload, AllZeroAndDenseTensorsAndRunsOfSeveralPayloads) {
  auto codec = cpuRegistry().create("topk:ratio=0.05");
  const size_t n = 5000;
  // All zero: nothing listed, the header alone.
  const std::vector<float> zero(n, 0.0f);
  const auto none = onTheWire(encodeToVector(*codec, zero));
  EXPECT_EQ(none.size(), kHeaderBytes);
  EXPECT_EQ(parseHeader(none).count, 0u);
  std::vector<float> out(n, 1.0f);
  codec->decode(received(none), out.data(), n);
  EXPECT_EQ(out, zero);
  // No zero among the values kept: the wire form expands to the same bytes.
  const auto dense = testing::randomTensor(n, 5);
  const auto plain = encodeToVector(*codec, dense);
  EXPECT_EQ(received(onTheWire(plain)), plain);
  // A run (one push of the plan executor: several payloads of a chunk back
  // to back): each payload loses its own zeros.
  const auto sparse = rowSparse(100, 50, 2, 9);  // 100 non-zeros, k = 250
  const auto sparsePlain = encodeToVector(*codec, sparse);
  std::vector<std::byte> run(plain);
  run.insert(run.end(), sparsePlain.begin(), sparsePlain.end());
  const auto wire = onTheWire(run);
  EXPECT_EQ(wire.size(), onTheWire(plain).size() + expectedWireBytes(sparse));
  const auto back = received(wire);
  const auto parts = splitRun(back);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parseHeader(parts[1]).count, 100u);
  std::vector<float> a(n), b(n);
  codec->decode(parts[0], a.data(), n);
  codec->decode(parts[1], b.data(), n);
  EXPECT_EQ(b, sparse);
  EXPECT_EQ(a, testing::decodeToVector(*codec, plain, n));
}

TEST(SparsePayload, MultiLevelTopKOfASparseTensorIsDirectTopKAtTheProduct) {
  // 2000 x 16 at 10x (k = 3200), then the candidate 4x further (k = 800):
  // non-zeros below both k's, between them and above both.
  const size_t rows = 2000, cols = 16, n = rows * cols;
  for (const char* name : {"topk", "dgc"}) {
    MultiLevelCodec c(cpuRegistry(), name);
    for (size_t nzRows : {20, 100, 400}) {
      SCOPED_TRACE(fmt::format("{}, {} non-zeros", name, nzRows * cols));
      const auto x = rowSparse(rows, cols, nzRows, nzRows);
      std::vector<std::byte> first(c.payloadBytes(n, 10.0)), second(c.payloadBytes(n, 40.0)),
          direct(c.payloadBytes(n, 40.0));
      first.resize(c.encode(x.data(), n, 10.0, first, {}));
      second.resize(c.recompress(first, n, 40.0, second));
      direct.resize(c.encode(x.data(), n, 40.0, direct, {}));
      EXPECT_EQ(second, direct);  // plain payloads, byte for byte
      const auto wire = onTheWire(second);
      EXPECT_EQ(wire, onTheWire(direct));
      const auto ref = bruteTopKOfNonzeros(x, MultiLevelCodec::keptAt(n, 40.0));
      EXPECT_EQ(parseHeader(wire).count, std::min<size_t>(800, nzRows * cols));
      EXPECT_EQ(wire.size(), expectedWireBytes(ref));
      std::vector<float> out(n, -1.0f);
      c.at(40.0)->decode(received(wire), out.data(), n);
      EXPECT_EQ(out, ref);
    }
  }
}

// GraVAC's error feedback with a row-sparse gradient whose rows move: what
// goes on the wire, decoded, plus the new residual is the compensated
// gradient, element for element, at every level.
void gravacIdentityOnTheWire(const char* codec) {
  GravacOptions o;
  o.codec = codec;
  o.window = 1;
  o.alpha = 1;
  o.minRatio = 10;
  o.maxRatio = 5000;
  GravacCompressor g(cpuRegistry(), o, 1);
  const float m = g.momentum();
  const size_t rows = 300, cols = 20, n = rows * cols;
  const uint64_t key = 1;
  const GravacSums forced[] = {{1, 1, 1}, {1, 1, 0.5}, {1, 0.1, 0.1}, {1, 1, 1}, {1, 1, 0.5}};
  std::vector<float> residual(n, 0.0f), velocity(n, 0.0f);
  std::set<GravacLevel> levels;
  bool fewer = false;
  for (size_t it = 0; it < std::size(forced); ++it) {
    const auto grad = rowSparse(rows, cols, 5 + 7 * it, 40 + it);
    std::vector<float> v(n), u(n);
    for (size_t i = 0; i < n; ++i) {
      u[i] = m > 0 ? m * velocity[i] + grad[i] : 0.0f;
      v[i] = residual[i] + (m > 0 ? u[i] : grad[i]);
    }
    g.prepare(key, grad.data(), n);
    const GravacStep s = g.decide(forced[it], 0);
    SCOPED_TRACE(fmt::format("{} iteration {} ({} at {}x)", codec, it + 1,
                             gravacLevelName(s.level), s.ratio));
    levels.insert(s.level);
    const auto msg = g.message(key);
    std::vector<float> sent(n, 0.0f);
    if (s.level == GravacLevel::kDense) {
      g.decompressAdd(key, msg, sent.data());
    } else {
      const std::vector<std::byte> plain(msg.begin(), msg.end());
      const auto wire = onTheWire(plain);
      const size_t k = MultiLevelCodec::keptAt(n, s.ratio);
      const size_t nnz = nonzeros(v);
      EXPECT_EQ(parseHeader(wire).count, std::min(k, nnz));
      fewer = fewer || nnz < k;
      g.decompressAdd(key, received(wire), sent.data());
    }
    const auto r = g.residual(key);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(sent[i] + r[i], v[i]) << i;
    if (m > 0) {
      const auto vel = g.velocity(key);
      velocity.assign(vel.begin(), vel.end());
    }
    residual.assign(r.begin(), r.end());
  }
  EXPECT_EQ(levels.size(), 3u);
  EXPECT_TRUE(fewer);  // some sparse step had fewer non-zeros than k
}

TEST(SparsePayload, GravacErrorFeedbackIdentityOnTheWireTopK) { gravacIdentityOnTheWire("topk"); }
TEST(SparsePayload, GravacErrorFeedbackIdentityOnTheWireDgc) { gravacIdentityOnTheWire("dgc"); }

TEST(SparsePayload, ErrorFeedbackOfTheEngineSendsNonzerosAndKeepsTheRest) {
  // The worker engine's path: ErrorFeedback encodes grad + residual at k,
  // the push goes compact. Rows that appear over steps: the residual holds
  // only what the k largest left out, and the wire carries min(k, nnz).
  for (const char* spec : {"topk:ratio=0.01", "dgc:ratio=0.01"}) {
    SCOPED_TRACE(spec);
    ErrorFeedback ef(cpuRegistry().create(spec));
    const size_t rows = 1000, cols = 10, n = rows * cols;  // k = 100
    std::vector<float> residual(n, 0.0f), velocity(n, 0.0f);
    const float m = ef.momentum();
    for (int it = 0; it < 6; ++it) {
      const auto grad = rowSparse(rows, cols, it % 2 ? 30 : 4, 70 + it);
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) {
        velocity[i] = m > 0 ? m * velocity[i] + grad[i] : 0.0f;
        v[i] = residual[i] + (m > 0 ? velocity[i] : grad[i]);
      }
      std::vector<std::byte> plain(ef.payloadBytes(n));
      plain.resize(ef.encode(0, grad.data(), n, plain));
      const auto wire = onTheWire(plain);
      EXPECT_EQ(parseHeader(wire).count, std::min<size_t>(100, nonzeros(v))) << it;
      std::vector<float> sent(n, 0.0f);
      ef.codec().decompressAdd(received(wire), sent.data(), n);
      EXPECT_EQ(sent, bruteTopKOfNonzeros(v, 100)) << it;
      const auto r = ef.residual(0);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(sent[i] + r[i], v[i]) << it << " " << i;
      residual.assign(r.begin(), r.end());
      if (m > 0) {
        const auto u = ef.velocity(0);
        velocity.assign(u.begin(), u.end());
      }
    }
  }
}

}  // namespace
}  // namespace cortado::compressor
