// The hand-computed timelines' setting, shared by simulator_test.cc and
// sync_skew_test.cc: links at 8 Gbit/s (1000 bytes per microsecond) with
// zero latency and codec costs fixed per call, so that every duration is a
// small round number.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "scheduler/planner/simulator.h"

namespace cortado::planner::hand {

inline Cluster cluster(int machines, int gpus, int cores) {
  Cluster c;
  c.machines = machines;
  c.gpusPerMachine = gpus;
  c.intra.base = AlphaBeta{0, 8};
  c.inter.base = AlphaBeta{0, 8};
  c.d2h = AlphaBeta{1, 8};
  c.h2d = AlphaBeta{1, 8};
  c.cpuCores = cores;
  c.cpuSumGbps = 8;
  return c;
}

// Payload: a quarter of the elements at 4 bytes each, no header. GPU encode
// 3 us, GPU decode 1 us, CPU encode 5 us, CPU decode 2 us, whatever the size.
inline ResolvedCodec codec() {
  ResolvedCodec r;
  r.spec = "test";
  r.cost.headerBytes = 0;
  r.cost.bytesPerSelected = 4;
  r.selectedFraction = 0.25;
  r.cost.encode[int(plan::Device::kGpu)].fixedUs = 3;
  r.cost.decode[int(plan::Device::kGpu)].fixedUs = 1;
  r.cost.encode[int(plan::Device::kCpu)].fixedUs = 5;
  r.cost.decode[int(plan::Device::kCpu)].fixedUs = 2;
  return r;
}

// Tensors t0, t1, ... of (elements, backward us), float32.
inline ModelProfile model(std::vector<std::pair<int64_t, double>> tensors) {
  ModelProfile p;
  p.model = "hand";
  for (size_t i = 0; i < tensors.size(); ++i)
    p.tensors.push_back(TensorProfile{fmt::format("t{}", i), tensors[i].first, 4, tensors[i].second});
  return p;
}

inline const plan::TensorOption kAllreduce{
    false, {plan::Step::comm(plan::Scope::kFlat, plan::CommOp::kAllreduce, false)}, ""};

}  // namespace cortado::planner::hand
