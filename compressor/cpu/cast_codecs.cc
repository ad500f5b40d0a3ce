// fp16 and bf16: a cast to 16 bits. Exact enough to sum as is, so servers may
// add payloads in compressed form.
#include <algorithm>

#include "compressor/cpu/codec_base.h"
#include "compressor/cpu/cpu_codecs.h"
#include "compressor/cpu/kernels.h"
#include "compressor/format.h"
#include "core/common/half.h"

namespace cortado::compressor::cpu {
namespace {

class CastCodec final : public CodecBase {
 public:
  CastCodec(CodecId id, std::string spec) : CodecBase(id, std::move(spec)) {}
  bool summable() const override { return true; }
  size_t payloadBytes(size_t n) const override { return kHeaderBytes + format::castBody(n); }

  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    size_t total = payloadBytes(n);
    auto* dst = reinterpret_cast<uint16_t*>(beginPayload(out, n, total, ctx));
    parallelAligned(ctx.pool, n, 8, [&](size_t b, size_t e) { toHalf(in + b, dst + b, e - b); });
    return total;
  }

  void decode(std::span<const std::byte> payload, float* out, size_t n,
              const EncodeContext& ctx) const override {
    check(payload, n);
    const uint16_t* src = halves(payload);
    parallelAligned(ctx.pool, n, 8, [&](size_t b, size_t e) { toFloat(src + b, out + b, e - b); });
  }

  void decompressAdd(std::span<const std::byte> payload, float* sum, size_t n, float alpha,
                     const EncodeContext& ctx) const override {
    check(payload, n);
    const uint16_t* src = halves(payload);
    parallelAligned(ctx.pool, n, 8, [&](size_t b, size_t e) {
      // Convert through a small stack buffer: stays in L1, no dense copy.
      float tmp[1024];
      for (size_t i = b; i < e; i += 1024) {
        size_t len = std::min<size_t>(1024, e - i);
        toFloat(src + i, tmp, len);
        for (size_t j = 0; j < len; ++j) sum[i + j] += alpha * tmp[j];
      }
    });
  }

  void validate(std::span<const std::byte> payload, size_t n) const override { check(payload, n); }

  void addPayload(std::span<std::byte> acc, std::span<const std::byte> in,
                  const EncodeContext& ctx) const override {
    PayloadHeader ha = parseHeader(acc);
    size_t n = ha.numel;
    check(acc, n);
    check(in, n);
    auto* a = reinterpret_cast<uint16_t*>(acc.data() + kHeaderBytes);
    const uint16_t* b = halves(in);
    float ta[1024], tb[1024];
    for (size_t i = 0; i < n; i += 1024) {
      size_t len = std::min<size_t>(1024, n - i);
      toFloat(a + i, ta, len);
      toFloat(b + i, tb, len);
      for (size_t j = 0; j < len; ++j) ta[j] += tb[j];
      toHalf(ta, a + i, len);
    }
  }

 private:
  void check(std::span<const std::byte> payload, size_t n) const {
    PayloadHeader h = checkPayload(payload, n, [](const PayloadHeader& h) {
      return format::castBody(h.numel);
    });
    CORTADO_ENFORCE(h.count == 0 && h.param == 0, ErrorCode::kProtocol,
                    "{} payload has unexpected parameters: {}", codecIdName(id()), describe(h));
  }
  static const uint16_t* halves(std::span<const std::byte> p) {
    return reinterpret_cast<const uint16_t*>(p.data() + kHeaderBytes);
  }
  void toHalf(const float* in, uint16_t* out, size_t n) const {
    if (id() == CodecId::kFp16)
      floatToHalfN(in, out, n);
    else
      floatToBf16(in, out, n);
  }
  void toFloat(const uint16_t* in, float* out, size_t n) const {
    if (id() == CodecId::kFp16)
      halfToFloatN(in, out, n);
    else
      bf16ToFloatN(in, out, n);
  }
};

}  // namespace

void registerCastCodecs(Registry& r) {
  r.add(Device::kCpu, {"fp16", "IEEE half per element (2 bytes), round to nearest even", {}},
        [](const Params& p) { return std::make_unique<CastCodec>(CodecId::kFp16, p.canonical()); });
  r.add(Device::kCpu, {"bf16", "bfloat16 per element (2 bytes), round to nearest even", {}},
        [](const Params& p) { return std::make_unique<CastCodec>(CodecId::kBf16, p.canonical()); });
}

}  // namespace cortado::compressor::cpu
