// The compact wire form of top-k and DGC payloads (compressor/compact.h):
// compacting and expanding give back the plain payload bit for bit at every
// density and gap size (less its zero values: sparse_payload_test.cc), the size is what the varint gaps make (counted here
// by a plain loop, not by the code under test), only well-formed plain
// payloads compact, and malformed compact payloads are refused with kProtocol
// naming what is wrong, writing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "compressor/compact.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "expect_protocol.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using cortado::test::expectProtocol;
using testing::cpuRegistry;
using testing::encodeToVector;
using testing::randomTensor;

// A plain top-k (or DGC) payload listing `idx` (ascending) of an n-element
// tensor, with values whose bits are arbitrary (NaNs, -0, denormals too).
std::vector<std::byte> plainPayload(uint64_t n, const std::vector<uint32_t>& idx,
                                    CodecId codec = CodecId::kTopK, uint64_t seed = 7) {
  std::vector<std::byte> p(kHeaderBytes + 8 * idx.size());
  PayloadHeader h;
  h.codec = codec;
  h.numel = n;
  h.count = idx.size();
  h.seed = seed;
  h.bodyBytes = 8 * idx.size();
  writeHeader(h, p);
  std::mt19937 rng(uint32_t(idx.size() + n));
  for (size_t i = 0; i < idx.size(); ++i) {
    storeLe<uint32_t>(p.data() + kHeaderBytes + 4 * i, idx[i]);
    storeLe<uint32_t>(p.data() + kHeaderBytes + 4 * idx.size() + 4 * i, uint32_t(rng()));
  }
  return p;
}

// k distinct indices of [0, n), ascending, with 0 and n - 1 among them.
std::vector<uint32_t> someIndices(uint64_t n, uint64_t k, uint32_t seed) {
  if (k >= n) {
    std::vector<uint32_t> all(n);
    for (uint64_t i = 0; i < n; ++i) all[i] = uint32_t(i);
    return all;
  }
  std::set<uint32_t> s{0, uint32_t(n - 1)};
  std::mt19937_64 rng(seed);
  while (s.size() < k) s.insert(uint32_t(rng() % n));
  return {s.begin(), s.end()};
}

// The compact size, by hand: 48 + 4k + the varint bytes of each gap.
size_t expectedCompactBytes(const std::vector<uint32_t>& idx) {
  size_t bytes = kHeaderBytes + 4 * idx.size();
  for (size_t i = 0; i < idx.size(); ++i) {
    uint64_t gap = i == 0 ? idx[0] : uint64_t(idx[i]) - idx[i - 1] - 1;
    bytes += gap < (1u << 7) ? 1 : gap < (1u << 14) ? 2 : gap < (1u << 21) ? 3 : gap < (1u << 28) ? 4 : 5;
  }
  return bytes;
}

std::vector<std::byte> compacted(const std::vector<std::byte>& plain) {
  std::vector<std::byte> c(compactBytes(plain));
  EXPECT_FALSE(c.empty());
  EXPECT_EQ(compactSparsePayload(plain, c), c.size());
  return c;
}

std::vector<std::byte> expanded(const std::vector<std::byte>& compact) {
  const PayloadHeader h = parseHeader(compact);
  std::vector<std::byte> p(expandedBytes(h));
  EXPECT_EQ(expandSparsePayload(compact, p), p.size());
  return p;
}

