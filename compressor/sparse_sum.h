// The lossless sparse form of a sum of sparse payloads, which servers send
// back for top-k, DGC and random-k tensors.
//
// Re-compressing a sum of W top-k payloads with the same top-k would drop
// what the workers' error feedback already counted as sent, so that error
// would never be corrected. The sum has at most W*k nonzeros; this writes all
// of them as a top-k payload (codec id topk, count = nonzeros, indices
// ascending, f32 values), which any top-k codec decodes whatever its ratio.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/common/dtype.h"

namespace cortado::compressor {

// Nonzero elements of sum[0..n).
size_t countNonzeros(const float* sum, size_t n);

// Payload bytes, header included, for `nonzeros` elements.
size_t sparseSumBytes(size_t nonzeros);

// Writes the nonzeros of sum[0..n) as a top-k payload; `out` must hold
// sparseSumBytes(countNonzeros(sum, n)) bytes (else kInvalidArgument), and n
// must fit u32 indices. Returns the bytes written.
size_t encodeSparseSum(const float* sum, size_t n, std::span<std::byte> out,
                       DType dtype = DType::kFloat32);

}  // namespace cortado::compressor
