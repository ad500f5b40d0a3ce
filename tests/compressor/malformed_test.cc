// Decoders reject every malformed payload with kProtocol, never write the
// output when they do, and never read past the end (run under ASan by the
// fuzz target; here: truncations, extensions, field corruptions, mutations).
#include <gtest/gtest.h>

#include <random>

#include "compressor/payload.h"
#include "test_util.h"

namespace cortado::compressor {
namespace {

using testing::cpuRegistry;
using testing::encodeToVector;
using testing::randomTensor;

const std::vector<std::string> kSpecs = {"fp16",     "bf16",     "onebit",        "signsgd",
                                         "efsignsgd", "topk:ratio=0.1", "dgc:ratio=0.1",
                                         "randomk:ratio=0.1", "qsgd:levels=1", "qsgd:levels=7",
                                         "qsgd:levels=100", "terngrad", "natural",
                                         "powersgd:rank=2"};
constexpr size_t kN = 100;

// validate()'s error code (kOk: none).
ErrorCode validateError(const Codec& c, std::span<const std::byte> p, size_t n) {
  try {
    c.validate(p, n);
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kOk;
}

// Returns the error code, checking that `sum` was left untouched, and that
// validate() refuses exactly the payloads that decompressAdd() refuses.
ErrorCode decodeError(const Codec& c, std::span<const std::byte> p, size_t n = kN) {
  std::vector<float> sum(n, 3.0f);
  ErrorCode validated = validateError(c, p, n), decoded = ErrorCode::kOk;
  try {
    c.decompressAdd(p, sum.data(), n);
  } catch (const Error& e) {
    for (float v : sum) EXPECT_EQ(v, 3.0f) << "output written before the error: " << e.what();
    decoded = e.code();
  }
  EXPECT_EQ(validated, decoded) << "validate() and decompressAdd() disagree on a " << p.size()
                                << "-byte " << c.spec() << " payload";
  return decoded;
}

class Malformed : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    codec_ = cpuRegistry().create(GetParam());
    EncodeContext ctx;
    ctx.rows = codec_->id() == CodecId::kPowerSgd ? 10 : 0;
    payload_ = encodeToVector(*codec_, randomTensor(kN, 1), ctx);
    ASSERT_EQ(decodeError(*codec_, payload_), ErrorCode::kOk);
  }
  CodecPtr codec_;
  std::vector<std::byte> payload_;
};

TEST_P(Malformed, EveryTruncationAndExtension) {
  for (size_t len = 0; len < payload_.size(); ++len) {
    // A fresh heap copy of exactly len bytes, so ASan would see an overread.
    std::vector<std::byte> cut(payload_.begin(), payload_.begin() + len);
    ASSERT_EQ(decodeError(*codec_, cut), ErrorCode::kProtocol) << len;
  }
  auto longer = payload_;
  longer.push_back(std::byte{0});
  EXPECT_EQ(decodeError(*codec_, longer), ErrorCode::kProtocol);
}

TEST_P(Malformed, HeaderFields) {
  auto corrupt = [&](size_t off, std::byte v) {
    auto p = payload_;
    p[off] = v;
    return decodeError(*codec_, p);
  };
  EXPECT_EQ(corrupt(0, std::byte{'X'}), ErrorCode::kProtocol);       // magic
  EXPECT_EQ(corrupt(4, std::byte{2}), ErrorCode::kProtocol);         // version
  EXPECT_EQ(corrupt(5, std::byte{0}), ErrorCode::kProtocol);         // codec id
  EXPECT_EQ(corrupt(5, std::byte{kMaxCodecId + 1}), ErrorCode::kProtocol);
  EXPECT_EQ(corrupt(6, std::byte{99}), ErrorCode::kProtocol);        // dtype
  EXPECT_EQ(corrupt(7, std::byte{0x80}), ErrorCode::kProtocol);      // flags
  EXPECT_EQ(corrupt(44, std::byte{1}), ErrorCode::kProtocol);        // reserved
  EXPECT_EQ(corrupt(16, std::byte{0xff}), ErrorCode::kProtocol);     // body size
  EXPECT_EQ(corrupt(15, std::byte{0x80}), ErrorCode::kProtocol);     // huge numel
  // The tensor's element count disagrees with the header.
  EXPECT_EQ(decodeError(*codec_, payload_, kN + 1), ErrorCode::kProtocol);
  EXPECT_EQ(decodeError(*codec_, payload_, kN - 1), ErrorCode::kProtocol);
}

TEST_P(Malformed, RandomMutationsNeverCrash) {
  std::mt19937 rng(1);
  int accepted = 0;
  for (int t = 0; t < 3000; ++t) {
    auto p = payload_;
    int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) p[rng() % p.size()] ^= std::byte(1u << (rng() % 8));
    ErrorCode c = decodeError(*codec_, p);
    ASSERT_TRUE(c == ErrorCode::kOk || c == ErrorCode::kProtocol);
    accepted += c == ErrorCode::kOk;
  }
  SUCCEED() << accepted << " mutations decoded as valid payloads";
}

