#include "compressor/gravac.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/common/error.h"

namespace cortado::compressor {

const char* gravacPolicyName(GravacPolicy policy) {
  return policy == GravacPolicy::kGeometric ? "geometric" : "exponential";
}

GravacPolicy parseGravacPolicy(std::string_view name) {
  if (name == "exponential") return GravacPolicy::kExponential;
  if (name == "geometric") return GravacPolicy::kGeometric;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("GraVAC policy '{}' is unknown: use exponential (theta_s squared at "
                          "each window) or geometric (theta_s doubled)",
                          name));
}

const char* gravacLevelName(GravacLevel level) {
  switch (level) {
    case GravacLevel::kCandidate: return "candidate";
    case GravacLevel::kMinimum: return "minimum";
    case GravacLevel::kDense: return "dense";
  }
  return "unknown";
}

void GravacOptions::validate() const {
  CORTADO_ENFORCE(codec == "topk" || codec == "dgc" || codec == "randomk",
                  ErrorCode::kInvalidArgument,
                  "GraVAC codec '{}' is not a sparsifier it can compress in two levels: use "
                  "topk, dgc or randomk",
                  codec);
  CORTADO_ENFORCE(std::isfinite(minRatio) && minRatio >= 1.0, ErrorCode::kInvalidArgument,
                  "GraVAC min_ratio is {}: it is a compression factor (10 keeps 10%), at least 1",
                  minRatio);
  CORTADO_ENFORCE(std::isfinite(maxRatio) && maxRatio <= 1e6, ErrorCode::kInvalidArgument,
                  "GraVAC max_ratio is {}: at most 1e6 (the codecs keep at least 1e-6 of a tensor)",
                  maxRatio);
  CORTADO_ENFORCE(maxRatio > minRatio, ErrorCode::kInvalidArgument,
                  "GraVAC ratios are out of order: min_ratio {} must be below max_ratio {}",
                  minRatio, maxRatio);
  CORTADO_ENFORCE(std::isfinite(step) && step > 1.0, ErrorCode::kInvalidArgument,
                  "GraVAC step is {}: the first candidate is min_ratio x step, so step must be "
                  "above 1 (the paper starts at 2)",
                  step);
  CORTADO_ENFORCE(window >= 1, ErrorCode::kInvalidArgument,
                  "GraVAC window is {}: at least 1 iteration between scale-ups (the paper: 500 "
                  "exponential, 2000 geometric)",
                  window);
  CORTADO_ENFORCE(std::isfinite(epsilon) && epsilon > 0.0 && epsilon <= 1.0,
                  ErrorCode::kInvalidArgument,
                  "GraVAC epsilon is {}: the least gain sent must be in (0, 1] (the paper: 0.7 or "
                  "0.9)",
                  epsilon);
  CORTADO_ENFORCE(std::isfinite(omega) && omega >= 0.0 && omega < 1.0, ErrorCode::kInvalidArgument,
                  "GraVAC omega is {}: the relative tolerance must be in [0, 1) (the paper: 0.01)",
                  omega);
  CORTADO_ENFORCE(std::isfinite(alpha) && alpha >= 0.0 && alpha <= 1.0, ErrorCode::kInvalidArgument,
                  "GraVAC alpha is {}: the EWMA weight must be in (0, 1], or 0 for workers / 100",
                  alpha);
}

double GravacOptions::smoothing(int workers) const {
  if (alpha > 0) return alpha;
  return std::clamp(static_cast<double>(workers) / 100.0, 0.01, 1.0);
}

GravacController::GravacController(GravacOptions options, int workers, double samplesPerIteration)
    : options_(std::move(options)), samples_(samplesPerIteration) {
  options_.validate();
  CORTADO_ENFORCE(workers >= 1, ErrorCode::kInvalidArgument,
                  "GraVAC needs at least 1 worker, got {}", workers);
  CORTADO_ENFORCE(std::isfinite(samplesPerIteration) && samplesPerIteration > 0,
                  ErrorCode::kInvalidArgument,
                  "GraVAC samples per iteration is {}: it must be positive (workers x batch)",
                  samplesPerIteration);
  alpha_ = options_.smoothing(workers);
  minRatio_ = options_.minRatio;
  step_ = capStep(options_.step);
}

double GravacController::capStep(double step) const {
  // The candidate never passes max_ratio, and never falls below the minimum.
  return std::max(1.0, std::min(step, options_.maxRatio / minRatio_));
}

