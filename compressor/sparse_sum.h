// The lossless sparse form of a sum of sparse payloads, which servers send
// back for top-k, DGC and random-k tensors.
//
// Re-compressing a sum of W top-k payloads with the same top-k would drop
// what the workers' error feedback already counted as sent, so that error
// would never be corrected. The sum has at most W*k nonzeros; this writes all
// of them as a top-k payload (codec id topk, count = nonzeros, indices
// ascending, f32 values), which any top-k codec decodes whatever its ratio.
//
// Top-k and DGC payloads list their indices, so a server can also keep the
// union of the indices a round's payloads carried (IndexUnion) and build the
// sparse sum from those alone: O(W*k) instead of a scan of all n elements,
// and only those elements to clear for the next round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compressor/codec.h"
#include "core/common/dtype.h"

namespace cortado::compressor {

// Nonzero elements of sum[0..n).
size_t countNonzeros(const float* sum, size_t n);
// Nonzero elements of sum among the indices `at`.
size_t countNonzeros(const float* sum, std::span<const uint32_t> at);

// Payload bytes, header included, for `nonzeros` elements.
size_t sparseSumBytes(size_t nonzeros);

// Writes the `nonzeros` nonzeros of sum[0..n) (countNonzeros(sum, n), which
// the caller has counted to size `out`) as a top-k payload; `out` must hold
// sparseSumBytes(nonzeros) bytes, n must fit u32 indices, and the count must
// be right (else kInvalidArgument). Returns the bytes written.
size_t encodeSparseSum(const float* sum, size_t n, size_t nonzeros, std::span<std::byte> out,
                       DType dtype = DType::kFloat32);
// The same payload, byte for byte, when every nonzero of sum[0..n) is at one
// of the indices `at` (ascending, unique, < n): reads only those elements.
// `nonzeros` is countNonzeros(sum, at).
size_t encodeSparseSum(const float* sum, size_t n, std::span<const uint32_t> at, size_t nonzeros,
                       std::span<std::byte> out, DType dtype = DType::kFloat32);

// True for the codecs whose payloads list their indices: top-k and DGC.
bool listsIndices(CodecId id);

// The union of the indices that top-k or DGC payloads of one n-element
// tensor list: add() each payload, then merged() is every index once,
// ascending. A bitmap of n bits: setting a bit per index and reading out the
// words costs O(indices + n/64), far below the O(n) scan of the sum.
class IndexUnion {
 public:
  // Empties the union and sizes it for n-element tensors.
  void reset(size_t n);
  // Throws kProtocol, adding nothing, for a payload that does not list
  // indices, is not for n elements, or has an index out of range.
  void add(std::span<const std::byte> payload);
  std::span<const uint32_t> merged();
  // Indices added, duplicates included.
  size_t added() const { return added_; }

 private:
  size_t n_ = 0, added_ = 0;
  bool listed_ = false;
  std::vector<uint64_t> bits_;
  std::vector<uint32_t> list_;
};

}  // namespace cortado::compressor
