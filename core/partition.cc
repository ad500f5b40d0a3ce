#include "core/partition.h"

#include <algorithm>

#include "core/common/error.h"

namespace cortado {

ServerPlacement::ServerPlacement(int numServers) {
  CORTADO_ENFORCE(numServers >= 1, ErrorCode::kInvalidArgument,
                  "need at least one server, got {}", numServers);
  load_.assign(numServers, 0);
}

std::vector<Chunk> ServerPlacement::place(uint64_t tensorKey, uint64_t numElements,
                                          size_t elementBytes, uint64_t partitionBytes) {
  CORTADO_ENFORCE(partitionBytes >= elementBytes && elementBytes > 0, ErrorCode::kInvalidArgument,
                  "partition size {} bytes is smaller than one element ({} bytes)", partitionBytes,
                  elementBytes);
  const uint64_t perChunkMax = partitionBytes / elementBytes;
  const uint64_t n = numElements == 0 ? 1 : (numElements + perChunkMax - 1) / perChunkMax;
  CORTADO_ENFORCE(n <= kMaxChunksPerTensor, ErrorCode::kInvalidArgument,
                  "tensor key {} needs {} chunks of {} bytes, more than the {} allowed: raise "
                  "CORTADO_PARTITION_BYTES",
                  tensorKey, n, partitionBytes, kMaxChunksPerTensor);
  std::vector<Chunk> chunks;
  chunks.reserve(n);
  // Nearly equal chunks: the first `rem` get one element more.
  const uint64_t base = numElements / n, rem = numElements % n;
  uint64_t offset = 0;
  for (uint64_t i = 0; i < n; ++i) {
    Chunk c;
    c.key = chunkKey(tensorKey, i);
    c.offset = offset;
    c.numElements = base + (i < rem ? 1 : 0);
    offset += c.numElements;
    auto it = std::min_element(load_.begin(), load_.end());
    c.server = static_cast<int>(it - load_.begin());
    // Count at least one byte so empty tensors still spread out.
    *it += std::max<uint64_t>(1, c.numElements * elementBytes);
    chunks.push_back(c);
  }
  return chunks;
}

}  // namespace cortado
