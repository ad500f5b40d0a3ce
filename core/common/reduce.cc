#include "core/common/reduce.h"

#include <algorithm>
#include <cstring>

#include "core/common/error.h"
#include "core/common/half.h"

namespace cortado {
namespace {

// target_clones makes GCC emit an AVX2 body and a baseline body, and pick one
// at load time: the loops below vectorize in both.
#define CORTADO_SIMD_CLONES __attribute__((target_clones("avx2", "default")))

CORTADO_SIMD_CLONES void addF32(float* __restrict a, const float* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += s[i];
}
CORTADO_SIMD_CLONES void addF64(double* __restrict a, const double* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += s[i];
}
CORTADO_SIMD_CLONES void addI32(int32_t* __restrict a, const int32_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += s[i];
}
CORTADO_SIMD_CLONES void addI64(int64_t* __restrict a, const int64_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += s[i];
}
CORTADO_SIMD_CLONES void addU8(uint8_t* __restrict a, const uint8_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<uint8_t>(a[i] + s[i]);
}
CORTADO_SIMD_CLONES void addI8(int8_t* __restrict a, const int8_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<int8_t>(a[i] + s[i]);
}
CORTADO_SIMD_CLONES void addBf16(float* __restrict a, const uint16_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(s[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    a[i] += f;
  }
}

// fp16 has no cheap bit trick: convert a block with F16C, then add.
void addF16(float* a, const uint16_t* s, size_t n) {
  constexpr size_t kBlock = 2048;
  alignas(64) float tmp[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    size_t m = std::min(kBlock, n - i);
    halfToFloatN(s + i, tmp, m);
    addF32(a + i, tmp, m);
  }
}

template <typename T>
CORTADO_SIMD_CLONES void scaleFloat(T* __restrict d, const T* __restrict s, size_t n, T inv) {
  for (size_t i = 0; i < n; ++i) d[i] = s[i] * inv;
}

template <typename T>
void divideInt(T* d, const T* s, size_t n, int64_t div) {
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(s[i] / div);
}

}  // namespace

DType accumulatorDType(DType t) {
  return (t == DType::kFloat16 || t == DType::kBFloat16) ? DType::kFloat32 : t;
}

void loadAccumulator(DType t, void* acc, const void* src, size_t n) {
  switch (t) {
    case DType::kFloat16:
      halfToFloatN(static_cast<const uint16_t*>(src), static_cast<float*>(acc), n);
      return;
    case DType::kBFloat16:
      bf16ToFloatN(static_cast<const uint16_t*>(src), static_cast<float*>(acc), n);
      return;
    default:
      if (n) std::memcpy(acc, src, n * dtypeSize(t));
  }
}

void accumulate(DType t, void* acc, const void* src, size_t n) {
  switch (t) {
    case DType::kFloat32: return addF32(static_cast<float*>(acc), static_cast<const float*>(src), n);
    case DType::kFloat64: return addF64(static_cast<double*>(acc), static_cast<const double*>(src), n);
    case DType::kInt32: return addI32(static_cast<int32_t*>(acc), static_cast<const int32_t*>(src), n);
    case DType::kInt64: return addI64(static_cast<int64_t*>(acc), static_cast<const int64_t*>(src), n);
    case DType::kUInt8: return addU8(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(src), n);
    case DType::kInt8: return addI8(static_cast<int8_t*>(acc), static_cast<const int8_t*>(src), n);
    case DType::kFloat16: return addF16(static_cast<float*>(acc), static_cast<const uint16_t*>(src), n);
    case DType::kBFloat16:
      return addBf16(static_cast<float*>(acc), static_cast<const uint16_t*>(src), n);
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("accumulate: invalid dtype {}", int(t)));
}

void storeAccumulator(DType t, void* dst, const void* acc, size_t n) {
  switch (t) {
    case DType::kFloat16:
      floatToHalfN(static_cast<const float*>(acc), static_cast<uint16_t*>(dst), n);
      return;
    case DType::kBFloat16:
      floatToBf16N(static_cast<const float*>(acc), static_cast<uint16_t*>(dst), n);
      return;
    default:
      if (n && dst != acc) std::memcpy(dst, acc, n * dtypeSize(t));
  }
}

void divideInto(DType t, void* dst, const void* src, size_t n, int64_t divisor) {
  CORTADO_ENFORCE(divisor != 0, ErrorCode::kInvalidArgument, "divideInto: divisor is zero");
  switch (t) {
    case DType::kFloat32:
      return scaleFloat(static_cast<float*>(dst), static_cast<const float*>(src), n,
                        1.0f / static_cast<float>(divisor));
    case DType::kFloat64:
      return scaleFloat(static_cast<double*>(dst), static_cast<const double*>(src), n,
                        1.0 / static_cast<double>(divisor));
    case DType::kFloat16:
    case DType::kBFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      auto* d = static_cast<uint16_t*>(dst);
      const float inv = 1.0f / static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) {
        float f = (t == DType::kFloat16 ? halfToFloat(s[i]) : bf16ToFloat(s[i])) * inv;
        d[i] = t == DType::kFloat16 ? floatToHalf(f) : floatToBf16(f);
      }
      return;
    }
    case DType::kInt32: return divideInt(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, divisor);
    case DType::kInt64: return divideInt(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, divisor);
    case DType::kUInt8: return divideInt(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, divisor);
    case DType::kInt8: return divideInt(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, divisor);
  }
}

}  // namespace cortado
