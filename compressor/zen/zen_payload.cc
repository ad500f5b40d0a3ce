#include "compressor/zen/zen_payload.h"

#include <bit>
#include <cstring>

#include "core/common/dtype.h"
#include "core/common/error.h"

namespace cortado::compressor::zen {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the Zen payloads are little-endian and read with memcpy");

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

const char* kindName(Kind k) { return k == Kind::kCoo ? "COO push" : "bitmap answer"; }

void writeZenHeader(const ZenHeader& h, std::byte* p) {
  store<uint32_t>(p, kZenMagic);
  p[4] = std::byte{kZenVersion};
  p[5] = std::byte{static_cast<uint8_t>(h.kind)};
  p[6] = std::byte{static_cast<uint8_t>(DType::kFloat32)};
  p[7] = std::byte{0};
  store<uint64_t>(p + 8, h.numel);
  store<uint32_t>(p + 16, h.servers);
  store<uint32_t>(p + 20, h.server);
  store<uint64_t>(p + 24, h.seed);
  store<uint64_t>(p + 32, h.count);
  store<uint64_t>(p + 40, h.listSize);
}

}  // namespace

size_t cooBytes(uint64_t pairs) { return kZenHeaderBytes + 8 * pairs; }

size_t bitmapBytes(uint64_t listSize, uint64_t nonzeros) {
  return kZenHeaderBytes + (listSize + 7) / 8 + 4 * nonzeros;
}

ZenHeader parseZenHeader(std::span<const std::byte> payload) {
  CORTADO_ENFORCE(payload.size() >= kZenHeaderBytes, ErrorCode::kProtocol,
                  "sparse payload truncated: {} bytes, the header alone needs {}", payload.size(),
                  kZenHeaderBytes);
  const std::byte* p = payload.data();
  const uint32_t magic = load<uint32_t>(p);
  CORTADO_ENFORCE(magic == kZenMagic, ErrorCode::kProtocol,
                  "not a sparse (Zen) payload: magic {:#010x}, expected {:#010x}", magic,
                  kZenMagic);
  const auto version = static_cast<uint8_t>(p[4]);
  CORTADO_ENFORCE(version == kZenVersion, ErrorCode::kProtocol,
                  "sparse payload format version {} is not supported (this build reads {})",
                  version, kZenVersion);
  const auto kind = static_cast<uint8_t>(p[5]);
  CORTADO_ENFORCE(kind == uint8_t(Kind::kCoo) || kind == uint8_t(Kind::kBitmap),
                  ErrorCode::kProtocol, "sparse payload of unknown kind {}", kind);
  CORTADO_ENFORCE(static_cast<uint8_t>(p[6]) == uint8_t(DType::kFloat32), ErrorCode::kProtocol,
                  "sparse payload of dtype {}: only float32 is supported", uint8_t(p[6]));
  CORTADO_ENFORCE(static_cast<uint8_t>(p[7]) == 0, ErrorCode::kProtocol,
                  "sparse payload header has a non-zero reserved byte");
  ZenHeader h;
  h.kind = static_cast<Kind>(kind);
  h.numel = load<uint64_t>(p + 8);
  h.servers = load<uint32_t>(p + 16);
  h.server = load<uint32_t>(p + 20);
  h.seed = load<uint64_t>(p + 24);
  h.count = load<uint64_t>(p + 32);
  h.listSize = load<uint64_t>(p + 40);
  const char* what = kindName(h.kind);
  CORTADO_ENFORCE(h.numel <= kMaxElements, ErrorCode::kProtocol,
                  "sparse {} declares {} elements, more than the limit of {}", what, h.numel,
                  kMaxElements);
  CORTADO_ENFORCE(h.servers >= 1 && h.server < h.servers, ErrorCode::kProtocol,
                  "sparse {} names server {} of {}", what, h.server, h.servers);
  const uint64_t body = payload.size() - kZenHeaderBytes;
  if (h.kind == Kind::kCoo) {
    CORTADO_ENFORCE(h.listSize == 0, ErrorCode::kProtocol,
                    "sparse COO push with a list size ({}); it must be zero", h.listSize);
    // count <= numel < 2^32 keeps 8 * count far from overflowing.
    CORTADO_ENFORCE(h.count <= h.numel && body == 8 * h.count, ErrorCode::kProtocol,
                    "sparse COO push of {} pairs for {} elements: the body has {} bytes, "
                    "{} expected (a truncated pair list?)",
                    h.count, h.numel, body, h.count <= h.numel ? 8 * h.count : 0);
  } else {
    CORTADO_ENFORCE(h.listSize <= h.numel && h.count <= h.listSize, ErrorCode::kProtocol,
                    "sparse bitmap answer of {} non-zeros over {} indices of a {}-element tensor",
                    h.count, h.listSize, h.numel);
    const uint64_t want = (h.listSize + 7) / 8 + 4 * h.count;
    CORTADO_ENFORCE(body == want, ErrorCode::kProtocol,
                    "sparse bitmap answer: the body has {} bytes, {} expected for {} bits and "
                    "{} values",
                    body, want, h.listSize, h.count);
  }
  return h;
}

