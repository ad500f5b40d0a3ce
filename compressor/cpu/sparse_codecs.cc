// top-k, DGC and random-k: a subset of elements. top-k and DGC send k u32
// indices (ascending) then k f32 values; both select exactly the k largest
// magnitudes (DGC from a larger sample, and ErrorFeedback adds its momentum
// correction). random-k sends only values: the receiver rebuilds the indices
// from the seed in the header, which every worker shares within a round.
#include <algorithm>
#include <cstring>
#include <vector>

#include "compressor/cpu/codec_base.h"
#include "compressor/cpu/cpu_codecs.h"
#include "compressor/cpu/kernels.h"
#include "compressor/cpu/topk_select.h"
#include "compressor/format.h"
#include "core/common/thread_pool.h"

namespace cortado::compressor::cpu {
namespace {

void checkSparseNumel(CodecId id, size_t n) {
  CORTADO_ENFORCE(n <= format::kMaxSparseNumel, ErrorCode::kInvalidArgument,
                  "{} cannot encode {} elements: indices are u32, split the tensor into chunks",
                  codecIdName(id), n);
}

class TopKCodec final : public CodecBase {
 public:
  // sampleFraction 0: top-k's fixed 64K-element sample; DGC: its own fraction.
  TopKCodec(CodecId id, std::string spec, double ratio, double sampleFraction, float momentum)
      : CodecBase(id, std::move(spec)),
        ratio_(ratio),
        sampleFraction_(sampleFraction),
        momentum_(momentum) {}
  bool sparse() const override { return true; }
  float momentumCorrection() const override { return momentum_; }
  size_t payloadBytes(size_t n) const override {
    return kHeaderBytes + format::sparseBody(format::kFromRatio(n, ratio_));
  }

  size_t encode(const float* in, size_t n, std::span<std::byte> out,
                const EncodeContext& ctx) const override {
    return encodeAny(in, nullptr, n, out, ctx);
  }
  // Error feedback's update in the selection's first scan.
  size_t encodeUpdated(const FeedbackUpdate& up, size_t n, std::span<std::byte> out,
                       const EncodeContext& ctx) const override {
    return encodeAny(up.e, &up, n, out, ctx);
  }

  void decode(std::span<const std::byte> payload, float* out, size_t n,
              const EncodeContext&) const override {
    size_t k = check(payload, n);
    std::fill(out, out + n, 0.0f);
    scatter(payload, k, out, 1.0f);
  }
  void decompressAdd(std::span<const std::byte> payload, float* sum, size_t n, float alpha,
                     const EncodeContext&) const override {
    size_t k = check(payload, n);
    scatter(payload, k, sum, alpha);
  }
  void validate(std::span<const std::byte> payload, size_t n) const override { check(payload, n); }
  void zeroSent(std::span<const std::byte> payload, float* buf, size_t n,
                const EncodeContext&) const override {
    size_t k = check(payload, n);
    const std::byte* idx = body(payload);
    for (size_t i = 0; i < k; ++i) buf[loadLe<uint32_t>(idx + 4 * i)] = 0.0f;
  }

 private:
  // in is up->e when up is not null.
  size_t encodeAny(const float* in, const FeedbackUpdate* up, size_t n, std::span<std::byte> out,
                   const EncodeContext& ctx) const {
    checkSparseNumel(id(), n);
    size_t k = format::kFromRatio(n, ratio_);
    size_t total = payloadBytes(n);
    std::byte* body = beginPayload(out, n, total, ctx, 0, 0, k);
    // The selection writes the indices and their values into the payload.
    size_t sample = std::max<size_t>(
        sampleFraction_ > 0 ? static_cast<size_t>(sampleFraction_ * n) : 65536, 1024);
    if (up)
      selectTopKUpdating(*up, n, k, sample, ctx.pool, body, body + 4 * k);
    else
      selectTopK(reinterpret_cast<const std::byte*>(in), n, k, sample, ctx.pool, body,
                 body + 4 * k);
    return total;
  }

  // Validates everything, indices included, before anything is written.
  size_t check(std::span<const std::byte> payload, size_t n) const {
    PayloadHeader h = checkPayload(payload, n, [](const PayloadHeader& h) {
      return h.count <= h.numel ? format::sparseBody(h.count) : ~uint64_t{0};
    });
    CORTADO_ENFORCE(h.param == 0, ErrorCode::kProtocol, "{} payload has unexpected parameters: {}",
                    codecIdName(id()), describe(h));
    const std::byte* idx = body(payload);
    uint32_t bad = 0;
    size_t badAt = 0;
    for (size_t i = 0; i < h.count; ++i) {
      uint32_t j = loadLe<uint32_t>(idx + 4 * i);
      if (j >= n && !bad) {
        bad = 1;
        badAt = i;
      }
    }
    CORTADO_ENFORCE(!bad, ErrorCode::kProtocol,
                    "{} payload: index #{} is {}, out of range for {} elements", codecIdName(id()),
                    badAt, loadLe<uint32_t>(idx + 4 * badAt), n);
    return h.count;
  }
  static void scatter(std::span<const std::byte> payload, size_t k, float* out, float alpha) {
    const std::byte* idx = payload.data() + kHeaderBytes;
    const std::byte* vals = idx + 4 * k;
    for (size_t i = 0; i < k; ++i)
      out[loadLe<uint32_t>(idx + 4 * i)] += alpha * loadLe<float>(vals + 4 * i);
  }

