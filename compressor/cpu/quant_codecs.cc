// QSGD, TernGrad and natural compression: unbiased stochastic quantizers.
// Each element draws its uniform from format::hash2(seed, index), so the
// result depends only on (input, seed): reproducible, thread-count
// independent, and the same on the GPU for QSGD.
#include <cmath>
#include <vector>

#include "compressor/cpu/codec_base.h"
#include "compressor/cpu/cpu_codecs.h"
#include "compressor/cpu/kernels.h"
#include "compressor/format.h"

namespace cortado::compressor::cpu {
namespace {

using format::hash2;
using format::uniform01;

// ---- QSGD -------------------------------------------------------------------

class QsgdCodec final : public OnePassCodec<QsgdCodec> {
 public:
  QsgdCodec(std::string spec, unsigned levels)
      : OnePassCodec(CodecId::kQsgd, std::move(spec)), levels_(levels) {}
  size_t payloadBytes(size_t n) const override {
    return kHeaderBytes + format::qsgdBody(n, levels_);
  }

  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    size_t total = payloadBytes(n);
    std::byte* body = beginPayload(out, n, total, ctx, 0, ctx.seed, 0, levels_);
    std::vector<float> chunks((n + format::kSumChunk - 1) / format::kSumChunk);
    parallelAligned(ctx.pool, n, format::kSumChunk, [&](size_t b, size_t e) {
      sqSumChunks(in + b, e - b, chunks.data() + b / format::kSumChunk);
    });
    auto norm = static_cast<float>(std::sqrt(combineChunks(chunks.data(), chunks.size())));
    storeLe<float>(body, norm);
    auto* codes = reinterpret_cast<uint8_t*>(body + 4);
    const unsigned bits = format::qsgdBits(levels_);
    const bool quantize = norm > 0.0f && std::isfinite(norm);
    const float s = static_cast<float>(levels_);
    const uint64_t seed = ctx.seed;
    parallelAligned(ctx.pool, n, 8, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        uint32_t code = 0;
        if (quantize) {
          float r = std::fabs(in[i]) / norm * s;
          float l = std::floor(r);
          auto level = static_cast<uint32_t>(l) + (uniform01(hash2(seed, i)) < r - l ? 1u : 0u);
          level = level > levels_ ? levels_ : level;
          code = level | (static_cast<uint32_t>(in[i] < 0.0f) << (bits - 1));
        }
        size_t bit = i * bits;
        if (bits == 8) {
          codes[i] = static_cast<uint8_t>(code);
        } else {
          // Elements of one byte always fall in one thread's range (8-aligned).
          uint8_t& byte = codes[bit / 8];
          if (bit % 8 == 0) byte = 0;
          byte |= static_cast<uint8_t>(code << (bit % 8));
        }
      }
    });
    return total;
  }

 private:
  friend class OnePassCodec<QsgdCodec>;

  // The code of element i: `bits` bits (8: a whole byte), little-endian order.
  static uint32_t codeAt(const uint8_t* codes, unsigned bits, size_t i) {
    if (bits == 8) return codes[i];
    size_t bit = i * bits;
    return (codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
  }
  // Header, every code's level within the payload's levels, zero padding.
  // Returns the levels.
  unsigned check(std::span<const std::byte> payload, size_t n) const {
    PayloadHeader h = checkPayload(payload, n, [](const PayloadHeader& h) {
      return h.param >= 1 && h.param <= 127 ? format::qsgdBody(h.numel, h.param) : ~uint64_t{0};
    });
    CORTADO_ENFORCE(h.count == 0, ErrorCode::kProtocol, "qsgd payload has unexpected count: {}",
                    describe(h));
    const unsigned levels = h.param, bits = format::qsgdBits(levels);
    auto* codes = reinterpret_cast<const uint8_t*>(body(payload) + 4);
    const uint32_t signBit = 1u << (bits - 1);
    for (size_t i = 0; i < n; ++i)
      CORTADO_ENFORCE((codeAt(codes, bits, i) & (signBit - 1)) <= levels, ErrorCode::kProtocol,
                      "qsgd payload: element {} has level {} above the {} levels", i,
                      codeAt(codes, bits, i) & (signBit - 1), levels);
    size_t usedBits = n * bits;
    if (usedBits % 8)
      CORTADO_ENFORCE((codes[usedBits / 8] >> (usedBits % 8)) == 0, ErrorCode::kProtocol,
                      "qsgd payload has non-zero padding bits");
    return levels;
  }

  void apply(std::span<const std::byte> payload, float* out, size_t n, float alpha, bool add,
             const EncodeContext& ctx) const {
    const unsigned levels = check(payload, n), bits = format::qsgdBits(levels);
    const std::byte* b = body(payload);
    float norm = loadLe<float>(b);
    auto* codes = reinterpret_cast<const uint8_t*>(b + 4);
    // Table of every code's value.
    const uint32_t numCodes = 1u << bits, signBit = 1u << (bits - 1);
    float table[256];
    for (uint32_t c = 0; c < numCodes; ++c) {
      uint32_t level = c & (signBit - 1);
      float mag = norm * (static_cast<float>(level) / static_cast<float>(levels));
      table[c] = alpha * ((c & signBit) ? -mag : mag);
    }
    auto codeAt = [&](size_t i) { return QsgdCodec::codeAt(codes, bits, i); };
    parallelAligned(ctx.pool, n, 8, [&](size_t s, size_t e) {
      for (size_t i = s; i < e; ++i) out[i] = add ? out[i] + table[codeAt(i)] : table[codeAt(i)];
    });
  }

  unsigned levels_;
};

