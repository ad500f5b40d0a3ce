// The timeline simulator against timelines computed by hand. Links are set to
// 8 Gbit/s (1000 bytes per microsecond) and zero latency so that every
// duration below is a small round number; each test spells its timeline out.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <numeric>
#include <random>

#include "scheduler/planner/compile.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/simulator.h"
#include "tests/common/error_of.h"
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

// codec() with a per-element encode cost too (0.1 ns on the GPU, 2 on the
// CPU), so that encode times grow with the tensors in the random instances.
ResolvedCodec codecWithPerElementEncode() {
  ResolvedCodec r = codec();
  r.cost.encode[int(Device::kGpu)].nsPerElement = 0.1;
  r.cost.encode[int(Device::kCpu)].nsPerElement = 2;
  return r;
}

// evaluate() of `overrides` on the simulator's base equals `full`, the
// choice simulated from scratch; with the base time as cutoff it is exact
// below it and at least the cutoff otherwise.
void expectEvaluateIsFull(Simulator& sim, const std::vector<std::pair<int, int>>& overrides,
                          double full, int trial) {
  EXPECT_DOUBLE_EQ(sim.evaluate(overrides), full) << "trial " << trial;
  const double cutoff = sim.baseTime();
  const double cut = sim.evaluate(overrides, cutoff);
  if (full < cutoff) EXPECT_DOUBLE_EQ(cut, full) << "trial " << trial;
  else EXPECT_GE(cut, cutoff) << "trial " << trial;
}

TensorOption gatherCompressed(Device enc, Device dec) {
  return TensorOption{false,
                      {Step::encode(enc), Step::comm(Scope::kFlat, CommOp::kAllgather, true), Step::decode(dec)},
                      "test"};
}

TEST(Simulator, CommunicationOverlapsAndSerializes) {
  // Two tensors of 1000 floats; allreduce over 2 GPUs: 2 * 1/2 * 4000 B = 4 us.
  // t0 ready at 10, allreduce [10,14]; t1 ready at 12, waits: [14,18].
  Simulator sim(cluster(1, 2, 4), codec(), model({{1000, 10}, {1000, 2}}), {kAllreduce});
  std::vector<TensorTiming> t;
  EXPECT_DOUBLE_EQ(sim.simulate({0, 0}, &t), 18.0);
  EXPECT_DOUBLE_EQ(t[0].ready, 10.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 14.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 12.0);
  EXPECT_DOUBLE_EQ(t[1].finish, 18.0);
  // With t1 ready after t0 finished there is an idle gap: t1 [20,24].
  Simulator gap(cluster(1, 2, 4), codec(), model({{1000, 10}, {1000, 10}}), {kAllreduce});
  EXPECT_DOUBLE_EQ(gap.simulate({0, 0}), 24.0);
  gap.setBase({0, 0});
  EXPECT_EQ(gap.lastBubble(), 1);
}

TEST(Simulator, GpuCodecDelaysLaterComputation) {
  // t0 ready at 10: GPU encode [10,13], allgather of 1000 B over 2 GPUs [13,14],
  // GPU decode of 2 payloads [14,15]. t1 needs 2 us of backward from 10: the
  // GPU runs codec kernels during [10,13] and [14,15], so it computes during
  // [13,14] and [15,16] and is ready at 16; allreduce [16,20].
  Simulator sim(cluster(1, 2, 4), codec(), model({{1000, 10}, {1000, 2}}),
                {kAllreduce, gatherCompressed(Device::kGpu, Device::kGpu)});
  std::vector<TensorTiming> t;
  std::vector<TraceEvent> trace;
  EXPECT_DOUBLE_EQ(sim.simulate({1, 0}, &t, &trace), 20.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 15.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 16.0);
  // The trace has the compute slices, both codec kernels and both collectives.
  int encodes = 0, comms = 0;
  for (const auto& e : trace) {
    encodes += e.name.rfind("encode", 0) == 0;
    comms += e.name.find("flat ") == 0;
  }
  EXPECT_EQ(encodes, 1);
  EXPECT_EQ(comms, 2);
  auto j = nlohmann::json::parse(chromeTrace(sim, trace));
  EXPECT_GT(j["traceEvents"].size(), trace.size());
}

TEST(Simulator, GpuCodecOffTheTrainingThreadDoesNotDelayComputation) {
  // As GpuCodecDelaysLaterComputation, with the "gpu" steps run off the
  // computation (Cluster::gpuCodecPausesCompute false: host buffers, the
  // plan executor). t0: encode [10,13], allgather [13,14], decode [14,15].
  // t1 is ready at 12 whatever the codec lane does; its allreduce (4 us)
  // finds the flat link free in [12,13] only and runs [14,18].
  Cluster c = cluster(1, 2, 4);
  c.gpuCodecPausesCompute = false;
  Simulator sim(c, codec(), model({{1000, 10}, {1000, 2}}),
                {kAllreduce, gatherCompressed(Device::kGpu, Device::kGpu)});
  std::vector<TensorTiming> t;
  EXPECT_DOUBLE_EQ(sim.simulate({1, 0}, &t), 18.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 15.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 12.0);
  // The codec steps still queue on their lane: two tensors that both encode
  // there, ready at 10 and 11. t0 holds the lane [10,13] and [14,15], so
  // t1 encodes [15,18], gathers [18,19] and decodes [19,20].
  Simulator both(c, codec(), model({{1000, 10}, {1000, 1}}),
                 {gatherCompressed(Device::kGpu, Device::kGpu)});
  EXPECT_DOUBLE_EQ(both.simulate({0, 0}, &t), 20.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 11.0);
  // The incremental paths agree with the full simulation.
  both.setBase({0, 0});
  EXPECT_DOUBLE_EQ(both.baseTime(), 20.0);
  EXPECT_DOUBLE_EQ(both.estimate(0, 1, {}), 20.0);
}

