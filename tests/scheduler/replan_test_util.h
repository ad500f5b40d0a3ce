// What the re-planner's tests share (replan_test.cc, replan_truth_test.cc).
#pragma once

#include "scheduler/replan.h"

namespace cortado::scheduler::test {

inline constexpr const char* kCodec = "dgc:ratio=0.01";

// The re-planner's options in these tests.
inline ReplanOptions options() {
  ReplanOptions o;
  o.codec = kCodec;
  o.ahead = 5;
  o.threshold = 0.25;
  o.inter = "10gbit";
  o.intra = "pcie";
  o.cpuCores = 8;
  // One window beyond the threshold re-plans in these tests of what a
  // moved link does; the default's confirmation (2 windows) has its own.
  o.confirmWindows = 1;
  return o;
}

}  // namespace cortado::scheduler::test