// ---- TernGrad -----------------------------------------------------------------

class TernGradCodec final : public OnePassCodec<TernGradCodec> {
 public:
  explicit TernGradCodec(std::string spec) : OnePassCodec(CodecId::kTernGrad, std::move(spec)) {}
  size_t payloadBytes(size_t n) const override { return kHeaderBytes + format::ternBody(n); }

  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    size_t total = payloadBytes(n);
    std::byte* body = beginPayload(out, n, total, ctx, 0, ctx.seed);
    float scale = maxAbs(in, n);
    storeLe<float>(body, scale);
    auto* codes = reinterpret_cast<uint8_t*>(body + 4);
    const bool quantize = scale > 0.0f && std::isfinite(scale);
    const uint64_t seed = ctx.seed;
    parallelAligned(ctx.pool, n, 8, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; i += 4) {
        uint8_t byte = 0;
        for (size_t j = 0; j < 4 && i + j < e; ++j) {
          float x = in[i + j];
          bool keep = quantize && uniform01(hash2(seed, i + j)) < std::fabs(x) / scale;
          uint8_t code = keep ? (x < 0.0f ? 2 : 1) : 0;
          byte |= static_cast<uint8_t>(code << (2 * j));
        }
        codes[i / 4] = byte;
      }
    });
    return total;
  }

 private:
  friend class OnePassCodec<TernGradCodec>;

  // Header, no code 3, zero padding.
  void check(std::span<const std::byte> payload, size_t n) const {
    PayloadHeader h = checkPayload(payload, n, [](const PayloadHeader& h) {
      return format::ternBody(h.numel);
    });
    CORTADO_ENFORCE(h.count == 0 && h.param == 0, ErrorCode::kProtocol,
                    "terngrad payload has unexpected parameters: {}", describe(h));
    auto* codes = reinterpret_cast<const uint8_t*>(body(payload) + 4);
    size_t bytes = (n + 3) / 4;
    for (size_t i = 0; i < bytes; ++i) {
      uint8_t c = codes[i];
      // Code 3 is unused: two bits both set anywhere means a corrupt payload.
      CORTADO_ENFORCE((c & (c >> 1) & 0x55) == 0, ErrorCode::kProtocol,
                      "terngrad payload: invalid code 3 in byte {}", i);
    }
    if (n % 4)
      CORTADO_ENFORCE((codes[n / 4] >> (2 * (n % 4))) == 0, ErrorCode::kProtocol,
                      "terngrad payload has non-zero padding bits");
  }

  void apply(std::span<const std::byte> payload, float* out, size_t n, float alpha, bool add,
             const EncodeContext& /*ctx*/) const {
    check(payload, n);
    const std::byte* b = body(payload);
    float scale = loadLe<float>(b);
    auto* codes = reinterpret_cast<const uint8_t*>(b + 4);
    const float table[3] = {0.0f, alpha * scale, -alpha * scale};
    for (size_t i = 0; i < n; ++i) {
      float v = table[(codes[i / 4] >> (2 * (i % 4))) & 3];
      out[i] = add ? out[i] + v : v;
    }
  }
};

// ---- natural compression -------------------------------------------------

