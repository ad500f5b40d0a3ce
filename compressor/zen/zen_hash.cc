#include "compressor/zen/zen_hash.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <new>
#include <utility>

#include <sys/mman.h>

#include "core/common/error.h"

namespace cortado::compressor::zen {

void* allocateLarge(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < kHuge) return ::operator new(bytes);
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p == nullptr) throw std::bad_alloc();
  // Transparent huge pages where the kernel gives them on request: the
  // tables are read at random, and a TLB miss per access (two-level page
  // walks in a VM) costs more than the access.
  madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

void freeLarge(void* p, size_t bytes) {
  if (bytes < (size_t{2} << 20))
    ::operator delete(p);
  else
    std::free(p);
}

Ownership::Ownership(uint64_t numElements, uint32_t numServers, uint64_t seed)
    : numElements_(numElements), numServers_(numServers), seed_(seed) {
  CORTADO_ENFORCE(numElements <= kMaxElements, ErrorCode::kInvalidArgument,
                  "sparse tensor of {} elements: indices are u32, at most {} elements", numElements,
                  kMaxElements);
  CORTADO_ENFORCE(numServers >= 1, ErrorCode::kInvalidArgument,
                  "sparse tensor needs at least one server, got {}", numServers);
}

IndexLists::IndexLists(const Ownership& own) : own_(own) {
  const uint32_t n = own.numServers();
  // Two passes (count, then fill) keep the lists in one allocation.
  offsets_.assign(n + 1, 0);
  for (uint64_t i = 0; i < own.numElements(); ++i) ++offsets_[own.owner(i) + 1];
  for (uint32_t p = 0; p < n; ++p) offsets_[p + 1] += offsets_[p];
  all_.resize(own.numElements());
  std::vector<uint64_t> at(offsets_.begin(), offsets_.end() - 1);
  for (uint64_t i = 0; i < own.numElements(); ++i)
    all_[at[own.owner(i)]++] = static_cast<uint32_t>(i);
}

std::span<const uint32_t> IndexLists::of(uint32_t server) const {
  CORTADO_ENFORCE(server < own_.numServers(), ErrorCode::kInvalidArgument,
                  "server {} of a sparse tensor on {} servers", server, own_.numServers());
  return {all_.data() + offsets_[server], offsets_[server + 1] - offsets_[server]};
}

std::vector<uint32_t> ownedIndices(const Ownership& own, uint32_t server) {
  CORTADO_ENFORCE(server < own.numServers(), ErrorCode::kInvalidArgument,
                  "server {} of a sparse tensor on {} servers", server, own.numServers());
  std::vector<uint32_t> list;
  list.reserve(own.numElements() / own.numServers() + 64);
  for (uint64_t i = 0; i < own.numElements(); ++i)
    if (own.owner(i) == server) list.push_back(static_cast<uint32_t>(i));
  return list;
}

uint64_t Partitioned::pairs() const {
  uint64_t n = 0;
  for (const auto& v : indices) n += v.size();
  return n;
}

HierarchicalHash::HierarchicalHash(const Ownership& own, PlacementOptions opts)
    : own_(own), opts_(opts) {
  CORTADO_ENFORCE(opts.probes >= 1 && opts.probes <= 16, ErrorCode::kInvalidArgument,
                  "hierarchical hash: {} probes, expected 1..16", opts.probes);
  CORTADO_ENFORCE(opts.slotFactor > 0 && opts.serialFactor >= 0, ErrorCode::kInvalidArgument,
                  "hierarchical hash: slot factor {} and serial factor {} must be positive",
                  opts.slotFactor, opts.serialFactor);
}

void HierarchicalHash::placeOne(uint32_t idx, float v) {
  const uint32_t p = own_.owner(idx);
  const uint64_t width = r1_ + r2_;
  Slot* table = slots_.data() + p * width;
  for (uint32_t t = 1; t <= opts_.probes; ++t) {
    // Level 2: slot h_t(idx) of the owner's parallel area. A claimed slot
    // is never emptied, so an index that found its k slots held finds them
    // held on every later visit: it is in one probe slot or in none.
    const uint64_t q = format::hash2(opts_.probeSeed + t, idx) % r1_;
    uint32_t seen = kEmpty;
    std::atomic_ref<uint32_t> slot(table[q].index);
    if (slot.compare_exchange_strong(seen, idx, std::memory_order_acq_rel) || seen == idx) {
      // Values start at 0, and a duplicate may add before the claimer does:
      // both add.
      std::atomic_ref<float>(table[q].value).fetch_add(v, std::memory_order_relaxed);
      return;
    }
  }
  // Overflow: the next serial slot, exclusively ours. Duplicates of an index
  // may both end here; extract() merges them.
  const uint64_t q = std::atomic_ref<uint64_t>(next_[p]).fetch_add(1, std::memory_order_relaxed);
  if (q < width) {
    std::atomic_ref<uint32_t>(table[q].index).store(idx, std::memory_order_relaxed);
    table[q].value = v;
    return;
  }
  // The overflow area is full (the artifact would write into the next
  // server's table here): keep the pair aside.
  std::lock_guard<std::mutex> lk(spillMu_);
  spill_[p].emplace_back(idx, v);
}

