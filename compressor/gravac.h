// GraVAC's controller (Tyagi and Swany, "GraVAC: Adaptive Compression for
// Communication-Efficient Distributed DL Training", CLOUD 2023): it chooses
// the compression factor (CF = original size / compressed size, 10 = keep
// 10%) of a sparsifying codec each iteration from the compression gain and
// the measured iteration time. docs/codecs.md explains it for users;
// /work/shared/specs/gravac.md has the paper's algorithm.
//
// Each iteration i the caller encodes every tensor's error-compensated
// gradient g_ef at the minimum CF theta_min and, from that payload, at the
// candidate CF theta_min * theta_s (gravac_compressor.h does both), and sums
// over the tensors E = sum |g_ef|^2, E_min = sum |g_min|^2, E_c = sum |g_c|^2.
// step() then:
//   1. records the previous iteration's compression throughput
//      Tc[CF sent] <- samples / seconds * gain of what was sent
//      (a mean over that CF's last `window` records);
//   2. smooths the gains d_min = EWMA(E_min / E), d_c = EWMA(E_c / E);
//   3. picks what this iteration sends: the candidate if d_c >= epsilon,
//      else the minimum if d_min >= epsilon, else the dense tensor;
//   4. every `window` iterations, unless the search has stopped: raises
//      theta_min to the candidate when |d_min - d_c| / d_min <= omega, scales
//      theta_s (exponential: squared; geometric: doubled; capped so the
//      candidate stays <= max CF), and stops the search when the two highest
//      throughputs in Tc are within omega of each other, settling the
//      candidate on the lower of their two CFs.
// Changes made in 4 take effect from the next iteration's encode.
//
// Agreement: step() is a pure function of its inputs and the controller's
// state, so workers that pass the same sums and seconds (reduced across
// workers: GravacSums are summed, the seconds averaged) take the same
// decisions, iteration by iteration. The controller does no communication.
//
// Threads: not thread-safe; one owner calls step() once per iteration.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>

namespace cortado::compressor {

enum class GravacPolicy : uint8_t { kExponential = 0, kGeometric = 1 };
const char* gravacPolicyName(GravacPolicy policy);
// "exponential" or "geometric"; throws kInvalidArgument naming both otherwise.
GravacPolicy parseGravacPolicy(std::string_view name);

// What one iteration sends, in the order they are tried.
enum class GravacLevel : uint8_t { kCandidate = 0, kMinimum = 1, kDense = 2 };
const char* gravacLevelName(GravacLevel level);

// The paper's defaults (DGC, exponential scaling, [10x, 1000x], window 500,
// epsilon 0.9, omega 1%). Ratios are compression factors, not kept fractions.
struct GravacOptions {
  std::string codec = "dgc";  // the sparsifier: topk, dgc or randomk
  double minRatio = 10.0;     // theta_min at the start, >= 1
  double maxRatio = 1000.0;   // theta_max, > minRatio, <= 1e6
  double step = 2.0;          // theta_s at the start, > 1
  GravacPolicy policy = GravacPolicy::kExponential;
  uint64_t window = 500;  // iterations between scale-ups, >= 1
  double epsilon = 0.9;   // least smoothed gain that may be sent, in (0, 1]
  double omega = 0.01;    // relative tolerance of the gain and saturation tests, in [0, 1)
  double alpha = 0.0;     // EWMA weight of the newest gain, in (0, 1]; 0: workers / 100
  uint64_t seed = 0;      // random-k's codec seed

  // Throws kInvalidArgument naming the field, its value and the valid range.
  void validate() const;
  // alpha, or (alpha == 0) the paper's workers / 100 clamped to [0.01, 1].
  double smoothing(int workers) const;
};

// Squared L2 norms summed over the compressed tensors (and, once reduced,
// over the workers).
struct GravacSums {
  double compensated = 0;  // sum |g_ef|^2
  double minimum = 0;      // sum |g_min|^2, g_min = C(g_ef, theta_min)
  double candidate = 0;    // sum |g_c|^2, g_c = C(g_min, theta_s)
};

// One iteration's decision.
struct GravacStep {
  uint64_t iteration = 0;  // 1 for the first step
  GravacLevel level = GravacLevel::kDense;
  double ratio = 1.0;     // CF sent (1: dense)
  double minRatio = 1.0;  // the CFs this iteration encoded at
  double candidateRatio = 1.0;
  double gainMin = 1.0;  // smoothed gains after this iteration's sample
  double gainCandidate = 1.0;
  double nextMinRatio = 1.0;  // the CFs of the next iteration's encode
  double nextCandidateRatio = 1.0;
  bool saturated = false;  // the search has stopped (after this step's check)
};

class GravacController {
 public:
  // workers: the job's worker count (for the default alpha); samplesPerIteration:
  // N * batch per worker, the numerator of the system throughput (any
  // constant works for the comparisons, 1 by default). Validates options.
  GravacController(GravacOptions options, int workers, double samplesPerIteration = 1.0);

  const GravacOptions& options() const { return options_; }
  double alpha() const { return alpha_; }
  double minRatio() const { return minRatio_; }
  double stepFactor() const { return step_; }
  double candidateRatio() const { return minRatio_ * step_; }
  bool saturated() const { return saturated_; }
  uint64_t iteration() const { return iteration_; }

  // One iteration (see the file comment). `sums`: this iteration's, agreed
  // by all workers; `previousSeconds`: the previous iteration's duration,
  // agreed too (<= 0: none, e.g. on the first step). Throws kInvalidArgument
  // on negative or non-finite sums.
  GravacStep step(const GravacSums& sums, double previousSeconds);

  // Tc: CF -> mean compression throughput (samples/s x gain) of its records.
  std::map<double, double> throughputs() const;

 private:
  void check(double gainMin, double gainCandidate);
  double capStep(double step) const;

  GravacOptions options_;
  double alpha_;
  double samples_;
  double minRatio_;
  double step_;
  bool saturated_ = false;
  uint64_t iteration_ = 0;
  bool smoothed_ = false;
  double gainMin_ = 1.0;
  double gainCandidate_ = 1.0;
  // The previous iteration's (CF sent, gain sent), recorded once its time is known.
  bool pending_ = false;
  double pendingRatio_ = 1.0;
  double pendingGain_ = 1.0;
  std::map<double, std::deque<double>> records_;
};

}  // namespace cortado::compressor
