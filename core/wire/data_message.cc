#include "core/wire/data_message.h"

#include <cstring>

namespace cortado::wire {
namespace {

// Fixed layout, little-endian (every platform we build for is).
struct RawHeader {  // naturally aligned: no padding
  uint32_t magic;
  uint8_t version;
  uint8_t op;
  uint8_t dtype;
  uint8_t flags;
  uint32_t requestId;
  uint32_t contributors;  // was reserved (always 0) before the plan executor
  uint64_t key;
  uint64_t round;
  uint64_t numElements;
  uint64_t bodyBytes;
};
static_assert(sizeof(RawHeader) == kHeaderBytes);

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::kPush: return "PUSH";
    case Op::kPull: return "PULL";
    case Op::kPullResponse: return "PULL_RESPONSE";
    case Op::kPushAck: return "PUSH_ACK";
    case Op::kError: return "ERROR";
    case Op::kRelease: return "RELEASE";
  }
  return "INVALID";
}

Buffer encodeHeader(const DataHeader& h) {
  RawHeader r{};
  r.magic = kMagic;
  r.version = kVersion;
  r.op = static_cast<uint8_t>(h.op);
  r.dtype = static_cast<uint8_t>(h.dtype);
  r.flags = h.flags;
  r.requestId = h.requestId;
  r.key = h.key;
  r.round = h.round;
  r.numElements = h.numElements;
  r.bodyBytes = h.bodyBytes;
  r.contributors = h.contributors;
  return Buffer::copyOf(&r, sizeof(r));
}

DataHeader decodeHeader(const Buffer& header, size_t bodySize) {
  CORTADO_ENFORCE(header.size() == kHeaderBytes, ErrorCode::kProtocol,
                  "data message header is {} bytes, expected {}", header.size(), kHeaderBytes);
  RawHeader r;
  std::memcpy(&r, header.data(), sizeof(r));
  CORTADO_ENFORCE(r.magic == kMagic, ErrorCode::kProtocol,
                  "data message has bad magic 0x{:08x} (expected 0x{:08x}): not a Cortado peer?",
                  r.magic, kMagic);
  CORTADO_ENFORCE(r.version == kVersion, ErrorCode::kProtocol,
                  "data message version {} is not supported (this build speaks {})", r.version,
                  kVersion);
  CORTADO_ENFORCE(r.op >= 1 && r.op <= 6, ErrorCode::kProtocol, "data message has unknown op {}",
                  r.op);
  CORTADO_ENFORCE(isValidDType(r.dtype), ErrorCode::kProtocol,
                  "data message has unknown dtype {}", r.dtype);
  CORTADO_ENFORCE((r.flags & ~kAllFlags) == 0, ErrorCode::kProtocol,
                  "data message has unknown flags 0x{:02x}", r.flags);
  CORTADO_ENFORCE(r.bodyBytes == bodySize, ErrorCode::kProtocol,
                  "data message for key {} promises a {}-byte body but carries {} bytes", r.key,
                  r.bodyBytes, bodySize);
  DataHeader h;
  h.op = static_cast<Op>(r.op);
  h.dtype = static_cast<DType>(r.dtype);
  h.flags = r.flags;
  h.requestId = r.requestId;
  h.key = r.key;
  h.round = r.round;
  h.numElements = r.numElements;
  h.bodyBytes = r.bodyBytes;
  h.contributors = r.contributors;
  CORTADO_ENFORCE(h.op != Op::kRelease || h.bodyBytes == 0, ErrorCode::kProtocol,
                  "data message RELEASE for key {} carries a {}-byte body; it has none", h.key,
                  h.bodyBytes);
  // A dense body must be exactly the elements it claims; guards the overflow
  // of numElements * size too.
  const bool carriesData = h.op == Op::kPush || h.op == Op::kPullResponse;
  CORTADO_ENFORCE(
      !(h.flags & kFlagSparse) || !(h.flags & (kFlagShm | kFlagCompressed | kFlagAsync)),
      ErrorCode::kProtocol,
      "data message {} for key {}: a sparse message with flags 0x{:02x} (sparse "
      "tensors travel as bytes, uncompressed, in sync mode)",
      opName(h.op), h.key, h.flags);
  CORTADO_ENFORCE(!(h.flags & kFlagAck) ||
                      (h.op == Op::kPush && !(h.flags & (kFlagShm | kFlagSparse))),
                  ErrorCode::kProtocol,
                  "data message {} for key {} has flags 0x{:02x}: only a PUSH that carries its "
                  "bytes (not shared memory, not sparse) asks for an acknowledgement (0x{:02x})",
                  opName(h.op), h.key, h.flags, uint8_t(kFlagAck));
  if (carriesData && (h.flags & kFlagShm)) {
    CORTADO_ENFORCE(h.bodyBytes == kShmDescriptorBytes && h.numElements <= (uint64_t(1) << 40),
                    ErrorCode::kProtocol,
                    "data message {} for key {}: a shared-memory body is {} bytes, got {}",
                    opName(h.op), h.key, kShmDescriptorBytes, h.bodyBytes);
  } else if (carriesData && (h.flags & (kFlagCompressed | kFlagSparse))) {
    // The body is a codec or Zen payload, checked by its parser; bound the tensor.
    CORTADO_ENFORCE(h.numElements <= (uint64_t(1) << 40), ErrorCode::kProtocol,
                    "data message {} for key {}: {} elements is beyond any chunk", opName(h.op),
                    h.key, h.numElements);
  } else if (carriesData && !(h.flags & kFlagCompressed)) {
    CORTADO_ENFORCE(h.numElements <= (uint64_t(1) << 40) && h.denseBytes() == h.bodyBytes,
                    ErrorCode::kProtocol,
                    "data message {} for key {}: {} elements of {} need {} bytes, body has {}",
                    opName(h.op), h.key, h.numElements, dtypeName(h.dtype),
                    h.numElements * dtypeSize(h.dtype), h.bodyBytes);
  }
  return h;
}