// F: E(c) a2a* D(c) E(c) ag* D(c): the alltoall*, decode, re-encode the
// block, the allgather*, decode.
TensorOption alltoallThenAllgather() {
  return TensorOption{false,
                      {Step::encode(Device::kCpu), Step::comm(Scope::kFlat, CommOp::kAlltoall, true),
                       Step::decode(Device::kCpu), Step::encode(Device::kCpu),
                       Step::comm(Scope::kFlat, CommOp::kAllgather, true), Step::decode(Device::kCpu)},
                      "test"};
}

TEST(Simulator, CpuCodecQueuesOnCoresAndCopies) {
  // One tensor of 1000 floats on 2 GPUs and 1 CPU core; CPU encode and decode.
  //   ready 10; copy d2h of 4000 B: 1 + 4 = 5 -> [10,15]
  //   encode: one task per GPU on the single core: [15,20], [20,25]
  //   copy h2d of the 1000 B payload: 1 + 1 = 2 -> [25,27]
  //   allgather of 1000 B: [27,28]; now 2 payloads, 2000 B
  //   copy d2h 1 + 2 = 3 -> [28,31]; decode tasks [31,33], [33,35]
  //   copy h2d of 4000 B: 5 -> [35,40]
  Simulator sim(cluster(1, 2, 1), codec(), model({{1000, 10}}), {gatherCompressed(Device::kCpu, Device::kCpu)});
  EXPECT_DOUBLE_EQ(sim.simulate({0}), 40.0);
  // With 2 cores both encode tasks (5 us) and both decode tasks (2 us) run
  // side by side: 40 - 5 - 2 = 33.
  Simulator two(cluster(1, 2, 2), codec(), model({{1000, 10}}), {gatherCompressed(Device::kCpu, Device::kCpu)});
  EXPECT_DOUBLE_EQ(two.simulate({0}), 33.0);
}

TEST(Simulator, ADecodeZeroesItsRegionFirst) {
  // 4 machines x 1 GPU, one tensor of 1000 floats, one CPU core, the codec's
  // fixed costs (decode 2 us whatever the payloads), no copies. At
  // cpuFillGbps 8 (1000 bytes per us) a decode first zeroes the elements its
  // rank covers, 4 bytes each, however many payloads it adds:
  Cluster c = cluster(4, 1, 1);
  c.d2h = c.h2d = AlphaBeta{0, 1e9};
  const ResolvedCodec k = codec();
  const TensorOption cpuGather = gatherCompressed(Device::kCpu, Device::kCpu);
  // alltoall*, decode, re-encode the block, allgather*, decode: the first
  // decode covers the rank's block (250 elements), the second every block.
  const TensorOption blocks = alltoallThenAllgather();
  const double gatherUs = compileOption(c, k, 1000, 4, cpuGather).pathUs;
  const double blocksUs = compileOption(c, k, 1000, 4, blocks).pathUs;
  c.cpuFillGbps = 8;
  // allgather*: 4 payloads into the whole tensor: 4000 B, 4 us.
  EXPECT_DOUBLE_EQ(compileOption(c, k, 1000, 4, cpuGather).pathUs, gatherUs + 4);
  // 1000 B for the block, then 4000 B.
  EXPECT_DOUBLE_EQ(compileOption(c, k, 1000, 4, blocks).pathUs, blocksUs + 1 + 4);
  // A "gpu" decode is not priced at the CPU's rate.
  const TensorOption gpuGather = gatherCompressed(Device::kGpu, Device::kGpu);
  const double gpuUs = compileOption(c, k, 1000, 4, gpuGather).pathUs;
  {
    Cluster none = c;
    none.cpuFillGbps = 0;
    EXPECT_DOUBLE_EQ(compileOption(none, k, 1000, 4, gpuGather).pathUs, gpuUs);
  }
  // A measured curve (us by elements) replaces the device's rate: 10 us at
  // 250 elements, 40 at 1000.
  {
    Cluster measured = c;
    measured.cpuFillCurve.add(250, 10);
    measured.cpuFillCurve.add(1000, 40);
    EXPECT_DOUBLE_EQ(compileOption(measured, k, 1000, 4, cpuGather).pathUs, gatherUs + 40);
    EXPECT_DOUBLE_EQ(compileOption(measured, k, 1000, 4, blocks).pathUs, blocksUs + 10 + 40);
    EXPECT_DOUBLE_EQ(compileOption(measured, k, 1000, 4, gpuGather).pathUs, gpuUs);
    measured.gpuFillCurve = measured.cpuFillCurve;
    EXPECT_DOUBLE_EQ(compileOption(measured, k, 1000, 4, gpuGather).pathUs, gpuUs + 40);
  }
  // Split into partitions of 2000 B, one task each on the one core: the same
  // 4 us of zeroing in all on the timeline (2 us per task).
  c.chunkBytes = 2000;
  Cluster none = c;
  none.cpuFillGbps = 0;
  Simulator filled(c, k, model({{1000, 10}}), {cpuGather});
  Simulator unfilled(none, k, model({{1000, 10}}), {cpuGather});
  EXPECT_DOUBLE_EQ(filled.simulate({0}), unfilled.simulate({0}) + 4);
  // With a curve, the pass is priced at the region's size and shared by the
  // tasks: 40 us at 1000 elements, not twice the 5 us of 500 (the executor
  // zeroes the region in one pass; past the caches it costs more per element).
  Cluster curved = c;
  curved.cpuFillCurve.add(500, 5);
  curved.cpuFillCurve.add(1000, 40);
  Simulator curvedSim(curved, k, model({{1000, 10}}), {cpuGather});
  EXPECT_DOUBLE_EQ(curvedSim.simulate({0}), unfilled.simulate({0}) + 40);
  // From a hardware file: cpu.fill_gbps, optional, a rate >= 0.
  nlohmann::json hw = {
      {"links", {{"l", {{"alpha_us", 1}, {"gbps", 8}}}}},
      {"copies",
       {{"d2h", {{"alpha_us", 1}, {"gbps", 8}}}, {"h2d", {{"alpha_us", 1}, {"gbps", 8}}}}},
      {"cpu", {{"sum_gbps", 8}}}};
  EXPECT_DOUBLE_EQ(HardwareModel::fromJson(hw).cpuFillGbps, 0);
  hw["cpu"]["fill_gbps"] = 80;
  EXPECT_DOUBLE_EQ(HardwareModel::fromJson(hw).cpuFillGbps, 80);
  hw["cpu"]["fill_gbps"] = -1;
  EXPECT_NE(test::errorOf([&] { HardwareModel::fromJson(hw); }).find("cpu.fill_gbps is -1"),
            std::string::npos);
}

