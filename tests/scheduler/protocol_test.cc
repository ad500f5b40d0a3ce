// Unit tests of the control plane's pieces: frame headers, the job-token
// proofs, and the scheduler's declaration table.
#include <gtest/gtest.h>

#include "core/control/auth.h"
#include "core/control/protocol.h"
#include "scheduler/declaration_table.h"

namespace cortado {
namespace {

using control::FrameHeader;
using control::TensorDecl;
using scheduler::DeclarationTable;
using Kind = DeclarationTable::Outcome::Kind;

TEST(ControlProtocol, HeaderRoundTripsAndIsChecked) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(control::MsgType::kDeclare);
  h.bodyLength = 1234;
  uint8_t buf[control::kFrameHeaderSize];
  control::encodeHeader(h, buf);
  EXPECT_EQ(buf[0], 0x43);  // big-endian magic "CTL1"
  auto back = control::decodeHeader(buf);
  EXPECT_EQ(back.magic, h.magic);
  EXPECT_EQ(back.type, h.type);
  EXPECT_EQ(back.bodyLength, 1234u);
  EXPECT_EQ(control::checkHeader(back, 2000), "");
  EXPECT_NE(control::checkHeader(back, 1000).find("over the limit of 1000"), std::string::npos);
  back.magic = 0;
  EXPECT_NE(control::checkHeader(back, 2000).find("bad magic"), std::string::npos);
}

TEST(ControlProtocol, FrameCarriesJson) {
  auto f = control::encodeFrame(control::MsgType::kBarrier, {{"name", "x"}, {"req", 7}});
  auto h = control::decodeHeader(reinterpret_cast<const uint8_t*>(f.data()));
  EXPECT_EQ(h.bodyLength, f.size() - control::kFrameHeaderSize);
  auto j = control::Json::parse(f.substr(control::kFrameHeaderSize));
  EXPECT_EQ(control::getUInt(j, "req"), 7u);
  EXPECT_THROW(control::getString(j, "req"), Error);
  EXPECT_THROW(control::getInt(j, "missing"), Error);
}

TEST(ControlAuth, ProofsDependOnTokenRoleAndNonces) {
  auto a = control::makeNonce(), b = control::makeNonce();
  EXPECT_EQ(a.size(), control::kNonceSize);
  EXPECT_NE(a, b);
  auto p = control::authProof("tok", control::Prover::kNode, a, b);
  EXPECT_EQ(p.size(), control::kProofSize);
  EXPECT_TRUE(control::proofMatches(p, control::authProof("tok", control::Prover::kNode, a, b)));
  EXPECT_FALSE(control::proofMatches(p, control::authProof("tok2", control::Prover::kNode, a, b)));
  EXPECT_FALSE(
      control::proofMatches(p, control::authProof("tok", control::Prover::kScheduler, a, b)));
  EXPECT_FALSE(control::proofMatches(p, control::authProof("tok", control::Prover::kNode, b, a)));
  EXPECT_FALSE(control::proofMatches(p, p.substr(1)));
  EXPECT_EQ(control::fromHex(control::toHex(a), control::kNonceSize), a);
  EXPECT_FALSE(control::fromHex("zz", 1).has_value());
  EXPECT_FALSE(control::fromHex("abcd", 1).has_value());
}

TEST(DeclarationTable, AgreesInWorkerZeroOrder) {
  DeclarationTable t(2);
  TensorDecl a{"a", DType::kFloat32, 10, ""}, b{"b", DType::kInt64, 5, "fp16"};
  // Worker 1 declares b then a; worker 0 declares a then b: keys follow worker 0.
  EXPECT_EQ(t.declare(1, b).kind, Kind::kPending);
  EXPECT_EQ(t.declare(0, a).kind, Kind::kPending);
  auto rb = t.declare(0, b);
  EXPECT_EQ(rb.kind, Kind::kAgreed);
  EXPECT_EQ(rb.key, 1u);
  auto ra = t.declare(1, a);
  EXPECT_EQ(ra.kind, Kind::kAgreed);
  EXPECT_EQ(ra.key, 0u);
  EXPECT_EQ(t.numAgreed(), 2u);
  EXPECT_EQ(t.declare(1, a).key, 0u);
  auto again = t.declare(1, TensorDecl{"a", DType::kFloat32, 11, ""});
  EXPECT_EQ(again.kind, Kind::kRejected);
  EXPECT_NE(again.status.message().find("x 10"), std::string::npos) << again.status.message();
  EXPECT_NE(again.status.message().find("x 11"), std::string::npos);
}

// A name declared again after its release is a new tensor: agreed on afresh,
// with the next key, in any shape; a mismatch names the declaration.
TEST(DeclarationTable, ANameDeclaredAfterItsReleaseIsANewTensor) {
  DeclarationTable t(2);
  TensorDecl a{"a", DType::kFloat32, 10, ""};
  EXPECT_EQ(t.declare(0, a).kind, Kind::kPending);
  EXPECT_EQ(t.declare(1, a).key, 0u);
  TensorDecl again{"a", DType::kFloat32, 7, "fp16"};
  again.incarnation = 1;
  EXPECT_EQ(t.declare(1, again).kind, Kind::kPending);
  auto r = t.declare(0, again);
  EXPECT_EQ(r.kind, Kind::kAgreed);
  EXPECT_EQ(r.key, 1u);
  EXPECT_EQ(t.numAgreed(), 2u);
  EXPECT_EQ(t.declare(0, a).key, 0u);  // the first declaration keeps its key
  TensorDecl third = again;
  third.incarnation = 2;
  EXPECT_EQ(t.declare(0, third).kind, Kind::kPending);
  third.numElements = 8;
  auto m = t.declare(1, third);
  ASSERT_EQ(m.kind, Kind::kMismatch);
  EXPECT_NE(m.status.message().find("tensor 'a' (declaration 3, after a release) (numElements differs)"),
            std::string::npos)
      << m.status.message();
}

TEST(DeclarationTable, MismatchNamesWorkersAndValues) {
  DeclarationTable t(3);
  EXPECT_EQ(t.declare(0, {"w", DType::kFloat32, 8, ""}).kind, Kind::kPending);
  EXPECT_EQ(t.declare(2, {"w", DType::kFloat32, 8, ""}).kind, Kind::kPending);
  auto m = t.declare(1, {"w", DType::kFloat16, 8, "onebit"});
  ASSERT_EQ(m.kind, Kind::kMismatch);
  EXPECT_EQ(m.status.code(), ErrorCode::kMismatch);
  const auto& s = m.status.message();
  EXPECT_NE(s.find("tensor 'w' (dtype, codec differ)"), std::string::npos) << s;
  EXPECT_NE(s.find("workers 0, 2 declared float32 x 8, codec none"), std::string::npos) << s;
  EXPECT_NE(s.find("worker 1 declared float16 x 8, codec 'onebit'"), std::string::npos) << s;
}

}  // namespace
}  // namespace cortado
