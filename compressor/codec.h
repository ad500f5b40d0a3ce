// The codec interface: a dense fp32 tensor becomes a self-describing payload
// (payload.h has the header) and back. Workers encode; servers validate,
// decompress-add into an fp32 sum and re-encode the sum.
//
// Contract, for every implementation:
// - A Codec object is immutable after construction; every method is const and
//   may be called from several threads at once. Per-tensor state (error
//   feedback residuals, DGC momentum, PowerSGD's warm start) lives outside, in
//   ErrorFeedback or PowerSgd objects that the caller owns.
// - All pointers and spans live on device(): host memory for CPU codecs,
//   device memory for CUDA codecs (then EncodeContext::stream orders the work
//   and calls are asynchronous with respect to the host unless stated).
// - The caller owns every buffer. `out` of encode() must hold at least
//   payloadBytes(n) bytes; encode() returns the bytes written, which is
//   exactly payloadBytes(n).
// - Decoding validates the header and the body before it writes anything:
//   a bad header, a size that does not match, a truncated body or an index out
//   of range throws cortado::Error(kProtocol) and leaves the output untouched.
//   Nothing is ever read past the end of the payload span.
// - Misuse by the caller (a wrong n, a too small output) throws kInvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/common/dtype.h"

namespace cortado {
class ThreadPool;
}

namespace cortado::compressor {

// Wire ids: never renumber, only append.
enum class CodecId : uint8_t {
  kFp16 = 1,
  kBf16 = 2,
  kOneBit = 3,
  kSignSgd = 4,
  kEfSignSgd = 5,
  kTopK = 6,
  kRandomK = 7,
  kDgc = 8,
  kQsgd = 9,
  kTernGrad = 10,
  kNatural = 11,
  kPowerSgd = 12,
};
inline constexpr uint8_t kMaxCodecId = 12;

const char* codecIdName(CodecId id);
bool isValidCodecId(uint8_t raw);

enum class Device : uint8_t { kCpu = 0, kCuda = 1 };
const char* deviceName(Device d);

// What one encode call needs besides the data.
struct EncodeContext {
  // Optional helpers for CPU codecs; nullptr runs on the calling thread.
  ThreadPool* pool = nullptr;
  // Randomness. Stochastic codecs (QSGD, TernGrad, natural) draw from
  // hash(seed, element): give each worker its own seed per round. Random-k
  // draws its indices from hash(codec seed, seed): give every worker the SAME
  // value for the same round (e.g. the iteration) so payloads are summable.
  uint64_t seed = 0;
  // The tensor's dtype at the worker, recorded in the header so the receiver
  // knows what to cast the fp32 result back to. Input is always fp32.
  DType dtype = DType::kFloat32;
  // PowerSGD only: rows of the matrix view (n = rows * cols); 0 = 1-D tensor,
  // which PowerSGD passes uncompressed.
  size_t rows = 0;
  // CUDA codecs: the cudaStream_t to run on (nullptr = default stream).
  void* stream = nullptr;
  // Error feedback with momentum (DGC): zero all of u after this encode, not
  // only where the payload sent something. The plan executor sets it when
  // the input carries residuals that a change of plan or of group boundaries
  // folded in (v and m u of retired encode points): they are velocity
  // already, so they enter v once and must not stay in u, where every later
  // step would add m times them again (error_feedback.h).
  bool restartMomentum = false;
};

// Error feedback's per-element update (error_feedback.h), for a codec that
// folds it into its own pass over the input (Codec::encodeUpdated): with u,
// u[i] = m u[i] + g[i] then e[i] += u[i] (DGC's momentum correction);
// without (u null), e[i] += g[i]. Every pointer covers n elements.
struct FeedbackUpdate {
  float* e;
  float* u;
  const float* g;
  float m;
};

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecId id() const = 0;
  virtual Device device() const { return Device::kCpu; }
  // Canonical spec string with every parameter, e.g. "topk:ratio=0.01".
  virtual std::string spec() const = 0;
  // True when payloads of the same tensor and round can be added in
  // compressed form (addPayload). fp16 and bf16 are; random-k is when every
  // worker used the same seed; top-k and the sign codecs are not.
  virtual bool summable() const { return false; }
  // True when the payload names a subset of elements (top-k, random-k, DGC):
  // error feedback then zeroes momentum only where something was sent.
  virtual bool sparse() const { return false; }
  // DGC's momentum m (u = m u + g; v = v + u): ErrorFeedback applies it when
  // wrapping this codec. 0 for every other codec.
  virtual float momentumCorrection() const { return 0.0f; }
  // Exact payload size, header included, for an n-element tensor.
  // PowerSGD's depends on the shape: it assumes a 1-D tensor (ctx.rows = 0);
  // use payloadBytes(n, rows) for a matrix.
  virtual size_t payloadBytes(size_t n) const = 0;
  virtual size_t payloadBytes(size_t n, size_t rows) const { return payloadBytes(n); }

  virtual size_t encode(const float* in, size_t n, std::span<std::byte> out,
                        const EncodeContext& ctx) const = 0;
  // Applies `up` to every element and encodes up.e: the same state and the
  // same payload, bit for bit, as running the update and then encode(up.e),
  // in fewer passes over memory. Returns the payload's bytes, or 0 where the
  // codec has no such pass (the default): the caller then runs the two.
  // top-k and DGC fold the update into their selection's scan, the sign
  // codecs (onebit, signSGD, EFSignSGD) into their pass a sum chunk at a time.
  virtual size_t encodeUpdated(const FeedbackUpdate& up, size_t n, std::span<std::byte> out,
                               const EncodeContext& ctx) const {
    return 0;
  }
  // out[0..n) = decoded tensor; n must equal the header's element count.
  virtual void decode(std::span<const std::byte> payload, float* out, size_t n,
                      const EncodeContext& ctx = {}) const = 0;
  // sum[i] += alpha * decoded[i], without materializing the dense tensor.
  // Several sparse payloads into one sum add up at duplicate indices.
  virtual void decompressAdd(std::span<const std::byte> payload, float* sum, size_t n,
                             float alpha = 1.0f, const EncodeContext& ctx = {}) const = 0;
  // Every check decode() runs on `payload` for an n-element tensor, writing
  // nothing: throws kProtocol exactly where decode() would. A server that
  // adds several payloads of one push validates them all before it adds any.
  // CPU codecs (host payloads); the CUDA codecs check on the device, in
  // decode(), and refuse this with kInvalidArgument.
  virtual void validate(std::span<const std::byte> payload, size_t n) const;
  // Summable codecs only: acc += in in compressed form; both must describe the
  // same tensor with the same parameters (and seed, for random-k), else kProtocol.
  virtual void addPayload(std::span<std::byte> acc, std::span<const std::byte> in,
                          const EncodeContext& ctx = {}) const;
  // Sparse codecs only: buf[i] = 0 for every index the payload carries
  // (DGC momentum correction). Validates like decode.
  virtual void zeroSent(std::span<const std::byte> payload, float* buf, size_t n,
                        const EncodeContext& ctx = {}) const;
};

using CodecPtr = std::shared_ptr<const Codec>;

}  // namespace cortado::compressor
