// Splitting tensors into chunks, placing chunks on servers, and the order in
// which a worker sends a tensor's chunks.
//
// A tensor becomes chunks of nearly equal size (element-aligned): one for
// every partitionBytes of its raw bytes, or of what its pushes carry when
// it has a codec (chunkCount()). Each chunk is placed on the server that has
// the fewest bytes so far (ties: the lower rank), tensors taken in key
// order. Every worker runs the same placement over the same declarations in
// the same order, so all agree on where each chunk lives without talking.
#pragma once

#include <algorithm>
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

// How many chunks place() cuts a tensor into. Without a codec, one for
// every partitionBytes of its raw bytes. With one (payloadBytes > 0: the
// codec's payload for the whole tensor), by what its pushes carry: one for
// every partitionBytes of payload, as many as the servers (up to `servers`)
// where each still carries kSpreadPayloadBytes, and one for every
// kMaxCompressedChunkBytes of raw data (or partitionBytes, if larger),
// whichever is most; never more than the raw bytes would make, at least
// one. A compressed chunk costs its own encode, push, servers' decode and
// re-encode, pull and decode, so cutting one by its raw size multiplied
// those calls by the compression ratio (a 4 MiB group of DGC at 1%: sixteen
// 256 KiB chunks of 2.6 KiB payloads across hosts, docs/benchmarks.md,
// "Compressed chunks"); a large payload still spreads over the servers'
// links; and a codec's statistics (top-k's selection, a sign's scale) stay
// per 4 MiB of gradients at most, as BytePS's partitions before compression
// keep them (resnet18's 25 MiB groups under DGC across 4 hosts: the same
// loss after 128 steps as with one chunk per server, about 6 MiB each, and
// 1.09x the speed). The planner prices push options with the same rule
// (scheduler/planner/compile.h, serverKeyChunks).
inline constexpr uint64_t kSpreadPayloadBytes = 64 << 10;
inline constexpr uint64_t kMaxCompressedChunkBytes = 4 << 20;
inline uint64_t chunkCount(uint64_t numElements, size_t elementBytes, uint64_t partitionBytes,
                           uint64_t payloadBytes = 0, int servers = 1) {
  auto cut = [&](uint64_t bytes) {
    const uint64_t perChunk = bytes / elementBytes;
    return numElements == 0 ? uint64_t(1) : (numElements + perChunk - 1) / perChunk;
  };
  const uint64_t raw = cut(partitionBytes);
  if (payloadBytes == 0) return raw;
  const uint64_t byPayload = (payloadBytes + partitionBytes - 1) / partitionBytes;
  const uint64_t spread =
      std::min<uint64_t>(uint64_t(std::max(servers, 1)), payloadBytes / kSpreadPayloadBytes);
  const uint64_t byRegion = cut(std::max(partitionBytes, kMaxCompressedChunkBytes));
  return std::min(raw, std::max<uint64_t>({1, byPayload, spread, byRegion}));
}

class ServerPlacement {
 public:
  explicit ServerPlacement(int numServers);

  // Splits a tensor into chunkCount() chunks and places them. Throws
  // Error(kInvalidArgument) when the tensor needs more than
  // kMaxChunksPerTensor chunks.
  std::vector<Chunk> place(uint64_t tensorKey, uint64_t numElements, size_t elementBytes,
                           uint64_t partitionBytes, uint64_t payloadBytes = 0);

  const std::vector<uint64_t>& bytesPerServer() const { return load_; }

 private:
  std::vector<uint64_t> load_;
};

// The order in which worker `rank` sends the chunks of one tensor: indices
// into `chunks` (as place() made them).
//
// Plain (stagger false): 0, 1, 2, ..., the same on every worker, so at the
// start of a round every worker pushes chunk 0 to the same server.
//
// Staggered: the chunks go in rounds; round g holds the g-th chunk (by
// index) of every server that has more than g of them. Within a round the
// chunks go in ascending server order rotated by the rank: worker r starts
// at position r mod m of the round's m servers. With a round per server
// (the placement's usual case), worker r pushes its k-th chunk of the round
// to server (r + k) mod S, so at each step of the round the workers (up to
// S of them) push to different servers and each server's in-link carries
// one worker's push. Each server still gets its chunks from every worker in
// index order, and every chunk of round g has been pushed by every worker
// by the end of round g, as in plain order.
//
// Deterministic: every worker can compute every other worker's order.
// WorkerOptions::staggerChunks chooses it; measured without effect on 4
// emulated hosts (docs/benchmarks.md, "Chunk order staggered per worker"),
// because a worker whose credits hold the whole tensor hands every chunk
// to the transport at once and the order only decides which connection
// starts first.
std::vector<size_t> sendOrder(const std::vector<Chunk>& chunks, int rank, bool stagger);

}  // namespace cortado
