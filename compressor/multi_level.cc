#include "compressor/multi_level.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "compressor/cpu/kernels.h"
#include "compressor/cpu/topk_select.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "core/common/error.h"
#include "core/common/thread_pool.h"

namespace cortado::compressor {
namespace {

CodecId idOf(std::string_view name) {
  if (name == "topk") return CodecId::kTopK;
  if (name == "dgc") return CodecId::kDgc;
  if (name == "randomk") return CodecId::kRandomK;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("multi-level compression needs a sparsifier: '{}' is not one of "
                          "topk, dgc, randomk",
                          name));
}

void checkRatio(double cf) {
  CORTADO_ENFORCE(std::isfinite(cf) && cf >= 1.0 && cf <= 1e6, ErrorCode::kInvalidArgument,
                  "compression factor {} is out of range: use 1 (everything) to 1e6", cf);
}

}  // namespace

MultiLevelCodec::MultiLevelCodec(const Registry& registry, std::string_view codec, uint64_t seed)
    : registry_(registry), name_(codec), id_(idOf(codec)), seed_(seed) {
  base_ = at(1.0);
}

float MultiLevelCodec::momentumCorrection() const { return base_->momentumCorrection(); }

std::string MultiLevelCodec::spec(double cf) const {
  double ratio = 1.0 / cf;
  if (id_ == CodecId::kRandomK)
    return fmt::format("randomk:ratio={},seed={},unbiased=0", ratio, seed_);
  return fmt::format("{}:ratio={}", name_, ratio);
}

CodecPtr MultiLevelCodec::at(double cf) const {
  checkRatio(cf);
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = byRatio_[cf];
  if (!slot) slot = registry_.create(spec(cf));
  return slot;
}

size_t MultiLevelCodec::keptAt(size_t n, double cf) { return format::kFromRatio(n, 1.0 / cf); }

size_t MultiLevelCodec::payloadBytes(size_t n, double cf) const {
  checkRatio(cf);
  size_t k = keptAt(n, cf);
  return kHeaderBytes + (id_ == CodecId::kRandomK ? format::randomKBody(k) : format::sparseBody(k));
}

size_t MultiLevelCodec::encode(const float* in, size_t n, double cf, std::span<std::byte> out,
                               const EncodeContext& ctx) const {
  return at(cf)->encode(in, n, out, ctx);
}

size_t MultiLevelCodec::recompress(std::span<const std::byte> first, size_t n, double cf,
                                   std::span<std::byte> out, const EncodeContext& ctx) const {
  checkRatio(cf);
  // The header and the body's size: enough to read it safely. The indices
  // are copied, never followed, and a decoder checks them.
  PayloadHeader h1 = parseHeader(first);
  expectHeader(h1, id_, n);
  CORTADO_ENFORCE(
      h1.count <= n && h1.bodyBytes == (id_ == CodecId::kRandomK ? format::randomKBody(h1.count)
                                                                 : format::sparseBody(h1.count)),
      ErrorCode::kProtocol, "{} first-level payload is malformed: {}", name_, describe(h1));
  const size_t k1 = h1.count;
  const size_t k2 = keptAt(n, cf);
  CORTADO_ENFORCE(k2 <= k1, ErrorCode::kInvalidArgument,
                  "{} second level at CF {} keeps {} of {} elements, more than the first level's "
                  "{}: the second CF must be at least the first's",
                  name_, cf, k2, n, k1);
  const size_t total = payloadBytes(n, cf);
  requireCapacity(out, total, id_, n);
  const std::byte* body = first.data() + kHeaderBytes;
  PayloadHeader h2 = h1;
  h2.count = k2;
  if (id_ == CodecId::kRandomK) {
    // Random-k over the first level's k1 values, with the first level's seed.
    h2.numel = k1;
    h2.bodyBytes = format::randomKBody(k2);
    writeHeader(h2, out);
    std::byte* vals = out.data() + kHeaderBytes;
    auto gather = [&](size_t b0, size_t b1) {
      cpu::randomKGather(body, k1, k2, h1.seed, b0, b1, vals + 4 * b0);
    };
    if (ctx.pool && k2 >= (size_t{1} << 18))
      ctx.pool->parallelFor(k2, size_t{1} << 16, gather);
    else
      gather(0, k2);
    return total;
  }
  // Top-k among the first level's values, read in place; their indices
  // ascend, so the chosen positions (ascending) map to ascending tensor
  // indices. The selection writes the positions where the indices go and
  // the values after them; each position is then replaced by the first
  // level's index at it.
  h2.bodyBytes = format::sparseBody(k2);
  writeHeader(h2, out);
  std::byte* idx = out.data() + kHeaderBytes;
  cpu::selectTopK(body + 4 * k1, k1, k2, std::max<size_t>(std::min<size_t>(k1, 65536), 1024),
                  ctx.pool, idx, idx + 4 * k2);
  for (size_t i = 0; i < k2; ++i)
    std::memcpy(idx + 4 * i, body + 4 * static_cast<size_t>(loadLe<uint32_t>(idx + 4 * i)), 4);
  return total;
}