  double ratio_;
  double sampleFraction_;
  float momentum_;
};

inline constexpr uint8_t kUnbiasedFlag = 1;

class RandomKCodec final : public CodecBase {
 public:
  RandomKCodec(std::string spec, double ratio, uint64_t seed, bool unbiased)
      : CodecBase(CodecId::kRandomK, std::move(spec)),
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
    checkSparseNumel(id(), n);
    size_t k = format::kFromRatio(n, ratio_);
    uint64_t seed = format::randomKSeed(seed_, ctx.seed);
    size_t total = payloadBytes(n);
    std::byte* vals =
        beginPayload(out, n, total, ctx, unbiased_ ? kUnbiasedFlag : 0, seed, k);
    // randomKGather (kernels.h): no division per block, eight blocks at a
    // time with AVX-512; large k in parallel slices of blocks.
    auto gather = [&](size_t b0, size_t b1) {
      randomKGather(reinterpret_cast<const std::byte*>(in), n, k, seed, b0, b1, vals + 4 * b0);
    };
    if (ctx.pool && k >= (size_t{1} << 18))
      ctx.pool->parallelFor(k, size_t{1} << 16, gather);
    else
      gather(0, k);
    return total;
  }

  void decode(std::span<const std::byte> payload, float* out, size_t n,
              const EncodeContext&) const override {
    PayloadHeader h = check(payload, n);
    std::fill(out, out + n, 0.0f);
    scatter(payload, h, out, 1.0f, false);
  }
  void decompressAdd(std::span<const std::byte> payload, float* sum, size_t n, float alpha,
                     const EncodeContext&) const override {
    scatter(payload, check(payload, n), sum, alpha, false);
  }
  void validate(std::span<const std::byte> payload, size_t n) const override { check(payload, n); }
  void zeroSent(std::span<const std::byte> payload, float* buf, size_t n,
                const EncodeContext&) const override {
    scatter(payload, check(payload, n), buf, 0.0f, true);
  }
  void addPayload(std::span<std::byte> acc, std::span<const std::byte> in,
                  const EncodeContext&) const override {
    PayloadHeader ha = parseHeader(acc);
    check(acc, ha.numel);
    PayloadHeader hb = check(in, ha.numel);
    CORTADO_ENFORCE(ha == hb, ErrorCode::kProtocol,
                    "random-k payloads can be added only with the same seed and k: {} vs {}",
                    describe(ha), describe(hb));
    std::byte* a = acc.data() + kHeaderBytes;
    const std::byte* b = in.data() + kHeaderBytes;
    for (size_t i = 0; i < ha.count; ++i)
      storeLe<float>(a + 4 * i, loadLe<float>(a + 4 * i) + loadLe<float>(b + 4 * i));
  }

 private:
  PayloadHeader check(std::span<const std::byte> payload, size_t n) const {
    PayloadHeader h = checkPayload(
        payload, n,
        [](const PayloadHeader& h) {
          return h.count <= h.numel ? format::randomKBody(h.count) : ~uint64_t{0};
        },
        kUnbiasedFlag);
    CORTADO_ENFORCE(h.param == 0 && (h.count > 0) == (n > 0) && n <= format::kMaxSparseNumel,
                    ErrorCode::kProtocol, "random-k payload has invalid parameters: {}",
                    describe(h));
    return h;
  }
  // Indices come from the seed, so they are in range by construction.
  static void scatter(std::span<const std::byte> payload, const PayloadHeader& h, float* out,
                      float alpha, bool zero) {
    const std::byte* vals = payload.data() + kHeaderBytes;
    bool unbiased = h.flags & kUnbiasedFlag;
    format::RandomKWalk walk(h.seed, 0, h.numel, h.count);
    for (size_t b = 0; b < h.count; ++b) {
      uint64_t size;
      uint64_t i = walk.next(&size);
      if (zero) {
        out[i] = 0.0f;
        continue;
      }
      float scale = unbiased ? static_cast<float>(size) : 1.0f;
      out[i] += alpha * scale * loadLe<float>(vals + 4 * b);
    }
  }

  double ratio_;
  uint64_t seed_;
  bool unbiased_;
};

const ParamDef kRatio{"ratio", 0.01, 1e-6, 1.0, false, "fraction of elements sent (k = n * ratio, at least 1)"};

}  // namespace

void registerSparseCodecs(Registry& r) {
  r.add(Device::kCpu,
        {"topk", "exactly the k largest magnitudes (ties to the lower index): k u32 indices + k f32", {kRatio}},
        [](const Params& p) {
          return std::make_unique<TopKCodec>(CodecId::kTopK, p.canonical(), p.get("ratio"), 0.0,
                                             0.0f);
        });
  ParamDef dgcRatio = kRatio;
  dgcRatio.defaultValue = 0.001;
  r.add(Device::kCpu,
        {"dgc",
         "deep gradient compression: sampled threshold then exactly k; momentum correction in "
         "ErrorFeedback",
         {dgcRatio,
          {"sample", 0.01, 1e-4, 1.0, false, "fraction of elements sampled for the threshold"},
          {"momentum", 0.9, 0.0, 0.999, false, "momentum m of the correction u = m u + g"}}},
        [](const Params& p) {
          return std::make_unique<TopKCodec>(CodecId::kDgc, p.canonical(), p.get("ratio"),
                                             p.get("sample"),
                                             static_cast<float>(p.get("momentum")));
        });
  r.add(Device::kCpu,
        {"randomk",
         "k values at indices drawn from a seed shared by all workers (one per block of n/k)",
         {kRatio,
          {"seed", 0, 0, 4294967295.0, true, "codec seed; the round seed comes from EncodeContext"},
          {"unbiased", 1, 0, 1, true, "1: decode scales by n/k (unbiased); 0: plain values"}}},
        [](const Params& p) {
          return std::make_unique<RandomKCodec>(p.canonical(), p.get("ratio"),
                                                static_cast<uint64_t>(p.getInt("seed")),
                                                p.getBool("unbiased"));
        });
}

}  // namespace cortado::compressor::cpu
