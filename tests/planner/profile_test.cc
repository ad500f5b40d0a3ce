// Model profiles read from JSON: a valid one round-trips, and every malformed
// one is refused naming the tensor, the field and what it must be.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/common/error.h"
#include "scheduler/planner/profile.h"

namespace cortado::planner {
namespace {

using nlohmann::json;

json valid() {
  return json::parse(R"({"format": "cortado-profile", "model": "m", "forward_us": 10.5,
      "tensors": [{"name": "a", "elements": 100, "dtype_bytes": 2, "backward_us": 3.5},
                  {"name": "b", "elements": 7, "backward_us": 0}]})");
}

std::string refusal(const json& j) {
  try {
    ModelProfile::fromJson(j);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << j.dump();
  return "";
}

TEST(ModelProfile, ValidProfileRoundTrips) {
  const ModelProfile p = ModelProfile::fromJson(valid());
  EXPECT_EQ(p.model, "m");
  EXPECT_DOUBLE_EQ(p.forwardUs, 10.5);
  ASSERT_EQ(p.tensors.size(), 2u);
  EXPECT_EQ(p.tensors[0].dtypeBytes, 2);
  EXPECT_EQ(p.tensors[1].dtypeBytes, 4);  // the default
  EXPECT_DOUBLE_EQ(p.backwardUs(), 3.5);
  EXPECT_DOUBLE_EQ(p.totalBytes(), 100 * 2 + 7 * 4);
  EXPECT_TRUE(p.contiguousGradients);  // the default
  const ModelProfile q = ModelProfile::fromJson(p.toJson());
  EXPECT_EQ(q.toJson(), p.toJson());
  json apart = valid();
  apart["contiguous_gradients"] = false;
  const ModelProfile r = ModelProfile::fromJson(apart);
  EXPECT_FALSE(r.contiguousGradients);
  EXPECT_FALSE(ModelProfile::fromJson(r.toJson()).contiguousGradients);
}

TEST(ModelProfile, MalformedProfilesNameTheTensorAndTheField) {
  struct Case {
    std::string what;
    std::function<void(json&)> spoil;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"not a profile", [](json& j) { j["format"] = "other"; }, {"not a cortado profile"}},
      {"an array", [](json& j) { j = json::array(); }, {"not a cortado profile"}},
      {"no model", [](json& j) { j.erase("model"); }, {"field \"model\" is missing", "a string"}},
      {"model a number", [](json& j) { j["model"] = 5; }, {"field \"model\" is number", "a string"}},
      {"forward negative", [](json& j) { j["forward_us"] = -1; }, {"profile 'm'", "forward_us"}},
      {"contiguous a string", [](json& j) { j["contiguous_gradients"] = "yes"; },
       {"profile 'm'", "\"contiguous_gradients\" is string", "true or false"}},
      {"no tensors", [](json& j) { j.erase("tensors"); },
       {"profile 'm'", "\"tensors\" is missing", "an array"}},
      {"tensors an object", [](json& j) { j["tensors"] = json::object(); },
       {"\"tensors\" is object"}},
      {"empty tensors", [](json& j) { j["tensors"] = json::array(); }, {"profile 'm' has no tensors"}},
      {"tensor not an object", [](json& j) { j["tensors"][1] = 3; },
       {"profile 'm', tensor 1 is number"}},
      {"no name", [](json& j) { j["tensors"][0].erase("name"); },
       {"profile 'm', tensor 0", "field \"name\" is missing"}},
      {"no backward", [](json& j) { j["tensors"][1].erase("backward_us"); },
       {"profile 'm', tensor 1 ('b')", "field \"backward_us\" is missing", "microseconds"}},
      {"elements a string", [](json& j) { j["tensors"][1]["elements"] = "7"; },
       {"tensor 1 ('b')", "field \"elements\" is string (\"7\")", "an integer > 0"}},
      {"elements fractional", [](json& j) { j["tensors"][0]["elements"] = 1.5; },
       {"tensor 0 ('a')", "field \"elements\" is number (1.5)"}},
      {"elements negative", [](json& j) { j["tensors"][0]["elements"] = -5; },
       {"tensor 0 ('a')", "elements (-5)", "must be > 0"}},
      {"dtype_bytes zero", [](json& j) { j["tensors"][0]["dtype_bytes"] = 0; },
       {"tensor 0 ('a')", "dtype_bytes (0)"}},
      {"backward negative", [](json& j) { j["tensors"][1]["backward_us"] = -2; },
       {"tensor 1 ('b')", "backward_us (-2)"}},
  };
  for (const auto& c : cases) {
    json j = valid();
    c.spoil(j);
    const std::string msg = refusal(j);
    for (const auto& w : c.want) EXPECT_NE(msg.find(w), std::string::npos) << c.what << ": " << msg;
  }
}

TEST(ModelProfile, FileErrorsNameTheFile) {
  const std::string path = fmt::format("{}/profile_{}.json", testing::TempDir(), getpid());
  {
    std::ofstream(path) << R"({"format": "cortado-profile", "tensors": [])";
  }
  try {
    ModelProfile::load(path);
    ADD_FAILURE() << "a truncated file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("profile '" + path + "' is not valid JSON"),
              std::string::npos)
        << e.what();
  }
  {
    json j = valid();
    j["tensors"][0].erase("elements");
    std::ofstream(path) << j.dump();
  }
  try {
    ModelProfile::load(path);
    ADD_FAILURE() << "a tensor without elements was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": profile 'm', tensor 0 ('a'): field \"elements\" is missing", 0), 0u)
        << msg;
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cortado::planner
