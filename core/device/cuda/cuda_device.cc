// The CUDA device (cuda/factory.h).
#include <cuda_runtime.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "compressor/cuda/cuda_codecs.h"
#include "core/common/half.h"
#include "compressor/registry.h"
#include "core/common/error.h"
#include "core/device/cuda/factory.h"
#include "core/device/cuda/kernels.h"

namespace cortado::device::cuda {

int deviceCount() { return compressor::cuda::deviceCount(); }

std::string deviceUuid(int device) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess)
    throw Error(ErrorCode::kUnavailable,
                fmt::format("cuda device {}: cudaGetDeviceProperties: {}", device,
                            cudaGetErrorString(e)));
  return std::string(reinterpret_cast<const char*>(prop.uuid.bytes), sizeof(prop.uuid.bytes));
}

namespace {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kInternal,
                fmt::format("cuda device: {}: {}", what, cudaGetErrorString(e)));
}

class CudaStream final : public Stream {
 public:
  explicit CudaStream(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaStream() override {
    if (s_) cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

cudaStream_t native(Stream& s) {
  auto* c = dynamic_cast<CudaStream*>(&s);
  CORTADO_ENFORCE(c != nullptr, ErrorCode::kInvalidArgument,
                  "a stream of another device was passed to the CUDA device");
  return c->get();
}

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaEvent() override {
    if (e_) cudaEventDestroy(e_);
  }
  void record(Stream& s) override { check(cudaEventRecord(e_, native(s)), "cudaEventRecord"); }
  bool query() override {
    const cudaError_t r = cudaEventQuery(e_);
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaEventQuery");
    return true;
  }
  // Polled against the deadline: cudaEventSynchronize cannot be given one.
  void synchronize(Deadline deadline, const char* what) override {
    for (long spins = 0; !query(); ++spins) {
      if (deadline.expired())
        throw Error(ErrorCode::kTimeout,
                    fmt::format("cuda device: waiting for {}: the GPU work did not complete by "
                                "its deadline",
                                what));
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class CudaDeviceErrorFeedback final : public ErrorFeedback {
 public:
  CudaDeviceErrorFeedback(compressor::CodecPtr codec, int device, compressor::StateDType state)
      : ef_(std::move(codec), -1.0f, state), device_(device) {}
  size_t payloadBytes(size_t n) const override { return ef_.codec().payloadBytes(n); }
  void encode(uint64_t key, const float* grad, size_t n, std::span<std::byte> out,
              compressor::EncodeContext ctx, Stream* s) override {
    CORTADO_ENFORCE(s != nullptr, ErrorCode::kInvalidArgument,
                    "CUDA error feedback needs the stream to run on");
    check(cudaSetDevice(device_), "cudaSetDevice");
    ctx.stream = native(*s);
    ef_.encode(key, grad, n, out, ctx);
    std::lock_guard<std::mutex> lk(mu_);
    sizes_[key] = n;
    streams_[key] = static_cast<cudaStream_t>(ctx.stream);
  }
  HostFloats residual(uint64_t key) const override {
    return toHost(key, ef_.residual(key), "residual");
  }
  float momentum() const override { return ef_.momentum(); }
  HostFloats velocity(uint64_t key) const override {
    return toHost(key, ef_.velocity(key), "velocity");
  }
  uint64_t heldBytes() const override {
    // A residual per key, and a velocity with momentum (CudaErrorFeedback's state).
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t elements = 0;
    for (const auto& [key, n] : sizes_) elements += n;
    return elements * compressor::stateBytes(ef_.stateDType()) * (ef_.momentum() > 0 ? 2 : 1);
  }

 private:
  // A host copy of the key's state at p (device memory), after its encode.
  HostFloats toHost(uint64_t key, const void* p, const char* what) const {
    size_t n = 0;
    cudaStream_t s = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = sizes_.find(key);
      if (it == sizes_.end()) return {};
      n = it->second;
      s = streams_.at(key);
    }
    if (p == nullptr) return {};
    HostFloats out(n);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamSynchronize(s), fmt::format("{}: synchronize the encode's stream", what));
    if (ef_.stateDType() == compressor::StateDType::kBFloat16) {
      std::vector<uint16_t> bits(n);
      check(cudaMemcpy(bits.data(), p, n * sizeof(uint16_t), cudaMemcpyDeviceToHost),
            fmt::format("{}: copy", what));
      bf16ToFloatN(bits.data(), out.data(), n);
      return out;
    }
    check(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost),
          fmt::format("{}: copy", what));
    return out;
  }

  compressor::cuda::CudaErrorFeedback ef_;
  int device_;
  mutable std::mutex mu_;
  std::map<uint64_t, size_t> sizes_;
  std::map<uint64_t, cudaStream_t> streams_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(Options o) : device_(o.device), groups_(std::move(o.groups)) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, device_), "cudaGetDeviceProperties");
    name_ = fmt::format("cuda:{} ({})", device_, p.name);
    auto r = std::make_shared<compressor::Registry>();
    compressor::registerCudaCodecs(*r);
    codecs_ = std::move(r);
  }

  Kind kind() const override { return Kind::kCuda; }
  std::string name() const override { return name_; }

  void* allocate(size_t bytes) override {
    bindThread();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorCode::kUnavailable, fmt::format("{}: cudaMalloc of {} bytes: {}", name_,
                                                       bytes, cudaGetErrorString(e)));
    }
    return p;
  }
  // cudaFree waits for the device's work on the memory first.
  void release(void* p) noexcept override {
    if (!p) return;
    cudaSetDevice(device_);
    cudaFree(p);
  }
  void* allocatePinned(size_t bytes) override {
    bindThread();
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorCode::kUnavailable, fmt::format("{}: cudaMallocHost of {} bytes: {}", name_,
                                                       bytes, cudaGetErrorString(e)));
    }
    return p;
  }
  void releasePinned(void* p) noexcept override {
    if (p) cudaFreeHost(p);
  }

  std::unique_ptr<Stream> createStream() override { return std::make_unique<CudaStream>(device_); }
  std::unique_ptr<Event> createEvent() override { return std::make_unique<CudaEvent>(device_); }
  void wait(Stream& s, Event& e) override {
    auto* ce = dynamic_cast<CudaEvent*>(&e);
    CORTADO_ENFORCE(ce != nullptr, ErrorCode::kInvalidArgument,
                    "an event of another device was passed to the CUDA device");
    check(cudaStreamWaitEvent(native(s), ce->get(), 0), "cudaStreamWaitEvent");
  }
  void bindThread() override { check(cudaSetDevice(device_), "cudaSetDevice"); }

  void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) override {
    CORTADO_ENFORCE(bytes == 0 || (dst && src), ErrorCode::kInvalidArgument,
                    "{}: copy of {} bytes with a null pointer", name_, bytes);
    if (bytes == 0 || dst == src) return;
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    check(cudaMemcpyAsync(dst, src, bytes, k, native(s)), fmt::format("copy of {} bytes", bytes));
  }
  void fill(float* x, float value, size_t n, Stream& s) override {
    CORTADO_ENFORCE(n == 0 || x, ErrorCode::kInvalidArgument, "{}: fill of a null pointer", name_);
    check(launchFill(x, value, n, native(s)), "fill kernel");
  }
  void scale(float* x, float factor, size_t n, Stream& s) override {
    CORTADO_ENFORCE(n == 0 || x, ErrorCode::kInvalidArgument, "{}: scale of a null pointer", name_);
    check(launchScale(x, factor, n, native(s)), "scale kernel");
  }
  void add(float* dst, const float* src, size_t n, Stream& s) override {
    CORTADO_ENFORCE(n == 0 || (dst && src), ErrorCode::kInvalidArgument,
                    "{}: add with a null pointer", name_);
    check(launchAdd(dst, src, n, native(s)), "add kernel");
  }

  compressor::Device codecDevice() const override { return compressor::Device::kCuda; }
  const compressor::Registry& codecs() const override { return *codecs_; }
  compressor::EncodeContext context(Stream& s) const override {
    compressor::EncodeContext c;
    c.stream = native(s);
    return c;
  }
  std::unique_ptr<ErrorFeedback> errorFeedback(compressor::CodecPtr codec,
                                               compressor::StateDType state) override {
    return std::make_unique<CudaDeviceErrorFeedback>(std::move(codec), device_, state);
  }
  uint64_t errorFeedbackScratchBytes() const override {
    return compressor::cuda::CudaErrorFeedback::scratchBytes();
  }
  void decompressAdd(const compressor::Codec& codec, std::span<const std::byte> payload, float* sum,
                     size_t n, Stream& s, ThreadPool* /*pool: CUDA codecs run on the device*/ = nullptr) override {
    bindThread();
    codec.decompressAdd(payload, sum, n, 1.0f, context(s));
  }

  const collective::Groups* groups() const override { return groups_.world ? &groups_ : nullptr; }

 private:
  int device_;
  std::string name_;
  collective::Groups groups_;
  std::shared_ptr<const compressor::Registry> codecs_;
};

}  // namespace

std::shared_ptr<Device> create(Options options) {
  const int n = deviceCount();
  CORTADO_ENFORCE(n > 0, ErrorCode::kUnavailable,
                  "CORTADO_DEVICE=cuda but no CUDA device is visible (cudaGetDeviceCount() == 0): "
                  "run on a GPU machine or use CORTADO_DEVICE=host");
  CORTADO_ENFORCE(options.device >= 0 && options.device < n, ErrorCode::kUnavailable,
                  "CUDA device {} asked for, but {} are visible", options.device, n);
  return std::make_shared<CudaDevice>(std::move(options));
}

}  // namespace cortado::device::cuda
