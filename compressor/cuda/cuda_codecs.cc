// Host side of the CUDA codecs: headers, validation and error reporting (which
// need fmt and cortado::Error, so they stay out of the .cu file).
#include "compressor/cuda/cuda_codecs.h"

#include <cuda_runtime.h>

#include <array>
#include <cmath>

#include "compressor/cpu/codec_base.h"
#include "compressor/cuda/kernels.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "core/common/error.h"

namespace cortado::compressor {
namespace cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kInternal, fmt::format("CUDA {}: {}", what, cudaGetErrorString(e)));
}
void checkLaunch(const char* what) { check(cudaGetLastError(), what); }

cudaStream_t streamOf(const EncodeContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(size_t n, cudaStream_t s) : s_(s) {
    if (n) check(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(T), s), "alloc");
  }
  ~DeviceBuffer() {
    if (p_) cudaFreeAsync(p_, s_);
  }
  T* get() { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t s_;
};

// What a decode brings back to the host before it writes anything: the
// header and a validation kernel's flag. Pinned, so the copies are plain DMA,
// and one per host thread (codecs are called from several threads) and device
// (the flag is device memory). Kept for the thread's life: an allocation per
// call would cost more than the copies.
struct HostStaging {
  struct Pinned {
    unsigned char header[kHeaderBytes];
    int flag;
  };
  Pinned* host = nullptr;
  int* deviceFlag = nullptr;
  int device = -1;
  size_t headerCopied = 0;
  ~HostStaging() {
    if (host) cudaFreeHost(host);
    if (deviceFlag) cudaFree(deviceFlag);
  }
};

HostStaging& staging() {
  thread_local HostStaging st;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (!st.host)
    check(cudaMallocHost(reinterpret_cast<void**>(&st.host), sizeof(HostStaging::Pinned)), "pinned staging");
  if (st.device != device) {
    if (st.deviceFlag) cudaFree(st.deviceFlag);
    st.deviceFlag = nullptr;
    check(cudaMalloc(reinterpret_cast<void**>(&st.deviceFlag), sizeof(int)), "alloc flag");
    st.device = device;
  }
  return st;
}

class CudaCodec : public Codec {
 public:
  CudaCodec(CodecId id, std::string spec) : id_(id), spec_(std::move(spec)) {}
  CodecId id() const override { return id_; }
  Device device() const override { return Device::kCuda; }
  std::string spec() const override { return spec_; }

 protected:
  unsigned char* begin(std::span<std::byte> out, size_t n, size_t total, const EncodeContext& ctx,
                       uint8_t flags = 0, uint64_t seed = 0, uint64_t count = 0,
                       uint32_t param = 0) const {
    requireCapacity(out, total, id_, n);
    CORTADO_ENFORCE(reinterpret_cast<uintptr_t>(out.data()) % 4 == 0, ErrorCode::kInvalidArgument,
                    "CUDA {} payload buffer must be 4-byte aligned", codecIdName(id_));
    kern::HeaderBytes bytes;
    writeHeader(cpu::headerFor(id_, ctx, n, total, flags, seed, count, param),
                std::as_writable_bytes(std::span(bytes.b)));
    auto* p = reinterpret_cast<unsigned char*>(out.data());
    kern::writeHeader(p, bytes, streamOf(ctx));
    checkLaunch("write header");
    return p + kHeaderBytes;
  }

