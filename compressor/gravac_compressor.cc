#include "compressor/gravac_compressor.h"

#include <algorithm>
#include <cstring>

#include "core/common/error.h"

namespace cortado::compressor {

GravacCompressor::GravacCompressor(const Registry& registry, GravacOptions options, int workers,
                                   double samplesPerIteration)
    : codec_((options.validate(), registry), options.codec, options.seed),
      controller_(options, workers, samplesPerIteration),
      momentum_(codec_.momentumCorrection()) {}

GravacCompressor::State& GravacCompressor::stateFor(uint64_t key, size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = states_[key];
  if (!slot) {
    slot = std::make_unique<State>();
    slot->n = n;
    slot->residual.assign(n, 0.0f);
    if (momentum_ > 0) slot->velocity.assign(n, 0.0f);
  }
  CORTADO_ENFORCE(slot->n == n, ErrorCode::kInvalidArgument,
                  "GraVAC: tensor key {} had {} elements, now {}", key, slot->n, n);
  return *slot;
}

const GravacCompressor::State& GravacCompressor::existing(uint64_t key, const char* what) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  CORTADO_ENFORCE(it != states_.end(), ErrorCode::kInvalidArgument,
                  "GraVAC {}: tensor key {} was never prepared", what, key);
  return *it->second;
}

void GravacCompressor::prepare(uint64_t key, const float* grad, size_t n,
                               const EncodeContext& ctx) {
  State& s = stateFor(key, n);
  CORTADO_ENFORCE(!s.prepared, ErrorCode::kInvalidArgument,
                  "GraVAC: tensor key {} was prepared twice in iteration {}; call decide() "
                  "once per iteration, after every tensor's prepare()",
                  key, controller_.iteration() + 1);
  float* e = s.residual.data();
  double energy = 0;
  if (momentum_ > 0) {
    float* u = s.velocity.data();
    for (size_t i = 0; i < n; ++i) {
      u[i] = momentum_ * u[i] + grad[i];
      e[i] += u[i];
      energy += static_cast<double>(e[i]) * e[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      e[i] += grad[i];
      energy += static_cast<double>(e[i]) * e[i];
    }
  }
  const double minCf = controller_.minRatio();
  const double candidateCf = controller_.candidateRatio();
  s.minimum.resize(codec_.payloadBytes(n, minCf));
  s.minimum.resize(codec_.encode(e, n, minCf, s.minimum, ctx));
  s.candidate.resize(codec_.payloadBytes(n, candidateCf));
  s.candidate.resize(codec_.recompress(s.minimum, n, candidateCf, s.candidate, ctx));
  s.energy = energy;
  s.energyMin = MultiLevelCodec::energy(s.minimum);
  s.energyCandidate = MultiLevelCodec::energy(s.candidate);
  s.prepared = true;
  s.ready = false;
}

GravacSums GravacCompressor::localSums() const {
  std::lock_guard<std::mutex> lk(mu_);
  GravacSums sums;
  for (const auto& [key, s] : states_) {
    if (!s->prepared) continue;
    sums.compensated += s->energy;
    sums.minimum += s->energyMin;
    sums.candidate += s->energyCandidate;
  }
  return sums;
}

GravacStep GravacCompressor::decide(const GravacSums& agreed, double previousSeconds) {
  GravacStep step = controller_.step(agreed, previousSeconds);
  level_ = step.level;
  decided_ = true;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [key, s] : states_) {
    if (s->prepared)
      commit(*s);
    else
      s->ready = false;  // not part of this iteration
  }
  return step;
}

void GravacCompressor::commit(State& s) {
  s.prepared = false;
  s.ready = true;
  if (level_ == GravacLevel::kDense) {
    // Everything goes out: the residual (and DGC's momentum) start over.
    std::swap(s.dense, s.residual);
    s.residual.assign(s.n, 0.0f);
    std::fill(s.velocity.begin(), s.velocity.end(), 0.0f);
    s.minimum.clear();
    s.candidate.clear();
    return;
  }
  const auto& sent = level_ == GravacLevel::kCandidate ? s.candidate : s.minimum;
  codec_.decompressAdd(sent, s.n, s.residual.data(), -1.0f);
  if (momentum_ > 0) codec_.zeroSent(sent, s.n, s.velocity.data());
  s.dense.clear();
}

std::span<const std::byte> GravacCompressor::message(uint64_t key) const {
  const State& s = existing(key, "message");
  CORTADO_ENFORCE(decided_ && s.ready, ErrorCode::kInvalidArgument,
                  "GraVAC message: tensor key {} has no decision for its last prepare(); call "
                  "prepare() and then decide() in the same iteration",
                  key);
  if (level_ == GravacLevel::kDense) return std::as_bytes(std::span<const float>(s.dense));
  return level_ == GravacLevel::kCandidate ? s.candidate : s.minimum;
}

void GravacCompressor::decompressAdd(uint64_t key, std::span<const std::byte> message, float* sum,
                                     float alpha) const {
  const State& s = existing(key, "decompressAdd");
  if (level_ == GravacLevel::kDense) {
    CORTADO_ENFORCE(message.size() == 4 * s.n, ErrorCode::kInvalidArgument,
                    "GraVAC decompressAdd: a dense message of tensor key {} has {} bytes, "
                    "expected {} ({} floats)",
                    key, message.size(), 4 * s.n, s.n);
    for (size_t i = 0; i < s.n; ++i) {
      float v;
      std::memcpy(&v, message.data() + 4 * i, 4);
      sum[i] += alpha * v;
    }
    return;
  }
  codec_.decompressAdd(message, s.n, sum, alpha);
}

void GravacCompressor::addResidual(uint64_t key, std::span<const float> values) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  CORTADO_ENFORCE(it != states_.end(), ErrorCode::kInvalidArgument,
                  "GraVAC addResidual: tensor key {} was never prepared", key);
  State& s = *it->second;
  CORTADO_ENFORCE(values.size() == s.n, ErrorCode::kInvalidArgument,
                  "GraVAC addResidual: tensor key {} has {} elements, given {}", key, s.n,
                  values.size());
  CORTADO_ENFORCE(!s.prepared, ErrorCode::kInvalidArgument,
                  "GraVAC addResidual: tensor key {} is prepared and not yet decided; add after "
                  "decide()",
                  key);
  for (size_t i = 0; i < s.n; ++i) s.residual[i] += values[i];
}

std::span<const float> GravacCompressor::residual(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? std::span<const float>{}
                             : std::span<const float>(it->second->residual);
}

std::span<const float> GravacCompressor::velocity(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? std::span<const float>{}
                             : std::span<const float>(it->second->velocity);
}

size_t GravacCompressor::elements(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? 0 : it->second->n;
}

}  // namespace cortado::compressor
