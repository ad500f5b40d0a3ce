#include "compressor/cpu/codec_base.h"

namespace cortado::compressor::cpu {

PayloadHeader headerFor(CodecId id, const EncodeContext& ctx, size_t n, size_t total, uint8_t flags,
                        uint64_t seed, uint64_t count, uint32_t param) {
  PayloadHeader h;
  h.codec = id;
  h.dtype = ctx.dtype;
  h.flags = flags;
  h.numel = n;
  h.bodyBytes = total - kHeaderBytes;
  h.seed = seed;
  h.count = count;
  h.param = param;
  return h;
}

std::byte* CodecBase::beginPayload(std::span<std::byte> out, size_t n, size_t total,
                                   const EncodeContext& ctx, uint8_t flags, uint64_t seed,
                                   uint64_t count, uint32_t param) const {
  requireCapacity(out, total, id_, n);
  writeHeader(headerFor(id_, ctx, n, total, flags, seed, count, param), out);
  return out.data() + kHeaderBytes;
}

}  // namespace cortado::compressor::cpu