// Cluster::cpuCodecByCall: a CPU encode or decode priced as the executor
// calls the codec (Run::encode), one call per piece it cuts the region into,
// in turn on the worker's thread, against the partitions spread over the
// cores. 4 machines x 1 GPU, one core, partitions of 1000 bytes, no copies;
// a CPU encode of 5 us + 2 ns an element, a decode of 2 us + 4 ns an
// element per payload; one tensor of 1000 floats (4 partitions), payloads
// as large as the raw data (the servers' key is cut by its payload: 4
// chunks too).
TEST(Simulator, CpuCodecByCallIsOneCallPerPieceTheExecutorCuts) {
  Cluster c = cluster(4, 1, 1);
  c.d2h = c.h2d = AlphaBeta{0, 1e9};
  c.chunkBytes = 1000;
  ResolvedCodec k = codecWithPerElementEncode();
  k.cost.decode[int(Device::kCpu)].nsPerElement = 4;
  k.selectedFraction = 1;
  // The CPU encode and decode operations' (us, tasks), in order.
  auto codecOps = [&](const Cluster& cl, const TensorOption& o) {
    std::vector<std::pair<double, int>> out;
    for (const SimOp& op : compileOption(cl, k, 1000, 4, o).ops)
      if (op.kind == OpKind::kEncode || op.kind == OpKind::kDecode) out.emplace_back(op.us, op.tasks);
    return out;
  };
  using Ops = std::vector<std::pair<double, int>>;
  const TensorOption gather = gatherCompressed(Device::kCpu, Device::kCpu);
  const TensorOption blocks = alltoallThenAllgather();
  const TensorOption servers{true,
                             {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
                              Step::encode(Device::kCpu), Step::comm(Scope::kInter, CommOp::kPush, true),
                              Step::comm(Scope::kInter, CommOp::kPull, true), Step::decode(Device::kCpu),
                              Step::comm(Scope::kIntra, CommOp::kAllgather, false)},
                             "test"};
  // By partitions (the default): 4 tasks of 250 elements each, the decode's
  // 4 payloads of a partition per task.
  EXPECT_EQ(codecOps(c, gather), (Ops{{5.5, 4}, {2 + 4 * 1.0, 4}}));
  c.cpuCodecByCall = true;
  // The allgather: one call for the whole tensor, then one decode of its 4
  // payloads (7 us; 2 + 4 x 4 us).
  EXPECT_EQ(codecOps(c, gather), (Ops{{7, 1}, {18, 1}}));
  // The alltoall ahead cuts the first encode into its 4 blocks (4 x 5.5 us);
  // behind it the region is one block of 250: a decode of 4 payloads
  // (2 + 4 x 1), an encode (5.5), then the whole tensor's decode of one
  // payload a block (the allgather makes the blocks whole: 2 + 4).
  EXPECT_EQ(codecOps(c, blocks), (Ops{{22, 1}, {6, 1}, {5.5, 1}, {6, 1}}));
  // Through the servers: the chunks of the shard key (its 4 partitions), an
  // encode and a decode (of the pulled sum) each; the zeroing pass over the
  // whole region (4000 bytes at 8 Gbit/s: 4 us) once, not a share per task.
  c.cpuFillGbps = 8;
  EXPECT_EQ(codecOps(c, servers), (Ops{{22, 1}, {4 * 3.0 + 4, 1}}));
  // Payloads a quarter of the raw size (1000 bytes): the shard key is one
  // chunk, one encode (5 + 2 us) and one decode (2 + 4, and the pass).
  k.selectedFraction = 0.25;
  EXPECT_EQ(codecOps(c, servers), (Ops{{7, 1}, {6 + 4, 1}}));
  k.selectedFraction = 1;
  // Two GPUs a machine: one task per GPU that holds data.
  Cluster two = c;
  two.gpusPerMachine = 2;
  EXPECT_EQ(codecOps(two, gather)[0], (std::pair<double, int>{7, 2}));
  // A decode's pieces cost no less than one decode of the whole region: a
  // measured curve that costs 8 ns an element at 250 elements and 20 at
  // 1000 (past the caches) prices the servers' 4 pieces at the whole's 20
  // us, not 4 x 2; the zeroing pass on top. Encodes keep their pieces' price.
  auto& curve = k.decodeCurve[int(Device::kCpu)];
  curve.add(250, 2);
  curve.add(1000, 20);
  EXPECT_EQ(codecOps(c, servers), (Ops{{22, 1}, {20 + 4, 1}}));
  // By partitions: each task a share of the whole (20 / 4 us) and of the pass.
  Cluster parts = c;
  parts.cpuCodecByCall = false;
  EXPECT_EQ(codecOps(parts, servers), (Ops{{5.5, 4}, {5 + 1, 4}}));
  // Where the pieces cost more than the whole (their calls' fixed cost), the
  // pieces' price: 4 x 2 us against 6.
  curve = {};
  curve.add(250, 2);
  curve.add(1000, 6);
  EXPECT_EQ(codecOps(c, servers), (Ops{{22, 1}, {4 * 2 + 4, 1}}));
  // The first payload's add priced apart (ResolvedCodec::decodeFirstCurve):
  // 3 us at 250 elements, 24 at 1000, each further payload 1 and 6. The
  // allgather's decode of 4 payloads: 24 + 3 x 6 (+ 4 zeroing); the
  // servers' pieces of one payload each: 4 x 3, at least the whole's 24.
  curve = {};
  curve.add(250, 1);
  curve.add(1000, 6);
  auto& once = k.decodeFirstCurve[int(Device::kCpu)];
  once.add(250, 3);
  once.add(1000, 24);
  EXPECT_EQ(codecOps(c, gather), (Ops{{7, 1}, {24 + 3 * 6 + 4, 1}}));
  EXPECT_EQ(codecOps(c, servers), (Ops{{22, 1}, {24 + 4, 1}}));
  // The servers' decodes (the busiest server's 250 elements, one partition):
  // a task per machine's payload, each a share of the partition's four,
  // (3 + 3 x 1) / 4 us; without the first priced apart, one payload at 1 us.
  auto serverDecode = [&](const ResolvedCodec& kk) {
    for (const SimOp& op : compileOption(c, kk, 1000, 4, servers).ops)
      if (op.kind == OpKind::kServer) return std::pair<double, int>{op.us, op.tasks};
    return std::pair<double, int>{0, 0};
  };
  EXPECT_EQ(serverDecode(k), (std::pair<double, int>{1.5, 4}));
  ResolvedCodec plain = k;
  plain.decodeFirstCurve[int(Device::kCpu)] = {};
  EXPECT_EQ(serverDecode(plain), (std::pair<double, int>{1, 4}));
}

