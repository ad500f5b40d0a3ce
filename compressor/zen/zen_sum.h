// The server side of Zen (specs/zen.md §3, §7.3): one server's sum of the
// COO pushes of a round for the indices it owns, and the round's answer as
// a hash bitmap over I_p, or as an index list (the non-zeros' indices,
// delta-coded) where that is smaller (zen_payload.h).
//
// The sum starts sparse: each push is kept as a run of (index, value)
// pairs in ascending index order (a delta-coded push ascends by its form; a
// COO push that does not, as the hierarchical hash's slot order does not,
// is sorted on arrival), and the
// runs are merged when the round is answered. Once the round's pairs pass
// an eighth of |I_p| a dense accumulator of |I_p| floats with a bit per
// touched position is cheaper in time and hardly more in memory, and the
// sum switches to it ("densifies") until the end of the round. Either way
// the answer lists the non-zeros of the sum in I_p order; a position whose
// pushes cancel to exactly zero is left out like any zero.
//
// Every push is checked completely before anything of it is added: the
// header against this server's partition, each index in range, owned by
// this server, and listed once (an ascending push needs no more than the
// order to show it; a delta-coded push cannot list one twice), and a
// delta-coded push's varints complete, not overlong, none left over. A
// refused push leaves the sum as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compressor/zen/zen_hash.h"
#include "compressor/zen/zen_payload.h"

namespace cortado::compressor::zen {

class ServerSum {
 public:
  // Builds I_p by hashing every index of the tensor once.
  ServerSum(const Ownership& own, uint32_t server);

  const Ownership& ownership() const { return own_; }
  uint32_t server() const { return server_; }
  std::span<const uint32_t> list() const { return list_; }

  // Adds one worker's push, COO or delta-coded. Throws Error(kProtocol)
  // saying what is wrong (the caller adds the tensor and the sender), adding
  // nothing.
  void add(std::span<const std::byte> payload);

  // The round's answer (zen_payload.h): kSmaller, the hash bitmap or the
  // index list, whichever is fewer bytes (the bitmap on a tie); or the form
  // named. Clears the sum for the next round.
  enum class Form { kSmaller, kBitmap, kIndexList };
  std::vector<std::byte> answer(Form form = Form::kSmaller);

  // This round: pairs added so far, and whether the sum densified.
  uint64_t pairs() const { return pairs_; }
  bool densified() const { return dense_; }

 private:
  // A delta-coded push: its indices ascend by construction, so it is
  // checked for range, ownership and its varints' form, never for repeats.
  void addDelta(const DeltaView& v);
  void densify();
  // Sparse mode: the runs merged into one, the values of an index added.
  void mergeRuns();
  // The position of index idx in I_p (idx owned by this server).
  uint32_t position(uint32_t idx) const;

  Ownership own_;
  uint32_t server_ = 0;
  std::vector<uint32_t> list_;
  // The position of an index in I_p in O(1) (a binary search of I_p costs a
  // cache miss per step on large tensors): bit (i & 63) of blockMask_[i >> 6]
  // says whether this server owns i, blockRank_[i >> 6] counts the indices
  // it owns before that block. 12 bytes per 64 elements.
  LargeVector<uint64_t> blockMask_;
  LargeVector<uint32_t> blockRank_;
  // Checking one push: its positions, and a bit per position it listed.
  std::vector<uint32_t> pos_;
  std::vector<uint64_t> seen_;
  // Sparse mode: (index, value) runs back to back, one per push, each
  // ascending; runEnds_ says where each ends; merged_ is the merge's
  // second buffer.
  std::vector<std::pair<uint32_t, float>> pending_, merged_;
  std::vector<size_t> runEnds_;
  // Dense mode.
  bool dense_ = false;
  LargeVector<float> acc_;
  std::vector<uint64_t> touched_;
  uint64_t pairs_ = 0;
};

}  // namespace cortado::compressor::zen