namespace {

// The tensor indices of a second-level random-k payload's values.
template <typename Fn>
void forEachNested(const PayloadHeader& h, size_t n, Fn fn) {
  format::RandomKWalk walk(h.seed, 0, h.numel, h.count);
  for (size_t b = 0; b < h.count; ++b) {
    uint64_t size;
    uint64_t j = walk.next(&size);
    fn(b, format::randomKIndex(h.seed, j, n, h.numel, &size));
  }
}

}  // namespace

bool MultiLevelCodec::nested(std::span<const std::byte> payload, const PayloadHeader& h,
                             size_t n) const {
  if (id_ != CodecId::kRandomK || h.numel == n) return false;
  CORTADO_ENFORCE(h.numel < n, ErrorCode::kProtocol,
                  "random-k second-level payload describes {} first-level values, more than the "
                  "tensor's {} elements: {}",
                  h.numel, n, describe(h));
  base_->validate(payload, h.numel);
  return true;
}

void MultiLevelCodec::decompressAdd(std::span<const std::byte> payload, size_t n, float* sum,
                                    float alpha) const {
  PayloadHeader h = parseHeader(payload);
  if (!nested(payload, h, n)) {
    base_->decompressAdd(payload, sum, n, alpha);
    return;
  }
  const std::byte* vals = payload.data() + kHeaderBytes;
  forEachNested(h, n, [&](size_t b, uint64_t i) { sum[i] += alpha * loadLe<float>(vals + 4 * b); });
}

void MultiLevelCodec::zeroSent(std::span<const std::byte> payload, size_t n, float* buf) const {
  PayloadHeader h = parseHeader(payload);
  if (!nested(payload, h, n)) {
    base_->zeroSent(payload, buf, n);
    return;
  }
  forEachNested(h, n, [&](size_t, uint64_t i) { buf[i] = 0.0f; });
}

double MultiLevelCodec::energy(std::span<const std::byte> payload) {
  PayloadHeader h = parseHeader(payload);
  const std::byte* vals = payload.data() + kHeaderBytes;
  if (h.codec == CodecId::kTopK || h.codec == CodecId::kDgc) {
    CORTADO_ENFORCE(h.bodyBytes == format::sparseBody(h.count), ErrorCode::kProtocol,
                    "energy: malformed sparse payload {}", describe(h));
    vals += 4 * h.count;
  } else {
    CORTADO_ENFORCE(h.codec == CodecId::kRandomK && h.bodyBytes == format::randomKBody(h.count),
                    ErrorCode::kProtocol, "energy: not a top-k, DGC or random-k payload: {}",
                    describe(h));
  }
  double e = 0;
  for (size_t i = 0; i < h.count; ++i) {
    double v = loadLe<float>(vals + 4 * i);
    e += v * v;
  }
  return e;
}

}  // namespace cortado::compressor
