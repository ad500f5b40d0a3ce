// Cost models: the alpha-beta formulas, codec specs and their errors, and the
// bundled data files.
#include <gtest/gtest.h>

#include <fstream>

#include <array>
#include <cstdint>
#include <vector>
#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "tests/common/error_of.h"
#include "scheduler/planner/cost_model.h"
#include "scheduler/planner/profile.h"

namespace cortado::planner {
namespace {

using plan::CommOp;

using test::errorOf;

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

TEST(CostModel, MeasuredCurvesReplaceTheFormulaForTheirGroupSize) {
  MeasuredCurve c;
  c.p = 4;
  c.add(100, 50);
  c.add(1100, 150);
  c.add(2100, 140);   // noise below the last point: raised to it (150)
  c.add(2100, 650);   // the same size again: averaged in ((150 + 650) / 2)
  c.add(4100, 600);
  ASSERT_EQ(c.points.size(), 4u);
  EXPECT_DOUBLE_EQ(c.us(10), 50.0);      // below the smallest size: its time
  EXPECT_DOUBLE_EQ(c.us(600), 100.0);    // halfway between 100 and 1100
  EXPECT_DOUBLE_EQ(c.us(2100), 400.0);
  EXPECT_DOUBLE_EQ(c.us(6100), 800.0);   // beyond: the last slope, 0.1 us per byte
  MeasuredCurve d;
  d.add(100, 50);
  d.add(200, 80);
  d.add(200, 10);     // the mean (45) would fall below the point before: 50
  EXPECT_DOUBLE_EQ(d.us(200), 50.0);

  LinkCost l;
  l.base = AlphaBeta{2.0, 8.0};
  l.curves[CommOp::kAllgather] = c;
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 4, 600), 100.0);
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 3, 8000), 2 * (2.0 + 8));  // other size: formula
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kReduceScatter, 4, 8000), 3 * 2.0 + 0.75 * 8);
  // Compressed steps: their own curve, else their own alpha-beta, else the raw curve.
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 4, 600, true), 100.0);
  l.perOpCompressed[CommOp::kAllgather] = AlphaBeta{5.0, 8.0};
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 4, 8000, true), 3 * (5.0 + 8));
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 4, 600, false), 100.0);
  MeasuredCurve z;
  z.p = 4;
  z.add(0, 7);
  l.curvesCompressed[CommOp::kAllgather] = z;
  EXPECT_DOUBLE_EQ(commTimeUs(l, CommOp::kAllgather, 4, 8000, true), 7.0);
}

// The isotonic curve against its min-max formula: the fitted value at i is
// max over j <= i of min over k >= i of the weighted mean of points j..k
// (Barlow et al.), computed here by brute force.
TEST(CostModel, MonotoneCurveIsTheWeightedIsotonicRegression) {
  auto reference = [](const std::vector<std::array<double, 3>>& xyw) {
    const size_t n = xyw.size();
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
      double best = -1e300;
      for (size_t j = 0; j <= i; ++j) {
        double lowest = 1e300;
        for (size_t k = i; k < n; ++k) {
          double sw = 0, swy = 0;
          for (size_t m = j; m <= k; ++m) sw += xyw[m][2], swy += xyw[m][2] * xyw[m][1];
          lowest = std::min(lowest, swy / sw);
        }
        best = std::max(best, lowest);
      }
      out[i] = best;
    }
    return out;
  };
  // One slow size among its neighbours (the case that the running maximum
  // of `add` made the floor of every larger size): pooled with the next
  // ones while their mean is above the one after ((2500 + 640) / 2 > 700).
  const std::vector<std::array<double, 3>> spike = {
      {64, 600, 9}, {256, 620, 9}, {1024, 2500, 9}, {4096, 640, 9}, {16384, 700, 9}, {65536, 1500, 5}};
  const MeasuredCurve c = MeasuredCurve::monotone(spike, 4);
  ASSERT_EQ(c.points.size(), spike.size());
  EXPECT_EQ(c.p, 4);
  for (int i : {2, 3, 4}) EXPECT_DOUBLE_EQ(c.points[size_t(i)].second, (2500.0 + 640.0 + 700.0) / 3);
  EXPECT_DOUBLE_EQ(c.points[5].second, 1500.0);
  // Random instances, weights and ties included.
  uint64_t seed = 12345;
  auto next = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return double((seed >> 33) % 1000);
  };
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::array<double, 3>> xyw;
    const size_t n = 1 + size_t(next()) % 9;
    for (size_t i = 0; i < n; ++i) xyw.push_back({double(100 * (i + 1)), next(), 1 + double(int(next()) % 5)});
    const auto want = reference(xyw);
    const MeasuredCurve got = MeasuredCurve::monotone(xyw, 2);
    ASSERT_EQ(got.points.size(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(got.points[i].first, xyw[i][0]);
      EXPECT_NEAR(got.points[i].second, want[i], 1e-9 * (1 + want[i])) << "trial " << trial << " point " << i;
    }
  }
}