TEST(Simulator, CpuCodecDoesNotDelayComputationButQueues) {
  // Two tensors, 2 GPUs, 1 core, both CPU-compressed; t0 as above (finish
  // 40, core busy [15,25] encoding and [31,35] decoding). t1 is ready at 12
  // (CPU codecs do not slow computation):
  //   d2h: the lane holds [10,15] -> [15,20]
  //   encode task 1: the core is free in [25,31]: [25,30]
  //   encode task 2: no 5 us gap before t0's decode -> [35,40]
  //   h2d: t0 holds [25,27] and [35,40] -> [40,42]; allgather [42,43]
  //   d2h of 2000 B [43,46]; decode [46,48], [48,50]; h2d [50,55]
  auto opt = gatherCompressed(Device::kCpu, Device::kCpu);
  Simulator sim(cluster(1, 2, 1), codec(), model({{1000, 10}, {1000, 2}}), {opt});
  std::vector<TensorTiming> t;
  EXPECT_DOUBLE_EQ(sim.simulate({0, 0}, &t), 55.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 12.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 40.0);
}

TEST(Simulator, HierarchicalThroughTheServers) {
  // 2 machines x 2 GPUs, one tensor of 1000 floats, raw push and pull:
  //   intra reduce-scatter of 4000 B over 2: 1/2 * 4000 B = 2 -> [10,12], 500 elements per GPU
  //   d2h of 2000 B: 1 + 2 = 3 -> [12,15]
  //   push: both GPUs' shards (4000 B) over the NIC: 1/2 * 4000 B = 2 -> [15,17]
  //   server sum: 500 elements from each of 2 machines, 4000 B at 1000 B/us -> [17,21]
  //   pull 4000 B: [21,23]; h2d of 2000 B: 3 -> [23,26]
  //   intra allgather of 2000 B per GPU: 2 -> [26,28]
  TensorOption o{true,
                 {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
                  Step::comm(Scope::kInter, CommOp::kPush, false), Step::comm(Scope::kInter, CommOp::kPull, false),
                  Step::comm(Scope::kIntra, CommOp::kAllgather, false)},
                 ""};
  Simulator sim(cluster(2, 2, 4), codec(), model({{1000, 10}}), {o});
  EXPECT_DOUBLE_EQ(sim.simulate({0}), 28.0);
}