size_t compressedPreambleBytes(std::string_view codecSpec, std::string_view tensorName) {
  CORTADO_ENFORCE(!codecSpec.empty() && codecSpec.size() <= kMaxCodecSpecBytes,
                  ErrorCode::kInvalidArgument,
                  "codec spec of {} bytes for tensor '{}': it must be 1 to {} bytes",
                  codecSpec.size(), tensorName, kMaxCodecSpecBytes);
  CORTADO_ENFORCE(tensorName.size() <= 0xffff, ErrorCode::kInvalidArgument,
                  "tensor name of {} bytes is too long for the data plane (at most 65535)",
                  tensorName.size());
  return 4 + codecSpec.size() + tensorName.size();
}

void writeCompressedPreamble(uint8_t* out, std::string_view codecSpec, std::string_view tensorName) {
  const uint16_t s = static_cast<uint16_t>(codecSpec.size());
  const uint16_t n = static_cast<uint16_t>(tensorName.size());
  std::memcpy(out, &s, 2);
  std::memcpy(out + 2, &n, 2);
  std::memcpy(out + 4, codecSpec.data(), s);
  std::memcpy(out + 4 + s, tensorName.data(), n);
}

CompressedPush parseCompressedPush(const uint8_t* body, size_t bodyBytes) {
  CORTADO_ENFORCE(bodyBytes >= 4, ErrorCode::kProtocol,
                  "compressed push body of {} bytes is shorter than its 4-byte preamble",
                  bodyBytes);
  uint16_t s, n;
  std::memcpy(&s, body, 2);
  std::memcpy(&n, body + 2, 2);
  CORTADO_ENFORCE(s >= 1 && s <= kMaxCodecSpecBytes, ErrorCode::kProtocol,
                  "compressed push names a codec spec of {} bytes (1 to {} allowed)", s,
                  kMaxCodecSpecBytes);
  CORTADO_ENFORCE(size_t{4} + s + n <= bodyBytes, ErrorCode::kProtocol,
                  "compressed push preamble promises a {}-byte codec spec and a {}-byte tensor "
                  "name, but the body has only {} bytes",
                  s, n, bodyBytes);
  CompressedPush p;
  p.codecSpec = std::string_view(reinterpret_cast<const char*>(body + 4), s);
  p.tensorName = std::string_view(reinterpret_cast<const char*>(body + 4 + s), n);
  p.payload = body + 4 + s + n;
  p.payloadBytes = bodyBytes - 4 - s - n;
  return p;
}

}  // namespace cortado::wire