TEST(Compact, RoundTripsBitForBitFromOneInTenThousandToEveryElement) {
  const uint64_t n = 200000;
  for (double density : {0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0}) {
    SCOPED_TRACE(::testing::Message() << "density " << density);
    const auto idx = someIndices(n, std::max<uint64_t>(2, uint64_t(density * double(n))), 11);
    for (CodecId codec : {CodecId::kTopK, CodecId::kDgc}) {
      const auto plain = plainPayload(n, idx, codec);
      const size_t want = expectedCompactBytes(idx);
      ASSERT_EQ(compactBytes(plain), want);
      const auto c = compacted(plain);
      const PayloadHeader h = parseHeader(c);
      EXPECT_EQ(h.flags, kCompactIndicesFlag);
      EXPECT_EQ(h.codec, codec);
      EXPECT_EQ(h.count, idx.size());
      EXPECT_EQ(h.seed, 7u);
      EXPECT_TRUE(isCompact(h));
      ASSERT_EQ(expanded(c), plain);
    }
    // At 5% and denser nearly every gap takes one byte: about 5 bytes a kept
    // element against the plain form's 8; at 1% (gaps of 100 on average)
    // about a quarter take two.
    const double perElement = double(expectedCompactBytes(idx)) / double(idx.size());
    if (density >= 0.05) {
      EXPECT_LT(perElement, 5.05);
    } else if (density == 0.01) {
      EXPECT_LT(perElement, 5.4);
    }
  }
}

TEST(Compact, GapsOfEverySizeUpToTheLastU32Index) {
  // Gaps needing 1 to 5 bytes, the boundaries of each size, and indices 0
  // and 2^32 - 2 (the last of the largest tensor a payload may hold).
  const uint64_t n = format::kMaxSparseNumel;
  std::vector<uint32_t> idx = {0, 1, 129, 129 + (1u << 7) + 1, 200000, 200000 + (1u << 21) + 1,
                               (1u << 28), (1u << 28) + (1u << 28) + 1, 0xfffffffeu};
  ASSERT_TRUE(std::is_sorted(idx.begin(), idx.end()));
  const auto plain = plainPayload(n, idx);
  ASSERT_EQ(compactBytes(plain), expectedCompactBytes(idx));
  EXPECT_EQ(expanded(compacted(plain)), plain);
  // One index only: the first varint is the index itself, 5 bytes here.
  const auto last = plainPayload(n, {0xfffffffeu});
  EXPECT_EQ(compactBytes(last), kHeaderBytes + 4 + 5);
  EXPECT_EQ(expanded(compacted(last)), last);
  // Gaps over 2^21 on an 8M-element tensor.
  const auto wide = plainPayload(8u << 20, {0, 3u << 20, (8u << 20) - 1});
  EXPECT_EQ(compactBytes(wide), kHeaderBytes + 12 + 1 + 4 + 4);
  EXPECT_EQ(expanded(compacted(wide)), wide);
  // An empty list (a sparse sum with no nonzeros).
  const auto none = plainPayload(10, {});
  EXPECT_EQ(compactBytes(none), kHeaderBytes);
  EXPECT_EQ(expanded(compacted(none)), none);
}

TEST(Compact, RealCodecPayloadsDecodeTheSameAfterTheRoundTrip) {
  const size_t n = 50000;
  const auto x = randomTensor(n, 3);
  for (const char* spec : {"topk:ratio=0.05", "dgc:ratio=0.05", "topk:ratio=0.001"}) {
    SCOPED_TRACE(spec);
    auto codec = cpuRegistry().create(spec);
    const auto plain = encodeToVector(*codec, x);
    const auto c = compacted(plain);
    EXPECT_LT(c.size(), plain.size());
    EXPECT_EQ(expanded(c), plain);
    // A codec never reads the compact form: it says to expand it first.
    std::vector<float> out(n);
    expectProtocol([&] { codec->decode(c, out.data(), n); }, "expand it first");
  }
}