  // Copies the header to the host and runs the CPU codec's checks on it.
  template <typename BodyFn>
  PayloadHeader readHeader(std::span<const std::byte> payload, size_t n, const EncodeContext& ctx,
                           BodyFn bodyFor, uint8_t allowedFlags = 0) const {
    HostStaging& st = staging();
    copyHeader(payload, st, ctx);
    check(cudaStreamSynchronize(streamOf(ctx)), "sync");
    return checkHeader(payload, st, n, bodyFor, allowedFlags);
  }
  // Enqueues the copy of the payload's header (what there is of it) into the
  // pinned staging buffer.
  void copyHeader(std::span<const std::byte> payload, HostStaging& st, const EncodeContext& ctx) const {
    CORTADO_ENFORCE(reinterpret_cast<uintptr_t>(payload.data()) % 4 == 0, ErrorCode::kInvalidArgument,
                    "CUDA {} payload buffer must be 4-byte aligned", codecIdName(id_));
    st.headerCopied = std::min(payload.size(), kHeaderBytes);
    if (st.headerCopied)
      check(cudaMemcpyAsync(st.host->header, payload.data(), st.headerCopied, cudaMemcpyDeviceToHost,
                            streamOf(ctx)),
            "copy header");
  }
  // The CPU codec's checks on a header that copyHeader staged (once the
  // stream has been synchronized).
  template <typename BodyFn>
  PayloadHeader checkHeader(std::span<const std::byte> payload, const HostStaging& st, size_t n, BodyFn bodyFor,
                            uint8_t allowedFlags = 0) const {
    PayloadHeader h = parseHeader(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(st.host->header), st.headerCopied),
        payload.size());
    expectHeader(h, id_, n);
    cpu::expectFlagsAndBody(h, id_, bodyFor, allowedFlags);
    return h;
  }
  static const unsigned char* bodyOf(std::span<const std::byte> p) {
    return reinterpret_cast<const unsigned char*>(p.data()) + kHeaderBytes;
  }
  // Checks the padding bits of a bit array's last byte (copied to the host).
  void checkPadding(const unsigned char* bits, size_t usedBits, const EncodeContext& ctx) const {
    if (usedBits % 8 == 0) return;
    unsigned char last = 0;
    check(cudaMemcpyAsync(&last, bits + usedBits / 8, 1, cudaMemcpyDeviceToHost, streamOf(ctx)),
          "copy padding");
    check(cudaStreamSynchronize(streamOf(ctx)), "sync");
    CORTADO_ENFORCE((last >> (usedBits % 8)) == 0, ErrorCode::kProtocol,
                    "{} payload has non-zero padding bits", codecIdName(id_));
  }

 private:
  CodecId id_;
  std::string spec_;
};

// decode and decompressAdd of a codec whose decoding is one pass,
// `Derived::apply(p, out, n, alpha, add, ctx)`: out = alpha * decoded, or
// out += alpha * decoded with `add`, after the payload's checks. Derived
// makes this class a friend and keeps apply() private.
template <typename Derived>
class CudaOnePassCodec : public CudaCodec {
 public:
  using CudaCodec::CudaCodec;
  void decode(std::span<const std::byte> p, float* out, size_t n,
              const EncodeContext& ctx) const override {
    self().apply(p, out, n, 1.0f, false, ctx);
  }
  void decompressAdd(std::span<const std::byte> p, float* sum, size_t n, float alpha,
                     const EncodeContext& ctx) const override {
    self().apply(p, sum, n, alpha, true, ctx);
  }

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

// ---- fp16 / bf16 -----------------------------------------------------------

class CudaCast final : public CudaOnePassCodec<CudaCast> {
 public:
  using CudaOnePassCodec::CudaOnePassCodec;
  bool summable() const override { return true; }
  size_t payloadBytes(size_t n) const override { return kHeaderBytes + format::castBody(n); }
  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    size_t total = payloadBytes(n);
    auto* body = begin(out, n, total, ctx);
    kern::castEncode(in, n, reinterpret_cast<uint16_t*>(body), bf16(), streamOf(ctx));
    checkLaunch("cast encode");
    return total;
  }
  void addPayload(std::span<std::byte> acc, std::span<const std::byte> in,
                  const EncodeContext& ctx) const override {
    auto cacc = std::span<const std::byte>(acc.data(), acc.size());
    PayloadHeader h = validate(cacc, SIZE_MAX, ctx, true);
    size_t n = h.numel;
    validate(in, n, ctx);
    DeviceBuffer<float> tmp(n, streamOf(ctx));
    kern::castDecode(halves(cacc), n, tmp.get(), 1.0f, false, bf16(), streamOf(ctx));
    kern::castDecode(halves(in), n, tmp.get(), 1.0f, true, bf16(), streamOf(ctx));
    kern::castEncode(tmp.get(), n,
                     reinterpret_cast<uint16_t*>(reinterpret_cast<unsigned char*>(acc.data()) + kHeaderBytes),
                     bf16(), streamOf(ctx));
    checkLaunch("cast add");
  }

 private:
  friend class CudaOnePassCodec<CudaCast>;

