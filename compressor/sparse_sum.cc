#include "compressor/sparse_sum.h"

#include <algorithm>

#include "compressor/format.h"
#include "compressor/payload.h"

namespace cortado::compressor {
namespace {

// The payload of the k nonzeros that forEach(fn) visits in ascending order.
template <typename ForEach>
size_t writeSparseSum(const float* sum, size_t n, size_t k, std::span<std::byte> out, DType dtype,
                      ForEach forEach) {
  CORTADO_ENFORCE(n <= format::kMaxSparseNumel, ErrorCode::kInvalidArgument,
                  "sparse sum of {} elements: indices are u32, split the tensor into chunks", n);
  const size_t total = sparseSumBytes(k);
  requireCapacity(out, total, CodecId::kTopK, n);
  PayloadHeader h;
  h.codec = CodecId::kTopK;
  h.dtype = dtype;
  h.numel = n;
  h.bodyBytes = format::sparseBody(k);
  h.count = k;
  writeHeader(h, out);
  std::byte* idx = out.data() + kHeaderBytes;
  std::byte* vals = idx + 4 * k;
  size_t j = 0;
  forEach([&](size_t i) {
    if (sum[i] == 0.0f) return;
    if (j < k) {
      storeLe<uint32_t>(idx + 4 * j, static_cast<uint32_t>(i));
      storeLe<float>(vals + 4 * j, sum[i]);
    }
    ++j;
  });
  CORTADO_ENFORCE(j == k, ErrorCode::kInvalidArgument,
                  "sparse sum of {} elements: {} nonzeros given, {} found", n, k, j);
  return total;
}

}  // namespace

size_t countNonzeros(const float* sum, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) c += sum[i] != 0.0f;
  return c;
}

size_t countNonzeros(const float* sum, std::span<const uint32_t> at) {
  size_t c = 0;
  for (uint32_t i : at) c += sum[i] != 0.0f;
  return c;
}

size_t sparseSumBytes(size_t nonzeros) { return kHeaderBytes + format::sparseBody(nonzeros); }

size_t encodeSparseSum(const float* sum, size_t n, size_t nonzeros, std::span<std::byte> out,
                       DType dtype) {
  return writeSparseSum(sum, n, nonzeros, out, dtype, [&](auto&& fn) {
    for (size_t i = 0; i < n; ++i) fn(i);
  });
}

size_t encodeSparseSum(const float* sum, size_t n, std::span<const uint32_t> at, size_t nonzeros,
                       std::span<std::byte> out, DType dtype) {
  CORTADO_ENFORCE(at.empty() || at.back() < n, ErrorCode::kInvalidArgument,
                  "sparse sum of {} elements: index {} is out of range", n, at.back());
  return writeSparseSum(sum, n, nonzeros, out, dtype, [&](auto&& fn) {
    for (uint32_t i : at) fn(i);
  });
}

bool listsIndices(CodecId id) { return id == CodecId::kTopK || id == CodecId::kDgc; }

void IndexUnion::reset(size_t n) {
  if (n_ == n && bits_.size() == (n + 63) / 64) {
    for (uint32_t i : merged()) bits_[i >> 6] = 0;  // only the words in use
  } else {
    bits_.assign((n + 63) / 64, 0);
  }
  n_ = n;
  added_ = 0;
  list_.clear();
  listed_ = false;
}

void IndexUnion::add(std::span<const std::byte> payload) {
  const PayloadHeader h = parseHeader(payload);
  CORTADO_ENFORCE(listsIndices(h.codec) && h.bodyBytes == format::sparseBody(h.count) &&
                      h.numel == n_,
                  ErrorCode::kProtocol, "{} payload does not list indices of a {}-element tensor",
                  describe(h), n_);
  const std::byte* idx = payload.data() + kHeaderBytes;
  for (size_t i = 0; i < h.count; ++i)
    CORTADO_ENFORCE(loadLe<uint32_t>(idx + 4 * i) < n_, ErrorCode::kProtocol,
                    "{} payload: index #{} is out of range for {} elements", describe(h), i, n_);
  for (size_t i = 0; i < h.count; ++i) {
    const uint32_t j = loadLe<uint32_t>(idx + 4 * i);
    bits_[j >> 6] |= uint64_t{1} << (j & 63);
  }
  added_ += h.count;
  listed_ = false;
}

std::span<const uint32_t> IndexUnion::merged() {
  if (!listed_) {
    list_.clear();
    for (size_t w = 0; w < bits_.size(); ++w)
      for (uint64_t b = bits_[w]; b; b &= b - 1)
        list_.push_back(static_cast<uint32_t>(w * 64 + __builtin_ctzll(b)));
    listed_ = true;
  }
  return list_;
}

}  // namespace cortado::compressor