class NaturalCodec final : public OnePassCodec<NaturalCodec> {
 public:
  explicit NaturalCodec(std::string spec) : OnePassCodec(CodecId::kNatural, std::move(spec)) {}
  size_t payloadBytes(size_t n) const override { return kHeaderBytes + format::naturalBody(n); }

  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    size_t total = payloadBytes(n);
    float mx = maxAbs(in, n);
    int top = 0;
    if (!std::isfinite(mx)) {
      top = 128;  // code 1 = 2^128 decodes as inf: non-finite stays non-finite
    } else if (mx > 0.0f) {
      std::frexp(mx, &top);  // mx in [2^(top-1), 2^top)
    }
    auto* codes = reinterpret_cast<uint8_t*>(
        beginPayload(out, n, total, ctx, 0, ctx.seed, 0, static_cast<uint32_t>(top)));
    const double lo = std::ldexp(1.0, top - 126);  // magnitude of code 127
    const uint64_t seed = ctx.seed;
    parallelAligned(ctx.pool, n, 8, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        double a = std::fabs(static_cast<double>(in[i]));
        double u = uniform01(hash2(seed, i));
        uint8_t code = 0;
        if (!std::isfinite(a)) {
          code = 1;
        } else if (a >= lo) {
          int fe;
          double m = std::frexp(a, &fe);  // a = m 2^fe, m in [0.5, 1)
          double p = 2.0 * m - 1.0;       // a = 2^(fe-1) (1 + p)
          int exp = fe - 1 + (u < p ? 1 : 0);
          code = static_cast<uint8_t>(top + 1 - exp);
        } else if (a > 0.0 && u < a / lo) {
          code = 127;  // below the smallest code: round to it or to zero, unbiased
        }
        codes[i] = static_cast<uint8_t>(code | (in[i] < 0.0f && code ? 0x80 : 0));
      }
    });
    return total;
  }

 private:
  friend class OnePassCodec<NaturalCodec>;

  // Header, the top exponent in range, no negative zero code. Returns the
  // top exponent.
  int32_t check(std::span<const std::byte> payload, size_t n) const {
    PayloadHeader h = checkPayload(payload, n, [](const PayloadHeader& h) {
      return format::naturalBody(h.numel);
    });
    auto top = static_cast<int32_t>(h.param);
    CORTADO_ENFORCE(h.count == 0 && top >= -160 && top <= 128, ErrorCode::kProtocol,
                    "natural payload has invalid parameters (top exponent {}): {}", top,
                    describe(h));
    auto* codes = reinterpret_cast<const uint8_t*>(body(payload));
    for (size_t i = 0; i < n; ++i)
      CORTADO_ENFORCE(codes[i] != 0x80, ErrorCode::kProtocol,
                      "natural payload: element {} is a negative zero code", i);
    return top;
  }

  void apply(std::span<const std::byte> payload, float* out, size_t n, float alpha, bool add,
             const EncodeContext& /*ctx*/) const {
    const int32_t top = check(payload, n);
    auto* codes = reinterpret_cast<const uint8_t*>(body(payload));
    float table[256];
    for (int c = 0; c < 128; ++c) {
      float mag = c == 0 ? 0.0f : static_cast<float>(std::ldexp(1.0, top + 1 - c));
      table[c] = alpha * mag;
      table[c | 0x80] = -alpha * mag;
    }
    for (size_t i = 0; i < n; ++i) out[i] = add ? out[i] + table[codes[i]] : table[codes[i]];
  }
};

}  // namespace

void registerQuantCodecs(Registry& r) {
  r.add(Device::kCpu,
        {"qsgd",
         "L2 norm + per element sign and one of s levels, stochastic rounding (unbiased); "
         "2, 4 or 8 bits per element",
         {{"levels", 7, 1, 127, true, "number of levels s (1: 2 bits, <=7: 4 bits, <=127: 8 bits)"}}},
        [](const Params& p) {
          return std::make_unique<QsgdCodec>(p.canonical(), static_cast<unsigned>(p.getInt("levels")));
        });
  r.add(Device::kCpu,
        {"terngrad", "max magnitude + {-1, 0, +1} per element in 2 bits, stochastic (unbiased)", {}},
        [](const Params& p) { return std::make_unique<TernGradCodec>(p.canonical()); });
  r.add(Device::kCpu,
        {"natural",
         "sign + power-of-two exponent per element in 1 byte, stochastic rounding (unbiased)", {}},
        [](const Params& p) { return std::make_unique<NaturalCodec>(p.canonical()); });
}

}  // namespace cortado::compressor::cpu
