#include <cuda_runtime.h>

#include "compressor/cuda/cuda_codecs.h"
#include "compressor/cuda/kernels.h"
#include "core/common/error.h"

namespace cortado::compressor::cuda {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kInternal, fmt::format("CUDA {}: {}", what, cudaGetErrorString(e)));
}
}  // namespace

CudaErrorFeedback::CudaErrorFeedback(CodecPtr codec, float momentum)
    : codec_(std::move(codec)),
      momentum_(momentum < 0 ? (codec_ ? codec_->momentumCorrection() : 0.0f) : momentum) {
  CORTADO_ENFORCE(codec_ && codec_->device() == Device::kCuda, ErrorCode::kInvalidArgument,
                  "CudaErrorFeedback wraps CUDA codecs");
  CORTADO_ENFORCE(momentum_ == 0.0f || codec_->sparse(), ErrorCode::kInvalidArgument,
                  "momentum correction needs a sparse codec, '{}' is dense", codec_->spec());
}

CudaErrorFeedback::~CudaErrorFeedback() {
  for (auto& [key, s] : states_) release(*s);
}

void CudaErrorFeedback::release(State& s) {
  if (s.residual) cudaFree(s.residual);
  if (s.velocity) cudaFree(s.velocity);
  s.residual = s.velocity = nullptr;
}

CudaErrorFeedback::State& CudaErrorFeedback::state(uint64_t key, size_t n, void* stream) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = states_[key];
  if (!slot) {
    slot = std::make_unique<State>();
    slot->n = n;
    auto s = static_cast<cudaStream_t>(stream);
    check(cudaMalloc(reinterpret_cast<void**>(&slot->residual), n * sizeof(float) + 4), "alloc");
    check(cudaMemsetAsync(slot->residual, 0, n * sizeof(float), s), "clear");
    if (momentum_ > 0) {
      check(cudaMalloc(reinterpret_cast<void**>(&slot->velocity), n * sizeof(float) + 4), "alloc");
      check(cudaMemsetAsync(slot->velocity, 0, n * sizeof(float), s), "clear");
    }
  }
  CORTADO_ENFORCE(slot->n == n, ErrorCode::kInvalidArgument,
                  "error feedback: tensor key {} had {} elements, now {}", key, slot->n, n);
  return *slot;
}

size_t CudaErrorFeedback::encode(uint64_t key, const float* grad, size_t n,
                                 std::span<std::byte> out, const EncodeContext& ctx) {
  State& st = state(key, n, ctx.stream);
  auto s = static_cast<cudaStream_t>(ctx.stream);
  if (momentum_ > 0)
    kern::momentumStep(st.velocity, st.residual, grad, momentum_, n, s);
  else
    kern::addInto(st.residual, grad, n, s);
  check(cudaGetLastError(), "error feedback update");
  size_t bytes = codec_->encode(st.residual, n, out, ctx);
  auto payload = std::span<const std::byte>(out.data(), bytes);
  codec_->decompressAdd(payload, st.residual, n, -1.0f, ctx);
  if (momentum_ > 0 && ctx.restartMomentum)
    check(cudaMemsetAsync(st.velocity, 0, n * sizeof(float), s), "restart the momentum");
  else if (momentum_ > 0)
    codec_->zeroSent(payload, st.velocity, n, ctx);
  return bytes;
}

const float* CudaErrorFeedback::velocity(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? nullptr : it->second->velocity;
}

const float* CudaErrorFeedback::residual(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? nullptr : it->second->residual;
}

void CudaErrorFeedback::reset(uint64_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  if (it == states_.end()) return;
  release(*it->second);
  states_.erase(it);
}

}  // namespace cortado::compressor::cuda
