// Summation kernels for every dtype, vectorized (AVX2 clone with a portable
// fallback, chosen at load time). Used by the servers to aggregate pushes and
// by the worker to average. fp16 and bf16 are accumulated in fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/common/dtype.h"

namespace cortado {

// The dtype in which `t` is accumulated: float32 for float16/bfloat16,
// otherwise `t` itself.
DType accumulatorDType(DType t);

// acc (accumulator dtype) = src (dtype t), n elements.
void loadAccumulator(DType t, void* acc, const void* src, size_t n);
// acc (accumulator dtype) += src (dtype t), n elements.
void accumulate(DType t, void* acc, const void* src, size_t n);
// dst (dtype t) = acc (accumulator dtype), n elements.
void storeAccumulator(DType t, void* dst, const void* acc, size_t n);
// dst (dtype t) = src (dtype t) * (1 / divisor). Integers use truncating
// division, as C++ does.
void divideInto(DType t, void* dst, const void* src, size_t n, int64_t divisor);

}  // namespace cortado
