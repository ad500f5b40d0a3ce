#include "compressor/zen/zen_payload.h"

#include <algorithm>
#include <bit>
#include <cstring>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "core/common/dtype.h"
#include "core/common/error.h"

namespace cortado::compressor::zen {
namespace {

// The header of a message for `server` of the tensor `own` describes.
ZenHeader headerFor(const Ownership& own, uint32_t server, Kind kind, uint64_t count,
                    uint64_t listSize) {
  ZenHeader h;
  h.kind = kind;
  h.numel = own.numElements();
  h.servers = own.numServers();
  h.server = server;
  h.seed = own.seed();
  h.count = count;
  h.listSize = listSize;
  return h;
}

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

const char* kindName(Kind k) {
  return k == Kind::kCoo         ? "COO push"
         : k == Kind::kBitmap    ? "bitmap answer"
         : k == Kind::kDeltaPush ? "delta-coded push"
                                 : "index-list answer";
}

// The gaps of strictly ascending indices as varints: the first index, then
// each index minus the previous minus 1. Returns the byte after them.
std::byte* writeGaps(std::byte* p, std::span<const uint32_t> indices) {
  for (size_t i = 0; i < indices.size(); ++i)
    p = writeVarint(p, i == 0 ? indices[0] : indices[i] - indices[i - 1] - 1);
  return p;
}

size_t gapBytes(std::span<const uint32_t> indices) {
  size_t bytes = 0;
  for (size_t i = 0; i < indices.size(); ++i)
    bytes += varintBytes(i == 0 ? indices[0] : indices[i] - indices[i - 1] - 1);
  return bytes;
}

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

size_t indexListBytes(std::span<const uint32_t> indices) {
  return kZenHeaderBytes + 4 * indices.size() + gapBytes(indices);
}

size_t deltaPushBytes(std::span<const uint32_t> indices) { return indexListBytes(indices); }

PushForm choosePushForm(std::span<const uint32_t> index, bool compact) {
  if (!compact) return PushForm::kCoo;
  for (size_t i = 1; i < index.size(); ++i)
    if (index[i] <= index[i - 1]) return PushForm::kCoo;
  return deltaPushBytes(index) < cooBytes(index.size()) ? PushForm::kDelta : PushForm::kCoo;
}

size_t pushBytes(std::span<const uint32_t> index, PushForm form) {
  return form == PushForm::kDelta ? deltaPushBytes(index) : cooBytes(index.size());
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
  CORTADO_ENFORCE(kind >= uint8_t(Kind::kCoo) && kind <= uint8_t(Kind::kDeltaPush),
                  ErrorCode::kProtocol,
                  "sparse payload of unknown kind {} (this build reads 1 = COO push, 2 = bitmap "
                  "answer, 3 = index-list answer, 4 = delta-coded push)",
                  kind);
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
  } else if (h.kind == Kind::kDeltaPush) {
    CORTADO_ENFORCE(h.listSize == 0, ErrorCode::kProtocol,
                    "sparse delta-coded push with a list size ({}); it must be zero", h.listSize);
    // Each pair: a value and a varint of 1 to 5 bytes (count <= numel < 2^32).
    CORTADO_ENFORCE(h.count <= h.numel && body >= 5 * h.count && body <= 9 * h.count,
                    ErrorCode::kProtocol,
                    "sparse delta-coded push of {} pairs for {} elements: the body has {} bytes, "
                    "{} pairs need {} to {} (a truncated push?)",
                    h.count, h.numel, body, h.count, 5 * h.count, 9 * h.count);
  } else if (h.kind == Kind::kIndexList) {
    CORTADO_ENFORCE(h.listSize <= h.numel && h.count <= h.listSize, ErrorCode::kProtocol,
                    "sparse index-list answer of {} non-zeros over {} indices of a {}-element "
                    "tensor",
                    h.count, h.listSize, h.numel);
    // Each non-zero: a value and a varint of 1 to 5 bytes (count < 2^32).
    CORTADO_ENFORCE(body >= 5 * h.count && body <= 9 * h.count, ErrorCode::kProtocol,
                    "sparse index-list answer: the body has {} bytes, {} non-zeros need {} to {} "
                    "(a truncated answer?)",
                    body, h.count, 5 * h.count, 9 * h.count);
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
  writeZenHeader(headerFor(own, server, Kind::kCoo, index.size(), 0), out.data());
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

size_t writePush(const Ownership& own, uint32_t server, std::span<const uint32_t> index,
                 std::span<const float> value, PushForm form, std::span<std::byte> out) {
  if (form == PushForm::kCoo) return writeCoo(own, server, index, value, out);
  CORTADO_ENFORCE(index.size() == value.size(), ErrorCode::kInvalidArgument,
                  "sparse push: {} indices but {} values", index.size(), value.size());
  for (size_t i = 0; i < index.size(); ++i)
    CORTADO_ENFORCE(index[i] < own.numElements() && (i == 0 || index[i] > index[i - 1]),
                    ErrorCode::kInvalidArgument,
                    "delta-coded push: index {} (#{}) is past the tensor's {} elements or does "
                    "not ascend",
                    index[i], i, own.numElements());
  const size_t bytes = deltaPushBytes(index);
  CORTADO_ENFORCE(out.size() >= bytes, ErrorCode::kInvalidArgument,
                  "sparse push of {} pairs needs {} bytes, the buffer has {}", index.size(), bytes,
                  out.size());
  writeZenHeader(headerFor(own, server, Kind::kDeltaPush, index.size(), 0), out.data());
  std::byte* p = out.data() + kZenHeaderBytes;
  if (!value.empty()) std::memcpy(p, value.data(), 4 * value.size());
  writeGaps(p + 4 * value.size(), index);
  return bytes;
}

std::vector<std::byte> encodeDeltaPush(const Ownership& own, uint32_t server,
                                       std::span<const uint32_t> index,
                                       std::span<const float> value) {
  std::vector<std::byte> out(deltaPushBytes(index));
  writePush(own, server, index, value, PushForm::kDelta, out);
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

float DeltaView::valueAt(size_t i) const { return load<float>(value + 4 * i); }

DeltaView parseDeltaPush(std::span<const std::byte> payload) {
  DeltaView v;
  v.header = parseZenHeader(payload);
  CORTADO_ENFORCE(v.header.kind == Kind::kDeltaPush, ErrorCode::kProtocol,
                  "expected a sparse delta-coded push, got a {}", kindName(v.header.kind));
  v.value = payload.data() + kZenHeaderBytes;
  v.gaps = reinterpret_cast<const uint8_t*>(v.value + 4 * v.header.count);
  v.end = reinterpret_cast<const uint8_t*>(payload.data() + payload.size());
  return v;
}

std::vector<std::byte> encodeBitmap(const Ownership& own, uint32_t server,
                                    std::span<const uint32_t> list,
                                    std::span<const uint64_t> presentBits,
                                    std::span<const float> values) {
  const uint64_t L = list.size();
  CORTADO_ENFORCE(presentBits.size() >= (L + 63) / 64, ErrorCode::kInvalidArgument,
                  "bitmap of {} words for {} indices", presentBits.size(), L);
  std::vector<std::byte> out(bitmapBytes(L, values.size()));
  writeZenHeader(headerFor(own, server, Kind::kBitmap, values.size(), L), out.data());
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

std::vector<std::byte> encodeIndexList(const Ownership& own, uint32_t server, uint64_t listSize,
                                       std::span<const uint32_t> indices,
                                       std::span<const float> values) {
  CORTADO_ENFORCE(indices.size() == values.size() && indices.size() <= listSize,
                  ErrorCode::kInvalidArgument,
                  "index-list answer with {} indices and {} values for a server owning {}",
                  indices.size(), values.size(), listSize);
  for (size_t i = 0; i < indices.size(); ++i)
    CORTADO_ENFORCE(indices[i] < own.numElements() && (i == 0 || indices[i] > indices[i - 1]),
                    ErrorCode::kInvalidArgument,
                    "index-list answer: index {} (#{}) is past the tensor's {} elements or does "
                    "not ascend",
                    indices[i], i, own.numElements());
  std::vector<std::byte> out(indexListBytes(indices));
  writeZenHeader(headerFor(own, server, Kind::kIndexList, values.size(), listSize), out.data());
  std::byte* p = out.data() + kZenHeaderBytes;
  if (!values.empty()) std::memcpy(p, values.data(), 4 * values.size());
  writeGaps(p + 4 * values.size(), indices);
  return out;
}

namespace {

// The index-list answer's checks: one pass over the varints and the
// ownership hash of every index. I_p itself is not read: only its size.
// With `index`, the indices are written there (h.count of them).
void checkIndexList(const ZenHeader& h, std::span<const std::byte> payload, const Ownership& own,
                    uint32_t server, uint64_t listSize, uint32_t* index = nullptr) {
  CORTADO_ENFORCE(h.listSize == listSize, ErrorCode::kProtocol,
                  "sparse index-list answer of server {} covers {} indices, but the server owns {}",
                  server, h.listSize, listSize);
  const auto* begin =
      reinterpret_cast<const uint8_t*>(payload.data() + kZenHeaderBytes + 4 * h.count);
  const auto* end = reinterpret_cast<const uint8_t*>(payload.data() + payload.size());
  const GapWalk w = walkGaps(begin, end, h.count, h.numel, [&](uint64_t i, uint64_t idx) {
    if (own.owner(idx) != server) return false;
    if (index) index[i] = static_cast<uint32_t>(idx);
    return true;
  });
  CORTADO_ENFORCE(w.stop != GapStop::kBadVarint, ErrorCode::kProtocol,
                  "sparse index-list answer of server {}: gap #{} (byte {} of the list) is "
                  "truncated, longer than 5 bytes, overlong or past 32 bits",
                  server, w.at, w.bytes);
  CORTADO_ENFORCE(w.stop != GapStop::kOutOfRange, ErrorCode::kProtocol,
                  "sparse index-list answer of server {}: non-zero #{} has index {}, past the "
                  "tensor's {} elements",
                  server, w.at, w.index, h.numel);
  CORTADO_ENFORCE(w.stop != GapStop::kRefused, ErrorCode::kProtocol,
                  "sparse index-list answer of server {}: non-zero #{} has index {}, which the "
                  "server does not own",
                  server, w.at, w.index);
  CORTADO_ENFORCE(w.stop != GapStop::kLeftOver, ErrorCode::kProtocol,
                  "sparse index-list answer of server {}: {} bytes left over after its {} gaps",
                  server, w.bytes, h.count);
}

// The bitmap answer's checks: its partition, its list size, the bit count
// against the value count, no bit past |I_p|.
void checkBitmap(const ZenHeader& h, std::span<const std::byte> payload, const Ownership& own,
                 uint32_t server, uint64_t listSize) {
  expectPartition(h, own, server);
  CORTADO_ENFORCE(h.listSize == listSize, ErrorCode::kProtocol,
                  "sparse bitmap answer of server {} covers {} indices, but the server owns {}",
                  server, h.listSize, listSize);
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
}

// The answer's header, checked for either kind and for this partition.
ZenHeader answerHeader(std::span<const std::byte> payload, const Ownership& own, uint32_t server) {
  const ZenHeader h = parseZenHeader(payload);
  CORTADO_ENFORCE(h.kind == Kind::kBitmap || h.kind == Kind::kIndexList, ErrorCode::kProtocol,
                  "expected a sparse answer (bitmap or index list), got a {}", kindName(h.kind));
  if (h.kind == Kind::kIndexList) expectPartition(h, own, server);
  return h;
}

// Walks a checked index-list answer: fn(index, value) in ascending order.
template <typename Fn>
void walkIndexList(const ZenHeader& h, std::span<const std::byte> payload, Fn&& fn) {
  const std::byte* vals = payload.data() + kZenHeaderBytes;
  const auto* p = reinterpret_cast<const uint8_t*>(vals + 4 * h.count);
  const auto* end = reinterpret_cast<const uint8_t*>(payload.data() + payload.size());
  uint64_t idx = 0;
  for (uint64_t i = 0; i < h.count; ++i) {
    uint32_t g = 0;
    p = readVarint(p, end, g);
    idx += g;
    fn(static_cast<uint32_t>(idx), load<float>(vals + 4 * i));
    ++idx;
  }
}

// Walks a checked bitmap answer: fn(index, value) in ascending order.
template <typename Fn>
void walkBitmap(const ZenHeader& h, std::span<const std::byte> payload,
                std::span<const uint32_t> list, Fn&& fn) {
  const std::byte* bits = payload.data() + kZenHeaderBytes;
  const size_t bitBytes = (h.listSize + 7) / 8;
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
void decodeImpl(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                std::span<const uint32_t> list, Fn&& fn) {
  const ZenHeader h = parseZenHeader(payload);
  CORTADO_ENFORCE(h.kind == Kind::kBitmap, ErrorCode::kProtocol,
                  "expected a sparse bitmap answer, got a {}", kindName(h.kind));
  checkBitmap(h, payload, own, server, list.size());
  walkBitmap(h, payload, list, fn);
}

ZenHeader checkAnswerHeader(std::span<const std::byte> payload, const Ownership& own,
                            uint32_t server, std::span<const uint32_t> list) {
  const ZenHeader h = answerHeader(payload, own, server);
  if (h.kind == Kind::kBitmap)
    checkBitmap(h, payload, own, server, list.size());
  else
    checkIndexList(h, payload, own, server, list.size());
  return h;
}

template <typename Fn>
void decodeAnswerImpl(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                      std::span<const uint32_t> list, Fn&& fn) {
  const ZenHeader h = checkAnswerHeader(payload, own, server, list);
  if (h.kind == Kind::kBitmap)
    walkBitmap(h, payload, list, fn);
  else
    walkIndexList(h, payload, fn);
}

}  // namespace

void checkAnswer(std::span<const std::byte> payload, const Ownership& own, uint32_t server,
                 std::span<const uint32_t> list, CheckedAnswer& out) {
  out.values = nullptr;
  out.header = answerHeader(payload, own, server);
  const ZenHeader& h = out.header;
  out.index.resize(h.count);  // count <= |I_p|, checked with the header
  if (h.kind == Kind::kBitmap) {
    checkBitmap(h, payload, own, server, list.size());
    out.values = payload.data() + kZenHeaderBytes + (h.listSize + 7) / 8;
    uint32_t* index = out.index.data();
    walkBitmap(h, payload, list, [&index](uint32_t i, float) { *index++ = i; });
  } else {
    checkIndexList(h, payload, own, server, list.size(), out.index.data());
    out.values = payload.data() + kZenHeaderBytes;
  }
}

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

void assembleDense(std::span<const CheckedAnswer> answers, uint64_t numElements, float scale,
                   float* dense) {
  // One cursor per answer: its next index and value.
  struct Cursor {
    const uint32_t* index;
    const uint32_t* end;
    const std::byte* value;
  };
  std::vector<Cursor> cursors;
  for (size_t a = 0; a < answers.size(); ++a) {
    const CheckedAnswer& c = answers[a];
    CORTADO_ENFORCE(c.index.size() == c.header.count && (c.values || c.index.empty()),
                    ErrorCode::kInvalidArgument,
                    "sparse answer #{} was not filled by checkAnswer ({} indices, {} non-zeros)", a,
                    c.index.size(), c.header.count);
    cursors.push_back({c.index.data(), c.index.data() + c.index.size(), c.values});
  }
  // Writes every non-zero below `limit` into out[index - first].
  auto fill = [&](uint64_t first, uint64_t limit, float* out) {
    for (Cursor& c : cursors) {
      for (; c.index != c.end && *c.index < limit; ++c.index, c.value += 4) {
        if (*c.index < first) break;  // not ascending: stuck here, refused below
        out[*c.index - first] = load<float>(c.value) * scale;
      }
    }
  };
  // The output in blocks: each is zeroed and gets every answer's values for
  // it in a buffer that stays in the L1 cache, and is then streamed to the
  // output with non-temporal stores, so every element is written once and
  // no line of the output is read for ownership. (A block zeroed in place
  // and stored into would read every line; the whole output zeroed first
  // and then stored into, a line per non-zero, at a cache miss each.)
  const uint64_t n = numElements;
  const auto misalign = reinterpret_cast<uintptr_t>(dense) & 63;
  uint64_t head = std::min<uint64_t>(n, misalign ? (64 - misalign) / sizeof(float) : 0);
#if !defined(__SSE2__)
  head = n;  // no streaming stores here: in place, in one go
#endif
  if (misalign % sizeof(float)) head = n;
  if (head > 0) {
    std::memset(dense, 0, head * sizeof(float));
    fill(0, head, dense);
  }
#if defined(__SSE2__)
  constexpr uint64_t kBlock = 4096;  // floats: 16 KiB
  alignas(64) float block[kBlock];
  for (uint64_t b0 = head; b0 < n; b0 += kBlock) {
    const uint64_t len = std::min(n - b0, kBlock);
    std::memset(block, 0, len * sizeof(float));
    fill(b0, b0 + len, block);
    uint64_t i = 0;
    for (; i + 4 <= len; i += 4) _mm_stream_ps(dense + b0 + i, _mm_load_ps(block + i));
    for (; i < len; ++i) dense[b0 + i] = block[i];
  }
  _mm_sfence();  // the streamed stores are ordered before what the caller does next
#endif
  // Indices from checkAnswer ascend and lie in the tensor: every one was
  // written. Others may have stopped a cursor (nothing was written out of
  // bounds): a caller's mistake.
  for (size_t a = 0; a < cursors.size(); ++a)
    CORTADO_ENFORCE(cursors[a].index == cursors[a].end, ErrorCode::kInvalidArgument,
                    "sparse answer #{}: {} of its indices do not ascend or lie past the tensor's "
                    "{} elements (not filled by checkAnswer?)",
                    a, cursors[a].end - cursors[a].index, n);
}

}  // namespace cortado::compressor::zen
