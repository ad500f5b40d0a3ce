// Splitting tensors into chunks and placing chunks on servers.
//
// A tensor of B bytes becomes ceil(B / partitionBytes) chunks of nearly equal
// size (element-aligned). Each chunk is placed on the server that has the
// fewest bytes so far (ties: the lower rank), tensors taken in key order.
// Every worker runs the same placement over the same declarations in the same
// order, so all agree on where each chunk lives without talking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cortado {

struct Chunk {
  uint64_t key = 0;        // job-wide chunk key
  uint64_t offset = 0;     // first element
  uint64_t numElements = 0;
  int server = 0;
};

// The chunk key of chunk `index` of the tensor with key `tensorKey`.
inline uint64_t chunkKey(uint64_t tensorKey, uint64_t index) { return (tensorKey << 20) | index; }
inline constexpr uint64_t kMaxChunksPerTensor = uint64_t(1) << 20;
// The tensor key and the chunk index a chunk key was made of.
inline uint64_t tensorKeyOf(uint64_t chunkKey) { return chunkKey >> 20; }
inline uint64_t chunkIndexOf(uint64_t chunkKey) { return chunkKey & (kMaxChunksPerTensor - 1); }

class ServerPlacement {
 public:
  explicit ServerPlacement(int numServers);

  // Splits a tensor and places its chunks. Throws Error(kInvalidArgument)
  // when the tensor needs more than kMaxChunksPerTensor chunks.
  std::vector<Chunk> place(uint64_t tensorKey, uint64_t numElements, size_t elementBytes,
                           uint64_t partitionBytes);

  const std::vector<uint64_t>& bytesPerServer() const { return load_; }

 private:
  std::vector<uint64_t> load_;
};

}  // namespace cortado
