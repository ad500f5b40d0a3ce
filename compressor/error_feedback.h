// Error feedback around any codec, with per-tensor residual state, and DGC's
// momentum correction. Lives wherever a codec encodes: on the worker (push-pull
// and the plan executor's encode steps) and on the server that re-encodes a
// round's sum for a compressed pull (server/server_engine.h, momentum 0).
//
// Without momentum (m = 0), for each tensor key:
//   p = g + e;  payload = encode(p);  e = p - decode(payload)
// so decode(payload) + e_new == g + e_old (up to one rounding per element;
// exactly for sparse codecs, whose sent elements leave a zero residual).
// With momentum m > 0 (DGC, Lin et al. 2018), u and v per key:
//   u = m u + g;  v = v + u;  payload = encode(v);  v = v - decode(payload);
//   u = 0 where the payload sent something (sparse codecs);
//   u = 0 everywhere with EncodeContext::restartMomentum.
//
// Threads: encode() for different keys may run concurrently; calls for the
// same key must not overlap (a tensor's pipeline runs one round at a time).
// CPU codecs only; compressor/cuda has the device-memory counterpart.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "compressor/codec.h"
#include "core/common/page_allocator.h"

namespace cortado::compressor {

class ErrorFeedback {
 public:
  // momentum < 0: take the codec's momentumCorrection() (DGC's m, else 0).
  explicit ErrorFeedback(CodecPtr codec, float momentum = -1.0f);

  const Codec& codec() const { return *codec_; }
  float momentum() const { return momentum_; }
  // Bytes the payload of an n-element tensor needs (the codec's payloadBytes).
  size_t payloadBytes(size_t n) const { return codec_->payloadBytes(n); }

  // Encodes grad with the key's residual folded in; updates the state. The
  // first call for a key starts from zero state; n must not change after.
  size_t encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx = {});

  // The key's residual e (or v with momentum) and momentum u; empty when the
  // key has no state yet. Valid until the next encode or reset of that key.
  std::span<const float> residual(uint64_t key) const;
  std::span<const float> velocity(uint64_t key) const;
  void reset(uint64_t key);
  void clear();
  // Bytes of state held for every key (residuals, and velocities with
  // momentum): the memory error feedback costs, 1x (2x with momentum) the
  // elements it has encoded.
  uint64_t heldBytes() const;

 private:
  struct State {
    // Mapped from the kernel and unmapped when freed (PageAllocator): a
    // retired key's memory goes back at once.
    std::vector<float, PageAllocator<float>> residual;
    std::vector<float, PageAllocator<float>> velocity;  // DGC's u; empty without momentum
  };
  State& state(uint64_t key, size_t n);

  CodecPtr codec_;
  float momentum_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<State>> states_;
};

}  // namespace cortado::compressor
