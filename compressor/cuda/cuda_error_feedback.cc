#include <cuda_runtime.h>

#include <map>
#include <utility>

#include "compressor/cuda/cuda_codecs.h"
#include "compressor/cuda/kernels.h"
#include "core/common/error.h"

namespace cortado::compressor::cuda {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kInternal, fmt::format("CUDA {}: {}", what, cudaGetErrorString(e)));
}

// The fp32 working copies of bf16 states: one per (device, stream), shared
// by every CudaErrorFeedback; work on one stream runs in the order it was
// enqueued, so a stream's encodes may share its scratch, and its lock is
// held while one encode enqueues its steps.
struct Scratch {
  std::mutex mu;
  float* e = nullptr;
  float* u = nullptr;
  size_t capE = 0, capU = 0;  // elements of each
};

struct ScratchPool {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Scratch>> byStream;
};

ScratchPool& scratchPool() {
  static ScratchPool* p = new ScratchPool;  // never destroyed: streams may still run at exit
  return *p;
}

Scratch& scratchFor(cudaStream_t s) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  ScratchPool& p = scratchPool();
  std::lock_guard<std::mutex> lk(p.mu);
  auto& slot = p.byStream[{device, s}];
  if (!slot) slot = std::make_unique<Scratch>();
  return *slot;
}

// Grows one of a stream's scratch buffers (its lock held) to n elements;
// the old buffer goes once the stream's earlier work is done.
void grow(float*& buf, size_t& cap, size_t n, cudaStream_t s) {
  if (cap >= n) return;
  check(cudaStreamSynchronize(s), "synchronize before growing the error-feedback scratch");
  cudaFree(buf);
  buf = nullptr;
  cap = 0;
  check(cudaMalloc(reinterpret_cast<void**>(&buf), n * sizeof(float) + 4), "alloc scratch");
  cap = n;
}

}  // namespace

uint64_t CudaErrorFeedback::scratchBytes() {
  ScratchPool& p = scratchPool();
  std::lock_guard<std::mutex> lk(p.mu);
  uint64_t bytes = 0;
  for (const auto& [where, s] : p.byStream) {
    std::lock_guard<std::mutex> sl(s->mu);
    bytes += (s->capE ? s->capE * sizeof(float) + 4 : 0) + (s->capU ? s->capU * sizeof(float) + 4 : 0);
  }
  return bytes;
}

CudaErrorFeedback::CudaErrorFeedback(CodecPtr codec, float momentum, StateDType state)
    : codec_(std::move(codec)),
      momentum_(momentum < 0 ? (codec_ ? codec_->momentumCorrection() : 0.0f) : momentum),
      stateType_(state) {
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
    const size_t bytes = n * stateBytes(stateType_);  // zero bits: +0 in fp32 and bf16
    check(cudaMalloc(&slot->residual, bytes + 4), "alloc");
    check(cudaMemsetAsync(slot->residual, 0, bytes, s), "clear");
    if (momentum_ > 0) {
      check(cudaMalloc(&slot->velocity, bytes + 4), "alloc");
      check(cudaMemsetAsync(slot->velocity, 0, bytes, s), "clear");
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
  const bool m = momentum_ > 0;
  // The algebra on fp32 e (and u): the state itself, or a bf16 state's
  // widened copy in the stream's scratch.
  auto run = [&](float* e, float* u) {
    if (m)
      kern::momentumStep(u, e, grad, momentum_, n, s);
    else
      kern::addInto(e, grad, n, s);
    check(cudaGetLastError(), "error feedback update");
    size_t bytes = codec_->encode(e, n, out, ctx);
    auto payload = std::span<const std::byte>(out.data(), bytes);
    codec_->decompressAdd(payload, e, n, -1.0f, ctx);
    if (m && ctx.restartMomentum)
      check(cudaMemsetAsync(u, 0, n * sizeof(float), s), "restart the momentum");
    else if (m)
      codec_->zeroSent(payload, u, n, ctx);
    return bytes;
  };
  if (stateType_ == StateDType::kFloat32)
    return run(static_cast<float*>(st.residual), static_cast<float*>(st.velocity));
  Scratch& sc = scratchFor(s);
  std::lock_guard<std::mutex> lk(sc.mu);
  grow(sc.e, sc.capE, n, s);
  if (m) grow(sc.u, sc.capU, n, s);
  auto* e16 = static_cast<uint16_t*>(st.residual);
  auto* u16 = static_cast<uint16_t*>(st.velocity);
  kern::castDecode(e16, n, sc.e, 1.0f, false, true, s);
  if (m) kern::castDecode(u16, n, sc.u, 1.0f, false, true, s);
  check(cudaGetLastError(), "widen the bf16 state");
  const size_t bytes = run(sc.e, m ? sc.u : nullptr);
  kern::castEncode(sc.e, n, e16, true, s);
  if (m) kern::castEncode(sc.u, n, u16, true, s);
  check(cudaGetLastError(), "store the bf16 state");
  return bytes;
}

const void* CudaErrorFeedback::velocity(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? nullptr : it->second->velocity;
}

const void* CudaErrorFeedback::residual(uint64_t key) const {
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