void expectPartition(const ZenHeader& h, const Ownership& own, uint32_t server) {
  CORTADO_ENFORCE(h.numel == own.numElements() && h.servers == own.numServers() &&
                      h.seed == own.seed() && h.server == server,
                  ErrorCode::kProtocol,
                  "sparse {} is for server {} of {} of a {}-element tensor with hash seed {:#x}; "
                  "expected server {} of {} of {} elements with seed {:#x} (workers declared "
                  "the tensor differently?)",
                  kindName(h.kind), h.server, h.servers, h.numel, h.seed, server, own.numServers(),
                  own.numElements(), own.seed());
}

size_t writeCoo(const Ownership& own, uint32_t server, std::span<const uint32_t> index,
                std::span<const float> value, std::span<std::byte> out) {
  CORTADO_ENFORCE(index.size() == value.size(), ErrorCode::kInvalidArgument,
                  "sparse push: {} indices but {} values", index.size(), value.size());
  const size_t bytes = cooBytes(index.size());
  CORTADO_ENFORCE(out.size() >= bytes, ErrorCode::kInvalidArgument,
                  "sparse push of {} pairs needs {} bytes, the buffer has {}", index.size(), bytes,
                  out.size());
  ZenHeader h;
  h.kind = Kind::kCoo;
  h.numel = own.numElements();
  h.servers = own.numServers();
  h.server = server;
  h.seed = own.seed();
  h.count = index.size();
  writeZenHeader(h, out.data());
  if (!index.empty()) {
    std::memcpy(out.data() + kZenHeaderBytes, index.data(), 4 * index.size());
    std::memcpy(out.data() + kZenHeaderBytes + 4 * index.size(), value.data(), 4 * value.size());
  }
  return bytes;
}

std::vector<std::byte> encodeCoo(const Ownership& own, uint32_t server,
                                 std::span<const uint32_t> index, std::span<const float> value) {
  std::vector<std::byte> out(cooBytes(index.size()));
  writeCoo(own, server, index, value, out);
  return out;
}

uint32_t CooView::indexAt(size_t i) const { return load<uint32_t>(index + 4 * i); }
float CooView::valueAt(size_t i) const { return load<float>(value + 4 * i); }

CooView parseCoo(std::span<const std::byte> payload) {
  CooView v;
  v.header = parseZenHeader(payload);
  CORTADO_ENFORCE(v.header.kind == Kind::kCoo, ErrorCode::kProtocol,
                  "expected a sparse COO push, got a {}", kindName(v.header.kind));
  v.index = payload.data() + kZenHeaderBytes;
  v.value = v.index + 4 * v.header.count;
  return v;
}

std::vector<std::byte> encodeBitmap(const Ownership& own, uint32_t server,
                                    std::span<const uint32_t> list,
                                    std::span<const uint64_t> presentBits,
                                    std::span<const float> values) {
  const uint64_t L = list.size();
  CORTADO_ENFORCE(presentBits.size() >= (L + 63) / 64, ErrorCode::kInvalidArgument,
                  "bitmap of {} words for {} indices", presentBits.size(), L);
  ZenHeader h;
  h.kind = Kind::kBitmap;
  h.numel = own.numElements();
  h.servers = own.numServers();
  h.server = server;
  h.seed = own.seed();
  h.count = values.size();
  h.listSize = L;
  std::vector<std::byte> out(bitmapBytes(L, values.size()));
  writeZenHeader(h, out.data());
  std::byte* bits = out.data() + kZenHeaderBytes;
  const size_t bitBytes = (L + 7) / 8;
  uint64_t set = 0;
  for (size_t b = 0; b < bitBytes; ++b) {
    uint8_t byte = static_cast<uint8_t>(presentBits[b / 8] >> (8 * (b % 8)));
    if (b == bitBytes - 1 && L % 8) byte &= static_cast<uint8_t>((1u << (L % 8)) - 1);
    bits[b] = std::byte{byte};
    set += std::popcount(byte);
  }
  CORTADO_ENFORCE(set == values.size(), ErrorCode::kInvalidArgument,
                  "bitmap answer with {} bits set but {} values", set, values.size());
  if (!values.empty()) std::memcpy(bits + bitBytes, values.data(), 4 * values.size());
  return out;
}

