// The `cortado plan` and `cortado bench plan` commands, run as the built
// `cortado` binary: the summary, the per-tensor table and the plan against the
// bundled profile read here directly, the Chrome trace, the plan file, and the
// errors for bad models, codecs, links and paths. Every run has a deadline.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/plan/plan.h"
#include "tests/multiprocess/run_command.h"

namespace cortado::test {
namespace {

using nlohmann::json;

const std::string kCortado = CORTADO_BIN;
const std::string kData = PLANNER_DATA_DIR;
constexpr double kDeadlineS = 120;

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

json readJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::filesystem::path tempDir() {
  auto dir = std::filesystem::temp_directory_path() /
             fmt::format("cortado_plan_cli_{}_{}", ::getpid(),
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

// "  <label>   123.45 ms  speedup ..." -> 123.45
double summaryMs(const std::string& out, const std::string& label) {
  std::smatch m;
  std::regex re("  " + label + " +([0-9.]+) ms");
  EXPECT_TRUE(std::regex_search(out, m, re)) << label << "\n" << out;
  return m.empty() ? 0 : std::stod(m[1]);
}

CommandResult plan(const std::string& args) {
  return runCommand(fmt::format("{} plan {} 2>&1", kCortado, args), kDeadlineS);
}

TEST(PlanCommand, IssueCommandLinePrintsSummaryTableAndPlan) {
  const auto dir = tempDir();
  const std::string trace = (dir / "trace.json").string();
  auto r = plan(fmt::format(
      "--model resnet50 --machines 8 --gpus-per-machine 8 --intra nvlink --inter 25gbit "
      "--codec dgc:ratio=0.01 --cpu-cores 16 --trace {}",
      trace));
  ASSERT_FALSE(r.timedOut);
  ASSERT_EQ(r.exitCode, 0) << r.output;

  // The summary: four predicted iteration times; Espresso between the upper
  // bound and both baselines.
  const double none = summaryMs(r.output, "no compression");
  const double allGpu = summaryMs(r.output, "compress everything on GPU");
  const double espresso = summaryMs(r.output, "Espresso plan");
  const double upper = summaryMs(r.output, "upper bound \\(free codec\\)");
  EXPECT_GT(none, 0);
  EXPECT_LE(espresso, none + 0.005);
  EXPECT_LE(espresso, allGpu + 0.005);
  EXPECT_LE(upper, espresso + 0.005);

  // The table: one row per tensor of the profile, in its gradient-ready order.
  const json profile = readJson(kData + "/profiles/resnet50.json");
  const auto& tensors = profile.at("tensors");
  ASSERT_EQ(tensors.size(), 161u);
  size_t pos = r.output.find("tensor");
  ASSERT_NE(pos, std::string::npos);
  for (size_t j = 0; j < tensors.size(); ++j) {
    const std::string row = fmt::format("{:>4}  {:<44} {:>11}", j,
                                        tensors[j]["name"].get<std::string>(),
                                        tensors[j]["elements"].get<int64_t>());
    size_t at = r.output.find(row, pos);
    ASSERT_NE(at, std::string::npos) << "row " << j << ": " << row;
    pos = at;
  }

  // The plan: valid, one option per tensor of the profile.
  size_t planAt = r.output.find("plan:\n");
  ASSERT_NE(planAt, std::string::npos);
  plan::Plan p = plan::planFromJsonString(r.output.substr(planAt + 6));
  EXPECT_EQ(p.version, 1u);
  ASSERT_EQ(p.tensors.size(), tensors.size());
  for (const auto& t : tensors) EXPECT_TRUE(p.tensors.count(t["name"].get<std::string>()));

  // The trace: trace-event JSON with named lanes, one backward slice per
  // tensor, non-overlapping slices per lane, and its end at the simulated
  // end of synchronization (the iteration time less the forward pass).
  const json tr = readJson(trace);
  ASSERT_TRUE(tr.contains("traceEvents"));
  std::map<int, std::vector<std::pair<double, double>>> lanes;
  std::set<std::string> backward, laneNames;
  double end = 0;
  for (const json& e : tr["traceEvents"]) {
    if (e["ph"] == "M") {
      laneNames.insert(e["args"]["name"].get<std::string>());
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    EXPECT_GE(ts, 0);
    EXPECT_GT(dur, 0);
    lanes[e["tid"].get<int>()].emplace_back(ts, ts + dur);
    end = std::max(end, ts + dur);
    const std::string name = e["name"].get<std::string>();
    if (name.starts_with("backward ")) backward.insert(name.substr(9));
  }
  for (const char* lane : {"GPU compute", "GPU codec", "network", "intra-machine links"})
    EXPECT_TRUE(laneNames.count(lane)) << lane;
  std::set<std::string> withBackward;
  for (const auto& t : tensors)
    if (t["backward_us"].get<double>() > 0) withBackward.insert(t["name"].get<std::string>());
  EXPECT_EQ(backward, withBackward);
  for (auto& [tid, v] : lanes) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i)
      ASSERT_GE(v[i].first + 1e-6, v[i - 1].second) << "overlapping slices on lane " << tid;
  }
  const double forwardMs = profile.at("forward_us").get<double>() / 1000.0;
  EXPECT_NEAR(end / 1000.0 + forwardMs, espresso, 0.01);
  std::filesystem::remove_all(dir);
}

TEST(PlanCommand, JsonOutAndPcieWithEfSignSgd) {
  const auto dir = tempDir();
  const std::string out = (dir / "plan.json").string();
  auto r = plan(fmt::format("--model lstm --machines 4 --gpus-per-machine 2 --intra pcie "
                            "--inter 10gbit --codec efsignsgd --cpu-cores 4 --plan-version 7 "
                            "--out {}",
                            out));
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "plan:\n"));  // written to the file instead
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  plan::Plan p = plan::planFromJsonString(text.str());
  EXPECT_EQ(p.version, 7u);
  EXPECT_EQ(p.tensors.size(), readJson(kData + "/profiles/lstm.json")["tensors"].size());
  // On a 10 Gbit/s network the LSTM's 136M parameters are worth compressing.
  int compressed = 0;
  for (const auto& [name, o] : p.tensors) compressed += o.compressed();
  EXPECT_GT(compressed, 0);
  for (const auto& [name, o] : p.tensors) {
    if (o.compressed()) {
      EXPECT_EQ(o.codec, "efsignsgd") << name;
    }
  }
  EXPECT_LT(summaryMs(r.output, "Espresso plan"), summaryMs(r.output, "no compression"));

