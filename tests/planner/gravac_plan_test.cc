// The planner at a GraVAC CF (scheduler/planner/gravac_plan.h): the re-planner
// gives what calling the planner directly with that ratio gives, the payload
// sizes are top-k's at the CF (computed by hand), the placement moves with
// the CF, and bad settings are refused.
#include <gtest/gtest.h>

#include <memory>

#include "core/common/error.h"
#include "scheduler/planner/gravac_plan.h"

namespace cortado::planner {
namespace {

// Tensors from 16 M elements down to 64, in gradient-ready order, the
// backward pass at 2 ns per element.
std::shared_ptr<const ModelProfile> handProfile() {
  auto p = std::make_shared<ModelProfile>();
  p->model = "gravac-hand";
  p->source = "gravac_plan_test";
  p->forwardUs = 1000;
  int k = 0;
  for (int64_t n : {int64_t(64), int64_t(1) << 10, int64_t(1) << 14, int64_t(1) << 18,
                    int64_t(1) << 20, int64_t(1) << 22, int64_t(1) << 24}) {
    TensorProfile t;
    t.name = fmt::format("t{}", k++);
    t.elements = n;
    t.backwardUs = double(n) * 2e-3;
    p->tensors.push_back(t);
  }
  return p;
}

PlanConfig handConfig() {
  PlanConfig c;
  c.profile = handProfile();
  c.machines = 4;
  c.gpusPerMachine = 1;
  c.intra = "pcie";
  c.inter = "10gbit";
  c.cpuCores = 4;
  c.parameterServer = true;
  c.upperBound = false;
  c.fuse = false;
  return c;
}

int compressedTensors(const plan::Plan& p) {
  int n = 0;
  for (const auto& [name, o] : p.tensors) n += o.compressed();
  return n;
}

TEST(GravacPlan, PayloadsAreTopkAtTheCf) {
  const CodecModel codecs = CodecModel::load(resolveDataDir("") + "/costs/codecs.json");
  const ResolvedCodec base = codecs.resolve("dgc:ratio=0.01");
  const ResolvedCodec at = codecAtRatio(base, 250);
  EXPECT_EQ(at.spec, "topk:ratio=0.004");
  EXPECT_EQ(gravacCarrierSpec(250), "topk:ratio=0.004");
  // 1M elements at 250x: 4000 kept, 8 bytes each (value, index), and the
  // codec's header.
  EXPECT_DOUBLE_EQ(at.payloadBytes(1e6), base.cost.headerBytes + 4000.0 * 8.0);
  EXPECT_DOUBLE_EQ(codecAtRatio(base, 2).payloadBytes(1e6), base.cost.headerBytes + 500000.0 * 8.0);
  // The spec the executor's carrier writes resolves to the same sizes.
  EXPECT_DOUBLE_EQ(codecs.resolve("topk:ratio=0.004").payloadBytes(1e6), at.payloadBytes(1e6));
}

// The re-planner's plan at a CF is the planner's plan for the codec spec
// written out by hand ("topk:ratio=0.01" for 100x), with and without groups.
TEST(GravacPlan, ReplannerGivesThePlannersPlanAtTheNewCf) {
  const PlanConfig cfg = handConfig();
  const PlanAtRatio replan = gravacReplanner(cfg);
  plan::Plan current;
  current.version = 7;
  struct Case {
    double cf;
    const char* spec;
  };
  for (const Case c :
       {Case{2, "topk:ratio=0.5"}, Case{100, "topk:ratio=0.01"}, Case{1000, "topk:ratio=0.001"}}) {
    SCOPED_TRACE(c.cf);
    PlanConfig direct = cfg;
    direct.codec = c.spec;
    plan::Plan want = runPlanner(direct).plan;
    plan::Plan got = replan(current, c.cf);
    EXPECT_EQ(got.version, 8u);
    EXPECT_EQ(got.tensors, want.tensors);
    EXPECT_TRUE(got.groups.empty());
    // The same from a simulator of the job (the executor's path in bench
    // model): its options and cluster, the codec at the CF.
    PlanConfig other = cfg;
    other.codec = "dgc:ratio=0.05";
    const PlanRun run = runPlanner(other);
    EXPECT_EQ(planAtRatio(*run.sim, c.cf, false, 3).tensors, want.tensors);
  }
  // A running plan with groups asks for the fusion search too.
  plan::Plan grouped;
  grouped.groups = {{"t0", "t1"}};
  PlanConfig direct = cfg;
  direct.codec = "topk:ratio=0.01";
  direct.fuse = true;
  const plan::Plan want = runPlanner(direct).plan;
  const plan::Plan got = replan(grouped, 100);
  EXPECT_EQ(got.tensors, want.tensors);
  EXPECT_EQ(got.groups, want.groups);
}

// The placement moves with the CF: at 2x a top-k payload is as large as the
// raw tensor (8 bytes per kept element) and nothing is compressed; at 1000x
// the large tensors are.
TEST(GravacPlan, PlacementMovesWithTheCf) {
  const PlanAtRatio replan = gravacReplanner(handConfig());
  const plan::Plan at2 = replan(plan::Plan{}, 2), at1000 = replan(plan::Plan{}, 1000);
  EXPECT_EQ(compressedTensors(at2), 0) << plan::toJsonString(at2);
  EXPECT_GT(compressedTensors(at1000), 0) << plan::toJsonString(at1000);
  EXPECT_TRUE(at1000.tensors.at("t6").compressed());
  for (const auto& [name, o] : at1000.tensors)
    if (o.compressed()) {
      EXPECT_EQ(o.codec, "topk:ratio=0.001") << name;
    }
}

// pushPullOnly (a job without MPI collectives): every option of the plan
// crosses machines by push and pull, and the re-planner honours it.
TEST(GravacPlan, PushPullOnlyPlansHaveNoCollectivesAcrossMachines) {
  PlanConfig cfg = handConfig();
  cfg.pushPullOnly = true;
  const PlanAtRatio replan = gravacReplanner(cfg);
  int compressed = 0;
  for (double cf : {2.0, 100.0, 1000.0}) {
    const plan::Plan p = replan(plan::Plan{}, cf);
    for (const auto& [name, o] : p.tensors) {
      compressed += o.compressed();
      for (const plan::Step& s : o.steps) {
        if (s.kind != plan::StepKind::kComm) continue;
        EXPECT_NE(s.scope, plan::Scope::kFlat) << name << " at CF " << cf;
        if (s.scope == plan::Scope::kInter) {
          EXPECT_TRUE(s.op == plan::CommOp::kPush || s.op == plan::CommOp::kPull)
              << name << " at CF " << cf;
        }
      }
    }
  }
  EXPECT_GT(compressed, 0);
  // Without the restriction the planner takes collectives on this cluster.
  bool collective = false;
  for (const auto& [name, o] : replan(plan::Plan{}, 2).tensors)
    for (const plan::Step& s : o.steps) collective = collective || s.scope == plan::Scope::kFlat;
  EXPECT_FALSE(collective);
  bool unrestricted = false;
  for (const auto& [name, o] : gravacReplanner(handConfig())(plan::Plan{}, 2).tensors)
    for (const plan::Step& s : o.steps)
      unrestricted =
          unrestricted || (s.kind == plan::StepKind::kComm && s.op != plan::CommOp::kPush &&
                           s.op != plan::CommOp::kPull && s.scope != plan::Scope::kIntra);
  EXPECT_TRUE(unrestricted) << "the unrestricted plan uses no collective: the check shows nothing";
}

TEST(GravacPlan, RefusesBadSettings) {
  PlanConfig cfg = handConfig();
  cfg.profile = nullptr;
  cfg.model = "no-such-model";
  try {
    gravacReplanner(cfg);
    ADD_FAILURE() << "an unknown model was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("no-such-model"), std::string::npos) << e.what();
  }
  cfg = handConfig();
  cfg.inter = "3gbit";
  EXPECT_THROW(gravacReplanner(cfg), Error);
  const PlanAtRatio replan = gravacReplanner(handConfig());
  for (double cf : {0.5, 0.0, -3.0}) {
    try {
      replan(plan::Plan{}, cf);
      ADD_FAILURE() << "CF " << cf << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("not a compression factor"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace cortado::planner