TEST(Simulator, OneTensorAtATimePushPullReachesOnlyItsChunksServers) {
  // 4 machines x 1 GPU, one tensor of 1000 floats (4000 B), raw push and pull.
  // Balanced over the 4 servers: push 3/4 * 4000 B = 3 us, each server sums
  // 250 elements from 4 machines (4 us), pull 3 us; and the copies to and
  // from the host, 1 + 4 us each.
  TensorOption o{true,
                 {Step::comm(Scope::kInter, CommOp::kPush, false), Step::comm(Scope::kInter, CommOp::kPull, false)},
                 ""};
  Cluster c = cluster(4, 1, 4);
  c.chunkBytes = 4000;
  ResolvedCodec k = codec();
  EXPECT_DOUBLE_EQ(compileOption(c, k, 1000, 4, o).pathUs, 5 + 3 + 4 + 3 + 5);
  // One tensor at a time: one chunk, one server, which receives all 4000 B
  // from each of the 3 other machines (12 us), sums the whole tensor from 4
  // (16 us) and sends it back to 3 (12 us).
  c.oneTensorAtATime = true;
  EXPECT_DOUBLE_EQ(compileOption(c, k, 1000, 4, o).pathUs, 5 + 12 + 16 + 12 + 5);
  // Two chunks: two servers, each with half.
  c.chunkBytes = 2000;
  EXPECT_DOUBLE_EQ(compileOption(c, k, 1000, 4, o).pathUs, 5 + 6 + 8 + 6 + 5);
  // Four chunks: every server, as balanced.
  c.chunkBytes = 1000;
  EXPECT_DOUBLE_EQ(compileOption(c, k, 1000, 4, o).pathUs, 5 + 3 + 4 + 3 + 5);
}

TEST(Simulator, OneTensorAtATimeStartsATensorWhenThePreviousHasEnded) {
  // t0 ready at 10: allreduce of 4000 B over 2 GPUs [10,14]. t1 ready at 11:
  // overlapped, its GPU encode runs beside t0's allreduce [11,14], then its
  // allgather [14,15] and decode [15,16]; one tensor at a time, it starts at
  // 14: encode [14,17], allgather [17,18], decode [18,19].
  Cluster c = cluster(1, 2, 4);
  Simulator overlapped(c, codec(), model({{1000, 10}, {1000, 1}}),
                       {kAllreduce, gatherCompressed(Device::kGpu, Device::kGpu)});
  EXPECT_DOUBLE_EQ(overlapped.simulate({0, 1}), 16.0);
  c.oneTensorAtATime = true;
  Simulator serial(c, codec(), model({{1000, 10}, {1000, 1}}),
                   {kAllreduce, gatherCompressed(Device::kGpu, Device::kGpu)});
  std::vector<TensorTiming> t;
  EXPECT_DOUBLE_EQ(serial.simulate({0, 1}, &t), 19.0);
  EXPECT_DOUBLE_EQ(t[1].ready, 11.0);
  // The planner's estimates place the tensor the same way.
  std::vector<double> est;
  serial.setBase({0, 1});
  serial.estimateOptions(1, {1}, est, Simulator::kInf);
  ASSERT_EQ(est.size(), 1u);
  EXPECT_DOUBLE_EQ(est[0], 19.0);
}

TEST(Simulator, FlatCollectiveHoldsBothLinks) {
  // 2 machines x 2 GPUs. t0 (ready 10) goes hierarchical with an inter
  // allreduce; t1 (ready 11) is a flat allreduce that needs the intra links
  // and the network at once.
  //   t0: intra rs [10,12] (2000 B), inter allreduce of 2 GPUs x 2000 B over
  //       2 machines: 2 * 1/2 * 4000 B = 4 -> [12,16], intra ag [16,18].
  //   t1: flat allreduce over 4 ranks: 2 * 3/4 * 4000 B = 6 us. The intra
  //       lane is free only in [12,16] (too short), the network from 16:
  //       first common gap of 6 us starts at 18 -> [18,24].
  TensorOption hier{true,
                    {Step::comm(Scope::kIntra, CommOp::kReduceScatter, false),
                     Step::comm(Scope::kInter, CommOp::kAllreduce, false),
                     Step::comm(Scope::kIntra, CommOp::kAllgather, false)},
                    ""};
  Simulator sim(cluster(2, 2, 4), codec(), model({{1000, 10}, {1000, 1}}), {hier, kAllreduce});
  std::vector<TensorTiming> t;
  EXPECT_DOUBLE_EQ(sim.simulate({0, 1}, &t), 24.0);
  EXPECT_DOUBLE_EQ(t[0].finish, 18.0);
}

// Incremental evaluation must equal a fresh simulation, whatever it skips.
TEST(Simulator, IncrementalEvaluationMatchesFullSimulation) {
  std::mt19937 rng(7);
  Cluster c = cluster(4, 4, 3);
  c.inter.base = AlphaBeta{20, 10};
  c.intra.base = AlphaBeta{5, 100};
  ModelProfile p;
  p.model = "random";
  for (int i = 0; i < 40; ++i)
    p.tensors.push_back(TensorProfile{fmt::format("t{}", i), int64_t(1000 + rng() % 3000000), 4,
                                      double(rng() % 3000)});
  ResolvedCodec cd = codecWithPerElementEncode();
  auto opts = plannerOptions(c, "test");
  Simulator sim(c, cd, p, opts);
  std::vector<int> base(40);
  for (int& b : base) b = rng() % opts.size();
  sim.setBase(base);
  EXPECT_DOUBLE_EQ(sim.baseTime(), sim.simulate(base));
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::pair<int, int>> ov;
    std::vector<int> choice = base;
    int n = 1 + rng() % 3;
    std::vector<int> idx;
    for (int k = 0; k < n; ++k) idx.push_back(rng() % 40);
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
    for (int j : idx) {
      int o = rng() % opts.size();
      ov.emplace_back(j, o);
      choice[j] = o;
    }
    const double full = sim.simulate(choice);
    expectEvaluateIsFull(sim, ov, full, trial);
  }
}


