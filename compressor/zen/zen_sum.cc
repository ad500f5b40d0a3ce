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

void ServerSum::add(std::span<const std::byte> payload) {
  const CooView v = parseCoo(payload);
  expectPartition(v.header, own_, server_);
  const uint64_t n = v.header.count;
  const uint64_t numel = own_.numElements();
  pos_.resize(n);
  // Check everything first; `seen_` marks the positions of this push and is
  // cleared again on every way out.
  uint64_t marked = 0;
  auto unmark = [&] {
    for (uint64_t i = 0; i < marked; ++i) seen_[pos_[i] >> 6] = 0;
  };
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t idx = v.indexAt(i);
    const uint64_t mask = idx < numel ? blockMask_[idx >> 6] : 0;
    const uint64_t below = (uint64_t{1} << (idx & 63)) - 1;
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
    const uint32_t t = blockRank_[idx >> 6] + static_cast<uint32_t>(std::popcount(mask & below));
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
  if (!dense_ && pending_.size() + n > list_.size() / 8) densify();
  if (dense_) {
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t t = pos_[i];
      acc_[t] += v.valueAt(i);
      touched_[t >> 6] |= uint64_t{1} << (t & 63);
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) pending_.emplace_back(pos_[i], v.valueAt(i));
  }
}

void ServerSum::densify() {
  dense_ = true;
  if (acc_.size() != list_.size()) {
    acc_.assign(list_.size(), 0.0f);
    touched_.assign((list_.size() + 63) / 64, 0);
  }
  for (const auto& [t, x] : pending_) {
    acc_[t] += x;
    touched_[t >> 6] |= uint64_t{1} << (t & 63);
  }
  pending_.clear();
}

std::vector<std::byte> ServerSum::answer(Form form) {
  // The non-zeros of the sum: their positions in I_p ascending, and values.
  std::vector<uint32_t> positions;
  std::vector<float> values;
  if (dense_) {
    for (size_t w = 0; w < touched_.size(); ++w) {
      for (uint64_t b = touched_[w]; b; b &= b - 1) {
        const size_t t = w * 64 + std::countr_zero(b);
        if (acc_[t] != 0.0f) {
          positions.push_back(static_cast<uint32_t>(t));
          values.push_back(acc_[t]);
        }
        acc_[t] = 0.0f;
      }
      touched_[w] = 0;
    }
  } else {
    // Stable, so that the pushes of one position add in arrival order.
    std::stable_sort(pending_.begin(), pending_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < pending_.size();) {
      const uint32_t t = pending_[i].first;
      float s = 0.0f;
      for (; i < pending_.size() && pending_[i].first == t; ++i) s += pending_[i].second;
      if (s != 0.0f) {
        positions.push_back(t);
        values.push_back(s);
      }
    }
    pending_.clear();
  }
  dense_ = false;
  pairs_ = 0;
  if (form != Form::kBitmap) {
    // The index list's bytes depend on the gaps between the indices.
    std::vector<uint32_t> indices(positions.size());
    for (size_t i = 0; i < positions.size(); ++i) indices[i] = list_[positions[i]];
    if (form == Form::kIndexList ||
        indexListBytes(indices) < bitmapBytes(list_.size(), values.size()))
      return encodeIndexList(own_, server_, list_.size(), indices, values);
  }
  std::vector<uint64_t> present((list_.size() + 63) / 64, 0);
  for (uint32_t t : positions) present[t >> 6] |= uint64_t{1} << (t & 63);
  return encodeBitmap(own_, server_, list_, present, values);
}

}  // namespace cortado::compressor::zen
