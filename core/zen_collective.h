// Zen for workers without servers (docs/zen.md, "Without servers"): sums a
// sparse float32 tensor over a collective group (core/collective: MPI for
// host memory) with either of Zen's two schemes (specs/zen.md §2):
//
// - Balanced parallelism: every rank is a server for the indices that the
//   ownership hash gives it (level 1, compressor/zen/zen_hash.h). A round
//   places the rank's pairs by owner (level 2, Algorithm 1, the same
//   placement as the server path), sends rank p the COO list of what p owns
//   (an alltoall of the byte counts, then one alltoallv), sums what it owns
//   (ServerSum: every list checked whole first), and every rank's summed
//   share goes to every rank as a hash bitmap or its pairs, whichever is
//   smaller (an allgather of the sizes, then one allgatherv), decoded with
//   I_p into the dense output.
// - Hierarchical centralization: log2 n stages of pairwise exchange in
//   which each rank adds what its partner holds (recursive doubling, ranks
//   past the largest power of two folded in and out), each stage one
//   alltoall of byte counts and one alltoallv in which a rank sends to its
//   partner alone.
//
// The scheme is set, or chosen after the first rounds from the sparsity
// they measured (equations 1 and 2, compressor/zen/zen_scheme.h): those
// rounds run hierarchical centralization, whose stages measure the density
// of the partial sums exactly; the members agree on the figures (one
// allreduce), so every rank takes the same scheme; the choice is logged at
// info with the figures.
//
// Contract: every member of the group calls allreduce() for the same tensor
// in the same order (the calls are labelled "zen:<tensor>", so a member
// running another tensor fails with kMismatch when the group checks its
// arguments). Calls are synchronous on the calling thread, like the group's.
// Input pairs with the same index add up (as in Worker::pushPullSparse).
// Bad input (an index past the tensor, spans of different lengths, a null
// buffer) and a malformed list from a peer (out of range, not owned by the
// receiver, listed twice, not ascending, truncated) throw on every member,
// not only where it was found, so no member waits for one that gave up: the
// rank that found it throws kInvalidArgument or kProtocol naming the tensor
// and the position or the sending rank, the others kInvalidArgument naming
// that rank. A refused round leaves the output as it was (every share's
// answer is checked before any is written). Every wait has the caller's
// deadline (the group's kTimeout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compressor/zen/zen_hash.h"
#include "compressor/zen/zen_scheme.h"
#include "compressor/zen/zen_sum.h"
#include "core/collective/collectives.h"
#include "core/common/deadline.h"
#include "core/worker.h"

namespace cortado {

struct ZenCollectiveOptions {
  // A fixed scheme; nullopt: measure in the first profileRounds rounds
  // (hierarchical centralization), then take the one equations (1) and (2)
  // give the smaller time.
  std::optional<compressor::zen::Scheme> scheme;
  int profileRounds = 2;
  // The bandwidth the logged times are at; both equations scale with it,
  // so the choice does not depend on it.
  double bytesPerSecond = 125e6;
  // The ownership hash's seed; 0: derived from the tensor name (every
  // member must then use the same name, which the call label checks).
  uint64_t seed = 0;
  compressor::zen::PlacementOptions placement;
  ThreadPool* pool = nullptr;  // for the placement; nullptr: the calling thread
  // Balanced parallelism's lists go delta-coded (the indices ascending as
  // varint gaps after the values; compressor/zen/zen_payload.h, kind 4)
  // where that is fewer bytes than COO, as the workers' pushes to servers
  // do (CORTADO_COMPACT_SPARSE); false: COO always.
  bool compact = true;
};

class ZenCollective {
 public:
  // `group` (host memory: the MPI backend) must outlive this object.
  // Throws kInvalidArgument for a CUDA group, numElements > kMaxElements,
  // or profileRounds < 1 without a fixed scheme.
  ZenCollective(collective::Collectives& group, std::string tensor, uint64_t numElements,
                ZenCollectiveOptions options = {});
  ~ZenCollective();
  ZenCollective(const ZenCollective&) = delete;
  ZenCollective& operator=(const ZenCollective&) = delete;

  const std::string& tensor() const { return tensor_; }
  uint64_t numElements() const { return numElements_; }

  // out (numElements floats) = the sum (kAverage: the mean) over the
  // group's members of their pairs, zeros elsewhere. index and value must
  // have the same length; out may not overlap them.
  void allreduce(std::span<const uint32_t> index, std::span<const float> value, float* out,
                 ReduceOp op, Deadline deadline);
  // The same for a dense buffer of numElements floats, scanned for its
  // non-zeros (out may be the same buffer).
  void allreduceDense(const float* in, float* out, ReduceOp op, Deadline deadline);

  // The scheme the next round runs.
  compressor::zen::Scheme nextScheme() const;
  // The measured choice, once made (nullopt with a fixed scheme or before).
  const std::optional<compressor::zen::SchemeChoice>& choice() const { return choice_; }
  uint64_t rounds() const { return rounds_; }

  // What the last completed round did on this rank.
  struct RoundStats {
    compressor::zen::Scheme scheme = compressor::zen::Scheme::kBalancedParallelism;
    uint64_t pairs = 0;        // this rank's input, duplicates merged
    uint64_t sumNonzeros = 0;  // non-zeros of the result
    uint64_t bytesSent = 0;    // payload bytes this rank sent (not the counts)
    uint64_t bytesReceived = 0;
  };
  const RoundStats& lastRound() const { return last_; }

 private:
  struct Input;
  void run(const Input& in, float* out, ReduceOp op, Deadline deadline);
  void runBalanced(const Input& in, float* out, Deadline deadline);
  void runCentralized(const Input& in, float* out, Deadline deadline);
  void profile(Deadline deadline);
  // Throws on every member when any member failed (its message, or one
  // naming the member); `failed` is this member's error, if any.
  void agree(const std::string& stage, const std::optional<Error>& failed, Deadline deadline);

  collective::Collectives& group_;
  std::string tensor_;
  uint64_t numElements_;
  ZenCollectiveOptions options_;
  compressor::zen::Ownership own_;
  std::unique_ptr<compressor::zen::IndexLists> lists_;  // balanced parallelism only
  std::unique_ptr<compressor::zen::ServerSum> sum_;
  std::unique_ptr<compressor::zen::HierarchicalHash> hash_;
  std::optional<compressor::zen::SchemeChoice> choice_;
  uint64_t rounds_ = 0;
  RoundStats last_;
  // Sums over the profiling rounds: each member's pairs, and the list sizes
  // after each doubling stage (ranks below the largest power of two), and
  // the size of the whole sum.
  std::vector<double> measured_;
};

// One rank's sum step of balanced parallelism: adds every sender's COO list
// (payloads[r] from rank r) to `sum` and returns the share's answer. A list
// is checked whole before anything of it is added (header against this
// rank's partition, every index in range, owned by it, listed once);
// throws kProtocol naming the tensor and the sending rank.
std::vector<std::byte> sumShares(compressor::zen::ServerSum& sum,
                                 std::span<const std::span<const std::byte>> payloads,
                                 const std::string& tensor);

// A list received in a stage of hierarchical centralization
// (zen::parseStageList); throws kProtocol naming the tensor and the peer.
compressor::zen::CooList parseStageList(std::span<const std::byte> bytes, uint64_t numElements,
                                        const std::string& tensor, int peer);

}  // namespace cortado