  bool bf16() const { return id() == CodecId::kBf16; }
  static const uint16_t* halves(std::span<const std::byte> p) {
    return reinterpret_cast<const uint16_t*>(bodyOf(p));
  }
  PayloadHeader validate(std::span<const std::byte> p, size_t n, const EncodeContext& ctx,
                         bool anyN = false) const {
    if (anyN) {
      // addPayload: take n from the accumulator's own header.
      std::array<std::byte, kHeaderBytes> host{};
      size_t copy = std::min(p.size(), kHeaderBytes);
      if (copy) {
        check(cudaMemcpy(host.data(), p.data(), copy, cudaMemcpyDeviceToHost), "copy header");
      }
      n = parseHeader(std::span<const std::byte>(host.data(), copy), p.size()).numel;
    }
    PayloadHeader h = readHeader(p, n, ctx, [](const PayloadHeader& h) {
      return format::castBody(h.numel);
    });
    CORTADO_ENFORCE(h.count == 0 && h.param == 0, ErrorCode::kProtocol,
                    "{} payload has unexpected parameters: {}", codecIdName(id()), describe(h));
    return h;
  }
  void apply(std::span<const std::byte> p, float* out, size_t n, float alpha, bool add,
             const EncodeContext& ctx) const {
    validate(p, n, ctx);
    kern::castDecode(halves(p), n, out, alpha, add, bf16(), streamOf(ctx));
    checkLaunch("cast decode");
  }
};

// ---- onebit / efsignsgd ---------------------------------------------------------

class CudaSign final : public CudaOnePassCodec<CudaSign> {
 public:
  using CudaOnePassCodec::CudaOnePassCodec;
  size_t payloadBytes(size_t n) const override { return kHeaderBytes + body(n); }
  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    size_t total = payloadBytes(n);
    auto* b = begin(out, n, total, ctx);
    cudaStream_t s = streamOf(ctx);
    bool oneBit = id() == CodecId::kOneBit;
    size_t chunks = (n + format::kSumChunk - 1) / format::kSumChunk;
    DeviceBuffer<float> a(chunks, s), c(oneBit ? chunks : 0, s);
    DeviceBuffer<unsigned long long> count(1, s);
    check(cudaMemsetAsync(count.get(), 0, sizeof(unsigned long long), s), "clear count");
    kern::chunkSums(in, n, oneBit ? 2 : 0, a.get(), c.get(), count.get(), s);
    kern::finalizeScalars(a.get(), c.get(), chunks, count.get(), n, oneBit ? 2 : 0,
                          reinterpret_cast<float*>(b), s);
    kern::signBits(in, n, b + prefix(), s);
    checkLaunch("sign encode");
    return total;
  }

 private:
  friend class CudaOnePassCodec<CudaSign>;

  size_t prefix() const { return id() == CodecId::kOneBit ? 8 : 4; }
  size_t body(size_t n) const {
    return id() == CodecId::kOneBit ? format::oneBitBody(n) : format::efSignBody(n);
  }
  void apply(std::span<const std::byte> p, float* out, size_t n, float alpha, bool add,
             const EncodeContext& ctx) const {
    PayloadHeader h = readHeader(p, n, ctx, [&](const PayloadHeader& h) { return body(h.numel); });
    CORTADO_ENFORCE(h.count == 0 && h.param == 0, ErrorCode::kProtocol,
                    "{} payload has unexpected parameters: {}", codecIdName(id()), describe(h));
    const unsigned char* b = bodyOf(p);
    checkPadding(b + prefix(), n, ctx);
    kern::expandBits(b + prefix(), n, reinterpret_cast<const float*>(b),
                     id() == CodecId::kOneBit ? 2 : 1, alpha, add, out, streamOf(ctx));
    checkLaunch("sign decode");
  }
};

// ---- QSGD -------------------------------------------------------------------------