  auto j = runCommand(fmt::format("{} plan --model vgg16 --machines 2 --gpus-per-machine 2 --json",
                                  kCortado),
                      kDeadlineS);
  ASSERT_EQ(j.exitCode, 0) << j.output;
  EXPECT_EQ(plan::planFromJsonString(j.output).tensors.size(), 32u);

  // --no-ps: no step goes through the servers; with them, on a slow network
  // and with EFSignSGD (the servers sum and re-encode its sign payloads),
  // some do (the LSTM's 9M-element weights).
  auto countPush = [&](const std::string& extra) {
    auto r = runCommand(fmt::format("{} plan --model lstm --machines 4 --gpus-per-machine 2 "
                                    "--inter 10gbit --codec efsignsgd --json {}",
                                    kCortado, extra),
                        kDeadlineS);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    int pushes = 0;
    for (const auto& [name, o] : plan::planFromJsonString(r.output).tensors)
      for (const auto& st : o.steps) pushes += st.kind == plan::StepKind::kComm && st.op == plan::CommOp::kPush;
    return pushes;
  };
  EXPECT_EQ(countPush("--no-ps"), 0);
  EXPECT_GT(countPush(""), 0);
  std::filesystem::remove_all(dir);
}

// A profile with an embedding at 1% density (docs/zen.md, "In a plan"): the
// plan sends it through Zen, says so, and keeps the dense tensors dense; a
// density out of range is refused naming the tensor.
TEST(PlanCommand, SparseEmbeddingGoesThroughZen) {
  const auto dir = tempDir();
  json hw = readJson(kData + "/costs/hardware.json");
  hw["links"]["1gbit"] = {{"alpha_us", 50}, {"gbps", 0.9}};
  const std::string hwFile = (dir / "hardware.json").string();
  std::ofstream(hwFile) << hw.dump();
  auto profile = [&](const std::string& density) {
    const std::string file = (dir / "model.json").string();
    std::ofstream(file) << R"({"format": "cortado-profile", "model": "click", "tensors": [
        {"name": "mlp.bias", "elements": 1024, "backward_us": 40},
        {"name": "mlp.weight", "elements": 1048576, "backward_us": 2500},
        {"name": "emb.weight", "elements": 8000000, "backward_us": 600, "density": )" +
                               density + "}]}";
    return file;
  };
  const std::string args =
      fmt::format("--model {} --machines 4 --gpus-per-machine 1 --hardware {} --inter 1gbit "
                  "--codec fp16",
                  profile("0.01"), hwFile);
  auto r = plan(args);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "sparse tensors: 1 with a density; 1 through Zen")) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("emb.weight +8000000 .* F: zen\\.(bp|hc) "
                                                     "\\(density 1%\\)")))
      << r.output;
  auto j = runCommand(fmt::format("{} plan {} --json", kCortado, args), kDeadlineS);
  ASSERT_EQ(j.exitCode, 0) << j.output;
  const plan::Plan p = plan::planFromJsonString(j.output);
  EXPECT_TRUE(p.tensors.at("emb.weight").zen());
  EXPECT_FALSE(p.tensors.at("mlp.weight").zen());
  EXPECT_FALSE(p.tensors.at("mlp.bias").zen());
  auto bad = plan(fmt::format("--model {} --machines 4", profile("2")));
  EXPECT_EQ(bad.exitCode, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "('emb.weight'): density is 2, it must be in (0, 1]"))
      << bad.output;
  std::filesystem::remove_all(dir);
}

