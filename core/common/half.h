// IEEE fp16 and bfloat16 conversions to and from fp32, scalar and bulk.
// Round-to-nearest-even in both directions; NaN stays NaN, overflow goes to inf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cortado {

inline float bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t absBits = bits & 0x7fffffffu;
  if (absBits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absBits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absBits < 0x38800000u) {  // result is subnormal or zero
    if (absBits < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest
    uint32_t exp = absBits >> 23;
    uint32_t mant = (absBits & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp-150); a subnormal half counts units of 2^-24.
    uint32_t shift = 126 - exp;
    uint32_t res = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (res & 1u))) ++res;
    return static_cast<uint16_t>(sign | res);
  }
  uint32_t res = ((absBits - 0x38000000u) >> 13);
  uint32_t rem = absBits & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) ++res;
  return static_cast<uint16_t>(sign | res);
}

// Bulk conversions; vectorized with F16C where the CPU has it.
void halfToFloatN(const uint16_t* in, float* out, size_t n);
void floatToHalfN(const float* in, uint16_t* out, size_t n);
void bf16ToFloatN(const uint16_t* in, float* out, size_t n);
void floatToBf16N(const float* in, uint16_t* out, size_t n);

}  // namespace cortado