void HierarchicalHash::place(std::span<const uint32_t> index, std::span<const float> value,
                             Partitioned& out, ThreadPool* pool) {
  CORTADO_ENFORCE(index.size() == value.size(), ErrorCode::kInvalidArgument,
                  "sparse tensor: {} indices but {} values", index.size(), value.size());
  const uint64_t n = own_.numElements();
  // Every index is checked before any is placed: a bad one places nothing.
  for (size_t i = 0; i < index.size(); ++i)
    CORTADO_ENFORCE(index[i] < n, ErrorCode::kInvalidArgument,
                    "sparse tensor of {} elements: index #{} is {}, out of range", n, i, index[i]);
  const uint32_t S = own_.numServers();
  bool ascending = opts_.directWhenAscending;
  for (size_t i = 1; ascending && i < index.size(); ++i) ascending = index[i - 1] < index[i];
  if (ascending) {
    out.indices.resize(S);
    out.values.resize(S);
    for (uint32_t p = 0; p < S; ++p) {
      out.indices[p].clear();
      out.values[p].clear();
      out.indices[p].reserve(index.size() / S + index.size() / (8 * S) + 16);
      out.values[p].reserve(index.size() / S + index.size() / (8 * S) + 16);
    }
    for (size_t i = 0; i < index.size(); ++i) {
      const uint32_t p = own_.owner(index[i]);
      out.indices[p].push_back(index[i]);
      out.values[p].push_back(value[i]);
    }
    out.probed = out.overflowed = out.spilled = out.merged = 0;
    out.direct = true;
    return;
  }
  out.direct = false;
  const double perServer = double(index.size()) / S;
  r1_ = std::max<uint64_t>(8, uint64_t(std::ceil(opts_.slotFactor * perServer)));
  r2_ = std::max<uint64_t>(8, uint64_t(std::ceil(opts_.serialFactor * double(r1_))));
  slots_.assign(S * (r1_ + r2_), Slot{kEmpty, 0.0f});
  next_.assign(S, r1_);
  spill_.assign(S, {});
  if (pool && index.size() > 4096) {
    pool->parallelFor(index.size(), 4096, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) placeOne(index[i], value[i]);
    });
  } else {
    for (size_t i = 0; i < index.size(); ++i) placeOne(index[i], value[i]);
  }
  extract(out);
  out.merged = index.size() - out.pairs();
}

void HierarchicalHash::placeDense(const float* dense, Partitioned& out, ThreadPool* pool) {
  scratchIdx_.clear();
  scratchVal_.clear();
  for (uint64_t i = 0; i < own_.numElements(); ++i) {
    if (dense[i] != 0.0f) {
      scratchIdx_.push_back(static_cast<uint32_t>(i));
      scratchVal_.push_back(dense[i]);
    }
  }
  place(scratchIdx_, scratchVal_, out, pool);
}

void HierarchicalHash::extract(Partitioned& out) {
  const uint32_t S = own_.numServers();
  const uint64_t width = r1_ + r2_;
  out.indices.resize(S);
  out.values.resize(S);
  out.probed = out.overflowed = out.spilled = out.merged = 0;
  std::vector<std::pair<uint32_t, float>> tail;
  for (uint32_t p = 0; p < S; ++p) {
    auto& oi = out.indices[p];
    auto& ov = out.values[p];
    oi.clear();
    ov.clear();
    const Slot* table = slots_.data() + p * width;
    for (uint64_t q = 0; q < r1_; ++q) {
      if (table[q].index == kEmpty) continue;
      oi.push_back(table[q].index);
      ov.push_back(table[q].value);
    }
    out.probed += oi.size();
    // Overflow and spill: sorted so that duplicates sit together and merge.
    const uint64_t used = std::min(next_[p], width);
    tail.clear();
    for (uint64_t q = r1_; q < used; ++q) tail.emplace_back(table[q].index, table[q].value);
    out.overflowed += tail.size();
    out.spilled += spill_[p].size();
    tail.insert(tail.end(), spill_[p].begin(), spill_[p].end());
    std::sort(tail.begin(), tail.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < tail.size(); ++i) {
      if (i > 0 && tail[i].first == tail[i - 1].first) {
        ov.back() += tail[i].second;
        continue;
      }
      oi.push_back(tail[i].first);
      ov.push_back(tail[i].second);
    }
    if (opts_.ascendingLists) sortPairsByIndex(oi, ov, own_.numElements(), sortA_, sortB_);
  }
}

void sortPairsByIndex(std::vector<uint32_t>& index, std::vector<float>& value, uint64_t numElements,
                      std::vector<uint64_t>& a, std::vector<uint64_t>& b) {
  const size_t n = index.size();
  CORTADO_ENFORCE(value.size() == n, ErrorCode::kInvalidArgument,
                  "sorting {} indices with {} values", n, value.size());
  // Each pair as one word, the index above the value's bits.
  a.resize(n);
  for (size_t i = 0; i < n; ++i)
    a[i] = uint64_t{index[i]} << 32 | std::bit_cast<uint32_t>(value[i]);
  if (n < 256) {
    std::sort(a.begin(), a.end());
  } else {
    constexpr unsigned kDigit = 11;
    const unsigned bits = numElements > 1 ? unsigned(std::bit_width(numElements - 1)) : 1;
    b.resize(n);
    std::vector<size_t> count(size_t{1} << kDigit);
    for (unsigned shift = 32; shift < 32 + bits; shift += kDigit) {
      std::fill(count.begin(), count.end(), 0);
      for (uint64_t w : a) ++count[(w >> shift) & ((1u << kDigit) - 1)];
      size_t sum = 0;
      for (size_t& c : count) sum += std::exchange(c, sum);
      for (uint64_t w : a) b[count[(w >> shift) & ((1u << kDigit) - 1)]++] = w;
      a.swap(b);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    index[i] = static_cast<uint32_t>(a[i] >> 32);
    value[i] = std::bit_cast<float>(static_cast<uint32_t>(a[i]));
  }
}

}  // namespace cortado::compressor::zen