struct BadInput {
  const char* name;
  std::string args;
  std::vector<std::string> expected;  // each must appear in the error
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.name; }

class PlanCommandErrors : public ::testing::TestWithParam<BadInput> {};

TEST_P(PlanCommandErrors, ClearErrorListingValidValues) {
  const BadInput& b = GetParam();
  auto r = plan(b.args);
  ASSERT_FALSE(r.timedOut);
  EXPECT_NE(r.exitCode, 0) << r.output;
  for (const auto& e : b.expected) EXPECT_TRUE(contains(r.output, e)) << e << "\n" << r.output;
  EXPECT_FALSE(contains(r.output, "plan:")) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, PlanCommandErrors,
    ::testing::Values(
        BadInput{"UnknownModel", "--model alexnet",
                 {"--model: unknown model 'alexnet'",
                  "valid: vgg16, resnet50, resnet101, bert-base, gpt2, lstm"}},
        BadInput{"MissingProfile", "--model /nonexistent/profile.json",
                 {"cannot open profile '/nonexistent/profile.json'"}},
        BadInput{"UnknownCodec", "--model vgg16 --codec zip",
                 {"--codec: unknown codec 'zip'", "dgc", "efsignsgd", "topk"}},
        BadInput{"UnknownCodecParameter", "--model vgg16 --codec dgc:k=5",
                 {"codec 'dgc' has no parameter 'k' (valid: ratio)"}},
        BadInput{"RatioOutOfRange", "--model vgg16 --codec dgc:ratio=2", {"ratio must be in (0, 1]"}},
        BadInput{"UnknownIntraLink", "--model vgg16 --intra infiniband",
                 {"--intra: unknown link 'infiniband'", "nvlink", "pcie", "--hardware"}},
        BadInput{"UnknownInterLink", "--model vgg16 --inter 3gbit",
                 {"--inter: unknown link '3gbit'", "25gbit", "100gbit"}},
        BadInput{"ZeroMachines", "--model vgg16 --machines 0", {"--machines"}},
        BadInput{"MissingModel", "--machines 2", {"--model is required"}},
        BadInput{"UnwritableTrace", "--model vgg16 --machines 2 --trace /nonexistent/dir/t.json",
                 {"--trace: cannot write '/nonexistent/dir/t.json'"}},
        BadInput{"MissingHardwareFile", "--model vgg16 --hardware /nonexistent/hw.json",
                 {"cannot open hardware model file '/nonexistent/hw.json'"}},
        BadInput{"NegativeOneOptionMargin", "--model vgg16 --one-option-margin -0.1",
                 {"--one-option-margin", "not in range"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(PlanCommand, ExactSearchOnRequest) {
  // ResNet50 (161 tensors) is past the size searched exactly by default.
  auto est = plan("--model resnet50 --codec dgc:ratio=0.01 --no-table");
  auto exact = plan("--model resnet50 --codec dgc:ratio=0.01 --no-table --exact");
  ASSERT_EQ(est.exitCode, 0) << est.output;
  ASSERT_EQ(exact.exitCode, 0) << exact.output;
  EXPECT_TRUE(contains(est.output, "decision (estimated search):")) << est.output;
  EXPECT_TRUE(contains(est.output, " estimates, ")) << est.output;
  EXPECT_TRUE(contains(exact.output, "decision (exact search):")) << exact.output;
}

// The one-option step's line names the margin it ran with; margin 0 runs no
// such step (bert-base/DGC at 8 x 8 on 10 Gbit/s mixes options).
TEST(PlanCommand, OneOptionMarginOnRequest) {
  const std::string base = "--model bert-base --codec dgc:ratio=0.01 --inter 10gbit --no-table";
  auto byDefault = plan(base);
  auto wide = plan(base + " --one-option-margin 0.5");
  auto off = plan(base + " --one-option-margin 0");
  for (const auto* r : {&byDefault, &wide, &off}) ASSERT_EQ(r->exitCode, 0) << r->output;
  EXPECT_TRUE(contains(byDefault.output, "one option in groups (margin 5%): ")) << byDefault.output;
  EXPECT_TRUE(contains(wide.output, "one option in groups (margin 50%): ")) << wide.output;
  EXPECT_FALSE(contains(off.output, "one option in groups")) << off.output;
}

TEST(PlanCommand, ErrorsExitWithTwo) {
  EXPECT_EQ(plan("--model alexnet").exitCode, 2);
  EXPECT_EQ(plan("--model vgg16 --codec zip").exitCode, 2);
}

TEST(BenchPlanCommand, PrintsTargetsNextToMeasurements) {
  auto r = runCommand(fmt::format("{} bench plan --models vgg16,lstm --codecs dgc:ratio=0.01,efsignsgd "
                                  "--synthetic 40 --repeat 1 --machines 2 --gpus-per-machine 4 2>&1",
                                  kCortado),
                      kDeadlineS);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "Targets: < 20 ms per model, < 100 ms for the synthetic model"))
      << r.output;
  for (const char* row : {"| vgg16 | 32 | dgc:ratio=0.01 |", "| vgg16 | 32 | efsignsgd |",
                          "| lstm | 11 | dgc:ratio=0.01 |", "| synthetic-40 | 40 | efsignsgd |"})
    EXPECT_TRUE(contains(r.output, row)) << row << "\n" << r.output;
  EXPECT_TRUE(contains(r.output, "| < 20 |"));
  EXPECT_TRUE(contains(r.output, "| < 100 |"));
  EXPECT_TRUE(contains(r.output, "of 6 decisions met their target")) << r.output;

  auto bad = runCommand(fmt::format("{} bench plan --models vgg16 --codecs zip --synthetic 0 2>&1",
                                    kCortado),
                        kDeadlineS);
  EXPECT_EQ(bad.exitCode, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "unknown codec 'zip'")) << bad.output;
}

TEST(BenchScaleCommand, SimulatorMatchesTheAlphaBetaFormulasFrom16To1024Gpus) {
  auto r = runCommand(fmt::format("{} bench scale 2>&1", kCortado), kDeadlineS);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  // A flat ring over 1024 GPUs at 25 Gbit/s (alpha 30 us, 22 Gbit/s in the
  // default hardware model), 100 MB: 2 * 1023 * 30 us + 2 * 1023/1024 *
  // 100e6 B * 8 / 22e3 Mbit/s = 134.04 ms, by hand.
  EXPECT_TRUE(contains(r.output, "| 25gbit | 1024 | 128 | 134.04 | 134.04 |")) << r.output;
  for (const char* row : {"| 25gbit | 16 | 2 |", "| 100gbit | 16 | 2 |", "| 100gbit | 1024 | 128 |"})
    EXPECT_TRUE(contains(r.output, row)) << row << "\n" << r.output;

  auto bad = runCommand(fmt::format("{} bench scale --gpus 12 2>&1", kCortado), kDeadlineS);
  EXPECT_EQ(bad.exitCode, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "--gpus 12 is not a multiple of --gpus-per-machine 8"))
      << bad.output;
}

}  // namespace
}  // namespace cortado::test
