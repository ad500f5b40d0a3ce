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
#include "compressor/error_feedback.h"
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
// key, in fp32 or bf16 (StateDType). A bf16 state is widened into fp32
// scratch on the encode's stream, updated and encoded there, and stored back
// rounded to nearest even, as the CPU's; the scratch is one per stream and
// device in the process, shared by every CudaErrorFeedback. The same
// threading rules apply.
class CudaErrorFeedback {
 public:
  explicit CudaErrorFeedback(CodecPtr codec, float momentum = -1.0f,
                             StateDType state = StateDType::kFloat32);
  ~CudaErrorFeedback();
  CudaErrorFeedback(const CudaErrorFeedback&) = delete;
  CudaErrorFeedback& operator=(const CudaErrorFeedback&) = delete;

  const Codec& codec() const { return *codec_; }
  float momentum() const { return momentum_; }
  StateDType stateDType() const { return stateType_; }
  size_t encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx = {});
  // Device pointer to the key's residual (v with momentum), stateDType()'s
  // elements; nullptr when none.
  const void* residual(uint64_t key) const;
  // Device pointer to the key's momentum u; nullptr when none (or m = 0).
  const void* velocity(uint64_t key) const;
  void reset(uint64_t key);
  // Bytes of device memory held as the bf16 states' fp32 scratch, every
  // device and stream of the process together (0 with fp32 state).
  static uint64_t scratchBytes();

 private:
  struct State {
    size_t n = 0;
    void* residual = nullptr;
    void* velocity = nullptr;
  };
  State& state(uint64_t key, size_t n, void* stream);
  static void release(State& s);

  CodecPtr codec_;
  float momentum_;
  StateDType stateType_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<State>> states_;
};

}  // namespace cuda
}  // namespace cortado::compressor
