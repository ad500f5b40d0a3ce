#include "compressor/zen/zen_sum.h"

#include <algorithm>
#include <bit>

#include "core/common/error.h"

namespace cortado::compressor::zen {

ServerSum::ServerSum(const Ownership& own, uint32_t server)
    : own_(own), server_(server), list_(ownedIndices(own, server)) {
  seen_.assign((list_.size() + 63) / 64, 0);
  // Per block of 64 indices: which of them this server owns, and how many
  // it owns before the block.
  const uint64_t blocks = (own.numElements() + 63) / 64;
  blockMask_.assign(blocks, 0);
  blockRank_.assign(blocks, 0);
  for (uint32_t idx : list_) blockMask_[idx >> 6] |= uint64_t{1} << (idx & 63);
  uint32_t before = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    blockRank_[b] = before;
    before += static_cast<uint32_t>(std::popcount(blockMask_[b]));
  }
}

uint32_t ServerSum::position(uint32_t idx) const {
  const uint64_t below = (uint64_t{1} << (idx & 63)) - 1;
  return blockRank_[idx >> 6] + static_cast<uint32_t>(std::popcount(blockMask_[idx >> 6] & below));
}

void ServerSum::add(std::span<const std::byte> payload) {
  if (parseZenHeader(payload).kind == Kind::kDeltaPush) {
    addDelta(parseDeltaPush(payload));
    return;
  }
  const CooView v = parseCoo(payload);
  expectPartition(v.header, own_, server_);
  const uint64_t n = v.header.count;
  const uint64_t numel = own_.numElements();
  pos_.resize(n);
  // Check everything first. While the indices ascend they cannot repeat;
  // from the first that does not, `seen_` marks the positions of this push
  // (those before it too) and is cleared again on every way out.
  uint64_t marked = 0;
  bool marking = false;
  uint32_t prev = 0;
  // Positions in I_p are needed for a dense sum and for marking; a sparse
  // sum keeps the indices.
  const bool dense = dense_ || pending_.size() + n > list_.size() / 8;
  auto unmark = [&] {
    for (uint64_t i = 0; i < marked; ++i) seen_[pos_[i] >> 6] = 0;
  };
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t idx = v.indexAt(i);
    const uint64_t mask = idx < numel ? blockMask_[idx >> 6] : 0;
    if (!(mask >> (idx & 63) & 1)) {
      unmark();
      CORTADO_ENFORCE(idx < numel, ErrorCode::kProtocol,
                      "sparse push: pair #{} has index {}, out of range for {} elements", i, idx,
                      numel);
      throw Error(ErrorCode::kProtocol,
                  fmt::format("sparse push: pair #{} has index {}, which server {} does not own "
                              "(its owner is server {} of {})",
                              i, idx, server_, own_.owner(idx), own_.numServers()));
    }
    if (!marking) {
      if (i == 0 || idx > prev) {
        if (dense) pos_[i] = position(idx);
        prev = idx;
        continue;
      }
      marking = true;
      for (uint64_t j = 0; j < i; ++j) {
        if (!dense) pos_[j] = position(v.indexAt(j));
        seen_[pos_[j] >> 6] |= uint64_t{1} << (pos_[j] & 63);
      }
      marked = i;
    }
    const uint32_t t = position(idx);
    const uint64_t bit = uint64_t{1} << (t & 63);
    if (seen_[t >> 6] & bit) {
      unmark();
      throw Error(ErrorCode::kProtocol,
                  fmt::format("sparse push: index {} is listed twice (pair #{}); a push lists "
                              "each index once",
                              idx, i));
    }
    seen_[t >> 6] |= bit;
    pos_[i] = t;
    marked = i + 1;
  }
  unmark();
  pairs_ += n;
  if (dense && !dense_) densify();
  if (dense_) {
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t t = pos_[i];
      acc_[t] += v.valueAt(i);
      touched_[t >> 6] |= uint64_t{1} << (t & 63);
    }
  } else if (n > 0) {
    const size_t start = pending_.size();
    for (uint64_t i = 0; i < n; ++i) pending_.emplace_back(v.indexAt(i), v.valueAt(i));
    // A run ascends (its indices are distinct: no order among equals).
    if (marking)
      std::sort(pending_.begin() + ptrdiff_t(start), pending_.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
    runEnds_.push_back(pending_.size());
  }
}