GravacStep GravacController::step(const GravacSums& sums, double previousSeconds) {
  CORTADO_ENFORCE(std::isfinite(sums.compensated) && std::isfinite(sums.minimum) &&
                      std::isfinite(sums.candidate) && sums.compensated >= 0 && sums.minimum >= 0 &&
                      sums.candidate >= 0,
                  ErrorCode::kInvalidArgument,
                  "GraVAC step {}: gradient energies must be finite and non-negative, got "
                  "compensated {}, minimum {}, candidate {} (a NaN or inf in a gradient?)",
                  iteration_ + 1, sums.compensated, sums.minimum, sums.candidate);
  // 1. The previous iteration's throughput, now that its duration is known.
  if (pending_ && std::isfinite(previousSeconds) && previousSeconds > 0) {
    auto& r = records_[pendingRatio_];
    r.push_back(samples_ / previousSeconds * pendingGain_);
    while (r.size() > options_.window) r.pop_front();
  }
  pending_ = false;

  // 2. Gains: the share of the compensated gradient's energy each level keeps.
  // A zero gradient loses nothing at any ratio.
  auto gain = [&](double kept) {
    return sums.compensated > 0 ? std::clamp(kept / sums.compensated, 0.0, 1.0) : 1.0;
  };
  double sampleMin = gain(sums.minimum);
  double sampleCandidate = gain(sums.candidate);
  if (!smoothed_) {
    gainMin_ = sampleMin;
    gainCandidate_ = sampleCandidate;
    smoothed_ = true;
  } else {
    gainMin_ = alpha_ * sampleMin + (1 - alpha_) * gainMin_;
    gainCandidate_ = alpha_ * sampleCandidate + (1 - alpha_) * gainCandidate_;
  }

  // 3. What goes out: the highest CF whose gain passes epsilon, else dense.
  GravacStep s;
  s.iteration = ++iteration_;
  s.minRatio = minRatio_;
  s.candidateRatio = candidateRatio();
  s.gainMin = gainMin_;
  s.gainCandidate = gainCandidate_;
  if (gainCandidate_ >= options_.epsilon) {
    s.level = GravacLevel::kCandidate;
    s.ratio = s.candidateRatio;
    pendingGain_ = gainCandidate_;
  } else if (gainMin_ >= options_.epsilon) {
    s.level = GravacLevel::kMinimum;
    s.ratio = s.minRatio;
    pendingGain_ = gainMin_;
  } else {
    s.level = GravacLevel::kDense;
    s.ratio = 1.0;
    pendingGain_ = 1.0;
  }
  pending_ = true;
  pendingRatio_ = s.ratio;

  // 4. Scale up at window boundaries.
  if (iteration_ % options_.window == 0 && !saturated_) check(gainMin_, gainCandidate_);
  s.nextMinRatio = minRatio_;
  s.nextCandidateRatio = candidateRatio();
  s.saturated = saturated_;
  return s;
}

void GravacController::check(double gainMin, double gainCandidate) {
  // The candidate kept as much as the minimum: it becomes the new minimum.
  // (Algorithm 1 scales theta_s first; the paper's text raises theta_min to
  // the CF just tried, which is what this does.)
  if (gainMin > 0 && std::abs(gainMin - gainCandidate) / gainMin <= options_.omega)
    minRatio_ = std::min(candidateRatio(), options_.maxRatio);
  double next = options_.policy == GravacPolicy::kExponential ? step_ * step_ : 2.0 * step_;
  step_ = capStep(next);

  // Saturation: the two best CFs give throughputs within omega; settle on
  // the lower CF of the two (the paper's text: its geometric run stops at
  // 1280x, not 2000x).
  std::vector<std::pair<double, double>> ranked;  // (throughput, CF)
  for (const auto& [cf, r] : records_) {
    if (r.empty()) continue;
    double sum = 0;
    for (double v : r) sum += v;
    ranked.emplace_back(sum / static_cast<double>(r.size()), cf);
  }
  if (ranked.size() < 2) return;
  std::sort(ranked.begin(), ranked.end(), std::greater<>());
  double best = ranked[0].first, second = ranked[1].first;
  if (second > 0 && (best - second) / second <= options_.omega) {
    saturated_ = true;
    double pick = std::min(ranked[0].second, ranked[1].second);
    if (pick >= minRatio_) {
      step_ = capStep(pick / minRatio_);
    } else {
      // The better CFs lie below the current minimum: go back down to them,
      // but not below the user's minimum (a dense record has CF 1).
      minRatio_ = std::max(pick, options_.minRatio);
      step_ = capStep(pick / minRatio_);
    }
  }
}

std::map<double, double> GravacController::throughputs() const {
  std::map<double, double> out;
  for (const auto& [cf, r] : records_) {
    if (r.empty()) continue;
    double sum = 0;
    for (double v : r) sum += v;
    out[cf] = sum / static_cast<double>(r.size());
  }
  return out;
}

}  // namespace cortado::compressor