namespace {

template <typename Fn>
void decodeImpl(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                std::span<const uint32_t> list, Fn&& fn) {
  const ZenHeader h = parseZenHeader(payload);
  CORTADO_ENFORCE(h.kind == Kind::kBitmap, ErrorCode::kProtocol,
                  "expected a sparse bitmap answer, got a {}", kindName(h.kind));
  expectPartition(h, own, server);
  CORTADO_ENFORCE(h.listSize == list.size(), ErrorCode::kProtocol,
                  "sparse bitmap answer of server {} covers {} indices, but the server owns {}",
                  server, h.listSize, list.size());
  const std::byte* bits = payload.data() + kZenHeaderBytes;
  const size_t bitBytes = (h.listSize + 7) / 8;
  uint64_t set = 0;
  for (size_t b = 0; b < bitBytes; ++b) set += std::popcount(static_cast<uint8_t>(bits[b]));
  CORTADO_ENFORCE(set == h.count, ErrorCode::kProtocol,
                  "sparse bitmap answer of server {}: {} bits set but {} values", server, set,
                  h.count);
  if (h.listSize % 8) {
    const auto last = static_cast<uint8_t>(bits[bitBytes - 1]);
    CORTADO_ENFORCE((last >> (h.listSize % 8)) == 0, ErrorCode::kProtocol,
                    "sparse bitmap answer of server {}: bits set past the {} indices it owns",
                    server, h.listSize);
  }
  const std::byte* vals = bits + bitBytes;
  uint64_t k = 0;
  for (size_t b = 0; b < bitBytes; ++b) {
    for (unsigned x = static_cast<uint8_t>(bits[b]); x; x &= x - 1) {
      const size_t t = 8 * b + std::countr_zero(x);
      fn(list[t], load<float>(vals + 4 * k++));
    }
  }
}

template <typename Fn>
void decodeAnswerImpl(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                      std::span<const uint32_t> list, Fn&& fn) {
  const ZenHeader h = parseZenHeader(payload);
  if (h.kind == Kind::kBitmap) return decodeImpl(payload, own, server, list, fn);
  expectPartition(h, own, server);
  const CooView v = parseCoo(payload);
  // Check every index before calling fn once.
  for (uint64_t i = 0; i < h.count; ++i) {
    const uint32_t idx = v.indexAt(i);
    CORTADO_ENFORCE(idx < own.numElements() && own.owner(idx) == server, ErrorCode::kProtocol,
                    "sparse answer of server {}: pair #{} has index {}, which the server does not "
                    "own",
                    server, i, idx);
    CORTADO_ENFORCE(i == 0 || v.indexAt(i - 1) < idx, ErrorCode::kProtocol,
                    "sparse answer of server {}: index {} at pair #{} does not ascend", server, idx,
                    i);
  }
  for (uint64_t i = 0; i < h.count; ++i) fn(v.indexAt(i), v.valueAt(i));
}

}  // namespace

void decodeAnswer(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                  std::span<const uint32_t> list, const std::function<void(uint32_t, float)>& fn) {
  decodeAnswerImpl(payload, own, server, list, fn);
}

void decodeAnswerInto(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                      std::span<const uint32_t> list, float* dense) {
  decodeAnswerImpl(payload, own, server, list, [dense](uint32_t i, float v) { dense[i] = v; });
}

void decodeBitmap(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                  std::span<const uint32_t> list, const std::function<void(uint32_t, float)>& fn) {
  decodeImpl(payload, own, server, list, fn);
}

void decodeBitmapInto(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                      std::span<const uint32_t> list, float* dense) {
  decodeImpl(payload, own, server, list, [dense](uint32_t i, float v) { dense[i] = v; });
}

}  // namespace cortado::compressor::zen
