// The data-plane wire format: round trips, and every malformed header
// rejected with a reason.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/wire/data_message.h"

namespace cortado::wire {
namespace {

DataHeader sample() {
  DataHeader h;
  h.op = Op::kPush;
  h.dtype = DType::kFloat16;
  h.flags = kFlagAsync;
  h.requestId = 77;
  h.key = (uint64_t(5) << 20) | 3;
  h.round = 12;
  h.numElements = 1000;
  h.bodyBytes = 2000;
  return h;
}

TEST(Wire, RoundTrip) {
  DataHeader h = sample();
  Buffer b = encodeHeader(h);
  ASSERT_EQ(b.size(), kHeaderBytes);
  DataHeader g = decodeHeader(b, 2000);
  EXPECT_EQ(g.op, h.op);
  EXPECT_EQ(g.dtype, h.dtype);
  EXPECT_EQ(g.flags, h.flags);
  EXPECT_EQ(g.requestId, h.requestId);
  EXPECT_EQ(g.key, h.key);
  EXPECT_EQ(g.round, h.round);
  EXPECT_EQ(g.numElements, h.numElements);
  EXPECT_EQ(g.bodyBytes, h.bodyBytes);
}

void expectRejected(const Buffer& b, size_t body, const std::string& needle) {
  try {
    decodeHeader(b, body);
    FAIL() << "accepted a bad header (" << needle << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Wire, RejectsMalformedHeaders) {
  Buffer good = encodeHeader(sample());
  expectRejected(good.slice(0, 47), 2000, "header is 47 bytes");
  auto corrupt = [&](size_t off, uint8_t v) {
    Buffer b = Buffer::copyOf(good.data(), good.size());
    b.data()[off] = v;
    return b;
  };
  expectRejected(corrupt(0, 0), 2000, "magic");
  expectRejected(corrupt(4, 9), 2000, "version");
  expectRejected(corrupt(5, 42), 2000, "op");
  expectRejected(corrupt(6, 99), 2000, "dtype");
  // Every flag bit has a meaning; kFlagAck only on a PUSH that carries bytes.
  DataHeader ack = sample();
  ack.flags = wire::kFlagAck;
  EXPECT_EQ(decodeHeader(encodeHeader(ack), 2000).flags, wire::kFlagAck);
  ack.op = Op::kPullResponse;
  expectRejected(encodeHeader(ack), 2000, "flags 0x80");
  ack.op = Op::kPush;
  ack.flags = wire::kFlagAck | wire::kFlagShm;
  ack.bodyBytes = kShmDescriptorBytes;
  expectRejected(encodeHeader(ack), kShmDescriptorBytes, "acknowledgement");
  expectRejected(good, 1999, "promises a 2000-byte body");
  // Element count that does not match the body (and one that would overflow).
  DataHeader h = sample();
  h.numElements = 1001;
  expectRejected(encodeHeader(h), 2000, "need 2002 bytes");
  h.numElements = (uint64_t(1) << 63) + 1000;
  expectRejected(encodeHeader(h), 2000, "elements");
  // A release carries no body; op 7 is beyond the known ones.
  DataHeader rel = sample();
  rel.op = Op::kRelease;
  rel.bodyBytes = 0;
  EXPECT_EQ(decodeHeader(encodeHeader(rel), 0).op, Op::kRelease);
  rel.bodyBytes = 16;
  expectRejected(encodeHeader(rel), 16, "RELEASE for key");
  expectRejected(corrupt(5, 7), 2000, "unknown op 7");
}

TEST(Wire, FuzzedHeadersNeverCrash) {
  // Random bytes: either a clean rejection or a header consistent with the body.
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 200000; ++i) {
    Buffer b = encodeHeader(sample());
    for (int k = 0; k < 3; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b.data()[x % kHeaderBytes] = uint8_t(x >> 32);
    }
    size_t body = (x >> 40) % 4096;
    try {
      DataHeader h = decodeHeader(b, body);
      EXPECT_EQ(h.bodyBytes, body);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kProtocol);
    }
  }
}

TEST(Wire, CompressedPushPreambleRoundTripsAndRejectsEveryTruncation) {
  const std::string spec = "topk:ratio=0.01", name = "layer1.weight";
  const size_t pre = compressedPreambleBytes(spec, name);
  EXPECT_EQ(pre, 4 + spec.size() + name.size());
  std::vector<uint8_t> body(pre + 10);
  writeCompressedPreamble(body.data(), spec, name);
  for (size_t i = 0; i < 10; ++i) body[pre + i] = uint8_t(i);
  CompressedPush p = parseCompressedPush(body.data(), body.size());
  EXPECT_EQ(p.codecSpec, spec);
  EXPECT_EQ(p.tensorName, name);
  EXPECT_EQ(p.payload, body.data() + pre);
  EXPECT_EQ(p.payloadBytes, 10u);
  // Every cut inside the preamble is refused; from its end on, the rest is
  // the (possibly empty) payload, which the codec checks.
  for (size_t len = 0; len < body.size(); ++len) {
    if (len < pre) {
      try {
        parseCompressedPush(body.data(), len);
        ADD_FAILURE() << "a " << len << "-byte body was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kProtocol) << e.what();
      }
    } else {
      EXPECT_EQ(parseCompressedPush(body.data(), len).payloadBytes, len - pre);
    }
  }
  // An empty spec and an oversized one are refused on both sides.
  std::vector<uint8_t> bad(body);
  bad[0] = bad[1] = 0;
  EXPECT_THROW(parseCompressedPush(bad.data(), bad.size()), Error);
  EXPECT_THROW(compressedPreambleBytes("", name), Error);
  EXPECT_THROW(compressedPreambleBytes(std::string(kMaxCodecSpecBytes + 1, 'x'), name), Error);
  EXPECT_THROW(compressedPreambleBytes(spec, std::string(70000, 'n')), Error);
}

TEST(Wire, CompressedMessagesSkipTheDenseSizeCheckButBoundTheElementCount) {
  DataHeader h;
  h.op = Op::kPush;
  h.flags = kFlagCompressed;
  h.numElements = 1000;
  h.bodyBytes = 77;  // a payload, not 4000 dense bytes
  EXPECT_EQ(decodeHeader(encodeHeader(h), 77).numElements, 1000u);
  h.numElements = (uint64_t(1) << 40) + 1;
  EXPECT_THROW(decodeHeader(encodeHeader(h), 77), Error);
}

}  // namespace
}  // namespace cortado::wire
