// onebit, signSGD and EFSignSGD: one sign bit per element (1 = negative) plus,
// for onebit, the means of the negatives and of the non-negatives, and for
// EFSignSGD the mean magnitude. Encoding is one pass over the input; the sums
// follow format.h's fixed order so the CUDA encoder produces the same bytes.
#include <atomic>
#include <cmath>
#include <vector>

#include "compressor/cpu/codec_base.h"
#include "compressor/cpu/cpu_codecs.h"
#include "compressor/cpu/kernels.h"
#include "compressor/format.h"

namespace cortado::compressor::cpu {
namespace {

using format::kSumChunk;

size_t numChunks(size_t n) { return (n + kSumChunk - 1) / kSumChunk; }

class SignCodec final : public OnePassCodec<SignCodec> {
 public:
  SignCodec(CodecId id, std::string spec) : OnePassCodec(id, std::move(spec)) {}

  size_t payloadBytes(size_t n) const override { return kHeaderBytes + bodyFor(n); }

  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    return encodeAny(in, nullptr, n, out, ctx);
  }
  // Error feedback's update a sum chunk at a time, each chunk encoded while
  // it is still in the cache.
  size_t encodeUpdated(const FeedbackUpdate& up, size_t n, std::span<std::byte> out,
                       const EncodeContext& ctx) const override {
    return encodeAny(up.e, &up, n, out, ctx);
  }

 private:
  friend class OnePassCodec<SignCodec>;

  // in is up->e when up is not null.
  size_t encodeAny(const float* in, const FeedbackUpdate* up, size_t n, std::span<std::byte> out,
                   const EncodeContext& ctx) const {
    // kernel(b, e) over [b, e), after the update where there is one, a sum
    // chunk at a time (the chunks' sums are the same either way).
    auto run = [up](size_t b, size_t e, auto&& kernel) {
      if (!up) return kernel(b, e);
      for (size_t c = b; c < e; c += kSumChunk) {
        const size_t ce = std::min(e, c + kSumChunk);
        applyUpdate(*up, c, ce);
        kernel(c, ce);
      }
    };
    size_t total = payloadBytes(n);
    std::byte* body = beginPayload(out, n, total, ctx);
    size_t prefix = id() == CodecId::kOneBit ? 8 : id() == CodecId::kEfSignSgd ? 4 : 0;
    auto* bits = reinterpret_cast<uint8_t*>(body + prefix);
    if (id() == CodecId::kSignSgd) {
      parallelAligned(ctx.pool, n, 256, [&](size_t b, size_t e) {
        run(b, e, [&](size_t c, size_t ce) { signBits(in + c, ce - c, bits + c / 8); });
      });
      return total;
    }
    std::vector<float> chunksA(numChunks(n)), chunksB(numChunks(n));
    if (id() == CodecId::kOneBit) {
      std::atomic<uint64_t> negCount{0};
      parallelAligned(ctx.pool, n, kSumChunk, [&](size_t b, size_t e) {
        uint64_t neg = 0;
        run(b, e, [&](size_t c, size_t ce) {
          uint64_t part = 0;  // oneBitScan stores its count, not adds it
          oneBitScan(in + c, ce - c, bits + c / 8, chunksA.data() + c / kSumChunk,
                     chunksB.data() + c / kSumChunk, &part);
          neg += part;
        });
        negCount += neg;
      });
      uint64_t neg = negCount.load(), pos = n - neg;
      double negSum = combineChunks(chunksA.data(), chunksA.size());
      double posSum = combineChunks(chunksB.data(), chunksB.size());
      storeLe<float>(body, neg ? static_cast<float>(negSum / static_cast<double>(neg)) : 0.0f);
      storeLe<float>(body + 4, pos ? static_cast<float>(posSum / static_cast<double>(pos)) : 0.0f);
    } else {
      parallelAligned(ctx.pool, n, kSumChunk, [&](size_t b, size_t e) {
        run(b, e, [&](size_t c, size_t ce) {
          absSumBits(in + c, ce - c, bits + c / 8, chunksA.data() + c / kSumChunk);
        });
      });
      double absSum = combineChunks(chunksA.data(), chunksA.size());
      storeLe<float>(body, n ? static_cast<float>(absSum / static_cast<double>(n)) : 0.0f);
    }
    return total;
  }

  size_t bodyFor(size_t n) const {
    switch (id()) {
      case CodecId::kOneBit: return format::oneBitBody(n);
      case CodecId::kEfSignSgd: return format::efSignBody(n);
      default: return format::signBody(n);
    }
  }

  // Bytes of the body before the bits: onebit's two means, efsignsgd's scale.
  size_t prefixBytes() const {
    return id() == CodecId::kOneBit ? 8 : id() == CodecId::kEfSignSgd ? 4 : 0;
  }
  void check(std::span<const std::byte> payload, size_t n) const {
    PayloadHeader h = checkPayload(payload, n, [&](const PayloadHeader& h) {
      return bodyFor(h.numel);
    });
    CORTADO_ENFORCE(h.count == 0 && h.param == 0, ErrorCode::kProtocol,
                    "{} payload has unexpected parameters: {}", codecIdName(id()), describe(h));
    auto* bits = reinterpret_cast<const uint8_t*>(body(payload) + prefixBytes());
    // Padding bits of the last byte must be zero: a canonical payload has one encoding.
    if (n % 8)
      CORTADO_ENFORCE((bits[n / 8] >> (n % 8)) == 0, ErrorCode::kProtocol,
                      "{} payload has non-zero padding bits", codecIdName(id()));
  }

  void apply(std::span<const std::byte> payload, float* out, size_t n, float alpha, bool add,
             const EncodeContext& ctx) const {
    check(payload, n);
    const std::byte* b = body(payload);
    float neg = -1.0f, pos = 1.0f;
    if (id() == CodecId::kOneBit) {
      neg = loadLe<float>(b);
      pos = loadLe<float>(b + 4);
    } else if (id() == CodecId::kEfSignSgd) {
      float scale = loadLe<float>(b);
      neg = -scale;
      pos = scale;
    }
    auto* bits = reinterpret_cast<const uint8_t*>(b + prefixBytes());
    parallelAligned(ctx.pool, n, 8, [&](size_t s, size_t e) {
      expandBits(bits + s / 8, e - s, neg, pos, alpha, add, out + s);
    });
  }
};

}  // namespace

void registerSignCodecs(Registry& r) {
  r.add(Device::kCpu,
        {"onebit", "sign bit per element plus the means of the negatives and non-negatives", {}},
        [](const Params& p) { return std::make_unique<SignCodec>(CodecId::kOneBit, p.canonical()); });
  r.add(Device::kCpu, {"signsgd", "sign bit per element, decoded as -1/+1", {}},
        [](const Params& p) {
          return std::make_unique<SignCodec>(CodecId::kSignSgd, p.canonical());
        });
  r.add(Device::kCpu,
        {"efsignsgd", "sign bit per element times the mean magnitude (use with error feedback)",
         {}},
        [](const Params& p) {
          return std::make_unique<SignCodec>(CodecId::kEfSignSgd, p.canonical());
        });
}

}  // namespace cortado::compressor::cpu
