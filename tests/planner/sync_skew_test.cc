// The workers' skew at synchronizing steps (Cluster::syncSkew) against
// timelines computed by hand, in hand_timeline.h's setting (every duration
// a small round number).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "scheduler/planner/compile.h"
#include "scheduler/planner/simulator.h"
#include "tests/planner/hand_timeline.h"

namespace cortado::planner {
namespace {

using plan::CommOp;
using plan::Device;
using plan::Scope;
using plan::Step;
using plan::TensorOption;

using hand::cluster;
using hand::codec;
using hand::kAllreduce;
using hand::model;

const TensorOption kGather{
    false,
    {Step::encode(Device::kGpu), Step::comm(Scope::kFlat, CommOp::kAllgather, true),
     Step::decode(Device::kGpu)},
    "test"};

// A skew of `us` plus `fraction` of the work before the step.
SyncSkew line(double us, double fraction) {
  SyncSkew s;
  s.us = us;
  s.fraction = fraction;
  return s;
}

// 2 us plus half the work before the step.
Cluster skewed(Cluster c) {
  c.syncSkew = line(2, 0.5);
  return c;
}

TEST(SyncSkew, NoSkewGivesTheTimelineWithoutIt) {
  // simulator_test's GpuCodecDelaysLaterComputation, with the skew's fields
  // set to 0 and 0: t0 encode [10,13], allgather [13,14], decode [14,15];
  // t1 computes in [13,14] and [15,16], allreduce [16,20]. Every op's wait
  // is 0 and each path is its durations' sum.
  Cluster c = cluster(1, 2, 4);
  c.syncSkew = line(0, 0);
  Simulator sim(c, codec(), model({{1000, 10}, {1000, 2}}), {kAllreduce, kGather});
  std::vector<TensorTiming> t;
  EXPECT_DOUBLE_EQ(sim.simulate({1, 0}, &t), 20.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 15.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 16.0);
  const CompiledOption& g = sim.compiled(0, 1);
  for (const SimOp& op : g.ops) EXPECT_EQ(op.waitUs, 0.0);
  EXPECT_DOUBLE_EQ(g.pathUs, 3 + 1 + 1);
  EXPECT_DOUBLE_EQ(sim.runAlone(0, 1000, 1), 5.0);
}

TEST(SyncSkew, WaitsBeforeACollectiveAfterAnEncodeAndNotAfterNoWork) {
  // The encode's 3 us: 2 + 0.5 * 3 = 3.5 us before the allgather. t0: encode
  // [10,13], allgather [16.5,17.5], decode [17.5,18.5]. t1 (ready at 12:
  // "gpu" steps off the computation) has no CPU work before its allreduce:
  // it takes the link's gap at once, [12,16], before t0's allgather.
  Cluster c = skewed(cluster(1, 2, 4));
  c.gpuCodecPausesCompute = false;
  Simulator sim(c, codec(), model({{1000, 10}, {1000, 2}}), {kAllreduce, kGather});
  std::vector<TensorTiming> t;
  std::vector<TraceEvent> trace;
  EXPECT_DOUBLE_EQ(sim.simulate({1, 0}, &t, &trace), 18.5);
  EXPECT_DOUBLE_EQ(t[0].finish, 18.5);
  EXPECT_DOUBLE_EQ(t[1].finish, 16.0);
  for (const TraceEvent& e : trace) {
    if (e.name.rfind("flat allgather*", 0) == 0) {
      EXPECT_DOUBLE_EQ(e.start, 16.5);
      EXPECT_DOUBLE_EQ(e.waitUs, 3.5);  // the trace carries the wait before it
    }
    if (e.name.rfind("flat allreduce", 0) == 0) {
      EXPECT_DOUBLE_EQ(e.start, 12.0);
      EXPECT_EQ(e.waitUs, 0.0);
    }
    if (e.name.rfind("encode", 0) == 0 || e.name.rfind("decode", 0) == 0) {
      EXPECT_EQ(e.waitUs, 0.0);
    }
  }
  // ... and so does the Chrome trace, as "skew_wait_us" on those events only.
  int waits = 0;
  const auto doc = nlohmann::json::parse(chromeTrace(sim, trace));
  for (const auto& e : doc["traceEvents"]) {
    if (!e.contains("args") || !e["args"].contains("skew_wait_us")) continue;
    ++waits;
    EXPECT_EQ(e["name"].get<std::string>().rfind("flat allgather*", 0), 0u) << e.dump();
    EXPECT_DOUBLE_EQ(e["args"]["skew_wait_us"].get<double>(), 3.5);
  }
  EXPECT_GE(waits, 1);
  // The wait is on the collective and in the tensor's path.
  const CompiledOption& g = sim.compiled(0, 1);
  ASSERT_EQ(g.ops.size(), 3u);
  EXPECT_EQ(g.ops[0].waitUs, 0.0);
  EXPECT_DOUBLE_EQ(g.ops[1].waitUs, 3.5);
  EXPECT_EQ(g.ops[2].waitUs, 0.0);
  EXPECT_DOUBLE_EQ(g.pathUs, 3 + 3.5 + 1 + 1);
  EXPECT_EQ(sim.compiled(0, 0).ops[0].waitUs, 0.0);
  EXPECT_DOUBLE_EQ(sim.runAlone(1, 1000, 0), 4.0);
  EXPECT_DOUBLE_EQ(sim.runAlone(0, 1000, 1), 8.5);
  // One tensor at a time: t1's allreduce starts when t0 ends, with no wait
  // of its own: [18.5,22.5].
  Cluster one = c;
  one.oneTensorAtATime = true;
  Simulator serial(one, codec(), model({{1000, 10}, {1000, 2}}), {kAllreduce, kGather});
  EXPECT_DOUBLE_EQ(serial.simulate({1, 0}), 22.5);
}

TEST(SyncSkew, EachStepWaitsForTheWorkSinceThePreviousOne) {
  // Two compressed steps on one machine of 2 GPUs: encode (3), alltoall*,
  // decode (1) and encode (3), allgather*, decode (1). Waits: 2 + 0.5 * 3
  // before the first, 2 + 0.5 * 4 before the second, none elsewhere.
  const TensorOption twoStep{
      false,
      {Step::encode(Device::kGpu), Step::comm(Scope::kFlat, CommOp::kAlltoall, true),
       Step::decode(Device::kGpu), Step::encode(Device::kGpu),
       Step::comm(Scope::kFlat, CommOp::kAllgather, true), Step::decode(Device::kGpu)},
      "test"};
  const CompiledOption plain = compileOption(cluster(1, 2, 4), codec(), 1000, 4, twoStep);
  const CompiledOption c = compileOption(skewed(cluster(1, 2, 4)), codec(), 1000, 4, twoStep);
  ASSERT_EQ(c.ops.size(), plain.ops.size());
  std::vector<double> waits;
  for (size_t i = 0; i < c.ops.size(); ++i) {
    waits.push_back(c.ops[i].waitUs);
    EXPECT_DOUBLE_EQ(c.ops[i].us, plain.ops[i].us) << "op " << i;
  }
  EXPECT_EQ(waits, (std::vector<double>{0, 3.5, 0, 0, 4, 0}));
  EXPECT_DOUBLE_EQ(c.pathUs, plain.pathUs + 3.5 + 4);
}

TEST(SyncSkew, APushWaitsForTheEncodeAndThePullForNothing) {
  // 2 machines x 1 GPU through the servers: the copy to the host (PCIe, not
  // counted), the CPU encode (5 us: wait 2 + 2.5), push, the servers' work
  // (theirs, not counted), pull (no wait), the CPU decode, the copy back.
  const TensorOption ps{
      true,
      {Step::encode(Device::kCpu), Step::comm(Scope::kInter, CommOp::kPush, true),
       Step::comm(Scope::kInter, CommOp::kPull, true), Step::decode(Device::kCpu)},
      "test"};
  const CompiledOption c = compileOption(skewed(cluster(2, 1, 4)), codec(), 1000, 4, ps);
  int pushes = 0, pulls = 0;
  double waits = 0;
  for (const SimOp& op : c.ops) {
    waits += op.waitUs;
    if (op.kind == OpKind::kComm && op.comm == CommOp::kPush) {
      ++pushes;
      EXPECT_DOUBLE_EQ(op.waitUs, 4.5);
    }
    if (op.kind == OpKind::kComm && op.comm == CommOp::kPull) {
      ++pulls;
      EXPECT_EQ(op.waitUs, 0.0);
    }
    if (op.kind != OpKind::kComm) {
      EXPECT_EQ(op.waitUs, 0.0);
    }
  }
  EXPECT_EQ(pushes, 1);
  EXPECT_EQ(pulls, 1);
  EXPECT_DOUBLE_EQ(waits, 4.5);
}

TEST(SyncSkew, AGroupsCopyIsWorkBeforeItsFirstStep) {
  // Two tensors of 1000 floats in buffers of their own: the group of 2000
  // elements is copied in (8000 B at 8 Gbit/s: 8 us), encoded (3), waits
  // 2 + 0.5 * 11 = 7.5, allgathers 2000 B (2 us), decodes (1), copies out
  // (8): 29.5 us, 7.5 more than without the skew.
  ModelProfile p = model({{1000, 10}, {1000, 2}});
  p.contiguousGradients = false;
  Simulator plain(cluster(1, 2, 4), codec(), p, {kGather});
  Simulator sim(skewed(cluster(1, 2, 4)), codec(), p, {kGather});
  EXPECT_DOUBLE_EQ(plain.runGroup(1, 2000, 0), 22.0);
  EXPECT_DOUBLE_EQ(sim.runGroup(1, 2000, 0), 29.5);
  // In place (a flat gradient buffer): no copies, 2 + 1.5 before the step.
  p.contiguousGradients = true;
  Simulator flat(skewed(cluster(1, 2, 4)), codec(), p, {kGather});
  EXPECT_DOUBLE_EQ(flat.runGroup(1, 2000, 0), 3 + 3.5 + 2 + 1);
  // And the group's timeline: ready at 12, [12, 21.5].
  Cluster one = skewed(cluster(1, 2, 4));
  one.oneTensorAtATime = true;
  one.gpuCodecPausesCompute = false;
  Simulator groups(one, codec(), p, {kGather});
  EXPECT_DOUBLE_EQ(groups.simulateGroups({0, 0}, {{0, 1}}), 12 + 9.5);
}

TEST(SyncSkew, ACpuStepsRoundsOverTheCoresAreItsWork) {
  // A CPU encode of 3 tasks (partitions of 4000 B; 2 machines x 1 GPU) on
  // 2 cores takes 2 rounds of 5 us: the wait before the allgather is
  // 2 + 0.5 * 10.
  Cluster c = skewed(cluster(2, 1, 2));
  c.chunkBytes = 4000;
  const TensorOption cpu{
      false,
      {Step::encode(Device::kCpu), Step::comm(Scope::kFlat, CommOp::kAllgather, true),
       Step::decode(Device::kCpu)},
      "test"};
  const CompiledOption o = compileOption(c, codec(), 3000, 4, cpu);
  double wait = -1;
  for (const SimOp& op : o.ops) {
    if (op.kind == OpKind::kEncode) {
      EXPECT_EQ(op.tasks, 3);
    }
    if (op.kind == OpKind::kComm) wait = op.waitUs;
  }
  EXPECT_DOUBLE_EQ(wait, 7.0);
}

// A hardware file of one link and the copies (1 us + 8 Gbit/s each) with
// `cpu` as its cpu section.
nlohmann::json hardware(nlohmann::json cpu) {
  return {{"links", {{"l", {{"alpha_us", 1}, {"gbps", 8}}}}},
          {"copies",
           {{"d2h", {{"alpha_us", 1}, {"gbps", 8}}}, {"h2d", {{"alpha_us", 1}, {"gbps", 8}}}}},
          {"cpu", std::move(cpu)}};
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SyncSkew, BadValuesAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const SyncSkew& s : {line(-1, 0), line(nan, 0), line(0, -0.1), line(0, nan),
                            line(0, SyncSkew::kMaxFraction + 1),
                            line(std::numeric_limits<double>::infinity(), 0)}) {
    const std::string e = errorOf([&] { s.check("test"); });
    EXPECT_NE(e.find("test: the skew's"), std::string::npos) << e;
    Cluster c = cluster(1, 2, 4);
    c.syncSkew = s;
    const std::string se = errorOf([&] {
      Simulator(c, codec(), model({{1000, 1}}), {kAllreduce});
    });
    EXPECT_NE(se.find("sync skew"), std::string::npos) << se;
  }
  EXPECT_EQ(errorOf([] { line(0, SyncSkew::kMaxFraction).check("x"); }), "");
  // From a hardware file.
  nlohmann::json hw =
      hardware({{"sum_gbps", 8}, {"sync_skew_us", 500}, {"sync_skew_fraction", 0.6}});
  const HardwareModel h = HardwareModel::fromJson(hw);
  EXPECT_DOUBLE_EQ(h.syncSkew.us, 500);
  EXPECT_DOUBLE_EQ(h.syncSkew.fraction, 0.6);
  hw["cpu"]["sync_skew_fraction"] = -0.5;
  EXPECT_NE(errorOf([&] { HardwareModel::fromJson(hw); }).find("cpu.sync_skew_fraction"),
            std::string::npos);
  hw["cpu"]["sync_skew_fraction"] = "a lot";
  EXPECT_NE(errorOf([&] { HardwareModel::fromJson(hw); }).find("malformed hardware model"),
            std::string::npos);
  hw["cpu"].erase("sync_skew_fraction");
  hw["cpu"].erase("sync_skew_us");
  EXPECT_FALSE(HardwareModel::fromJson(hw).syncSkew.any());
  // A curve: by increasing work, waits >= 0.
  hw["cpu"]["sync_skew_curve"] = {{100, 50}, {1000, 500}};
  const HardwareModel hc = HardwareModel::fromJson(hw);
  EXPECT_EQ(hc.syncSkew.curve.points,
            (std::vector<std::pair<double, double>>{{100, 50}, {1000, 500}}));
  EXPECT_DOUBLE_EQ(hc.syncSkew.after(550), 275);
  for (const nlohmann::json& bad : {nlohmann::json{{100, 50}, {100, 60}},
                                    nlohmann::json{{100, 50}, {50, 60}},
                                    nlohmann::json{{100, -1}}, nlohmann::json{{0, 10}}}) {
    hw["cpu"]["sync_skew_curve"] = bad;
    const std::string e = errorOf([&] { HardwareModel::fromJson(hw); });
    EXPECT_NE(e.find("cpu.sync_skew_curve"), std::string::npos) << bad.dump() << ": " << e;
    EXPECT_NE(e.find("the skew curve's point"), std::string::npos) << e;
  }
  hw["cpu"]["sync_skew_curve"] = "steep";
  EXPECT_NE(errorOf([&] { HardwareModel::fromJson(hw); }).find("malformed hardware model"),
            std::string::npos);
}

TEST(SyncSkew, APushWaitsForThePushSkewWhereItIsSet) {
  // The same option with a skew of its own before a push (10 us + the
  // work's 5 us) and the collectives' (2 us + half the work): the push
  // waits 15, the pull nothing; a flat allgather after its 3 us encode the
  // collectives' 3.5. Without the push's, the push takes the collectives'.
  const TensorOption ps{
      true,
      {Step::encode(Device::kCpu), Step::comm(Scope::kInter, CommOp::kPush, true),
       Step::comm(Scope::kInter, CommOp::kPull, true), Step::decode(Device::kCpu)},
      "test"};
  Cluster c = skewed(cluster(2, 1, 4));
  c.pushSkew = line(10, 1);
  auto waits = [&](const Cluster& cl, const TensorOption& o, CommOp op) {
    double w = 0;
    for (const SimOp& x : compileOption(cl, codec(), 1000, 4, o).ops)
      if (x.kind == OpKind::kComm && x.comm == op) w += x.waitUs;
    return w;
  };
  EXPECT_DOUBLE_EQ(waits(c, ps, CommOp::kPush), 15.0);
  EXPECT_DOUBLE_EQ(waits(c, ps, CommOp::kPull), 0.0);
  EXPECT_DOUBLE_EQ(waits(c, kGather, CommOp::kAllgather), 3.5);
  EXPECT_DOUBLE_EQ(c.skewBefore(CommOp::kPush, 5), 15.0);
  EXPECT_DOUBLE_EQ(c.skewBefore(CommOp::kAllreduce, 5), 4.5);
  EXPECT_DOUBLE_EQ(c.skewBefore(CommOp::kPush, 0), 0.0);  // no work, no wait
  c.pushSkew = {};
  EXPECT_DOUBLE_EQ(waits(c, ps, CommOp::kPush), 4.5);
  // A bad one is refused by the simulator as the collectives' is.
  c.pushSkew = line(-1, 0);
  const std::string e = errorOf([&] { Simulator(c, codec(), model({{1000, 1}}), {ps}); });
  EXPECT_NE(e.find("sync skew before a push"), std::string::npos) << e;
  // From a hardware file: cpu.push_skew_us, _fraction and _curve, checked
  // as the collectives' are; absent, none.
  nlohmann::json hw = hardware({{"sum_gbps", 8}, {"sync_skew_us", 5}});
  EXPECT_FALSE(HardwareModel::fromJson(hw).pushSkew.any());
  hw["cpu"]["push_skew_curve"] = {{100, 300}, {1000, 900}};
  const HardwareModel h = HardwareModel::fromJson(hw);
  EXPECT_EQ(h.pushSkew.curve.points,
            (std::vector<std::pair<double, double>>{{100, 300}, {1000, 900}}));
  EXPECT_DOUBLE_EQ(h.syncSkew.us, 5);
  hw["cpu"]["push_skew_fraction"] = -1;
  const std::string he = errorOf([&] { HardwareModel::fromJson(hw); });
  EXPECT_NE(he.find("cpu.push_skew_fraction"), std::string::npos) << he;
}

// A measured curve (cortado bench model's chains): the wait by the work,
// on the line from (0, 0) below its first point, between points
// interpolated, beyond the last its last wait; it takes the place of
// the constant and the fraction, and the timeline charges it before the
// step after the work.
TEST(SyncSkew, ACurveIsTheWaitByTheWork) {
  SyncSkew s = line(1000, 5);  // not used where the curve has points
  s.curve.points = {{100, 50}, {1000, 500}, {4000, 800}};
  EXPECT_TRUE(s.any());
  EXPECT_DOUBLE_EQ(s.after(0), 0);
  EXPECT_DOUBLE_EQ(s.after(-3), 0);
  EXPECT_DOUBLE_EQ(s.after(50), 25);
  EXPECT_DOUBLE_EQ(s.after(100), 50);
  EXPECT_DOUBLE_EQ(s.after(550), 275);
  EXPECT_DOUBLE_EQ(s.after(2500), 650);
  EXPECT_DOUBLE_EQ(s.after(4000), 800);
  EXPECT_DOUBLE_EQ(s.after(7000), 800);
  EXPECT_EQ(s.describe(), "by work:wait 100:50us 1000:500us 4000:800us");
  EXPECT_EQ(line(2, 0.5).describe(), "2 us + 0.500 x the work");
  SyncSkew curveOnly;
  curveOnly.curve.points = {{2, 1}, {4, 3}};
  EXPECT_TRUE(curveOnly.any());
  // kGather's encode of 1000 elements takes 3 us: a wait of 2 us (between
  // (2, 1) and (4, 3)) before its allgather, none before the allreduce.
  Cluster c = cluster(1, 2, 4);
  c.syncSkew = curveOnly;
  const CompiledOption g = compileOption(c, codec(), 1000, 4, kGather);
  ASSERT_EQ(g.ops.size(), 3u);
  EXPECT_DOUBLE_EQ(g.ops[0].waitUs, 0);
  EXPECT_DOUBLE_EQ(g.ops[1].waitUs, 2);
  EXPECT_DOUBLE_EQ(g.pathUs, 3 + 2 + 1 + 1);
  EXPECT_DOUBLE_EQ(compileOption(c, codec(), 1000, 4, kAllreduce).ops[0].waitUs, 0);
}

}  // namespace
}  // namespace cortado::planner
