// The wire format every codec shares: a fixed 48-byte little-endian header,
// then a codec-specific body (docs/codecs.md lists each body). The header is
// self-describing so a server can check a push before it touches its sums.
//
//   off size field
//     0    4 magic "CTDC"
//     4    1 version (kPayloadVersion)
//     5    1 codec id (CodecId)
//     6    1 dtype of the tensor at the worker (DType)
//     7    1 flags (codec-specific, unknown bits rejected)
//     8    8 numel: elements of the dense tensor
//    16    8 body bytes (must equal payload size - 48)
//    24    8 seed (random-k: the index seed; others: informational)
//    32    8 count (top-k/DGC/random-k: k; PowerSGD: rank)
//    40    4 param (QSGD: levels; natural: top exponent; PowerSGD: rows)
//    44    4 reserved, zero
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "compressor/codec.h"
#include "core/common/error.h"

namespace cortado::compressor {

inline constexpr uint32_t kPayloadMagic = 0x43445443u;  // "CTDC" in memory order
inline constexpr uint8_t kPayloadVersion = 1;
inline constexpr size_t kHeaderBytes = 48;
// Largest element count a header may declare: far above any tensor, and low
// enough that no body-size formula (at most 8 bytes per element) overflows.
inline constexpr uint64_t kMaxNumel = uint64_t{1} << 48;

struct PayloadHeader {
  CodecId codec = CodecId::kFp16;
  DType dtype = DType::kFloat32;
  uint8_t flags = 0;
  uint64_t numel = 0;
  uint64_t bodyBytes = 0;
  uint64_t seed = 0;
  uint64_t count = 0;
  uint32_t param = 0;

  bool operator==(const PayloadHeader&) const = default;
};

// Writes the header into the first kHeaderBytes of out (which must be that big).
void writeHeader(const PayloadHeader& h, std::span<std::byte> out);

// Parses and checks what the header alone can tell: size at least
// kHeaderBytes, magic, version, a known codec id, a valid dtype, reserved
// bytes zero, numel <= kMaxNumel, body size equal to the rest of the span. Throws kProtocol with
// what was wrong. Safe on any input: the server's first call on a push.
PayloadHeader parseHeader(std::span<const std::byte> payload);
// The same from a copy of the first kHeaderBytes of a payload of payloadSize
// bytes that lives elsewhere (device memory, a receive buffer not yet full).
PayloadHeader parseHeader(std::span<const std::byte> header, size_t payloadSize);

// The payloads of a run (payloads back to back), each sized by its own
// header (kHeaderBytes plus the body size it declares). Reads the size
// fields only (parseHeader or the codec checks the rest). Throws kProtocol
// naming the payload's position where a header is cut short or a body runs
// past the end of the run.
std::vector<std::span<const std::byte>> splitRun(std::span<const std::byte> run);

// One line for logs and error messages: "topk v1 n=1000 k=10 body=80".
std::string describe(const PayloadHeader& h);

// Codec-side check after parseHeader: the payload is this codec's and for an
// n-element tensor. `what` names the codec in the message.
void expectHeader(const PayloadHeader& h, CodecId id, size_t n);

// Bounds-checked little-endian reads and writes for bodies.
template <typename T>
inline T loadLe(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void storeLe(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Throws kInvalidArgument unless out can hold `need` bytes.
void requireCapacity(std::span<std::byte> out, size_t need, CodecId id, size_t n);

}  // namespace cortado::compressor