class CudaQsgd final : public CudaOnePassCodec<CudaQsgd> {
 public:
  CudaQsgd(std::string spec, unsigned levels)
      : CudaOnePassCodec(CodecId::kQsgd, std::move(spec)), levels_(levels) {}
  size_t payloadBytes(size_t n) const override { return kHeaderBytes + format::qsgdBody(n, levels_); }
  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    size_t total = payloadBytes(n);
    auto* b = begin(out, n, total, ctx, 0, ctx.seed, 0, levels_);
    cudaStream_t s = streamOf(ctx);
    size_t chunks = (n + format::kSumChunk - 1) / format::kSumChunk;
    DeviceBuffer<float> a(chunks, s);
    kern::chunkSums(in, n, 1, a.get(), nullptr, nullptr, s);
    auto* norm = reinterpret_cast<float*>(b);
    kern::finalizeScalars(a.get(), nullptr, chunks, nullptr, n, 1, norm, s);
    kern::qsgdEncode(in, n, norm, levels_, ctx.seed, b + 4, s);
    checkLaunch("qsgd encode");
    return total;
  }

 private:
  friend class CudaOnePassCodec<CudaQsgd>;

  void apply(std::span<const std::byte> p, float* out, size_t n, float alpha, bool add,
             const EncodeContext& ctx) const {
    PayloadHeader h = readHeader(p, n, ctx, [](const PayloadHeader& h) {
      return h.param >= 1 && h.param <= 127 ? format::qsgdBody(h.numel, h.param) : ~uint64_t{0};
    });
    CORTADO_ENFORCE(h.count == 0, ErrorCode::kProtocol, "qsgd payload has unexpected count: {}",
                    describe(h));
    const unsigned char* b = bodyOf(p);
    // The code check needs the header's levels, so it is a second round trip.
    cudaStream_t s = streamOf(ctx);
    HostStaging& st = staging();
    check(cudaMemsetAsync(st.deviceFlag, 0, sizeof(int), s), "clear flag");
    kern::qsgdValidate(b + 4, n, h.param, st.deviceFlag, s);
    checkLaunch("qsgd validate");
    check(cudaMemcpyAsync(&st.host->flag, st.deviceFlag, sizeof(int), cudaMemcpyDeviceToHost, s), "read flag");
    check(cudaStreamSynchronize(s), "sync");
    CORTADO_ENFORCE(st.host->flag == 0, ErrorCode::kProtocol,
                    "qsgd payload has a level above {} or non-zero padding bits", h.param);
    kern::qsgdDecode(b + 4, n, reinterpret_cast<const float*>(b), h.param, alpha, add, out,
                     streamOf(ctx));
    checkLaunch("qsgd decode");
  }
  unsigned levels_;
};

// ---- sparse codecs ------------------------------------------------------------------

// decode, decompressAdd and zeroSent of a sparse codec: `Derived::validate(p,
// n, ctx)` checks the payload and returns what `Derived::scatter(p, that,
// out, alpha, zero, ctx)` needs to write its selected elements into `out`
// (out[i] += alpha * value, or out[i] = 0 with `zero`). Derived makes this
// class a friend and keeps the two private.
template <typename Derived>
class CudaSparseCodec : public CudaCodec {
 public:
  using CudaCodec::CudaCodec;
  void decode(std::span<const std::byte> p, float* out, size_t n,
              const EncodeContext& ctx) const override {
    const auto v = self().validate(p, n, ctx);
    check(cudaMemsetAsync(out, 0, n * sizeof(float), streamOf(ctx)), "clear");
    self().scatter(p, v, out, 1.0f, false, ctx);
  }
  void decompressAdd(std::span<const std::byte> p, float* sum, size_t n, float alpha,
                     const EncodeContext& ctx) const override {
    self().scatter(p, self().validate(p, n, ctx), sum, alpha, false, ctx);
  }
  void zeroSent(std::span<const std::byte> p, float* buf, size_t n,
                const EncodeContext& ctx) const override {
    self().scatter(p, self().validate(p, n, ctx), buf, 0.0f, true, ctx);
  }

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

// ---- top-k / DGC --------------------------------------------------------------------

class CudaTopK final : public CudaSparseCodec<CudaTopK> {
 public:
  CudaTopK(CodecId id, std::string spec, double ratio, double sample, float momentum)
      : CudaSparseCodec(id, std::move(spec)), ratio_(ratio), sample_(sample), momentum_(momentum) {}
  bool sparse() const override { return true; }
  float momentumCorrection() const override { return momentum_; }
  size_t payloadBytes(size_t n) const override {
    return kHeaderBytes + format::sparseBody(format::kFromRatio(n, ratio_));
  }
  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    CORTADO_ENFORCE(n <= format::kMaxSparseNumel, ErrorCode::kInvalidArgument,
                    "{} cannot encode {} elements: indices are u32", codecIdName(id()), n);
    size_t k = format::kFromRatio(n, ratio_);
    size_t total = payloadBytes(n);
    auto* b = begin(out, n, total, ctx, 0, 0, k);
    // Sampled as the CPU codec samples (65536 keys for top-k): the threshold
    // only bounds the candidates, the selection stays exact (kernels.h).
    size_t sample = std::max<size_t>(1024, sample_ > 0 ? static_cast<size_t>(sample_ * n) : 65536);
    kern::topkSelect(in, n, k, sample, reinterpret_cast<uint32_t*>(b),
                     reinterpret_cast<float*>(b + 4 * k), streamOf(ctx));
    checkLaunch("topk encode");
    return total;
  }

