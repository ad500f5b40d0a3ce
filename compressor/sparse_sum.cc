#include "compressor/sparse_sum.h"

#include "compressor/format.h"
#include "compressor/payload.h"

namespace cortado::compressor {

size_t countNonzeros(const float* sum, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) c += sum[i] != 0.0f;
  return c;
}

size_t sparseSumBytes(size_t nonzeros) { return kHeaderBytes + format::sparseBody(nonzeros); }

size_t encodeSparseSum(const float* sum, size_t n, std::span<std::byte> out, DType dtype) {
  CORTADO_ENFORCE(n <= format::kMaxSparseNumel, ErrorCode::kInvalidArgument,
                  "sparse sum of {} elements: indices are u32, split the tensor into chunks", n);
  const size_t k = countNonzeros(sum, n);
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
  for (size_t i = 0; i < n; ++i) {
    if (sum[i] == 0.0f) continue;
    storeLe<uint32_t>(idx + 4 * j, static_cast<uint32_t>(i));
    storeLe<float>(vals + 4 * j, sum[i]);
    ++j;
  }
  return total;
}

}  // namespace cortado::compressor
