#include "compressor/payload.h"

#include <algorithm>
#include <bit>

namespace cortado::compressor {

static_assert(std::endian::native == std::endian::little,
              "the payload format is little-endian and read with memcpy");

namespace {

const char* kNames[] = {"?",     "fp16", "bf16",     "onebit",   "signsgd", "efsignsgd", "topk",
                        "randomk", "dgc", "qsgd", "terngrad", "natural", "powersgd"};

}  // namespace

const char* codecIdName(CodecId id) {
  auto raw = static_cast<uint8_t>(id);
  return raw >= 1 && raw <= kMaxCodecId ? kNames[raw] : "invalid";
}

bool isValidCodecId(uint8_t raw) { return raw >= 1 && raw <= kMaxCodecId; }

const char* deviceName(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

void Codec::addPayload(std::span<std::byte>, std::span<const std::byte>,
                       const EncodeContext&) const {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("codec '{}' is not summable: its payloads must be decompressed and "
                          "summed in fp32, never added in compressed form",
                          spec()));
}

void Codec::validate(std::span<const std::byte>, size_t) const {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("codec '{}' ({}) checks its payloads in decode(): validate() reads host "
                          "payloads, which only the CPU codecs take",
                          spec(), deviceName(device())));
}

void Codec::zeroSent(std::span<const std::byte>, float*, size_t, const EncodeContext&) const {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("codec '{}' is dense: zeroSent applies to sparse codecs only", spec()));
}

std::vector<std::span<const std::byte>> splitRun(std::span<const std::byte> run) {
  std::vector<std::span<const std::byte>> out;
  for (size_t at = 0; at < run.size();) {
    const size_t left = run.size() - at;
    CORTADO_ENFORCE(left >= kHeaderBytes, ErrorCode::kProtocol,
                    "payload #{} (byte {}) is cut short: {} bytes, a header needs {}", out.size(),
                    at, left, kHeaderBytes);
    const uint64_t body = loadLe<uint64_t>(run.data() + at + 16);
    CORTADO_ENFORCE(body <= left - kHeaderBytes, ErrorCode::kProtocol,
                    "payload #{} (byte {}) declares a {}-byte body but {} bytes follow its header",
                    out.size(), at, body, left - kHeaderBytes);
    const size_t n = kHeaderBytes + size_t(body);
    out.push_back(run.subspan(at, n));
    at += n;
  }
  return out;
}

void writeHeader(const PayloadHeader& h, std::span<std::byte> out) {
  CORTADO_ENFORCE(out.size() >= kHeaderBytes, ErrorCode::kInvalidArgument,
                  "payload buffer of {} bytes cannot hold the {}-byte header", out.size(),
                  kHeaderBytes);
  std::byte* p = out.data();
  storeLe<uint32_t>(p, kPayloadMagic);
  p[4] = std::byte{kPayloadVersion};
  p[5] = std::byte{static_cast<uint8_t>(h.codec)};
  p[6] = std::byte{static_cast<uint8_t>(h.dtype)};
  p[7] = std::byte{h.flags};
  storeLe<uint64_t>(p + 8, h.numel);
  storeLe<uint64_t>(p + 16, h.bodyBytes);
  storeLe<uint64_t>(p + 24, h.seed);
  storeLe<uint64_t>(p + 32, h.count);
  storeLe<uint32_t>(p + 40, h.param);
  storeLe<uint32_t>(p + 44, 0);
}

PayloadHeader parseHeader(std::span<const std::byte> payload) {
  return parseHeader(payload.first(std::min(payload.size(), kHeaderBytes)), payload.size());
}

PayloadHeader parseHeader(std::span<const std::byte> header, size_t payloadSize) {
  CORTADO_ENFORCE(payloadSize >= kHeaderBytes && header.size() >= kHeaderBytes,
                  ErrorCode::kProtocol, "payload truncated: {} bytes, the header alone needs {}",
                  payloadSize, kHeaderBytes);
  const std::byte* p = header.data();
  uint32_t magic = loadLe<uint32_t>(p);
  CORTADO_ENFORCE(magic == kPayloadMagic, ErrorCode::kProtocol,
                  "not a codec payload: magic {:#010x}, expected {:#010x}", magic, kPayloadMagic);
  auto version = static_cast<uint8_t>(p[4]);
  CORTADO_ENFORCE(version == kPayloadVersion, ErrorCode::kProtocol,
                  "payload format version {} is not supported (this build reads {})", version,
                  kPayloadVersion);
  auto codec = static_cast<uint8_t>(p[5]);
  CORTADO_ENFORCE(isValidCodecId(codec), ErrorCode::kProtocol, "payload has unknown codec id {}",
                  codec);
  auto dtype = static_cast<uint8_t>(p[6]);
  CORTADO_ENFORCE(isValidDType(dtype), ErrorCode::kProtocol, "payload has invalid dtype {}",
                  dtype);
  CORTADO_ENFORCE(loadLe<uint32_t>(p + 44) == 0, ErrorCode::kProtocol,
                  "payload header has non-zero reserved bytes");
  PayloadHeader h;
  h.codec = static_cast<CodecId>(codec);
  h.dtype = static_cast<DType>(dtype);
  h.flags = static_cast<uint8_t>(p[7]);
  h.numel = loadLe<uint64_t>(p + 8);
  h.bodyBytes = loadLe<uint64_t>(p + 16);
  h.seed = loadLe<uint64_t>(p + 24);
  h.count = loadLe<uint64_t>(p + 32);
  h.param = loadLe<uint32_t>(p + 40);
  CORTADO_ENFORCE(h.numel <= kMaxNumel, ErrorCode::kProtocol,
                  "{} payload declares {} elements, more than the limit of {}",
                  codecIdName(h.codec), h.numel, kMaxNumel);
  CORTADO_ENFORCE(h.bodyBytes == payloadSize - kHeaderBytes, ErrorCode::kProtocol,
                  "{} payload: header declares a {}-byte body but {} bytes follow the header",
                  codecIdName(h.codec), h.bodyBytes, payloadSize - kHeaderBytes);
  return h;
}

std::string describe(const PayloadHeader& h) {
  return fmt::format("{} v{} dtype={} n={} count={} param={} flags={:#x} body={}",
                     codecIdName(h.codec), kPayloadVersion, dtypeName(h.dtype), h.numel, h.count,
                     h.param, h.flags, h.bodyBytes);
}

void expectHeader(const PayloadHeader& h, CodecId id, size_t n) {
  CORTADO_ENFORCE(h.codec == id, ErrorCode::kProtocol,
                  "payload is '{}' but the tensor's codec is '{}'", codecIdName(h.codec),
                  codecIdName(id));
  CORTADO_ENFORCE(h.numel == n, ErrorCode::kProtocol,
                  "{} payload has {} elements but the tensor has {}", codecIdName(id), h.numel, n);
}

void requireCapacity(std::span<std::byte> out, size_t need, CodecId id, size_t n) {
  CORTADO_ENFORCE(out.size() >= need, ErrorCode::kInvalidArgument,
                  "{} encode of {} elements needs {} bytes, the output has {}", codecIdName(id), n,
                  need, out.size());
}

}  // namespace cortado::compressor
