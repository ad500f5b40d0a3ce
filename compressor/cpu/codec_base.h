// Shared plumbing of the CPU codecs: header writing and the checks every
// decoder runs before it writes a single output element (the CUDA codecs
// build and check their headers on the host with the same functions).
// Private to compressor/.
#pragma once

#include <string>

#include "compressor/codec.h"
#include "compressor/compact.h"
#include "compressor/payload.h"

namespace cortado::compressor::cpu {

// The header of an n-element payload of `total` bytes (header included).
PayloadHeader headerFor(CodecId id, const EncodeContext& ctx, size_t n, size_t total, uint8_t flags,
                        uint64_t seed, uint64_t count, uint32_t param);

// The checks after expectHeader: flags within `allowedFlags`, and the body
// exactly `bodyFor(h)` bytes. Throws kProtocol naming codec `id`.
template <typename BodyFn>
void expectFlagsAndBody(const PayloadHeader& h, CodecId id, BodyFn bodyFor, uint8_t allowedFlags) {
  // The compact wire form of top-k and DGC (compact.h) is never a codec's
  // to read: the receiver expands it first.
  CORTADO_ENFORCE((h.flags & ~allowedFlags) == 0, ErrorCode::kProtocol,
                  "{} payload has unknown flags {:#x}{}", codecIdName(id), h.flags,
                  (id == CodecId::kTopK || id == CodecId::kDgc) && (h.flags & kCompactIndicesFlag)
                      ? " (the compact wire form, which codecs do not read: expand it first "
                        "with compressor::expandSparsePayload)"
                      : "");
  uint64_t want = bodyFor(h);
  CORTADO_ENFORCE(h.bodyBytes == want, ErrorCode::kProtocol,
                  "{} payload body is {} bytes, expected {} for {}", codecIdName(id), h.bodyBytes,
                  want, describe(h));
}

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
    expectFlagsAndBody(h, id_, bodyFor, allowedFlags);
    return h;
  }
  static const std::byte* body(std::span<const std::byte> payload) {
    return payload.data() + kHeaderBytes;
  }

 private:
  CodecId id_;
  std::string spec_;
};

// The decode, decompressAdd and validate of a codec whose decoding is one
// pass, `Derived::apply(payload, out, n, alpha, add, ctx)`: out = alpha *
// decoded, or out += alpha * decoded with `add`, after the payload's checks,
// which `Derived::check(payload, n)` runs (and validate() runs alone).
// Derived makes this class a friend and keeps apply() and check() private.
template <typename Derived>
class OnePassCodec : public CodecBase {
 public:
  using CodecBase::CodecBase;
  void decode(std::span<const std::byte> payload, float* out, size_t n,
              const EncodeContext& ctx) const override {
    self().apply(payload, out, n, 1.0f, false, ctx);
  }
  void decompressAdd(std::span<const std::byte> payload, float* sum, size_t n, float alpha,
                     const EncodeContext& ctx) const override {
    self().apply(payload, sum, n, alpha, true, ctx);
  }
  void validate(std::span<const std::byte> payload, size_t n) const override {
    self().check(payload, n);
  }

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

}  // namespace cortado::compressor::cpu
