// Unsigned LEB128 varints of 32-bit values: 7 bits a byte, low bits first,
// the high bit set on every byte but the last; 1 to 5 bytes, never overlong.
// The gap-coded index lists use them: Zen's index-list answers and
// delta-coded pushes (zen/zen_payload.h) and the compact wire form of top-k
// and DGC payloads (compact.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cortado::compressor {

// Bytes of one varint of v (1 to 5).
inline size_t varintBytes(uint32_t v) {
  return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5;
}

// Writes v at p (varintBytes(v) bytes) and returns the byte after it.
inline std::byte* writeVarint(std::byte* p, uint32_t v) {
  while (v >= 0x80) {
    *p++ = std::byte{static_cast<uint8_t>(v | 0x80)};
    v >>= 7;
  }
  *p++ = std::byte{static_cast<uint8_t>(v)};
  return p;
}

// Reads the varint at p (before end) into v; returns the byte after it, or
// null where it is truncated, longer than 5 bytes, overlong (a last byte of
// zero after the first) or past 32 bits. Never reads at or past end.
inline const uint8_t* readVarint(const uint8_t* p, const uint8_t* end, uint32_t& v) {
  if (p < end && *p < 0x80) {  // the common case: one byte
    v = *p;
    return p + 1;
  }
  uint64_t x = 0;
  for (int shift = 0; shift < 35; shift += 7) {
    if (p == end) return nullptr;
    const uint8_t b = *p++;
    x |= uint64_t(b & 0x7f) << shift;
    if (b < 0x80) {
      if ((b == 0 && shift > 0) || x > 0xffffffffull) return nullptr;
      v = static_cast<uint32_t>(x);
      return p;
    }
  }
  return nullptr;
}

// What stopped a checked walk over a gap-coded index list (walkGaps).
enum class GapStop {
  kNone,        // every gap read, nothing left over
  kBadVarint,   // gap #at is truncated, longer than 5 bytes, overlong or past 32 bits
  kOutOfRange,  // gap #at gives `index`, not below numel
  kRefused,     // accept(at, index) said no
  kLeftOver,    // `bytes` left after the last gap
};

struct GapWalk {
  GapStop stop = GapStop::kNone;
  uint64_t at = 0;     // the gap that stopped the walk
  uint64_t index = 0;  // its index (kOutOfRange, kRefused)
  ptrdiff_t bytes = 0;  // kBadVarint: where the gap starts in the list; kLeftOver: bytes left
};

// Reads `count` gaps (the first index, then each index minus the previous
// minus 1) from [begin, end): every varint whole, every index below numel
// and accepted by accept(i, index) (which may also keep it), and no byte
// left after the last gap. Stops at the first failure and says which; never
// reads at or past end. The callers word the errors.
template <typename Accept>
GapWalk walkGaps(const uint8_t* begin, const uint8_t* end, uint64_t count, uint64_t numel,
                 Accept&& accept) {
  const uint8_t* p = begin;
  uint64_t next = 0;  // one past the previous index
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t gap = 0;
    const uint8_t* after = readVarint(p, end, gap);
    if (after == nullptr) return {GapStop::kBadVarint, i, 0, p - begin};
    p = after;
    const uint64_t index = next + gap;
    if (index >= numel) return {GapStop::kOutOfRange, i, index, 0};
    if (!accept(i, index)) return {GapStop::kRefused, i, index, 0};
    next = index + 1;
  }
  if (p != end) return {GapStop::kLeftOver, count, 0, end - p};
  return {};
}

}  // namespace cortado::compressor
