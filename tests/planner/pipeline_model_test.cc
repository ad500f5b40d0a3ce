// The encode pipeline in the timeline simulator (Cluster::pipeline): an
// execution's leading local steps start when the previous execution's first
// communication step has begun, its first communication step when they are
// done and the previous execution has ended. Checked against timelines
// computed by hand (hand_timeline.h's setting: every duration a round
// number), through every path that places an execution (simulate, the
// groups, the estimates, the prefix checkpoints).
#include <gtest/gtest.h>

#include <vector>

#include "scheduler/planner/fusion_search.h"
#include "tests/planner/hand_timeline.h"

namespace cortado::planner {
namespace {

using plan::CommOp;
using plan::Device;
using plan::Scope;
using plan::Step;
using plan::TensorOption;
using namespace hand;

// Encode on the "gpu" (3 us), allgather of the payload, decode (1 us).
const TensorOption kGather{
    false, {Step::encode(Device::kGpu), Step::comm(Scope::kFlat, CommOp::kAllgather, true),
            Step::decode(Device::kGpu)},
    "test"};

// One machine with 2 GPUs; the codec steps run off the computation, as in
// the plan executor (gpuCodecPausesCompute off), one execution at a time.
Cluster serialCluster(bool pipeline) {
  Cluster c = cluster(1, 2, 4);
  c.oneTensorAtATime = true;
  c.gpuCodecPausesCompute = false;
  c.pipeline = pipeline;
  return c;
}

// Three tensors of 4000 floats (payload 1000 floats = 4000 B: the allgather
// over 2 GPUs takes 1 x 4000 B / 1000 B/us = 4 us), ready at 10, 11, 12.
ModelProfile three() { return model({{4000, 10}, {4000, 1}, {4000, 1}}); }

TEST(PipelineModel, HandComputedTimeline) {
  // Without the pipeline each execution starts when the previous has ended:
  //   t0 [10,18] (encode [10,13], allgather [13,17], decode [17,18]),
  //   t1 [18,26], t2 [26,34].
  Simulator serial(serialCluster(false), codec(), three(), {kGather});
  EXPECT_DOUBLE_EQ(serial.simulate({0, 0, 0}), 34.0);
  // With it:
  //   t0: encode [10,13]; its exchange begins at 13: allgather [13,17],
  //       decode [17,18].
  //   t1: encode from max(ready 11, t0's exchange 13) [13,16] (the codec
  //       lane is free: t0's decode is at [17,18]); allgather from
  //       max(16, t0's end 18) [18,22], decode [22,23].
  //   t2: encode from max(12, t1's exchange 18) [18,21] (one execution
  //       ahead: not at t1's encode end, 16); allgather from max(21, 23)
  //       [23,27], decode [27,28].
  Simulator pipe(serialCluster(true), codec(), three(), {kGather});
  ASSERT_TRUE(pipe.pipelined());
  std::vector<TensorTiming> t;
  std::vector<TraceEvent> trace;
  EXPECT_DOUBLE_EQ(pipe.simulate({0, 0, 0}, &t, &trace), 28.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 18.0);
  EXPECT_DOUBLE_EQ(t[1].finish, 23.0);
  EXPECT_DOUBLE_EQ(t[2].finish, 28.0);
  std::vector<std::pair<double, double>> encodes, gathers;
  for (const TraceEvent& e : trace) {
    if (e.name.rfind("encode", 0) == 0) encodes.emplace_back(e.start, e.start + e.dur);
    if (e.name.find("allgather") != std::string::npos)
      gathers.emplace_back(e.start, e.start + e.dur);
  }
  EXPECT_EQ(encodes, (std::vector<std::pair<double, double>>{{10, 13}, {13, 16}, {18, 21}}));
  // The "gpu" codec steps run the CPU twin off the computation: with the
  // pipeline they take a core (Simulator::twinOnCpu), here one of 4.
  for (const TraceEvent& e : trace)
    if (e.name.rfind("encode", 0) == 0 || e.name.rfind("decode", 0) == 0) {
      EXPECT_EQ(pipe.laneName(e.lane).rfind("CPU core", 0), 0u) << e.name;
    }
  EXPECT_EQ(gathers, (std::vector<std::pair<double, double>>{{13, 17}, {18, 22}, {23, 27}}));

  // The planner's other paths place executions the same way: the estimate
  // of t2's option from the checkpoint before it, and a re-simulation from
  // t1 with an override.
  pipe.setBase({0, 0, 0});
  EXPECT_DOUBLE_EQ(pipe.baseTime(), 28.0);
  std::vector<double> est;
  pipe.estimateOptions(2, {0}, est, Simulator::kInf);
  ASSERT_EQ(est.size(), 1u);
  EXPECT_DOUBLE_EQ(est[0], 28.0);
  EXPECT_DOUBLE_EQ(pipe.simulateFrom(1, {{1, 0}}), 28.0);
}

TEST(PipelineModel, GroupsAndFirstCommunicatingOptions) {
  // t1 and t2 as one group of 8000 floats, in place (contiguous): encode
  // from max(ready 12, t0's exchange 13) [13,16], allgather of 8000 B from
  // max(16, 18) [18,26], decode [26,27].
  ModelProfile p = three();
  p.contiguousGradients = true;
  Simulator pipe(serialCluster(true), codec(), p, {kGather, kAllreduce});
  std::vector<TensorTiming> t;
  EXPECT_DOUBLE_EQ(pipe.simulateGroups({0, 0, 0}, {{1, 2}}, &t), 27.0);
  EXPECT_DOUBLE_EQ(t[1].finish, 27.0);
  // The search's walk (readyAfter, placeGroup) gives the same.
  SimState st = pipe.initialState();
  pipe.placeGroup(st, 0, 0, 0, pipe.readyAfter(st, 0, 0));
  EXPECT_DOUBLE_EQ(st.exchangeStart, 13.0);
  double ready = st.prevReady;
  for (int k = 1; k <= 2; ++k) ready = pipe.readyAfter(st, ready, k);
  EXPECT_DOUBLE_EQ(pipe.placeGroup(st, 1, 2, 0, ready), 27.0);
  EXPECT_DOUBLE_EQ(st.exchangeStart, 18.0);
  // An option that communicates first has nothing to run ahead: t1's
  // allreduce of 16000 B over 2 GPUs (2 x 1/2 x 16000 / 1000 = 16 us) starts
  // when t0 has ended, [18,34]; t2's encode from t1's exchange [18,21] and
  // its allgather from 34: [34,38], decode [38,39].
  EXPECT_DOUBLE_EQ(pipe.simulate({0, 1, 0}), 39.0);
  Simulator serial(serialCluster(false), codec(), three(), {kGather, kAllreduce});
  // Without the pipeline: t0 [10,18], t1 [18,34], t2 [34,42].
  EXPECT_DOUBLE_EQ(serial.simulate({0, 1, 0}), 42.0);
}

TEST(PipelineModel, CodecTwinsShareTheCores) {
  // One core: the encode of t1 and t0's decode compete for it. Tensors of
  // 1000 floats (allgather of 1000 B: 1 us), ready at 10 and 11.
  //   t0: encode [10,13], allgather [13,14], decode [14,15].
  //   t1: encode from t0's exchange start, 13; the core is taken by t0's
  //       decode at [14,15], so the 3 us go after it: [15,18]; allgather
  //       [18,19], decode [19,20].
  Cluster c = serialCluster(true);
  c.cpuCores = 1;
  Simulator sim(c, codec(), model({{1000, 10}, {1000, 1}}), {kGather});
  EXPECT_DOUBLE_EQ(sim.simulate({0, 0}), 20.0);
  // Without the pipeline: t0 [10,15], t1 [15,20]: the same here, where the
  // exchange is too short to hide an encode.
  c.pipeline = false;
  Simulator serial(c, codec(), model({{1000, 10}, {1000, 1}}), {kGather});
  EXPECT_DOUBLE_EQ(serial.simulate({0, 0}), 20.0);
}

TEST(PipelineModel, NotWithFusionBySize) {
  // The runtime's tensor fusion keeps its batch model: the pipeline is not
  // modelled there (docs/planner.md).
  Cluster c = serialCluster(true);
  c.fusionBytes = 1 << 20;
  Simulator sim(c, codec(), three(), {kGather});
  EXPECT_FALSE(sim.pipelined());
  Cluster overlapped = cluster(1, 2, 4);
  overlapped.pipeline = true;  // only with one execution at a time
  EXPECT_FALSE(Simulator(overlapped, codec(), three(), {kGather}).pipelined());
}

TEST(PipelineModel, FusionSearchUsesTheOverlap) {
  // Six tensors of 4000 floats ready 1 us apart: with the pipeline the
  // search's best is no later than without it, and its time is the
  // simulated time of its groups.
  ModelProfile p = model({{4000, 10}, {4000, 1}, {4000, 1}, {4000, 1}, {4000, 1}, {4000, 1}});
  p.contiguousGradients = true;
  double best[2];
  for (bool on : {false, true}) {
    Simulator sim(serialCluster(on), codec(), p, {kGather, kAllreduce});
    FusionConfig cfg;
    cfg.exact = true;
    cfg.allOptions = true;
    FusionSearch s(sim, cfg);
    const Strategy oracle = s.exhaustive();
    const Strategy got = s.search(Strategy{std::vector<int>(6, 0), 0});
    EXPECT_NEAR(got.iterUs, oracle.iterUs, 1e-9);
    EXPECT_NEAR(sim.simulateGroups(got.choice, got.groups), got.iterUs, 1e-9);
    best[on] = got.iterUs;
  }
  EXPECT_LT(best[1], best[0]);
}

}  // namespace
}  // namespace cortado::planner