TEST(Simulator, TailEstimateIsExactWhenQueueBound) {
  // Three tensors of 1000 floats ready at 10, 11 and 12; each allreduce takes
  // 4 us, so the link is the bottleneck: [10,14], [14,18], [18,22]. After
  // simulating t0 alone, the estimate is the link's backlog (4 us from 10)
  // plus the later tensors' 8 us of link work: 22, the exact time.
  Simulator sim(cluster(1, 2, 4), codec(), model({{1000, 10}, {1000, 1}, {1000, 1}}), {kAllreduce});
  sim.setBase({0, 0, 0});
  EXPECT_DOUBLE_EQ(sim.baseTime(), 22.0);
  EXPECT_DOUBLE_EQ(sim.estimate(0, 0, {}), 22.0);
  std::vector<double> est;
  sim.estimateOptions(0, {0}, est);
  EXPECT_DOUBLE_EQ(est[0], 22.0);
  // With idle gaps the compute chain decides: 100 us of backward each, so
  // every allreduce ends 4 us after its tensor is ready (304).
  Simulator idle(cluster(1, 2, 4), codec(), model({{1000, 100}, {1000, 100}, {1000, 100}}), {kAllreduce});
  idle.setBase({0, 0, 0});
  EXPECT_DOUBLE_EQ(idle.baseTime(), 304.0);
  EXPECT_DOUBLE_EQ(idle.estimate(0, 0, {}), 304.0);
}

// Also with "gpu" codec steps off the computation (gpuCodecPausesCompute).
class SimulatorLazy : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(GpuCodecPausesCompute, SimulatorLazy, ::testing::Bool());

TEST_P(SimulatorLazy, LazyBaseAndEstimatesMatchFullSimulation) {
  std::mt19937 rng(11);
  Cluster c = cluster(4, 4, 3);
  c.gpuCodecPausesCompute = GetParam();
  c.inter.base = AlphaBeta{20, 10};
  c.intra.base = AlphaBeta{5, 100};
  ModelProfile p;
  p.model = "random";
  const int N = 40;
  for (int i = 0; i < N; ++i)
    p.tensors.push_back(TensorProfile{fmt::format("t{}", i), int64_t(1000 + rng() % 3000000), 4,
                                      double(rng() % 3000)});
  ResolvedCodec cd = codecWithPerElementEncode();
  auto opts = plannerOptions(c, "test");
  const int K = int(opts.size());
  Simulator sim(c, cd, p, opts);
  std::vector<int> choice(N);
  for (int& b : choice) b = rng() % K;
  sim.setBase(choice);
  std::vector<int> all(K);
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> est, bounded;
  for (int trial = 0; trial < 100; ++trial) {
    // The base changes without a re-simulation; everything below must still
    // see the changed base.
    const int j = rng() % N, o = rng() % K;
    choice[j] = o;
    sim.changeBase(j, o);
    const int k = rng() % N, q = rng() % K;
    std::vector<int> alt = choice;
    alt[k] = q;
    const double full = sim.simulate(alt);
    EXPECT_DOUBLE_EQ(sim.simulateFrom(k, {{k, q}}), full) << "trial " << trial;
    // An estimate whose window reaches the end is exact.
    EXPECT_DOUBLE_EQ(sim.estimate(k, N - 1, {{k, q}}), full) << "trial " << trial;
    // estimateOptions places the tensor without copying the state: the same
    // values as estimate() with no window; with a bound, the values at or
    // below it are the same and the others stay above it.
    sim.estimateOptions(k, all, est);
    const double bound = est[rng() % K];
    sim.estimateOptions(k, all, bounded, bound);
    for (int x = 0; x < K; x += 7) EXPECT_DOUBLE_EQ(est[x], sim.estimate(k, k, {{k, x}})) << "option " << x;
    for (int x = 0; x < K; ++x) {
      if (est[x] <= bound) EXPECT_DOUBLE_EQ(bounded[x], est[x]);
      else EXPECT_GT(bounded[x], bound);
    }
    if (trial % 50 == 49) {
      EXPECT_DOUBLE_EQ(sim.exactBaseTime(), sim.simulate(choice));
      sim.setBase(choice);
      EXPECT_DOUBLE_EQ(sim.baseTime(), sim.simulate(choice));
    }
  }
}

// --- Tensor fusion (Cluster::fusionBytes, one tensor at a time) -------------

