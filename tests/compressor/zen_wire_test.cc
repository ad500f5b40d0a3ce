// Zen's two answer forms (compressor/zen/zen_payload.h): the index-list
// answer's round trip (every varint length), the server's choice of the
// smaller form against sizes computed by hand, and the refusal of every
// malformed index list without writing anything or reading past its end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "compressor/zen/zen_hash.h"
#include "compressor/zen/zen_payload.h"
#include "compressor/zen/zen_sum.h"
#include "core/common/error.h"
#include "tests/compressor/expect_protocol.h"

namespace cortado::compressor::zen {
namespace {

using test::expectProtocol;

std::map<uint32_t, float> decoded(const std::vector<std::byte>& payload, const Ownership& own,
                                  uint32_t server, std::span<const uint32_t> list) {
  std::map<uint32_t, float> got;
  int64_t last = -1;
  decodeAnswer(payload, own, server, list, [&](uint32_t i, float v) {
    EXPECT_GT(int64_t(i), last);  // ascending
    last = i;
    got[i] = v;
  });
  return got;
}

TEST(ZenIndexList, VarintLengths) {
  EXPECT_EQ(varintBytes(0), 1u);
  EXPECT_EQ(varintBytes(127), 1u);
  EXPECT_EQ(varintBytes(128), 2u);
  EXPECT_EQ(varintBytes(16383), 2u);
  EXPECT_EQ(varintBytes(16384), 3u);
  EXPECT_EQ(varintBytes((1u << 21) - 1), 3u);
  EXPECT_EQ(varintBytes(1u << 21), 4u);
  EXPECT_EQ(varintBytes((1u << 28) - 1), 4u);
  EXPECT_EQ(varintBytes(1u << 28), 5u);
  EXPECT_EQ(varintBytes(0xffffffffu), 5u);
}

// Gaps of every varint length up to 4 bytes, the first and the last index,
// an empty answer; one server owns everything (S = 1) so the indices are
// free, and with S = 3 every owned index of a server.
TEST(ZenIndexList, RoundTrip) {
  const uint64_t n = (1u << 22) + 5;
  Ownership one(n, 1, 5);
  const uint64_t L = n;  // server 0 owns every index
  std::vector<uint32_t> idx{0, 1, 129, 130 + 16383, 130 + 16383 + 16385};
  idx.push_back(idx.back() + (1u << 21) + 1);  // a 4-byte gap
  idx.push_back(uint32_t(n - 1));
  std::vector<float> val;
  std::map<uint32_t, float> want;
  for (size_t i = 0; i < idx.size(); ++i) val.push_back(float(i) - 3.5f), want[idx[i]] = val[i];
  auto payload = encodeIndexList(one, 0, L, idx, val);
  // 48 header + 4 per value + gaps 0, 0, 127, 16383, 16384, 2^21, rest.
  const uint32_t lastGap = idx[6] - idx[5] - 1;
  EXPECT_EQ(payload.size(), 48 + 4 * 7 + 1 + 1 + 1 + 2 + 3 + 4 + varintBytes(lastGap));
  EXPECT_EQ(payload.size(), indexListBytes(idx));
  EXPECT_EQ(parseZenHeader(payload).kind, Kind::kIndexList);
  // The decoder reads the size of I_p only; a list of the right size will do.
  std::vector<uint32_t> list(L);
  EXPECT_EQ(decoded(payload, one, 0, list), want);
  // Empty.
  auto empty = encodeIndexList(one, 0, L, {}, {});
  EXPECT_EQ(empty.size(), kZenHeaderBytes);
  EXPECT_TRUE(decoded(empty, one, 0, list).empty());

  // Three servers: all, none, every third of each server's indices.
  Ownership three(1001, 3, 77);
  IndexLists lists(three);
  for (uint32_t p = 0; p < 3; ++p) {
    auto own = lists.of(p);
    for (int pattern = 0; pattern < 3; ++pattern) {
      std::vector<uint32_t> i3;
      std::vector<float> v3;
      std::map<uint32_t, float> w3;
      for (size_t t = 0; t < own.size(); ++t) {
        if (pattern == 0 || (pattern == 2 && t % 3)) continue;
        i3.push_back(own[t]), v3.push_back(float(t + 1)), w3[own[t]] = float(t + 1);
      }
      auto pl = encodeIndexList(three, p, own.size(), i3, v3);
      EXPECT_EQ(decoded(pl, three, p, own), w3) << "server " << p << " pattern " << pattern;
      std::vector<float> out(1001, 0.0f);
      decodeAnswerInto(pl, three, p, own, out.data());
      for (const auto& [i, v] : w3) EXPECT_EQ(out[i], v);
    }
  }
  // The encoder refuses what it cannot write.
  EXPECT_THROW(encodeIndexList(one, 0, L, std::vector<uint32_t>{5, 5}, std::vector<float>{1, 2}),
               Error);
  EXPECT_THROW(
      encodeIndexList(one, 0, L, std::vector<uint32_t>{uint32_t(n)}, std::vector<float>{1}), Error);
  EXPECT_THROW(encodeIndexList(one, 0, L, std::vector<uint32_t>{1}, std::vector<float>{}), Error);
}

// The server answers with whichever form is fewer bytes, the bitmap on a
// tie. With one server of n = 1000 indices, c non-zeros 8 apart (gaps of 7,
// and 0 before the first: 1 byte each) cost 48 + 4c + c as an index list
// and 48 + 125 + 4c as a bitmap: the list is smaller for c < 125, equal at
// c = 125.
TEST(ZenIndexList, TheServerSendsTheSmallerForm) {
  Ownership own(1000, 1, 3);
  ServerSum s(own, 0);
  auto answerFor = [&](size_t c, uint32_t stride) {
    std::vector<uint32_t> idx;
    for (size_t k = 0; k < c; ++k) idx.push_back(uint32_t(k * stride));
    s.add(encodeCoo(own, 0, idx, std::vector<float>(c, 2.0f)));
    auto a = s.answer();
    std::vector<float> out(1000, 0.0f);
    decodeAnswerInto(a, own, 0, s.list(), out.data());
    for (uint32_t i = 0; i < 1000; ++i)
      EXPECT_EQ(out[i], i % stride == 0 && i / stride < c ? 2.0f : 0.0f) << i;
    return a;
  };
  auto a124 = answerFor(124, 8);
  EXPECT_EQ(parseZenHeader(a124).kind, Kind::kIndexList);
  EXPECT_EQ(a124.size(), 48u + 5 * 124);  // 668; the bitmap: 669
  auto a125 = answerFor(125, 8);
  EXPECT_EQ(parseZenHeader(a125).kind, Kind::kBitmap);
  EXPECT_EQ(a125.size(), 48u + 125 + 4 * 125);  // 673, the index list too
  // Two-byte gaps: n = 100000, 500 non-zeros 200 apart: the list is
  // 48 + 2000 + 1 + 2 * 499 = 3047 bytes, the bitmap 48 + 12500 + 2000.
  Ownership big(100000, 1, 3);
  ServerSum sb(big, 0);
  std::vector<uint32_t> idx;
  for (uint32_t k = 0; k < 500; ++k) idx.push_back(k * 200);
  sb.add(encodeCoo(big, 0, idx, std::vector<float>(500, 1.0f)));
  auto a = sb.answer();
  EXPECT_EQ(parseZenHeader(a).kind, Kind::kIndexList);
  EXPECT_EQ(a.size(), 3047u);
  // Every element non-zero: the bitmap (48 + 125 + 4000 against 48 + 5000).
  std::vector<uint32_t> all(1000);
  for (uint32_t i = 0; i < 1000; ++i) all[i] = i;
  s.add(encodeCoo(own, 0, all, std::vector<float>(1000, 1.0f)));
  auto full = s.answer();
  EXPECT_EQ(parseZenHeader(full).kind, Kind::kBitmap);
  EXPECT_EQ(full.size(), 48u + 125 + 4000);
  // The forms can be forced.
  s.add(encodeCoo(own, 0, all, std::vector<float>(1000, 1.0f)));
  EXPECT_EQ(parseZenHeader(s.answer(ServerSum::Form::kIndexList)).kind, Kind::kIndexList);
}

// A hand-made index-list answer of server 0 of `own` with these varint
// bytes and `count` values of 1.
std::vector<std::byte> rawList(const Ownership& own, uint64_t listSize, uint64_t count,
                               std::vector<uint8_t> gaps, uint32_t server = 0) {
  auto p = encodeIndexList(own, server, listSize, {}, {});
  std::memcpy(p.data() + 32, &count, 8);
  for (uint64_t i = 0; i < count; ++i) {
    const float one = 1.0f;
    const auto* b = reinterpret_cast<const std::byte*>(&one);
    p.insert(p.end(), b, b + 4);
  }
  for (uint8_t g : gaps) p.push_back(std::byte{g});
  return p;
}

TEST(ZenIndexList, MalformedAnswersAreRefused) {
  const uint64_t n = 1000;
  Ownership one(n, 1, 5);
  std::vector<uint32_t> list(n);
  for (uint32_t i = 0; i < n; ++i) list[i] = i;
  std::vector<float> out(n, 0.0f);
  auto decode = [&](const std::vector<std::byte>& p) {
    decodeAnswerInto(p, one, 0, list, out.data());
  };
  // Well formed: indices 5 and 6.
  decode(rawList(one, n, 2, {5, 0}));
  EXPECT_EQ(out[5], 1.0f);
  EXPECT_EQ(out[6], 1.0f);
  std::fill(out.begin(), out.end(), 0.0f);
  // A varint cut at the payload's end (continuation bit on the last byte).
  expectProtocol([&] { decode(rawList(one, n, 2, {5, 0x85})); }, "truncated");
  // Overlong (0 in two bytes), more than 5 bytes, past 32 bits.
  expectProtocol([&] { decode(rawList(one, n, 1, {0x80, 0x00})); }, "overlong");
  expectProtocol(
      [&] {
        decode(rawList(one, n, 2, {0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0}));
      },
      "longer than 5 bytes");
  expectProtocol(
      [&] {
        decode(rawList(one, n, 1, {0xff, 0xff, 0xff, 0xff, 0x1f}));
      },
      "past 32 bits");
  // A gap past the tensor's end: 5, then 994 more (index 1000 of 1000).
  expectProtocol([&] { decode(rawList(one, n, 2, {5, 0xe2, 0x07})); }, "past the tensor's");
  // Bytes left over after the last gap.
  expectProtocol([&] { decode(rawList(one, n, 1, {5, 1})); }, "left over");
  // More non-zeros than the server owns, another list size than it owns.
  expectProtocol([&] { decode(rawList(one, 3, 4, {0, 0, 0, 0})); }, "non-zeros over 3 indices");
  expectProtocol([&] { decode(rawList(one, n - 1, 1, {5})); }, "but the server owns 1000");
  // A body too short or too long for its count (truncated values).
  expectProtocol([&] { decode(rawList(one, n, 3, {5, 0})); }, "body has");
  // An unknown kind.
  auto kind = rawList(one, n, 1, {5});
  kind[5] = std::byte{5};
  expectProtocol([&] { decode(kind); }, "unknown kind 5");
  // A COO payload (a push) where an answer belongs.
  expectProtocol([&] { decode(encodeCoo(one, 0, {}, {})); }, "expected a sparse answer");
  // An index that another server owns; another server's answer.
  Ownership two(n, 2, 5);
  IndexLists lists(two);
  const uint32_t other = lists.of(1)[0];
  ASSERT_LT(other, 128u);
  expectProtocol(
      [&] {
        decodeAnswerInto(rawList(two, lists.of(0).size(), 1, {uint8_t(other)}), two, 0, lists.of(0),
                         out.data());
      },
      "does not own");
  expectProtocol(
      [&] {
        decodeAnswerInto(rawList(two, lists.of(1).size(), 0, {}, 1), two, 0, lists.of(0),
                         out.data());
      },
      "expected server 0");
  // Nothing was written by any refused answer.
  EXPECT_EQ(std::count(out.begin(), out.end(), 0.0f), int64_t(n));
  // Every prefix of a good answer is refused (ASan in the fuzzer).
  std::vector<uint32_t> idx{0, 200, 999};
  auto good = encodeIndexList(one, 0, n, idx, std::vector<float>{1, 2, 3});
  for (size_t k = 0; k < good.size(); ++k) {
    std::vector<std::byte> cut(good.begin(), good.begin() + k);
    EXPECT_THROW(decode(cut), Error) << k;
  }
  EXPECT_EQ(std::count(out.begin(), out.end(), 0.0f), int64_t(n));
}

// The worker's assembly (assembleDense): every server's answer written
// into an output that held something else, in one pass of blocks, equals
// the plain sum (times the scale) with zeros elsewhere: tensors of one
// element, under, at and past a block (16384), and of several blocks;
// 1, 3 and 4 servers answering in mixed forms; 3 workers whose indices
// overlap or are disjoint, index 0 and the last index always among them.
TEST(ZenAssemble, OnePassEqualsThePlainSum) {
  for (uint64_t n : {1ull, 2ull, 16383ull, 16384ull, 16385ull, 3ull * 16384 + 7, 100003ull}) {
    for (uint32_t S : {1u, 3u, 4u}) {
      for (bool disjoint : {false, true}) {
        Ownership own(n, S, 11);
        IndexLists lists(own);
        std::vector<ServerSum> servers;
        for (uint32_t p = 0; p < S; ++p) servers.emplace_back(own, p);
        std::vector<float> ref(n, 0.0f);
        std::mt19937_64 rng(n * 31 + S + disjoint);
        for (int w = 0; w < 3; ++w) {
          std::set<uint32_t> pick{0, uint32_t(n - 1)};
          for (uint64_t k = 0; k < n / 50; ++k) pick.insert(uint32_t(rng() % n));
          std::vector<std::vector<uint32_t>> idx(S);
          std::vector<std::vector<float>> val(S);
          for (uint32_t i : pick) {
            if (disjoint && n > 2 && i != 0 && i != n - 1 && i % 3 != uint32_t(w)) continue;
            const auto p = own.owner(i);
            idx[p].push_back(i);
            val[p].push_back(float(int(rng() % 9) - 4));
            ref[i] += val[p].back();
          }
          for (uint32_t p = 0; p < S; ++p) servers[p].add(encodeCoo(own, p, idx[p], val[p]));
        }
        const ServerSum::Form forms[] = {ServerSum::Form::kSmaller, ServerSum::Form::kBitmap,
                                         ServerSum::Form::kIndexList};
        std::vector<std::vector<std::byte>> answers;
        std::vector<CheckedAnswer> checked(S);
        for (uint32_t p = 0; p < S; ++p) answers.push_back(servers[p].answer(forms[p % 3]));
        for (uint32_t p = 0; p < S; ++p) {
          checkAnswer(answers[p], own, p, lists.of(p), checked[p]);
          // The decoded indices are the decoder's, ascending.
          std::vector<uint32_t> want;
          decodeAnswer(answers[p], own, p, lists.of(p),
                       [&](uint32_t i, float) { want.push_back(i); });
          EXPECT_EQ(checked[p].index, want);
          EXPECT_EQ(checked[p].header.count, want.size());
        }
        const std::string what = fmt::format("n={} S={} disjoint={}", n, S, disjoint);
        std::vector<float> out(n + 1, 7.0f);
        out[n] = 9.0f;  // one past the tensor: never written
        assembleDense(checked, n, 1.0f, out.data());
        EXPECT_EQ(out[n], 9.0f);
        out.pop_back();
        EXPECT_EQ(out, ref) << what;
        EXPECT_EQ(out[0], ref[0]);
        EXPECT_EQ(out[n - 1], ref[n - 1]);
        // The average of 4 workers: a power of two, so exact. An output
        // that does not start on a cache line (a view at +1 float).
        std::vector<float> shifted(n + 1, 7.0f);
        assembleDense(checked, n, 0.25f, shifted.data() + 1);
        EXPECT_EQ(shifted[0], 7.0f);
        for (uint64_t i = 0; i < n; ++i)
          ASSERT_EQ(shifted[i + 1], ref[i] * 0.25f) << what << " i=" << i;
        // A round with no pushes: zeros everywhere.
        answers.clear();
        for (uint32_t p = 0; p < S; ++p) answers.push_back(servers[p].answer(forms[p % 3]));
        for (uint32_t p = 0; p < S; ++p) checkAnswer(answers[p], own, p, lists.of(p), checked[p]);
        std::fill(out.begin(), out.end(), 7.0f);
        assembleDense(checked, n, 1.0f, out.data());
        EXPECT_EQ(std::count(out.begin(), out.end(), 0.0f), int64_t(n)) << what;
      }
    }
  }
}

// checkAnswer refuses what decodeAnswer refuses (the same checks), and the
// assembly refuses answers that checkAnswer did not fill (indices that do
// not ascend or lie past the tensor, a count that differs) with
// kInvalidArgument, without writing outside the output.
TEST(ZenAssemble, RefusesWhatWasNotChecked) {
  const uint64_t n = 40000;
  Ownership one(n, 1, 5);
  IndexLists lists(one);
  CheckedAnswer c;
  checkAnswer(rawList(one, n, 2, {5, 0}), one, 0, lists.of(0), c);
  EXPECT_EQ(c.index, (std::vector<uint32_t>{5, 6}));
  expectProtocol(
      [&] {
        checkAnswer(rawList(one, n, 2, {5, 0x85}), one, 0, lists.of(0), c);
      },
      "truncated");
  expectProtocol(
      [&] {
        checkAnswer(rawList(one, n, 2, {0xb6, 0xb8, 0x02, 100}), one, 0, lists.of(0), c);
      },
      "past the tensor's");
  std::vector<uint64_t> bits((n + 63) / 64, 0);
  bits[0] = 1;
  auto bm = encodeBitmap(one, 0, lists.of(0), bits, std::vector<float>{2.0f});
  bm[kZenHeaderBytes] = std::byte{0x0f};
  expectProtocol([&] { checkAnswer(bm, one, 0, lists.of(0), c); }, "4 bits set but 1 values");
  Ownership two(n, 2, 5);
  IndexLists lists2(two);
  expectProtocol(
      [&] {
        checkAnswer(encodeIndexList(two, 1, lists2.of(1).size(), {}, {}), two, 0, lists2.of(0), c);
      },
      "expected server 0");
  expectProtocol([&] { checkAnswer(encodeCoo(one, 0, {}, {}), one, 0, lists.of(0), c); },
                 "expected a sparse answer");
  auto good = encodeIndexList(one, 0, n, std::vector<uint32_t>{0, 200, uint32_t(n - 1)},
                              std::vector<float>{1, 2, 3});
  for (size_t k = 0; k < good.size(); ++k) {
    std::vector<std::byte> cut(good.begin(), good.begin() + k);
    EXPECT_THROW(checkAnswer(cut, one, 0, lists.of(0), c), Error) << k;
  }

  // Hand-made answers the assembly refuses; the output has a guard element
  // on each side.
  const float vals[3] = {1, 2, 3};
  auto made = [&](std::vector<uint32_t> idx, uint64_t count) {
    CheckedAnswer a;
    a.header.count = count;
    a.index = std::move(idx);
    a.values = reinterpret_cast<const std::byte*>(vals);
    return a;
  };
  std::vector<float> out(n + 2, 5.0f);
  auto refused = [&](CheckedAnswer a, const std::string& words) {
    std::vector<CheckedAnswer> v{std::move(a)};
    try {
      assembleDense(v, n, 1.0f, out.data() + 1);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    EXPECT_EQ(out[0], 5.0f);
    EXPECT_EQ(out[n + 1], 5.0f);
  };
  refused(made({0, 20000, 3}, 3), "do not ascend");
  refused(made({0, 5, uint32_t(n)}, 3), "past the tensor's");
  refused(made({0, 5}, 3), "not filled by checkAnswer");
  CheckedAnswer noValues = made({7}, 1);
  noValues.values = nullptr;
  refused(noValues, "not filled by checkAnswer");
  // Well made: written, the guards untouched.
  std::vector<CheckedAnswer> ok{made({0, 5, uint32_t(n - 1)}, 3)};
  assembleDense(ok, n, 1.0f, out.data() + 1);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[6], 2.0f);
  EXPECT_EQ(out[n], 3.0f);
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_EQ(out[n + 1], 5.0f);
  EXPECT_EQ(std::count(out.begin(), out.end(), 0.0f), int64_t(n - 3));
}

// A delta-coded push of `count` pairs of value 1 with the raw gap bytes
// `gaps` (well formed or not) for server `server`.
std::vector<std::byte> rawDelta(const Ownership& own, uint64_t count, std::vector<uint8_t> gaps,
                                uint32_t server) {
  auto p = encodeDeltaPush(own, server, {}, {});
  std::memcpy(p.data() + 32, &count, 8);
  for (uint64_t i = 0; i < count; ++i) {
    const float one = 1.0f;
    const auto* b = reinterpret_cast<const std::byte*>(&one);
    p.insert(p.end(), b, b + 4);
  }
  for (uint8_t g : gaps) p.push_back(std::byte{g});
  return p;
}

// The delta-coded push's layout and size, and when a worker sends it: only
// where asked, the indices strictly ascend and it is smaller than COO.
TEST(ZenDeltaPush, BytesAndForm) {
  const uint64_t n = 1ull << 31;
  Ownership one(n, 1, 5);
  // Gaps of 1, 2, 3 and 4 bytes: 0, 200 - 0 - 1, ...
  std::vector<uint32_t> idx{0, 200, 200 + 20000, 200 + 20000 + 3000000};
  std::vector<float> val{1, -2, 3, -4};
  const size_t want = kZenHeaderBytes + 4 * 4 + (1 + 2 + 3 + 4);
  EXPECT_EQ(deltaPushBytes(idx), want);
  EXPECT_EQ(pushBytes(idx, PushForm::kDelta), want);
  EXPECT_EQ(pushBytes(idx, PushForm::kCoo), cooBytes(4));
  EXPECT_EQ(cooBytes(4), kZenHeaderBytes + 32);
  EXPECT_EQ(choosePushForm(idx, true), PushForm::kDelta);
  EXPECT_EQ(choosePushForm(idx, false), PushForm::kCoo);
  auto p = encodeDeltaPush(one, 0, idx, val);
  ASSERT_EQ(p.size(), want);
  EXPECT_EQ(p[5], std::byte{4});  // kind
  const DeltaView v = parseDeltaPush(p);
  EXPECT_EQ(v.header.count, 4u);
  EXPECT_EQ(v.header.listSize, 0u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(v.valueAt(i), val[i]);
  const std::vector<uint8_t> gaps(v.gaps, v.end);
  // Gaps 0, 199, 19999, 2999999 as LEB128.
  EXPECT_EQ(gaps,
            (std::vector<uint8_t>{0x00, 0xc7, 0x01, 0x9f, 0x9c, 0x01, 0xbf, 0x8d, 0xb7, 0x01}));
  // Not ascending, or repeating: COO, and writing it delta-coded is refused.
  std::vector<uint32_t> down{200, 0}, twice{5, 5};
  EXPECT_EQ(choosePushForm(down, true), PushForm::kCoo);
  EXPECT_EQ(choosePushForm(twice, true), PushForm::kCoo);
  std::vector<std::byte> buf(100);
  EXPECT_THROW(writePush(one, 0, down, {val.data(), 2}, PushForm::kDelta, buf), Error);
  EXPECT_THROW(writePush(one, 0, twice, {val.data(), 2}, PushForm::kDelta, buf), Error);
  // Gaps of 2^28 or more take 5 bytes, more than an index: COO is smaller.
  std::vector<uint32_t> far{1u << 28, (1u << 29) + 1, (1u << 30) + 2};
  EXPECT_GT(deltaPushBytes(far), cooBytes(3));
  EXPECT_EQ(choosePushForm(far, true), PushForm::kCoo);
  // Empty: the header alone either way (COO, the plain form, on a tie).
  EXPECT_EQ(choosePushForm({}, true), PushForm::kCoo);
  EXPECT_EQ(deltaPushBytes({}), kZenHeaderBytes);
  // The server reads it: one server owning everything sums it as given.
  const Ownership small(1u << 16, 1, 5);
  ServerSum s(small, 0);
  s.add(encodeDeltaPush(small, 0, std::vector<uint32_t>{0, 200, 20200}, {val.data(), 3}));
  s.add(encodeCoo(small, 0, std::vector<uint32_t>{20200, 7}, std::vector<float>{10, 1}));
  std::map<uint32_t, float> got = decoded(s.answer(), small, 0, s.list());
  EXPECT_EQ(got, (std::map<uint32_t, float>{{0, 1}, {7, 1}, {200, -2}, {20200, 13}}));
}

// Malformed delta-coded pushes: refused with what is wrong, nothing added,
// never read past the end. (A repeat cannot be written: each gap moves past
// the previous index.)
TEST(ZenDeltaPush, MalformedPushesAreRefusedAndLeaveTheSum) {
  const uint64_t n = 5000;
  Ownership own(n, 3, 8);
  ServerSum s(own, 2);
  auto list = s.list();
  ASSERT_GT(list.size(), 10u);
  std::vector<uint32_t> good{list[0], list[5], list[9]};
  std::vector<float> vals{1, 2, 3};
  s.add(encodeDeltaPush(own, 2, good, vals));
  // Indices of the push {list[1], bad} as a gap list.
  auto withIndex = [&](uint32_t bad) {
    std::vector<uint8_t> gaps;
    auto put = [&](uint32_t v) {
      std::byte b[5];
      const std::byte* e = writeVarint(b, v);
      for (const std::byte* q = b; q != e; ++q) gaps.push_back(uint8_t(*q));
    };
    put(list[1]);
    put(bad - list[1] - 1);
    return rawDelta(own, 2, gaps, 2);
  };
  uint32_t notMine = list[1] + 1;
  while (own.owner(notMine) == 2) ++notMine;
  expectProtocol([&] { s.add(withIndex(uint32_t(n))); }, "index 5000, out of range");
  expectProtocol([&] { s.add(withIndex(notMine)); }, "does not own");
  // Varints: cut at the end, overlong, longer than 5 bytes, past 32 bits.
  ASSERT_LT(list[0], 128u);  // one byte
  expectProtocol([&] { s.add(rawDelta(own, 2, {uint8_t(list[0]), 0x85}, 2)); }, "truncated");
  expectProtocol([&] { s.add(rawDelta(own, 1, {0x80, 0x00}, 2)); }, "overlong");
  expectProtocol(
      [&] {
        s.add(rawDelta(own, 2, {0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0}, 2));
      },
      "longer than 5 bytes");
  expectProtocol(
      [&] {
        s.add(rawDelta(own, 1, {0xff, 0xff, 0xff, 0xff, 0x1f}, 2));
      },
      "past 32 bits");
  // A gap of 2^32 - 1 after an index: past the tensor, no wrap-around.
  expectProtocol(
      [&] {
        s.add(rawDelta(own, 2, {uint8_t(list[0]), 0xff, 0xff, 0xff, 0xff, 0x0f}, 2));
      },
      "out of range");
  // Trailing bytes after the last gap.
  {
    auto p = encodeDeltaPush(own, 2, good, vals);
    p.push_back(std::byte{0});
    expectProtocol([&] { s.add(p); }, "left over");
  }
  // The header: a list size, a count the body cannot hold, another server.
  {
    auto p = encodeDeltaPush(own, 2, good, vals);
    p[40] = std::byte{1};
    expectProtocol([&] { s.add(p); }, "list size");
    auto q = encodeDeltaPush(own, 2, good, vals);
    q[32] = std::byte{0xff}, q[39] = std::byte{0x7f};
    expectProtocol([&] { s.add(q); }, "pairs for 5000 elements");
    q = encodeDeltaPush(own, 2, good, vals);
    q[32] = std::byte{100};
    expectProtocol([&] { s.add(q); }, "truncated push");
    expectProtocol([&] { s.add(encodeDeltaPush(own, 1, {}, {})); }, "expected server 2");
    expectProtocol([&] { s.add(encodeDeltaPush(Ownership(n, 3, 9), 2, {}, {})); }, "seed");
  }
  // Every prefix of a good push: refused, never read past (ASan in the fuzzer).
  const auto whole = encodeDeltaPush(own, 2, good, vals);
  for (size_t k = 0; k < whole.size(); ++k) {
    std::vector<std::byte> cut(whole.begin(), whole.begin() + std::ptrdiff_t(k));
    EXPECT_THROW(s.add(cut), Error) << k;
  }
  // A delta-coded push is not an answer.
  IndexLists lists(own);
  CheckedAnswer c;
  expectProtocol([&] { checkAnswer(whole, own, 2, lists.of(2), c); }, "expected a sparse answer");
  // The sum is the first push's alone.
  EXPECT_EQ(decoded(s.answer(), own, 2, list),
            (std::map<uint32_t, float>{{list[0], 1}, {list[5], 2}, {list[9], 3}}));
  // And the densified sum too: a push over more than an eighth of I_p.
  std::vector<uint32_t> many(list.begin(), list.begin() + ptrdiff_t(list.size() / 4));
  s.add(encodeDeltaPush(own, 2, many, std::vector<float>(many.size(), 1.0f)));
  ASSERT_TRUE(s.densified());
  expectProtocol([&] { s.add(withIndex(notMine)); }, "does not own");
  s.add(encodeCoo(own, 2, many, std::vector<float>(many.size(), 2.0f)));
  std::map<uint32_t, float> want;
  for (uint32_t i : many) want[i] = 3;
  EXPECT_EQ(decoded(s.answer(), own, 2, list), want);
}

}  // namespace
}  // namespace cortado::compressor::zen