TEST(Compact, OnlyWellFormedPlainTopKAndDgcPayloadsCompact) {
  const uint64_t n = 1000;
  // Not ascending, a repeated index, an index past the tensor.
  EXPECT_EQ(compactBytes(plainPayload(n, {5, 3, 9})), 0u);
  EXPECT_EQ(compactBytes(plainPayload(n, {3, 3, 9})), 0u);
  EXPECT_EQ(compactBytes(plainPayload(n, {3, 9, 1000})), 0u);
  // Another codec, a flag already set, a body that is not 8 bytes an index.
  auto fp16 = encodeToVector(*cpuRegistry().create("fp16"), randomTensor(100, 1));
  EXPECT_EQ(compactBytes(fp16), 0u);
  auto flagged = plainPayload(n, {1, 2, 3});
  flagged[7] = std::byte{1};
  EXPECT_EQ(compactBytes(flagged), 0u);
  EXPECT_EQ(compactBytes(compacted(plainPayload(n, {1, 2, 3}))), 0u);  // already compact
  EXPECT_EQ(compactBytes(std::vector<std::byte>(20)), 0u);
  std::vector<std::byte> out(100);
  try {
    compactSparsePayload(plainPayload(n, {5, 3, 9}), out);
    ADD_FAILURE() << "a non-ascending payload was compacted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

// A compact payload with its body replaced by `body` and its header's count
// and body size set to match (`count`).
std::vector<std::byte> compactWith(uint64_t n, uint64_t count, const std::vector<uint8_t>& body,
                                   uint8_t flags = kCompactIndicesFlag,
                                   CodecId codec = CodecId::kTopK) {
  std::vector<std::byte> p(kHeaderBytes + body.size());
  PayloadHeader h;
  h.codec = codec;
  h.numel = n;
  h.count = count;
  h.flags = flags;
  h.bodyBytes = body.size();
  writeHeader(h, p);
  std::memcpy(p.data() + kHeaderBytes, body.data(), body.size());
  return p;
}

// Two indices: values (8 bytes of 1.0f), then the varints `gaps`.
std::vector<uint8_t> twoValues(const std::vector<uint8_t>& gaps) {
  std::vector<uint8_t> b = {0, 0, 0x80, 0x3f, 0, 0, 0x80, 0x3f};
  b.insert(b.end(), gaps.begin(), gaps.end());
  return b;
}

TEST(Compact, MalformedCompactPayloadsAreRefusedNamingTheProblemWritingNothing) {
  struct Case {
    std::vector<std::byte> payload;
    std::string words;
  };
  const uint64_t n = 1000;
  const std::vector<Case> cases = {
      {compactWith(n, 2, twoValues({3, 4})), ""},  // the good one: indices 3 and 8
      {compactWith(n, 2, twoValues({3, 0x84})), "gap #1 (byte 1 of the index list) is truncated"},
      {compactWith(n, 2, twoValues({3, 0x80, 0x00})), "overlong"},
      {compactWith(n, 2, twoValues({3, 0xff, 0xff, 0xff, 0xff, 0x7f})), "past 32 bits"},
      {compactWith(n, 2, twoValues({3, 0xe4, 0x07})), "index #1 is 1000, out of range for 1000"},
      // Gaps that add up past 2^32: never wraps to a small index.
      {compactWith(format::kMaxSparseNumel, 2, twoValues({0xfe, 0xff, 0xff, 0xff, 0x0f, 0x05})),
       "index #1 is 4294967300, out of range"},
      {compactWith(n, 2, twoValues({3, 4, 0})), "1 bytes left over"},
      {compactWith(n, 2, twoValues({3})), "truncated payload?"},  // 9 bytes: under 5 an index
      {compactWith(n, 3, twoValues({3, 4})), "the body has 10 bytes, 3 indices need 15 to 27"},
      {compactWith(2, 3, std::vector<uint8_t>(15)), "lists 3 indices of a 2-element tensor"},
      {compactWith(n, 2, twoValues({3, 4}), kCompactIndicesFlag | 1), "not a compact"},
      {compactWith(n, 2, twoValues({3, 4}), kCompactIndicesFlag, CodecId::kRandomK),
       "not a compact"},
      {compactWith(n, 2, twoValues({3, 4}), 0), "not a compact"},
      // Zeros are left out of the compact form (+0 and -0 alike): one listed
      // is no canonical form.
      {compactWith(n, 2, std::vector<uint8_t>{0, 0, 0x80, 0x3f, 0, 0, 0, 0, 3, 4}),
       "value #1 is zero"},
      {compactWith(n, 2, std::vector<uint8_t>{0, 0, 0, 0x80, 0, 0, 0x80, 0x3f, 3, 4}),
       "value #0 is zero"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.words);
    std::vector<std::byte> out(kHeaderBytes + 8 * 3, std::byte{0x5a});
    if (c.words.empty()) {
      ASSERT_EQ(expandSparsePayload(c.payload, out), kHeaderBytes + 16);
      EXPECT_EQ(loadLe<uint32_t>(out.data() + kHeaderBytes), 3u);
      EXPECT_EQ(loadLe<uint32_t>(out.data() + kHeaderBytes + 4), 8u);
      EXPECT_EQ(loadLe<float>(out.data() + kHeaderBytes + 12), 1.0f);
      continue;
    }
    expectProtocol([&] { expandSparsePayload(c.payload, out); }, c.words);
    for (std::byte b : out) ASSERT_EQ(b, std::byte{0x5a}) << "written before the error";
    // A run holding it is refused too, naming its position (where it claims
    // the compact form; else it is a plain payload for the codecs to refuse).
    const auto codec = uint8_t(c.payload[5]);
    if (!((codec == uint8_t(CodecId::kTopK) || codec == uint8_t(CodecId::kDgc)) &&
          (uint8_t(c.payload[7]) & kCompactIndicesFlag)))
      continue;
    std::vector<std::byte> run = plainPayload(n, {1, 2});
    run.insert(run.end(), c.payload.begin(), c.payload.end());
    std::vector<std::byte> scratch;
    expectProtocol([&] { expandRun(run, scratch); }, "payload #1");
  }
  // Cut anywhere, the good payload is refused (the header's body size no
  // longer matches, or the header itself is cut).
  const auto good = compactWith(n, 2, twoValues({3, 4}));
  for (size_t cut = 0; cut < good.size(); ++cut) {
    std::vector<std::byte> part(good.begin(), good.begin() + cut), out(200);
    EXPECT_THROW(expandSparsePayload(part, out), Error) << cut;
  }
}

TEST(Compact, RunsOfPayloadsCompactAndExpandEachPayload) {
  const uint64_t n = 100000;
  const auto a = plainPayload(n, someIndices(n, 5000, 1));
  const auto b = plainPayload(n, someIndices(n, 100, 2), CodecId::kDgc);
  // Gaps of 2^28 and more take 5 bytes: this one is larger compact, so it
  // stays plain in a compacted run.
  const auto big = plainPayload(format::kMaxSparseNumel, {(1u << 28) + 5, (2u << 28) + 9});
  ASSERT_GT(compactBytes(big), big.size());
  std::vector<std::byte> run;
  for (const auto* p : {&a, &b, &big, &a}) run.insert(run.end(), p->begin(), p->end());
  const size_t want = 2 * compactBytes(a) + compactBytes(b) + big.size();
  ASSERT_EQ(compactedRunBytes(run), want);
  std::vector<std::byte> c(want);
  ASSERT_EQ(compactRun(run, c), want);
  std::vector<std::byte> scratch;
  const auto back = expandRun(c, scratch);
  ASSERT_EQ(std::vector<std::byte>(back.begin(), back.end()), run);
  // A run with nothing compact comes back as itself, not copied.
  const auto same = expandRun(run, scratch);
  EXPECT_EQ(same.data(), run.data());
  EXPECT_EQ(same.size(), run.size());
  // Bytes that do not split into payloads are left as they are (for the
  // codecs' checks to refuse), and a compact payload cut short is named.
  std::vector<std::byte> junk(run.begin(), run.end() - 3);
  EXPECT_EQ(compactedRunBytes(junk), junk.size());
  std::vector<std::byte> cut(c.begin(), c.end() - 3);
  expectProtocol([&] { expandRun(cut, scratch); }, "compact payload #3 (byte");
}

}  // namespace
}  // namespace cortado::compressor
