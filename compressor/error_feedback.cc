#include "compressor/error_feedback.h"

#include <algorithm>

#include "compressor/cpu/kernels.h"
#include "core/common/error.h"

namespace cortado::compressor {

ErrorFeedback::ErrorFeedback(CodecPtr codec, float momentum)
    : codec_(std::move(codec)),
      momentum_(momentum < 0 ? (codec_ ? codec_->momentumCorrection() : 0.0f) : momentum) {
  CORTADO_ENFORCE(codec_ != nullptr, ErrorCode::kInvalidArgument,
                  "ErrorFeedback needs a codec");
  CORTADO_ENFORCE(codec_->device() == Device::kCpu, ErrorCode::kInvalidArgument,
                  "ErrorFeedback wraps CPU codecs; '{}' runs on {} (use cuda::CudaErrorFeedback)",
                  codec_->spec(), deviceName(codec_->device()));
  CORTADO_ENFORCE(momentum_ == 0.0f || codec_->sparse(), ErrorCode::kInvalidArgument,
                  "momentum correction needs a sparse codec, '{}' is dense", codec_->spec());
}

ErrorFeedback::State& ErrorFeedback::state(uint64_t key, size_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = states_[key];
  if (!slot) {
    slot = std::make_unique<State>();
    slot->residual.assign(n, 0.0f);
    if (momentum_ > 0) slot->velocity.assign(n, 0.0f);
  }
  CORTADO_ENFORCE(slot->residual.size() == n, ErrorCode::kInvalidArgument,
                  "error feedback: tensor key {} had {} elements, now {}", key,
                  slot->residual.size(), n);
  return *slot;
}

size_t ErrorFeedback::encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
                             const EncodeContext& ctx) {
  State& s = state(key, n);
  float* e = s.residual.data();
  if (momentum_ > 0) {
    float* u = s.velocity.data();
    const float m = momentum_;
    cpu::parallelAligned(ctx.pool, n, 64, [&](size_t b, size_t end) {
      for (size_t i = b; i < end; ++i) {
        u[i] = m * u[i] + grad[i];
        e[i] += u[i];
      }
    });
  } else {
    cpu::parallelAligned(ctx.pool, n, 64, [&](size_t b, size_t end) {
      for (size_t i = b; i < end; ++i) e[i] += grad[i];
    });
  }
  size_t bytes = codec_->encode(e, n, out, ctx);
  auto payload = std::span<const std::byte>(out.data(), bytes);
  codec_->decompressAdd(payload, e, n, -1.0f, ctx);
  if (momentum_ > 0 && ctx.restartMomentum)
    std::fill(s.velocity.begin(), s.velocity.end(), 0.0f);
  else if (momentum_ > 0)
    codec_->zeroSent(payload, s.velocity.data(), n, ctx);
  return bytes;
}

std::span<const float> ErrorFeedback::residual(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? std::span<const float>{} : std::span<const float>(it->second->residual);
}

std::span<const float> ErrorFeedback::velocity(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? std::span<const float>{} : std::span<const float>(it->second->velocity);
}

void ErrorFeedback::reset(uint64_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  states_.erase(key);
}

void ErrorFeedback::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  states_.clear();
}

uint64_t ErrorFeedback::heldBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t bytes = 0;
  for (const auto& [key, s] : states_)
    bytes += (s->residual.capacity() + s->velocity.capacity()) * sizeof(float);
  return bytes;
}

}  // namespace cortado::compressor