INSTANTIATE_TEST_SUITE_P(Cpu, Malformed, ::testing::ValuesIn(kSpecs), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
});

TEST(MalformedBody, WrongCodecForTheTensor) {
  auto fp16 = cpuRegistry().create("fp16"), bf16 = cpuRegistry().create("bf16");
  auto p = encodeToVector(*fp16, randomTensor(kN, 1));
  EXPECT_EQ(decodeError(*bf16, p), ErrorCode::kProtocol);
}

TEST(MalformedBody, TopKIndexOutOfRange) {
  auto c = cpuRegistry().create("topk:ratio=0.1");
  auto p = encodeToVector(*c, randomTensor(kN, 1));
  for (uint32_t bad : {uint32_t{kN}, uint32_t{kN + 5}, 0xffffffffu}) {
    auto q = p;
    storeLe<uint32_t>(q.data() + kHeaderBytes + 4 * 9, bad);  // the last index
    EXPECT_EQ(decodeError(*c, q), ErrorCode::kProtocol);
    std::vector<float> buf(kN, 1.0f);
    EXPECT_THROW(c->zeroSent(q, buf.data(), kN), Error);
  }
}

TEST(MalformedBody, TopKCountAboveNumel) {
  auto c = cpuRegistry().create("topk:ratio=1");
  auto p = encodeToVector(*c, randomTensor(kN, 1));
  PayloadHeader h = parseHeader(p);
  h.count = kN + 1;
  h.bodyBytes = 8 * h.count;
  p.resize(kHeaderBytes + h.bodyBytes);
  writeHeader(h, p);
  EXPECT_EQ(decodeError(*c, p), ErrorCode::kProtocol);
}

TEST(MalformedBody, InvalidCodes) {
  auto x = randomTensor(kN, 1);
  {
    auto c = cpuRegistry().create("terngrad");
    auto p = encodeToVector(*c, x);
    p[kHeaderBytes + 4 + 3] = std::byte{0x0c};  // code 3
    EXPECT_EQ(decodeError(*c, p), ErrorCode::kProtocol);
  }
  {
    auto c = cpuRegistry().create("qsgd:levels=5");
    auto p = encodeToVector(*c, x);
    p[kHeaderBytes + 4] = std::byte{0x07};  // level 7 > 5
    EXPECT_EQ(decodeError(*c, p), ErrorCode::kProtocol);
    PayloadHeader h = parseHeader(p);
    h.param = 0;  // zero levels
    writeHeader(h, p);
    EXPECT_EQ(decodeError(*c, p), ErrorCode::kProtocol);
  }
  {
    auto c = cpuRegistry().create("onebit");
    std::vector<float> odd(kN + 3, 1.0f);
    auto p = encodeToVector(*c, odd);
    p.back() |= std::byte{0x80};  // a padding bit
    EXPECT_EQ(decodeError(*c, p, kN + 3), ErrorCode::kProtocol);
  }
  {
    auto c = cpuRegistry().create("natural");
    auto p = encodeToVector(*c, x);
    p[kHeaderBytes + 2] = std::byte{0x80};  // negative zero
    EXPECT_EQ(decodeError(*c, p), ErrorCode::kProtocol);
    PayloadHeader h = parseHeader(p);
    h.param = 1000;  // exponent out of range
    writeHeader(h, p);
    EXPECT_EQ(decodeError(*c, p), ErrorCode::kProtocol);
  }
  {
    auto c = cpuRegistry().create("powersgd:rank=2");
    EncodeContext ctx;
    ctx.rows = 10;
    auto p = encodeToVector(*c, x, ctx);
    PayloadHeader h = parseHeader(p);
    h.param = 7;  // 100 is not a multiple of 7
    writeHeader(h, p);
    EXPECT_EQ(decodeError(*c, p), ErrorCode::kProtocol);
  }
}

TEST(MalformedBody, RandomKDifferentSeedsNotAddable) {
  auto c = cpuRegistry().create("randomk:ratio=0.1");
  auto p = encodeToVector(*c, randomTensor(kN, 1));
  auto q = p;
  q[24] ^= std::byte{1};  // seed
  try {
    c->addPayload(p, q);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol);
  }
}

}  // namespace
}  // namespace cortado::compressor

namespace cortado::compressor {
namespace {

// Found by the fuzzer: numel 2^63 + 16 made fp16's 2 * numel body size wrap
// to 32 bytes, and addPayload (which takes n from the header) then ran off
// the end. Headers now cap numel at kMaxNumel.
TEST(MalformedBody, HugeNumelCannotWrapTheBodySize) {
  auto c = cpuRegistry().create("fp16");
  PayloadHeader h;
  h.codec = CodecId::kFp16;
  h.numel = (uint64_t{1} << 63) + 16;
  h.bodyBytes = 32;
  std::vector<std::byte> p(kHeaderBytes + 32);
  writeHeader(h, p);
  auto q = p;
  try {
    c->addPayload(p, q);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol);
    EXPECT_NE(std::string(e.what()).find("more than the limit"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cortado::compressor