// The executor's batch loop written out plainly (bench model's replay with
// Executor::runBatch): when the executor is free, every tensor ready by then
// is the batch (none ready: the next one, when it is); inside it, runs of
// equal fusible options fuse while their bytes stay within the threshold.
// `alone(elements, option)` is the time of one execution on idle lanes.
template <typename Alone>
std::vector<double> referenceFinish(const ModelProfile& p, const std::vector<TensorOption>& opts,
                                    const std::vector<int>& choice, uint64_t threshold, double agree,
                                    Alone alone) {
  const int N = int(p.tensors.size());
  std::vector<double> ready(N), finish(N);
  double r = 0;
  for (int j = 0; j < N; ++j) ready[j] = r += p.tensors[j].backwardUs;
  double free = 0;
  for (int j = 0; j < N;) {
    const double formed = std::max(free, ready[j]);
    int end = j;
    while (end < N && ready[end] <= formed) ++end;
    // The workers agree on the batch, then run it (fusion off: no batches):
    // the lone tensors in order, then per fusible option its tensors packed
    // in order within the threshold. A fused member's finish is reported as
    // the batch's end.
    double t = formed + (threshold > 0 ? agree : 0.0);
    std::vector<std::vector<int>> byOption;
    for (int i = j; i < end; ++i) {
      if (threshold == 0 || !opts[choice[i]].fusible()) {
        t += alone(p.tensors[i].elements, choice[i]);
        finish[i] = t;
        continue;
      }
      bool found = false;
      for (auto& g : byOption)
        if (choice[g[0]] == choice[i]) g.push_back(i), found = true;
      if (!found) byOption.push_back({i});
    }
    for (const auto& g : byOption) {
      int64_t elements = 0;
      for (int i : g) {
        if (elements > 0 && uint64_t(elements + p.tensors[i].elements) * 4 > threshold) {
          t += alone(elements, choice[g[0]]);
          elements = 0;
        }
        elements += p.tensors[i].elements;
      }
      t += alone(elements, choice[g[0]]);
    }
    for (const auto& g : byOption)
      for (int i : g) finish[i] = t;
    free = t;
    j = end;
  }
  return finish;
}

Cluster fusionCluster(uint64_t threshold) {
  Cluster c = cluster(2, 1, 4);
  c.intra.base = AlphaBeta{3, 8};
  c.inter.base = AlphaBeta{5, 8};
  c.oneTensorAtATime = true;
  c.fusionBytes = threshold;
  return c;
}

const TensorOption kRsAg{false,
                         {Step::comm(Scope::kFlat, CommOp::kReduceScatter, false),
                          Step::comm(Scope::kFlat, CommOp::kAllgather, false)},
                         ""};
const TensorOption kPushPull{true,
                             {Step::comm(Scope::kInter, CommOp::kPush, false),
                              Step::comm(Scope::kInter, CommOp::kPull, false)},
                             ""};

TEST(Simulator, FusionFollowsTheExecutorsBatchesByHand) {
  // 2 machines x 1 GPU. t0 ready at 10 runs alone (nothing else is ready);
  // t1..t3 (ready 11, 12, 13) are ready when t0 ends, so they are one batch.
  const ModelProfile p = model({{1000, 10}, {1000, 1}, {1000, 1}, {500, 1}});
  const std::vector<TensorOption> opts{kAllreduce, kPushPull, kRsAg};
  auto alone = [&](int64_t e, int o) {
    Simulator one(fusionCluster(0), codec(), model({{e, 0}}), opts);
    return one.simulate({o});
  };
  const double A1 = alone(1000, 0), A2 = alone(2000, 0), A05 = alone(500, 0), A25 = alone(2500, 0);
  ASSERT_GT(A1, 1.0);  // t1 is ready before t0 ends
  ASSERT_LT(A2, 2 * A1);  // one latency less
  auto run = [&](uint64_t threshold, const std::vector<int>& choice,
                 std::vector<TensorTiming>* t = nullptr,
                 std::vector<TraceEvent>* trace = nullptr) {
    Simulator sim(fusionCluster(threshold), codec(), p, opts);
    return sim.simulate(choice, t, trace);
  };
  // 8000 bytes: t1 + t2 exactly fit (fused), t3 would exceed it (alone).
  std::vector<TensorTiming> t;
  std::vector<TraceEvent> trace;
  EXPECT_NEAR(run(8000, {0, 0, 0, 0}, &t, &trace), 10 + A1 + A2 + A05, 1e-9);
  EXPECT_NEAR(t[0].finish, 10 + A1, 1e-9);
  for (int k : {1, 2, 3}) EXPECT_NEAR(t[k].finish, 10 + A1 + A2 + A05, 1e-9) << k;  // the batch's end
  int fusedEvents = 0;
  for (const TraceEvent& e : trace) {
    fusedEvents += e.name.find("fused2:t1..t2") != std::string::npos;
    EXPECT_FALSE(e.lane >= 0 && e.name.size() > 3 && e.name.substr(e.name.size() - 3) == " t1" &&
                 e.name.find("backward") == std::string::npos)
        << "t1's own execution is still traced: " << e.name;
  }
  EXPECT_GT(fusedEvents, 0);
  // The Chrome trace names the group as the tensor, so that `cortado trace
  // compare` finds the stage in front of it.
  Simulator traced(fusionCluster(8000), codec(), p, opts);
  const auto j = nlohmann::json::parse(chromeTrace(traced, trace));
  int fusedArgs = 0;
  for (const auto& e : j["traceEvents"])
    if (e.contains("args") && e["args"].contains("tensor") && e["args"]["tensor"] == "fused2:t1..t2") {
      ++fusedArgs;
      EXPECT_EQ(e["name"].get<std::string>().rfind(" fused2:t1..t2"), e["name"].get<std::string>().size() - 14);
    }
  EXPECT_EQ(fusedArgs, fusedEvents);
  // One byte less: t1 runs alone, t2 + t3 (6000 bytes) fuse; below 6000
  // nothing fuses. Off: the same.
  EXPECT_NEAR(run(7999, {0, 0, 0, 0}), 10 + 2 * A1 + alone(1500, 0), 1e-9);
  EXPECT_NEAR(run(6000, {0, 0, 0, 0}), 10 + 2 * A1 + alone(1500, 0), 1e-9);
  EXPECT_NEAR(run(5999, {0, 0, 0, 0}), 10 + 3 * A1 + A05, 1e-9);
  EXPECT_NEAR(run(0, {0, 0, 0, 0}), 10 + 3 * A1 + A05, 1e-9);
  // 10000 bytes: the whole batch fuses.
  EXPECT_NEAR(run(10000, {0, 0, 0, 0}), 10 + A1 + A25, 1e-9);
  // A push/pull tensor between them runs alone, first; t1 and t3 fuse.
  EXPECT_NEAR(run(1 << 20, {0, 0, 1, 0}), 10 + A1 + alone(1000, 1) + alone(1500, 0), 1e-9);
  // Different fusible options do not fuse with each other.
  EXPECT_NEAR(run(1 << 20, {0, 0, 2, 2}), 10 + 2 * A1 + alone(1500, 2), 1e-9);
  // A tensor ready after the batch was formed is in the next batch: with
  // 100 us of backward each, every tensor runs alone.
  const ModelProfile slow = model({{1000, 100}, {1000, 100}, {1000, 100}});
  Simulator s(fusionCluster(1 << 20), codec(), slow, opts);
  EXPECT_NEAR(s.simulate({0, 0, 0}), 300 + A1, 1e-9);
}

