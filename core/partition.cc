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
                                          size_t elementBytes, uint64_t partitionBytes,
                                          uint64_t payloadBytes) {
  CORTADO_ENFORCE(partitionBytes >= elementBytes && elementBytes > 0, ErrorCode::kInvalidArgument,
                  "partition size {} bytes is smaller than one element ({} bytes)", partitionBytes,
                  elementBytes);
  const uint64_t n =
      chunkCount(numElements, elementBytes, partitionBytes, payloadBytes, int(load_.size()));
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

std::vector<size_t> sendOrder(const std::vector<Chunk>& chunks, int rank, bool stagger) {
  CORTADO_ENFORCE(rank >= 0, ErrorCode::kInvalidArgument,
                  "send order for rank {}: ranks are 0..N-1", rank);
  std::vector<size_t> order(chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!stagger || chunks.size() < 2) return order;
  // round[i]: how many chunks of the same server come before chunk i.
  int maxServer = 0;
  for (const Chunk& c : chunks) {
    CORTADO_ENFORCE(c.server >= 0, ErrorCode::kInvalidArgument, "chunk key {} has server {}", c.key,
                    c.server);
    maxServer = std::max(maxServer, c.server);
  }
  std::vector<uint64_t> seen(size_t(maxServer) + 1, 0), round(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) round[i] = seen[size_t(chunks[i].server)]++;
  // By round, then by server (a round holds each server at most once).
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (round[a] != round[b]) return round[a] < round[b];
    return chunks[a].server < chunks[b].server;
  });
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin;
    while (end < order.size() && round[order[end]] == round[order[begin]]) ++end;
    const size_t m = end - begin;
    std::rotate(order.begin() + begin, order.begin() + begin + size_t(rank) % m,
                order.begin() + end);
    begin = end;
  }
  return order;
}

}  // namespace cortado
