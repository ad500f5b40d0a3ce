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
// With fp32 state, a codec that folds the update into its own pass over the
// input (Codec::encodeUpdated: top-k and DGC in the selection's scan, the
// sign codecs in their one pass) is given the update to apply, one pass over
// the state fewer; the state and the payload are the same bit for bit.
//
// The state (e, and u with momentum) is kept in fp32, or in bfloat16
// (StateDType::kBFloat16, CORTADO_EF_DTYPE=bf16): half the memory, at one
// bf16 rounding of the state per round. An encode then widens the key's
// state into fp32 scratch, runs the same algebra there, and stores it back
// rounded to nearest even, so that
//   decode(payload) + e_new == g + e_old  up to |e_new| * 2^-8 per element
// (bf16 keeps 8 significant bits). The scratch is one fp32 buffer (two with
// momentum) per encode running at once in the process, shared by every
// ErrorFeedback, as large as the largest key encoded; it is kept for the
// next encode (scratchBytes()).
//
// Threads: encode() for different keys may run concurrently; calls for the
// same key must not overlap (a tensor's pipeline runs one round at a time).
// CPU codecs only; compressor/cuda has the device-memory counterpart.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "compressor/codec.h"
#include "core/common/page_allocator.h"

namespace cortado::compressor {

// What error feedback keeps its per-element state in.
enum class StateDType { kFloat32, kBFloat16 };
// "fp32" | "bf16".
const char* toString(StateDType t);
// Parses "fp32" or "bf16" (also "float32", "bfloat16"); throws
// kInvalidArgument naming `what` and the values it takes otherwise.
StateDType stateDTypeFromString(const std::string& s, const std::string& what);
// Bytes per element of state.
inline size_t stateBytes(StateDType t) { return t == StateDType::kBFloat16 ? 2 : 4; }

class ErrorFeedback {
 public:
  // momentum < 0: take the codec's momentumCorrection() (DGC's m, else 0).
  explicit ErrorFeedback(CodecPtr codec, float momentum = -1.0f,
                         StateDType state = StateDType::kFloat32);

  const Codec& codec() const { return *codec_; }
  float momentum() const { return momentum_; }
  StateDType stateDType() const { return stateType_; }
  // Bytes the payload of an n-element tensor needs (the codec's payloadBytes).
  size_t payloadBytes(size_t n) const { return codec_->payloadBytes(n); }

  // Encodes grad with the key's residual folded in; updates the state. The
  // first call for a key starts from zero state; n must not change after.
  size_t encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx = {});

  // Copies of the key's residual e (or v with momentum) and momentum u, in
  // fp32 whatever the state's type; empty when the key has no state yet.
  // Mapped from the kernel (PageAllocator), which takes them back when freed.
  using Floats = std::vector<float, PageAllocator<float>>;
  Floats residual(uint64_t key) const;
  Floats velocity(uint64_t key) const;
  void reset(uint64_t key);
  void clear();
  // Bytes of state held for every key (residuals, and velocities with
  // momentum): the memory error feedback costs, 1x (2x with momentum) the
  // elements it has encoded in fp32, half that in bf16.
  uint64_t heldBytes() const;
  // Bytes of the process's bf16 scratch (every ErrorFeedback's together).
  static uint64_t scratchBytes();
  // Frees the scratch no encode is using (the next encode makes its own):
  // after a probe that encoded larger sizes than the job will.
  static void releaseIdleScratch();

 private:
  struct State {
    size_t n = 0;
    // Mapped from the kernel and unmapped when freed (PageAllocator): a
    // retired key's memory goes back at once. One pair is used: fp32 or bf16.
    std::vector<float, PageAllocator<float>> residual;
    std::vector<float, PageAllocator<float>> velocity;  // DGC's u; empty without momentum
    std::vector<uint16_t, PageAllocator<uint16_t>> residual16, velocity16;
  };
  State& state(uint64_t key, size_t n);
  void update(float* e, float* u, const float* grad, size_t n, const EncodeContext& ctx) const;
  // After the encode of e into out (bytes): e -= what was sent, and u's
  // reset (zeroed where sent, or everywhere with restartMomentum). Returns
  // bytes.
  size_t afterEncode(float* e, float* u, size_t n, std::span<std::byte> out, size_t bytes,
                     const EncodeContext& ctx) const;

  CodecPtr codec_;
  float momentum_;
  StateDType stateType_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<State>> states_;
};

}  // namespace cortado::compressor
