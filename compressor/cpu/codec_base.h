// Shared plumbing of the CPU codecs: header writing and the checks every
// decoder runs before it writes a single output element. Private to compressor/.
#pragma once

#include <string>

#include "compressor/codec.h"
#include "compressor/payload.h"

namespace cortado::compressor::cpu {

class CodecBase : public Codec {
 public:
  CodecBase(CodecId id, std::string spec) : id_(id), spec_(std::move(spec)) {}
  CodecId id() const override { return id_; }
  std::string spec() const override { return spec_; }

 protected:
  // Writes a header for an n-element encode into out (after checking it can
  // hold `total` bytes) and returns the body pointer.
  std::byte* beginPayload(std::span<std::byte> out, size_t n, size_t total,
                          const EncodeContext& ctx, uint8_t flags = 0, uint64_t seed = 0,
                          uint64_t count = 0, uint32_t param = 0) const;
  // parseHeader + this codec's id + element count + the exact body size
  // `bodyFor(h)` + flags within `allowedFlags`. Returns the header.
  template <typename BodyFn>
  PayloadHeader checkPayload(std::span<const std::byte> payload, size_t n, BodyFn bodyFor,
                             uint8_t allowedFlags = 0) const {
    PayloadHeader h = parseHeader(payload);
    expectHeader(h, id_, n);
    CORTADO_ENFORCE((h.flags & ~allowedFlags) == 0, ErrorCode::kProtocol,
                    "{} payload has unknown flags {:#x}", codecIdName(id_), h.flags);
    uint64_t want = bodyFor(h);
    CORTADO_ENFORCE(h.bodyBytes == want, ErrorCode::kProtocol,
                    "{} payload body is {} bytes, expected {} for {}", codecIdName(id_),
                    h.bodyBytes, want, describe(h));
    return h;
  }
  static const std::byte* body(std::span<const std::byte> payload) {
    return payload.data() + kHeaderBytes;
  }

 private:
  CodecId id_;
  std::string spec_;
};

}  // namespace cortado::compressor::cpu
