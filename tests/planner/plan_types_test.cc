// The plan data types: validation messages and the JSON round trip.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/plan/plan.h"

namespace cortado::plan {
namespace {

TensorOption flatDgc() {
  return TensorOption{false,
                      {Step::encode(Device::kGpu), Step::comm(Scope::kFlat, CommOp::kAllgather, true),
                       Step::decode(Device::kCpu)},
                      "dgc:ratio=0.01"};
}

TensorOption hierPs() {
  return TensorOption{true,
                      {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
                       Step::encode(Device::kCpu), Step::comm(Scope::kInter, CommOp::kPush, true),
                       Step::comm(Scope::kInter, CommOp::kPull, true), Step::decode(Device::kGpu),
                       Step::comm(Scope::kIntra, CommOp::kAllgather, false)},
                      "topk:ratio=0.001"};
}

std::string errorOf(const TensorOption& o) {
  try {
    validate(o, "fc.weight");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(PlanTypes, ValidOptionsPass) {
  EXPECT_NO_THROW(validate(flatDgc()));
  EXPECT_NO_THROW(validate(hierPs()));
  EXPECT_NO_THROW(validate(TensorOption{false, {Step::comm(Scope::kFlat, CommOp::kAllreduce, false)}, ""}));
  EXPECT_TRUE(hierPs().compressed());
  // Push raw, pull compressed: the servers encode, so it is compressed without a worker encode.
  TensorOption serverEncodes{true,
                             {Step::comm(Scope::kIntra, CommOp::kReduce, false),
                              Step::comm(Scope::kInter, CommOp::kPush, false),
                              Step::comm(Scope::kInter, CommOp::kPull, true),
                              Step::comm(Scope::kIntra, CommOp::kBroadcast, true),
                              Step::decode(Device::kGpu)},
                             "fp16"};
  EXPECT_NO_THROW(validate(serverEncodes));
  EXPECT_TRUE(serverEncodes.compressed());
}

TEST(PlanTypes, CompressedAllreduceIsRejectedWithAClearMessage) {
  TensorOption o{false,
                 {Step::encode(Device::kGpu), Step::comm(Scope::kFlat, CommOp::kAllreduce, true),
                  Step::decode(Device::kGpu)},
                 "dgc"};
  std::string msg = errorOf(o);
  EXPECT_NE(msg.find("fc.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot be summed by allreduce"), std::string::npos) << msg;
}

TEST(PlanTypes, StructuralErrors) {
  // Unpaired divisible step.
  EXPECT_NE(errorOf({false,
                     {Step::comm(Scope::kFlat, CommOp::kReduceScatter, false),
                      Step::comm(Scope::kFlat, CommOp::kBroadcast, false)},
                     ""})
                .find("reduce_scatter pairs with allgather"),
            std::string::npos);
  // Still compressed at the end.
  EXPECT_NE(errorOf({false, {Step::encode(Device::kGpu), Step::comm(Scope::kFlat, CommOp::kAllgather, true)}, "x"})
                .find("still compressed"),
            std::string::npos);
  // The step's compressed flag disagrees with the data.
  EXPECT_NE(errorOf({false, {Step::comm(Scope::kFlat, CommOp::kAllgather, true)}, "x"}).find("raw here"),
            std::string::npos);
  // Push outside the inter-machine stage.
  EXPECT_NE(errorOf({false,
                     {Step::comm(Scope::kFlat, CommOp::kPush, false),
                      Step::comm(Scope::kFlat, CommOp::kPull, false)},
                     ""})
                .find("inter-machine"),
            std::string::npos);
  // Hierarchical option whose first step is indivisible.
  EXPECT_NE(errorOf({true, {Step::comm(Scope::kIntra, CommOp::kAllreduce, false)}, ""}).find("divisible"),
            std::string::npos);
  // Codec missing, codec without compression.
  TensorOption noCodec = flatDgc();
  noCodec.codec.clear();
  EXPECT_NE(errorOf(noCodec).find("without a codec"), std::string::npos);
  EXPECT_NE(errorOf({false, {Step::comm(Scope::kFlat, CommOp::kAllreduce, false)}, "dgc"}).find("no step is compressed"),
            std::string::npos);
  EXPECT_NE(errorOf({false, {}, ""}).find("no steps"), std::string::npos);
}

TEST(PlanTypes, JsonRoundTrip) {
  Plan p;
  p.version = 7;
  p.tensors["fc.weight"] = hierPs();
  p.tensors["fc.bias"] = TensorOption{false, {Step::comm(Scope::kFlat, CommOp::kAllreduce, false)}, ""};
  p.tensors["conv1.weight"] = flatDgc();
  std::string text = toJsonString(p);
  Plan q = planFromJsonString(text);
  EXPECT_EQ(q.version, 7u);
  ASSERT_EQ(q.tensors.size(), 3u);
  for (const auto& [name, o] : p.tensors) EXPECT_EQ(q.tensors.at(name), o) << name;
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["tensors"]["fc.weight"]["steps"][2]["op"], "push");
  EXPECT_EQ(j["tensors"]["fc.weight"]["steps"][1]["device"], "cpu");
}

TEST(PlanTypes, MalformedJsonNamesTheProblem) {
  auto expectError = [](const std::string& text, const std::string& needle) {
    try {
      planFromJsonString(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expectError("{", "not valid JSON");
  expectError(R"({"format":"other","version":1,"tensors":{}})", "not a cortado plan");
  expectError(R"({"format":"cortado-plan","version":1,"tensors":{"w":{"scheme":"flat","steps":[{"op":"allsum","scope":"flat"}]}}})",
              "unknown operation 'allsum'");
  expectError(R"({"format":"cortado-plan","version":1,"tensors":{"w":{"scheme":"flat","codec":"dgc","steps":[{"op":"encode","device":"gpu"},{"op":"allreduce","scope":"flat","compressed":true},{"op":"decode","device":"gpu"}]}}})",
              "cannot be summed");
  expectError(R"({"format":"cortado-plan","version":1,"tensors":{"w":{"scheme":"ring","steps":[]}}})",
              "unknown scheme");
}

// Fused groups: carried through JSON, found by groupOf, and each way a group
// can be wrong refused naming the group and the tensor.
TEST(PlanTypes, GroupsRoundTripAndAreChecked) {
  Plan p;
  p.version = 3;
  for (const char* n : {"a", "b", "c", "d"}) p.tensors[n] = flatDgc();
  p.tensors["e"] = hierPs();
  p.groups = {{"a", "b", "c"}};
  EXPECT_NO_THROW(validate(p));
  Plan q = planFromJsonString(toJsonString(p));
  EXPECT_EQ(q.groups, p.groups);
  EXPECT_EQ(q.groupOf("b"), 0);
  EXPECT_EQ(q.groupOf("d"), -1);
  // A plan without groups has no "groups" key (older readers see no change).
  Plan none = p;
  none.groups.clear();
  EXPECT_FALSE(toJson(none).contains("groups"));

  auto errorOfPlan = [](const Plan& bad) -> std::string {
    try {
      validate(bad);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return e.what();
    }
    return "";
  };
  Plan bad = p;
  bad.groups = {{"a"}};
  EXPECT_NE(errorOfPlan(bad).find("two or more"), std::string::npos) << errorOfPlan(bad);
  bad.groups = {{"a", "zz"}};
  EXPECT_NE(errorOfPlan(bad).find("'zz'"), std::string::npos) << errorOfPlan(bad);
  bad.groups = {{"a", "b"}, {"c", "a"}};
  EXPECT_NE(errorOfPlan(bad).find("tensor 'a' is in plan group 0 and again in group 1"),
            std::string::npos)
      << errorOfPlan(bad);
  bad.groups = {{"d", "e"}};
  EXPECT_NE(errorOfPlan(bad).find("share one option"), std::string::npos) << errorOfPlan(bad);
  bad.tensors["d"].codec = "powersgd:rank=2";
  bad.tensors["c"].codec = "powersgd:rank=2";
  bad.groups = {{"c", "d"}};
  EXPECT_NE(errorOfPlan(bad).find("matrix shape"), std::string::npos) << errorOfPlan(bad);
  // The JSON reader checks groups too.
  nlohmann::json j = toJson(p);
  j["groups"] = {{"a", "nope"}};
  EXPECT_THROW(planFromJson(j), Error);
  j["groups"] = "a,b";
  EXPECT_THROW(planFromJson(j), Error);
}

}  // namespace
}  // namespace cortado::plan