 private:
  friend class CudaSparseCodec<CudaTopK>;

  // One round trip to the host: a valid payload's body is exactly 8 bytes per
  // selected element (the header check below insists), so the index check
  // runs over the k that the payload's size implies, in the same stream as
  // the header's copy, before either is looked at; then one synchronization.
  // It only reads inside the payload, whatever its header says.
  size_t validate(std::span<const std::byte> p, size_t n, const EncodeContext& ctx) const {
    cudaStream_t s = streamOf(ctx);
    HostStaging& st = staging();
    copyHeader(p, st, ctx);
    const size_t kFromSize = p.size() > kHeaderBytes ? (p.size() - kHeaderBytes) / 8 : 0;
    check(cudaMemsetAsync(st.deviceFlag, 0, sizeof(int), s), "clear flag");
    kern::sparseValidate(reinterpret_cast<const uint32_t*>(bodyOf(p)), kFromSize, n, st.deviceFlag, s);
    checkLaunch("sparse validate");
    check(cudaMemcpyAsync(&st.host->flag, st.deviceFlag, sizeof(int), cudaMemcpyDeviceToHost, s), "read flag");
    check(cudaStreamSynchronize(s), "sync");
    PayloadHeader h = checkHeader(p, st, n, [](const PayloadHeader& h) {
      return h.count <= h.numel ? format::sparseBody(h.count) : ~uint64_t{0};
    });
    CORTADO_ENFORCE(h.param == 0, ErrorCode::kProtocol, "{} payload has unexpected parameters: {}",
                    codecIdName(id()), describe(h));
    CORTADO_ENFORCE(st.host->flag == 0, ErrorCode::kProtocol,
                    "{} payload has an index out of range for {} elements", codecIdName(id()), n);
    return h.count;
  }
  void scatter(std::span<const std::byte> p, size_t k, float* out, float alpha, bool zero,
               const EncodeContext& ctx) const {
    const unsigned char* b = bodyOf(p);
    kern::sparseScatter(reinterpret_cast<const uint32_t*>(b), reinterpret_cast<const float*>(b + 4 * k),
                        k, alpha, zero, out, streamOf(ctx));
    checkLaunch("sparse scatter");
  }
  double ratio_, sample_;
  float momentum_;
};

// ---- random-k -------------------------------------------------------------------------

constexpr uint8_t kUnbiasedFlag = 1;

