#include <gtest/gtest.h>
#include <stdlib.h>

#include "core/common/dtype.h"
#include "core/common/env.h"
#include "core/common/error.h"
#include "core/common/node.h"

namespace cortado {
namespace {

TEST(Env, FirstSetNameWinsAndAliasesWork) {
  unsetenv("CORTADO_TEST_A");
  setenv("DMLC_TEST_A", "5", 1);
  auto v = getEnvInt({"CORTADO_TEST_A", "DMLC_TEST_A"});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, 5);
  setenv("CORTADO_TEST_A", "6", 1);
  EXPECT_EQ(*getEnvInt({"CORTADO_TEST_A", "DMLC_TEST_A"}), 6);
  unsetenv("CORTADO_TEST_A");
  unsetenv("DMLC_TEST_A");
  EXPECT_FALSE(getEnvInt({"CORTADO_TEST_A"}).has_value());
}

TEST(Env, BadValuesNameTheVariable) {
  setenv("CORTADO_TEST_B", "12abc", 1);
  try {
    getEnvInt({"CORTADO_TEST_B"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CORTADO_TEST_B"), std::string::npos);
  }
  setenv("CORTADO_TEST_B", "maybe", 1);
  EXPECT_THROW(getEnvBool({"CORTADO_TEST_B"}), Error);
  unsetenv("CORTADO_TEST_B");
}

TEST(Env, ParseBytes) {
  EXPECT_EQ(parseBytes("4096"), 4096u);
  EXPECT_EQ(parseBytes("4K"), 4096u);
  EXPECT_EQ(parseBytes("64MiB"), 64u << 20);
  EXPECT_EQ(parseBytes("1g"), 1u << 30);
  EXPECT_THROW(parseBytes("4X"), Error);
  EXPECT_THROW(parseBytes("lots"), Error);
}

TEST(DType, ParseAndErrors) {
  EXPECT_EQ(parseDType("fp16"), DType::kFloat16);
  EXPECT_EQ(parseDType("bfloat16"), DType::kBFloat16);
  try {
    parseDType("float8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid are"), std::string::npos);
  }
}

TEST(NodeId, WireFormRoundTrips) {
  for (auto role : {Role::kScheduler, Role::kServer, Role::kWorker}) {
    NodeId id{role, 17};
    auto back = NodeId::fromWire(id.toWire());
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, id);
  }
  EXPECT_FALSE(NodeId::fromWire("x1").has_value());
  EXPECT_FALSE(NodeId::fromWire("w").has_value());
  EXPECT_FALSE(NodeId::fromWire("w-1").has_value());
  EXPECT_FALSE(NodeId::fromWire("w1z").has_value());
}

}  // namespace
}  // namespace cortado