TEST(CostModel, MeasuredCodecCurvesReplaceTheLinearCostsPerDevice) {
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  ResolvedCodec c = codecs.resolve("dgc:ratio=0.01");
  const double lineEnc = c.encodeUs(plan::Device::kCpu, 3000);
  const double lineDec = c.decodeUs(plan::Device::kGpu, 3000, 4);
  MeasuredCurve enc;  // per call, by elements
  enc.add(1000, 20);
  enc.add(5000, 60);
  c.encodeCurve[int(plan::Device::kCpu)] = enc;
  c.decodeCurve[int(plan::Device::kCpu)] = enc;
  EXPECT_DOUBLE_EQ(c.encodeUs(plan::Device::kCpu, 3000), 40.0);   // halfway between the points
  EXPECT_DOUBLE_EQ(c.encodeUs(plan::Device::kCpu, 9000), 100.0);  // the last slope beyond
  EXPECT_DOUBLE_EQ(c.decodeUs(plan::Device::kCpu, 3000, 4), 4 * 40.0);  // one call per payload
  // The other device keeps its linear costs; zeroCost() clears the curves too.
  EXPECT_DOUBLE_EQ(c.encodeUs(plan::Device::kGpu, 3000), codecs.resolve("dgc:ratio=0.01").encodeUs(plan::Device::kGpu, 3000));
  EXPECT_DOUBLE_EQ(c.decodeUs(plan::Device::kGpu, 3000, 4), lineDec);
  EXPECT_NE(lineEnc, 40.0);
  EXPECT_DOUBLE_EQ(c.zeroCost().encodeUs(plan::Device::kCpu, 3000), 0.0);
  EXPECT_DOUBLE_EQ(c.zeroCost().decodeUs(plan::Device::kCpu, 3000, 4), 0.0);
  // The first payload priced apart (decodeFirstCurve, here 3x the further
  // ones): 120 us for the first, 40 for each further one; a share of one
  // payload at the first's rate.
  MeasuredCurve first;
  first.add(1000, 60);
  first.add(5000, 180);
  c.decodeFirstCurve[int(plan::Device::kCpu)] = first;
  EXPECT_DOUBLE_EQ(c.decodeUs(plan::Device::kCpu, 3000, 1), 120.0);
  EXPECT_DOUBLE_EQ(c.decodeUs(plan::Device::kCpu, 3000, 4), 120.0 + 3 * 40.0);
  EXPECT_DOUBLE_EQ(c.decodeUs(plan::Device::kCpu, 3000, 2.5), 120.0 + 1.5 * 40.0);
  EXPECT_DOUBLE_EQ(c.decodeUs(plan::Device::kCpu, 3000, 0.5), 60.0);
  EXPECT_DOUBLE_EQ(c.decodeUs(plan::Device::kGpu, 3000, 4), lineDec);  // the other device's own
  EXPECT_DOUBLE_EQ(c.zeroCost().decodeUs(plan::Device::kCpu, 3000, 1), 0.0);
  // One of 4 calls of one payload each into one region: a quarter of
  // (120 + 3 x 40); of 2 payloads each: a quarter of (120 + 7 x 40).
  EXPECT_DOUBLE_EQ(c.decodeShareUs(plan::Device::kCpu, 3000, 1, 4), 60.0);
  EXPECT_DOUBLE_EQ(c.decodeShareUs(plan::Device::kCpu, 3000, 2, 4), 100.0);
  // Without the first payload's curve each call is priced whole: with the
  // one curve, 40 per payload; with linear costs, one call's fixed cost each.
  ResolvedCodec one = c;
  one.decodeFirstCurve[int(plan::Device::kCpu)] = {};
  EXPECT_DOUBLE_EQ(one.decodeShareUs(plan::Device::kCpu, 3000, 1, 4), 40.0);
  EXPECT_DOUBLE_EQ(one.decodeShareUs(plan::Device::kCpu, 3000, 2, 4), 80.0);
  EXPECT_DOUBLE_EQ(c.decodeShareUs(plan::Device::kGpu, 3000, 1, 4),
                   c.decodeUs(plan::Device::kGpu, 3000, 1));
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

namespace cortado::planner {
namespace {

// The layout `cortado_codec_bench --export_costs` writes (bench/codec/cost_export.cc).
nlohmann::json measuredExport(double threads) {
  auto entry = [](const char* codec, const char* op, double alpha, double beta) {
    return nlohmann::json{{"codec", codec}, {"device", "cpu"}, {"op", op}, {"alpha", alpha},
                          {"beta", beta}, {"points", nlohmann::json::array()}};
  };
  return {{"schema", "cortado.codec_costs.v1"},
          {"date", "2026-11-21"},
          {"machine", "Linux test, 2 cores"},
          {"threads", threads},
          {"model", "seconds = alpha + beta * input_bytes"},
          {"entries",
           {entry("dgc:ratio=0.001", "encode", 4e-6, 1e-9),
            entry("dgc:ratio=0.001", "decode", 1e-6, 2e-10),
            entry("dgc:ratio=0.001", "decompress_add", 2e-6, 5e-10),
            entry("efsignsgd", "encode", 3e-6, 2.5e-10)}}};
}

TEST(CostModel, MeasuredFitsFromTheCodecBenchmark) {
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  const auto defaults = codecs.resolve("dgc:ratio=0.001");
  codecs.applyMeasured(measuredExport(1), "costs.json");
  // Exactly the measured spec: encode = 4 us + 1e-9 s/B * 4 B * n; decode is
  // the decode-and-sum fit (decompress_add), per contribution.
  auto m = codecs.resolve("dgc:ratio=0.001");
  EXPECT_NEAR(m.encodeUs(plan::Device::kCpu, 1e6), 4.0 + 4000.0, 1e-9);
  EXPECT_NEAR(m.decodeUs(plan::Device::kCpu, 1e6, 1), 2.0 + 2000.0, 1e-9);
  EXPECT_NEAR(m.decodeUs(plan::Device::kCpu, 1e6, 3), 2.0 + 3 * 2000.0, 1e-9);
  EXPECT_NE(m.costSource.find("measured (costs.json"), std::string::npos) << m.costSource;
  EXPECT_NE(m.costSource.find("2026-11-21"), std::string::npos);
  // GPU terms and payload sizes stay the table's.
  EXPECT_DOUBLE_EQ(m.encodeUs(plan::Device::kGpu, 1e6), defaults.encodeUs(plan::Device::kGpu, 1e6));
  EXPECT_DOUBLE_EQ(m.payloadBytes(1e6), defaults.payloadBytes(1e6));
  // Another ratio was not measured: the table's terms.
  auto other = codecs.resolve("dgc:ratio=0.01");
  EXPECT_EQ(other.costSource, "defaults");
  EXPECT_DOUBLE_EQ(other.encodeUs(plan::Device::kCpu, 1e6),
                   CodecModel::load(defaultDataDir() + "/costs/codecs.json")
                       .resolve("dgc:ratio=0.01")
                       .encodeUs(plan::Device::kCpu, 1e6));
  // A codec measured with encode only keeps the table's decode.
  auto ef = codecs.resolve("efsignsgd");
  EXPECT_NEAR(ef.encodeUs(plan::Device::kCpu, 1e6), 3.0 + 1000.0, 1e-9);
  EXPECT_DOUBLE_EQ(ef.decodeUs(plan::Device::kCpu, 1e6, 1),
                   CodecModel::load(defaultDataDir() + "/costs/codecs.json")
                       .resolve("efsignsgd")
                       .decodeUs(plan::Device::kCpu, 1e6, 1));
}

TEST(CostModel, MeasuredFitsWithThreadsAreScaledToOneCore) {
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  codecs.applyMeasured(measuredExport(4), "costs.json");
  auto m = codecs.resolve("dgc:ratio=0.001");
  EXPECT_NEAR(m.encodeUs(plan::Device::kCpu, 1e6), 4.0 + 4 * 4000.0, 1e-9);
  EXPECT_NE(m.costSource.find("scaled to one core"), std::string::npos);
}

// The H100's fits that cortado_cuda_codec_bench exported (bundled with the
// planner's data): every GPU fit loads, and the planner's GPU costs follow the
// measured points (the raw medians, not the fit's own terms), each within
// 2.5x: one line through 8 sizes, and top-k's curve bends where its sampled
// threshold starts (n > 262144).
TEST(CostModel, BundledGpuFitsFollowTheirMeasuredPoints) {
  const std::string file = defaultDataDir() + "/costs/h100_gpu_codecs.json";
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  codecs.loadInto(file);
  std::ifstream in(file);
  ASSERT_TRUE(in) << file;
  const nlohmann::json doc = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& e : doc.at("entries")) {
    ASSERT_EQ(e.at("device"), "gpu");
    EXPECT_GE(e.at("alpha").get<double>(), 0.0) << e.at("codec");
    EXPECT_GE(e.at("beta").get<double>(), 0.0) << e.at("codec");
    const std::string op = e.at("op");
    if (op == "decode") continue;  // the planner's decode is decompress_add
    // The spec as a user writes it: the table's parameters only (DGC's
    // sample and momentum are the codec's defaults, which the fit matched).
    std::string spec = e.at("codec").get<std::string>();
    const std::string name = spec.substr(0, spec.find(':'));
    for (const char* param : {"ratio=", "levels="})
      if (auto at = spec.find(param); at != std::string::npos)
        spec = name + ":" + spec.substr(at, spec.find(',', at) - at);
    auto r = codecs.resolve(spec);
    EXPECT_NE(r.costSource.find("h100_gpu_codecs.json"), std::string::npos) << r.costSource;
    for (const auto& pt : e.at("points")) {
      const double n = pt.at("elements").get<double>(), measuredUs = pt.at("seconds").get<double>() * 1e6;
      const double modelUs = op == "encode" ? r.encodeUs(plan::Device::kGpu, n) : r.decodeUs(plan::Device::kGpu, n, 1);
      EXPECT_LT(modelUs, 2.5 * measuredUs) << spec << " " << op << " at " << n;
      EXPECT_GT(modelUs, measuredUs / 2.5) << spec << " " << op << " at " << n;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10 * 2 * 8);  // 10 codecs, encode and decompress_add, 8 sizes
}

// `cortado plan --codec-costs cpu.json --codec-costs gpu.json`: each file's
// device is applied, the other's terms kept, and both are named.
TEST(CostModel, CpuAndGpuFitsFromTwoFilesCombine) {
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  codecs.applyMeasured(measuredExport(1), "cpu.json");
  nlohmann::json gpu = measuredExport(1);
  gpu["machine"] = "NVIDIA test GPU";
  gpu["entries"] = {{{"codec", "dgc:ratio=0.001"}, {"device", "gpu"}, {"op", "encode"}, {"alpha", 1e-4},
                     {"beta", 1e-12}, {"points", nlohmann::json::array()}}};
  codecs.applyMeasured(gpu, "gpu.json");
  auto m = codecs.resolve("dgc:ratio=0.001");
  EXPECT_NEAR(m.encodeUs(plan::Device::kCpu, 1e6), 4.0 + 4000.0, 1e-9);   // cpu.json
  EXPECT_NEAR(m.encodeUs(plan::Device::kGpu, 1e6), 100.0 + 4.0, 1e-9);    // gpu.json
  EXPECT_NE(m.costSource.find("cpu.json"), std::string::npos) << m.costSource;
  EXPECT_NE(m.costSource.find("gpu.json"), std::string::npos) << m.costSource;
}

TEST(CostModel, MeasuredFitsErrors) {
  auto codecs = CodecModel::load(defaultDataDir() + "/costs/codecs.json");
  auto bad = measuredExport(1);
  bad["entries"][0]["codec"] = "zip:ratio=0.1";
  EXPECT_NE(errorOf([&] { codecs.applyMeasured(bad, "f.json"); }).find("codec 'zip' is not in the cost table"),
            std::string::npos);
  bad = measuredExport(1);
  bad["entries"][1].erase("beta");
  EXPECT_NE(errorOf([&] { codecs.applyMeasured(bad, "f.json"); }).find("malformed measured codec costs 'f.json'"),
            std::string::npos);
  bad = measuredExport(1);
  bad["entries"][1]["alpha"] = -1;
  EXPECT_NE(errorOf([&] { codecs.applyMeasured(bad, "f.json"); }).find("must be >= 0"), std::string::npos);
}

}  // namespace
}  // namespace cortado::planner