class CudaRandomK final : public CudaSparseCodec<CudaRandomK> {
 public:
  CudaRandomK(std::string spec, double ratio, uint64_t seed, bool unbiased)
      : CudaSparseCodec(CodecId::kRandomK, std::move(spec)),
        ratio_(ratio),
        seed_(seed),
        unbiased_(unbiased) {}
  bool summable() const override { return true; }
  bool sparse() const override { return true; }
  size_t payloadBytes(size_t n) const override {
    return kHeaderBytes + format::randomKBody(format::kFromRatio(n, ratio_));
  }
  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    CORTADO_ENFORCE(n <= format::kMaxSparseNumel, ErrorCode::kInvalidArgument,
                    "randomk cannot encode {} elements: indices are u32", n);
    size_t k = format::kFromRatio(n, ratio_);
    uint64_t seed = format::randomKSeed(seed_, ctx.seed);
    size_t total = payloadBytes(n);
    auto* b = begin(out, n, total, ctx, unbiased_ ? kUnbiasedFlag : 0, seed, k);
    kern::randomkEncode(in, n, k, seed, reinterpret_cast<float*>(b), streamOf(ctx));
    checkLaunch("randomk encode");
    return total;
  }
  void addPayload(std::span<std::byte> acc, std::span<const std::byte> in,
                  const EncodeContext& ctx) const override {
    std::array<std::byte, kHeaderBytes> host{};
    size_t copy = std::min(acc.size(), kHeaderBytes);
    if (copy) check(cudaMemcpy(host.data(), acc.data(), copy, cudaMemcpyDeviceToHost), "copy header");
    size_t n = parseHeader(std::span<const std::byte>(host.data(), copy), acc.size()).numel;
    PayloadHeader ha = validate(std::span<const std::byte>(acc.data(), acc.size()), n, ctx);
    PayloadHeader hb = validate(in, n, ctx);
    CORTADO_ENFORCE(ha == hb, ErrorCode::kProtocol,
                    "random-k payloads can be added only with the same seed and k: {} vs {}",
                    describe(ha), describe(hb));
    kern::addInto(reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(acc.data()) + kHeaderBytes),
                  reinterpret_cast<const float*>(bodyOf(in)), ha.count, streamOf(ctx));
    checkLaunch("randomk add");
  }

 private:
  friend class CudaSparseCodec<CudaRandomK>;

  PayloadHeader validate(std::span<const std::byte> p, size_t n, const EncodeContext& ctx) const {
    PayloadHeader h = readHeader(
        p, n, ctx,
        [](const PayloadHeader& h) {
          return h.count <= h.numel ? format::randomKBody(h.count) : ~uint64_t{0};
        },
        kUnbiasedFlag);
    CORTADO_ENFORCE(h.param == 0 && (h.count > 0) == (n > 0) && n <= format::kMaxSparseNumel,
                    ErrorCode::kProtocol, "random-k payload has invalid parameters: {}", describe(h));
    return h;
  }
  void scatter(std::span<const std::byte> p, const PayloadHeader& h, float* out, float alpha,
               bool zero, const EncodeContext& ctx) const {
    kern::randomkScatter(reinterpret_cast<const float*>(bodyOf(p)), h.numel, h.count, h.seed,
                         h.flags & kUnbiasedFlag, alpha, zero, out, streamOf(ctx));
    checkLaunch("randomk scatter");
  }
  double ratio_;
  uint64_t seed_;
  bool unbiased_;
};

}  // namespace

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace cuda

void registerCudaCodecs(Registry& r) {
  using namespace cuda;
  // Same names and parameters as the CPU codecs: reuse their declarations.
  Registry cpu;
  registerCpuCodecs(cpu);
  auto info = [&](const char* name) { return cpu.info(name); };
  r.add(Device::kCuda, info("fp16"), [](const Params& p) {
    return std::make_unique<CudaCast>(CodecId::kFp16, p.canonical());
  });
  r.add(Device::kCuda, info("bf16"), [](const Params& p) {
    return std::make_unique<CudaCast>(CodecId::kBf16, p.canonical());
  });
  r.add(Device::kCuda, info("onebit"), [](const Params& p) {
    return std::make_unique<CudaSign>(CodecId::kOneBit, p.canonical());
  });
  r.add(Device::kCuda, info("efsignsgd"), [](const Params& p) {
    return std::make_unique<CudaSign>(CodecId::kEfSignSgd, p.canonical());
  });
  r.add(Device::kCuda, info("qsgd"), [](const Params& p) {
    return std::make_unique<CudaQsgd>(p.canonical(), static_cast<unsigned>(p.getInt("levels")));
  });
  r.add(Device::kCuda, info("topk"), [](const Params& p) {
    return std::make_unique<CudaTopK>(CodecId::kTopK, p.canonical(), p.get("ratio"), 0.0, 0.0f);
  });
  r.add(Device::kCuda, info("dgc"), [](const Params& p) {
    return std::make_unique<CudaTopK>(CodecId::kDgc, p.canonical(), p.get("ratio"), p.get("sample"),
                                      static_cast<float>(p.get("momentum")));
  });
  r.add(Device::kCuda, info("randomk"), [](const Params& p) {
    return std::make_unique<CudaRandomK>(p.canonical(), p.get("ratio"),
                                         static_cast<uint64_t>(p.getInt("seed")),
                                         p.getBool("unbiased"));
  });
}

}  // namespace cortado::compressor
