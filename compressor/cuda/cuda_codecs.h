// The CUDA codecs: fp16, bf16, onebit, efsignsgd, topk, randomk, dgc and qsgd
// for Device::kCuda, with the same spec strings, parameters and payload bytes
// as the CPU codecs (byte-identical for all but NaN payload bits; QSGD too,
// given the same seed, since both draw format::hash2). Every pointer passed to
// them is device memory; work runs on EncodeContext::stream. encode() returns
// without waiting; decode(), decompressAdd() and zeroSent() wait for the
// header check (and the index or code check) before they touch the output,
// so they synchronize the stream. Payload buffers must be 4-byte aligned
// (cudaMalloc's are).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>

#include "compressor/codec.h"
#include "compressor/registry.h"

namespace cortado::compressor {

// Registers the CUDA codecs for Device::kCuda. Safe without a GPU: building a
// codec needs none, running one does.
void registerCudaCodecs(Registry& registry);

namespace cuda {

// Number of visible CUDA devices; 0 when there is none or no driver.
int deviceCount();

// ErrorFeedback for CUDA codecs: the same algebra (error_feedback.h) with the
// residual and momentum in device memory, allocated at the first encode of a
// key. The same threading rules apply.
class CudaErrorFeedback {
 public:
  explicit CudaErrorFeedback(CodecPtr codec, float momentum = -1.0f);
  ~CudaErrorFeedback();
  CudaErrorFeedback(const CudaErrorFeedback&) = delete;
  CudaErrorFeedback& operator=(const CudaErrorFeedback&) = delete;

  const Codec& codec() const { return *codec_; }
  float momentum() const { return momentum_; }
  size_t encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx = {});
  // Device pointer to the key's residual (v with momentum); nullptr when none.
  const float* residual(uint64_t key) const;
  // Device pointer to the key's momentum u; nullptr when none (or m = 0).
  const float* velocity(uint64_t key) const;
  void reset(uint64_t key);

 private:
  struct State {
    size_t n = 0;
    float* residual = nullptr;
    float* velocity = nullptr;
  };
  State& state(uint64_t key, size_t n, void* stream);
  static void release(State& s);

  CodecPtr codec_;
  float momentum_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<State>> states_;
};

}  // namespace cuda
}  // namespace cortado::compressor
