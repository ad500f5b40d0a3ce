// Cost models: the alpha-beta formulas, codec specs and their errors, and the
// bundled data files.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "scheduler/planner/cost_model.h"
#include "scheduler/planner/profile.h"

namespace cortado::planner {
namespace {

using plan::CommOp;

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CostModel, NcclFormulas) {
  LinkCost l;
  l.base = AlphaBeta{2.0, 8.0};  // 1000 bytes per microsecond
  const double n = 8000;
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllreduce, 4, n), 2 * 3 * 2.0 + 2 * 0.75 * 8);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kReduceScatter, 4, n), 3 * 2.0 + 0.75 * 8);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAlltoall, 4, n), 3 * 2.0 + 0.75 * 8);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 4, n), 3 * (2.0 + 8));
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kBroadcast, 4, n), 2 * 2.0 + 8);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kBroadcast, 5, n), 3 * 2.0 + 8);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kGather, 4, n), 3 * 2.0 + 3 * 8);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kPush, 4, n), 2.0 + 0.75 * 8);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllreduce, 1, n), 0.0);
  l.perOp[CommOp::kAllgather] = AlphaBeta{0.0, 16.0};
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 4, n), 3 * 4.0);
}

TEST(CostModel, DefaultFilesLoad) {
  auto hw = HardwareModel::load(defaultDataDir() + "/costs/hardware.json");
  for (const char* name : {"nvlink", "pcie", "10gbit", "25gbit", "100gbit"}) EXPECT_NO_THROW(hw.link(name));
  EXPECT_NE(errorOf([&] { hw.link("infiniband"); }).find("valid: 100gbit, 10gbit"), std::string::npos);
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  EXPECT_GE(codecs.names().size(), 10u);
  for (const auto& m : bundledModels()) {
    auto p = loadModel(m, defaultDataDir());
    EXPECT_GT(p.tensors.size(), 5u) << m;
    EXPECT_GT(p.backwardUs(), 1000.0) << m;
  }
  EXPECT_EQ(loadModel("resnet50", defaultDataDir()).tensors.size(), 161u);
  EXPECT_EQ(loadModel("resnet101", defaultDataDir()).tensors.size(), 314u);
  EXPECT_NE(errorOf([] { loadModel("alexnet", defaultDataDir()); }).find("valid: vgg16, resnet50"),
            std::string::npos);
}

TEST(CostModel, CodecSpecs) {
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  auto dgc = codecs.resolve("dgc:ratio=0.001");
  EXPECT_DOUBLE_EQ(dgc.selectedFraction, 0.001);
  EXPECT_DOUBLE_EQ(dgc.payloadBytes(1e6), 16 + 1000 * 8);
  auto q = codecs.resolve("qsgd:levels=4");
  EXPECT_DOUBLE_EQ(q.cost.bitsPerElement, 1 + 3);  // sign + ceil(log2(5))
  EXPECT_DOUBLE_EQ(codecs.resolve("fp16").payloadBytes(1000), 16 + 2000);
  EXPECT_NE(errorOf([&] { codecs.resolve("zip"); }).find("unknown codec 'zip'"), std::string::npos);
  EXPECT_NE(errorOf([&] { codecs.resolve("zip"); }).find("dgc"), std::string::npos);
  EXPECT_NE(errorOf([&] { codecs.resolve("dgc:k=3"); }).find("(valid: ratio)"), std::string::npos);
  EXPECT_NE(errorOf([&] { codecs.resolve("dgc:ratio=abc"); }).find("not a number"), std::string::npos);
  EXPECT_NE(errorOf([&] { codecs.resolve("dgc:ratio=2"); }).find("(0, 1]"), std::string::npos);
  EXPECT_NE(errorOf([&] { codecs.resolve("fp16:ratio=0.1"); }).find("valid: none"), std::string::npos);
  auto z = dgc.zeroCost();
  EXPECT_EQ(z.encodeUs(plan::Device::kGpu, 1e6), 0.0);
  EXPECT_EQ(z.payloadBytes(1e6), dgc.payloadBytes(1e6));
}

TEST(CostModel, ReplacementFileIsUsed) {
  nlohmann::json j = {{"codecs",
                       {{"mine",
                         {{"payload", {{"bits_per_element", 4}}},
                          {"gpu", {{"encode", {{"fixed_us", 7}}}, {"decode", {{"fixed_us", 1}}}}},
                          {"cpu", {{"encode", {{"ns_per_element", 1000}}}, {"decode", nlohmann::json::object()}}}}}}}};
  auto m = CodecModel::fromJson(j);
  auto c = m.resolve("mine");
  EXPECT_DOUBLE_EQ(c.encodeUs(plan::Device::kGpu, 100), 7.0);
  EXPECT_DOUBLE_EQ(c.encodeUs(plan::Device::kCpu, 100), 100.0);
  EXPECT_DOUBLE_EQ(c.payloadBytes(100), 16 + 50);
  EXPECT_NE(errorOf([] { CodecModel::fromJson(nlohmann::json{{"codecs", {{"x", {}}}}}); })
                .find("malformed codec cost model"),
            std::string::npos);
}

}  // namespace
}  // namespace cortado::planner
