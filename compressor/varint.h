// Unsigned LEB128 varints of 32-bit values: 7 bits a byte, low bits first,
// the high bit set on every byte but the last; 1 to 5 bytes, never overlong.
// The gap-coded index lists use them: Zen's index-list answers
// (zen/zen_payload.h) and the compact wire form of top-k and DGC payloads
// (compact.h).
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

}  // namespace cortado::compressor