void ServerSum::addDelta(const DeltaView& v) {
  expectPartition(v.header, own_, server_);
  const uint64_t n = v.header.count;
  const uint64_t numel = own_.numElements();
  // Decoded and checked whole into pos_ (the indices) before anything is
  // added. Each gap moves past the previous index, so the indices strictly
  // ascend: none can repeat, and the push is a run as it is.
  pos_.resize(n);
  const GapWalk w = walkGaps(v.gaps, v.end, n, numel, [&](uint64_t i, uint64_t idx) {
    if (!(blockMask_[idx >> 6] >> (idx & 63) & 1)) return false;
    pos_[i] = static_cast<uint32_t>(idx);
    return true;
  });
  CORTADO_ENFORCE(w.stop != GapStop::kBadVarint, ErrorCode::kProtocol,
                  "sparse delta-coded push: gap #{} (byte {} of the gaps) is truncated, longer "
                  "than 5 bytes, overlong or past 32 bits",
                  w.at, w.bytes);
  CORTADO_ENFORCE(w.stop != GapStop::kOutOfRange, ErrorCode::kProtocol,
                  "sparse delta-coded push: pair #{} has index {}, out of range for {} elements",
                  w.at, w.index, numel);
  if (w.stop == GapStop::kRefused)
    throw Error(ErrorCode::kProtocol,
                fmt::format("sparse delta-coded push: pair #{} has index {}, which server {} "
                            "does not own (its owner is server {} of {})",
                            w.at, w.index, server_, own_.owner(w.index), own_.numServers()));
  CORTADO_ENFORCE(w.stop != GapStop::kLeftOver, ErrorCode::kProtocol,
                  "sparse delta-coded push: {} bytes left over after its {} gaps", w.bytes, n);
  const bool dense = dense_ || pending_.size() + n > list_.size() / 8;
  pairs_ += n;
  if (dense && !dense_) densify();
  if (dense_) {
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t t = position(pos_[i]);
      acc_[t] += v.valueAt(i);
      touched_[t >> 6] |= uint64_t{1} << (t & 63);
    }
  } else if (n > 0) {
    for (uint64_t i = 0; i < n; ++i) pending_.emplace_back(pos_[i], v.valueAt(i));
    runEnds_.push_back(pending_.size());
  }
}

void ServerSum::densify() {
  dense_ = true;
  if (acc_.size() != list_.size()) {
    acc_.assign(list_.size(), 0.0f);
    touched_.assign((list_.size() + 63) / 64, 0);
  }
  for (const auto& [idx, x] : pending_) {
    const uint32_t t = position(idx);
    acc_[t] += x;
    touched_[t >> 6] |= uint64_t{1} << (t & 63);
  }
  pending_.clear();
  runEnds_.clear();
}

void ServerSum::mergeRuns() {
  // Adjacent runs merged pairwise until one is left: O(pairs log runs),
  // each pass sequential. An index's values add in a fixed order given by
  // the arrival order: ((1st + 2nd) + (3rd + 4th)) + ...
  std::vector<size_t> ends = std::move(runEnds_);
  runEnds_.clear();
  while (ends.size() > 1) {
    merged_.clear();
    merged_.reserve(pending_.size());
    std::vector<size_t> next;
    size_t begin = 0;
    for (size_t r = 0; r < ends.size(); r += 2) {
      auto a = pending_.begin() + ptrdiff_t(begin);
      const auto aEnd = pending_.begin() + ptrdiff_t(ends[r]);
      if (r + 1 == ends.size()) {
        merged_.insert(merged_.end(), a, aEnd);
      } else {
        auto b = aEnd;
        const auto bEnd = pending_.begin() + ptrdiff_t(ends[r + 1]);
        while (a != aEnd && b != bEnd) {
          if (a->first < b->first) {
            merged_.push_back(*a++);
          } else if (b->first < a->first) {
            merged_.push_back(*b++);
          } else {
            merged_.emplace_back(a->first, a->second + b->second);
            ++a, ++b;
          }
        }
        merged_.insert(merged_.end(), a, aEnd);
        merged_.insert(merged_.end(), b, bEnd);
      }
      begin = ends[std::min(r + 1, ends.size() - 1)];
      next.push_back(merged_.size());
    }
    pending_.swap(merged_);
    ends = std::move(next);
  }
}

std::vector<std::byte> ServerSum::answer(Form form) {
  // The non-zeros of the sum, ascending: their indices and values.
  std::vector<uint32_t> indices;
  std::vector<float> values;
  if (dense_) {
    for (size_t w = 0; w < touched_.size(); ++w) {
      for (uint64_t b = touched_[w]; b; b &= b - 1) {
        const size_t t = w * 64 + std::countr_zero(b);
        if (acc_[t] != 0.0f) {
          indices.push_back(list_[t]);
          values.push_back(acc_[t]);
        }
        acc_[t] = 0.0f;
      }
      touched_[w] = 0;
    }
  } else {
    mergeRuns();
    indices.reserve(pending_.size());
    values.reserve(pending_.size());
    for (const auto& [idx, x] : pending_) {
      if (x != 0.0f) {
        indices.push_back(idx);
        values.push_back(x);
      }
    }
    pending_.clear();
  }
  dense_ = false;
  pairs_ = 0;
  if (form == Form::kIndexList ||
      (form == Form::kSmaller &&
       indexListBytes(indices) < bitmapBytes(list_.size(), values.size())))
    return encodeIndexList(own_, server_, list_.size(), indices, values);
  std::vector<uint64_t> present((list_.size() + 63) / 64, 0);
  for (uint32_t idx : indices) {
    const uint32_t t = position(idx);
    present[t >> 6] |= uint64_t{1} << (t & 63);
  }
  return encodeBitmap(own_, server_, list_, present, values);
}

}  // namespace cortado::compressor::zen
