// The GraVAC settings that the executor's GraVAC checks share, in threads
// (tests/core/executor_gravac_test.cc) and under mpirun
// (tests/multiprocess/exec_check_gravac.cc): top-k between 2x and 64x, a
// short window and a loose epsilon, so that a run of a few iterations
// moves through GraVAC's levels and ratios.
#pragma once

#include "compressor/gravac_compressor.h"

namespace cortado::test {

inline compressor::GravacOptions gravacTestOptions() {
  compressor::GravacOptions o;
  o.codec = "topk";
  o.minRatio = 2;
  o.maxRatio = 64;
  o.window = 3;
  o.epsilon = 0.9;
  o.omega = 0.0;
  o.alpha = 0.5;
  return o;
}

}  // namespace cortado::test