// With "gpu" codec steps off the computation (the replay's host buffers,
// Cluster::gpuCodecPausesCompute false) and such options among the choices,
// the same holds: the simulator is `cortado bench model`'s timeline.
TEST(Simulator, FusionMatchesTheBruteForceBatchLoop) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 120; ++trial) {
    const bool gpuCodec = trial >= 60;
    std::vector<TensorOption> opts{kAllreduce, kPushPull, kRsAg};
    if (gpuCodec) opts.push_back(gatherCompressed(Device::kGpu, Device::kGpu));
    auto clusterOf = [&](uint64_t threshold) {
      Cluster c = fusionCluster(threshold);
      c.gpuCodecPausesCompute = !gpuCodec;
      return c;
    };
    ModelProfile p;
    p.model = "random";
    const int N = 3 + int(rng() % 10);
    for (int i = 0; i < N; ++i)
      p.tensors.push_back(TensorProfile{fmt::format("t{}", i), int64_t(1 + rng() % 3000), 4,
                                        double(rng() % 4 == 0 ? rng() % 40 : rng() % 3)});
    const uint64_t threshold = trial % 5 == 0 ? 0 : 4 * (1 + rng() % 6000);
    std::vector<int> choice(N);
    for (int& c : choice) c = rng() % 4 == 0 ? int(rng() % opts.size()) : 0;
    auto alone = [&](int64_t e, int o) {
      Simulator one(clusterOf(0), codec(), model({{e, 0}}), opts);
      return one.simulate({o});
    };
    const double agree = trial % 2 ? 0.0 : 1.5;
    const auto expect = referenceFinish(p, opts, choice, threshold, agree, alone);
    Cluster c = clusterOf(threshold);
    c.batchAgreeUs = agree;
    Simulator sim(c, codec(), p, opts);
    std::vector<TensorTiming> t;
    const double total = sim.simulate(choice, &t);
    for (int j = 0; j < N; ++j) EXPECT_NEAR(t[j].finish, expect[j], 1e-9) << "trial " << trial << " tensor " << j;
    EXPECT_NEAR(total, *std::max_element(expect.begin(), expect.end()), 1e-9) << "trial " << trial;
  }
}

// Incremental evaluation (checkpoints, early stops, cut-offs) with fusion.
TEST(Simulator, FusionIncrementalEvaluationMatchesFullSimulation) {
  std::mt19937 rng(31);
  Cluster c = cluster(4, 2, 3);
  c.inter.base = AlphaBeta{20, 10};
  c.intra.base = AlphaBeta{5, 100};
  c.oneTensorAtATime = true;
  c.fusionBytes = 400000;
  ModelProfile p;
  p.model = "random";
  const int N = 40;
  for (int i = 0; i < N; ++i)
    p.tensors.push_back(TensorProfile{fmt::format("t{}", i), int64_t(100 + rng() % (i % 3 ? 50000 : 3000000)), 4,
                                      double(rng() % 300)});
  ResolvedCodec cd = codecWithPerElementEncode();
  auto opts = plannerOptions(c, "test");
  Simulator sim(c, cd, p, opts);
  int fusibleOpt = -1;
  for (int o = 0; o < int(opts.size()) && fusibleOpt < 0; ++o)
    if (opts[o].fusible()) fusibleOpt = o;
  ASSERT_GE(fusibleOpt, 0);
  std::vector<int> base(N);
  for (int& b : base) b = rng() % 3 ? fusibleOpt : int(rng() % opts.size());
  sim.setBase(base);
  EXPECT_DOUBLE_EQ(sim.baseTime(), sim.simulate(base));
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::pair<int, int>> ov;
    std::vector<int> choice = base;
    std::vector<int> idx;
    for (int k = 0, n = 1 + rng() % 3; k < n; ++k) idx.push_back(rng() % N);
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
    for (int j : idx) {
      int o = rng() % 2 ? fusibleOpt : int(rng() % opts.size());
      ov.emplace_back(j, o);
      choice[j] = o;
    }
    const double full = sim.simulate(choice);
    expectEvaluateIsFull(sim, ov, full, trial);
    // A screen whose window reaches the end is exact.
    if (ov.size() == 1) {
      EXPECT_NEAR(sim.screen(ov[0].first, ov[0].second, N), full, 1e-6);
    }
  }
}

}  // namespace
}  // namespace cortado::planner
