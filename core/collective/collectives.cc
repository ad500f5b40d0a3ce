// The checks every backend shares: local argument checks, and the optional
// comparison of the members' arguments before any data moves.
#include "core/collective/collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/common/error.h"

namespace cortado::collective {

const char* collOpName(CollOp op) {
  switch (op) {
    case CollOp::kAllreduce: return "allreduce";
    case CollOp::kReduceScatter: return "reduce-scatter";
    case CollOp::kAllgather: return "allgather";
    case CollOp::kAllgatherv: return "allgatherv";
    case CollOp::kAlltoall: return "alltoall";
    case CollOp::kAlltoallv: return "alltoallv";
    case CollOp::kReduce: return "reduce";
    case CollOp::kGather: return "gather";
    case CollOp::kGatherv: return "gatherv";
    case CollOp::kBroadcast: return "broadcast";
  }
  return "unknown-op";
}

const char* groupKindName(GroupKind kind) {
  switch (kind) {
    case GroupKind::kWorld: return "world";
    case GroupKind::kIntra: return "intra";
    case GroupKind::kInter: return "inter";
  }
  return "unknown-group";
}

CallLabel::CallLabel(Collectives& group, const std::string& label) { this->label(&group, label); }

CallLabel::CallLabel(const Groups& groups, const std::string& label) {
  for (const auto* g : {&groups.world, &groups.intra, &groups.inter}) this->label(g->get(), label);
}

void CallLabel::label(Collectives* group, const std::string& label) {
  if (!group) return;
  replaced_.emplace_back(group, group->callLabel());
  group->setCallLabel(label);
}

CallLabel::~CallLabel() {
  for (auto it = replaced_.rbegin(); it != replaced_.rend(); ++it)
    it->first->setCallLabel(std::move(it->second));
}

Collectives& Groups::get(GroupKind kind) const {
  const std::unique_ptr<Collectives>* g = nullptr;
  switch (kind) {
    case GroupKind::kWorld: g = &world; break;
    case GroupKind::kIntra: g = &intra; break;
    case GroupKind::kInter: g = &inter; break;
  }
  CORTADO_ENFORCE(g != nullptr, ErrorCode::kInvalidArgument, "unknown collective group kind {}",
                  static_cast<int>(kind));
  CORTADO_ENFORCE(*g != nullptr, ErrorCode::kInvalidArgument,
                  "rank {} (local rank {} on machine {}) has no {} group: with inter-machine groups formed by "
                  "the machine roots only, ranks other than local rank 0 take no part in inter-machine steps",
                  topology.rank, topology.localRank, topology.machine, groupKindName(kind));
  return **g;
}

namespace {

size_t sum(std::span<const size_t> v) {
  size_t s = 0;
  for (size_t x : v) s += x;
  return s;
}

bool hasRoot(CollOp op) {
  return op == CollOp::kReduce || op == CollOp::kGather || op == CollOp::kGatherv || op == CollOp::kBroadcast;
}

// What each member tells the others before an operation (checkArguments).
struct Signature {
  int32_t op;
  int32_t dtype;
  int32_t root;
  int32_t badPeer;  // alltoallv: the first peer whose counts disagree with ours, else -1
  int64_t count;
  int64_t badPeerSends;    // what badPeer says it sends us
  int64_t badPeerExpects;  // our recvCounts[badPeer]
  uint64_t countsHash;     // allgatherv: of the counts list (it must be the same everywhere)
  uint64_t labelHash;      // of the group's callLabel(), the whole text
  // The label's first bytes, NUL-terminated ("..." where it was cut).
  char label[Collectives::kShownLabelBytes + 1];
};

uint64_t hashBytes(std::string_view v) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : v) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

void setLabel(Signature& s, const std::string& label) {
  s.labelHash = hashBytes(label);
  std::memset(s.label, 0, sizeof s.label);
  const size_t shown = Collectives::kShownLabelBytes;
  if (label.size() <= shown) {
    std::memcpy(s.label, label.data(), label.size());
  } else {
    std::memcpy(s.label, label.data(), shown - 3);
    std::memcpy(s.label + shown - 3, "...", 3);
  }
}

// gatherv: the root's finding, which only the root can make (it alone reads counts).
struct RootVerdict {
  int64_t badRank;  // -1: every rank sends what the root's counts say
  int64_t sends;
  int64_t expected;
};

// The ranks of one job share one byte order, so the values' bytes compare.
uint64_t hashCounts(std::span<const size_t> v) {
  return hashBytes(std::string_view(reinterpret_cast<const char*>(v.data()), v.size_bytes()));
}

std::string formatCounts(std::span<const size_t> v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size() && i < 16; ++i) out += fmt::format("{}{}", i ? ", " : "", v[i]);
  return out + (v.size() > 16 ? ", ...]" : "]");
}

std::string listValues(const std::vector<Signature>& all, const std::function<std::string(const Signature&)>& f) {
  std::string out;
  for (size_t r = 0; r < all.size(); ++r) {
    if (r == 8 && all.size() > 9) {
      out += fmt::format(", ... ({} ranks)", all.size());
      break;
    }
    out += fmt::format("{}rank {}: {}", r ? ", " : "", r, f(all[r]));
  }
  return out;
}

}  // namespace

void Collectives::checkLocal(const Call& c) const {
  const char* op = collOpName(c.op);
  auto where = [&] { return fmt::format("{} on group '{}' (rank {} of {})", op, name_, rank_, size_); };
  CORTADO_ENFORCE(isValidDType(static_cast<uint8_t>(c.dtype)), ErrorCode::kInvalidArgument,
                  "{}: invalid dtype value {}", where(), static_cast<int>(c.dtype));
  if (hasRoot(c.op)) {
    CORTADO_ENFORCE(c.root >= 0 && c.root < size_, ErrorCode::kInvalidArgument,
                    "{}: root {} is not a rank of the group (valid: 0..{})", where(), c.root, size_ - 1);
  }
  const size_t limit = maxCount();
  auto checkCount = [&](size_t n, const char* what) {
    CORTADO_ENFORCE(n <= limit, ErrorCode::kInvalidArgument,
                    "{}: {} = {} elements is more than this backend takes in one call ({}); split the tensor "
                    "into chunks (the partitioner's chunks are far smaller)",
                    where(), what, n, limit);
  };
  auto checkList = [&](std::span<const size_t> v, const char* what) {
    CORTADO_ENFORCE(v.size() == static_cast<size_t>(size_), ErrorCode::kInvalidArgument,
                    "{}: {} has {} entries, the group has {} ranks (one entry per rank)", where(), what, v.size(),
                    size_);
    checkCount(sum(v), what);
  };
  size_t sendElems = c.count;
  size_t recvElems = 0;
  switch (c.op) {
    case CollOp::kAllreduce:
      checkCount(c.count, "count");
      recvElems = c.count;
      break;
    case CollOp::kReduceScatter:
      checkCount(c.count * static_cast<size_t>(size_), "size() * recvCount");
      sendElems = c.count * size_;
      recvElems = c.count;
      break;
    case CollOp::kAllgather:
    case CollOp::kAlltoall:
      checkCount(c.count * static_cast<size_t>(size_), "size() * count");
      if (c.op == CollOp::kAlltoall) sendElems = c.count * size_;
      recvElems = c.count * size_;
      break;
    case CollOp::kAllgatherv:
      checkList(c.counts, "counts");
      CORTADO_ENFORCE(c.count == c.counts[rank_], ErrorCode::kInvalidArgument,
                      "{}: this rank sends {} elements but counts[{}] = {}", where(), c.count, rank_,
                      c.counts[rank_]);
      recvElems = sum(c.counts);
      break;
    case CollOp::kAlltoallv:
      checkList(c.sendCounts, "sendCounts");
      checkList(c.recvCounts, "recvCounts");
      sendElems = sum(c.sendCounts);
      recvElems = sum(c.recvCounts);
      break;
    case CollOp::kReduce:
      checkCount(c.count, "count");
      recvElems = rank_ == c.root ? c.count : 0;
      break;
    case CollOp::kGather:
      checkCount(c.count * static_cast<size_t>(size_), "size() * count");
      recvElems = rank_ == c.root ? c.count * size_ : 0;
      break;
    case CollOp::kGatherv:
      if (rank_ == c.root || !c.counts.empty()) {
        checkList(c.counts, rank_ == c.root ? "counts (on the root)" : "counts");
        CORTADO_ENFORCE(c.count == c.counts[rank_], ErrorCode::kInvalidArgument,
                        "{}: this rank sends {} elements but counts[{}] = {}", where(), c.count, rank_,
                        c.counts[rank_]);
      }
      checkCount(c.count, "count");
      recvElems = rank_ == c.root ? sum(c.counts) : 0;
      break;
    case CollOp::kBroadcast:
      checkCount(c.count, "count");
      sendElems = 0;
      recvElems = c.count;
      break;
  }
  CORTADO_ENFORCE(sendElems == 0 || c.send != nullptr, ErrorCode::kInvalidArgument,
                  "{}: the send buffer is null but {} elements are to be sent", where(), sendElems);
  CORTADO_ENFORCE(recvElems == 0 || c.recv != nullptr, ErrorCode::kInvalidArgument,
                  "{}: the receive buffer is null but {} elements are to be received", where(), recvElems);
  // Only allreduce may run in place (send == recv); other overlaps would be
  // read while written.
  if (sendElems && recvElems && !(c.op == CollOp::kAllreduce && c.send == c.recv)) {
    const size_t es = dtypeSize(c.dtype);
    auto s = reinterpret_cast<uintptr_t>(c.send), r = reinterpret_cast<uintptr_t>(c.recv);
    bool overlap = s < r + recvElems * es && r < s + sendElems * es;
    CORTADO_ENFORCE(!overlap, ErrorCode::kInvalidArgument,
                    "{}: the send and receive buffers overlap; use separate buffers (only allreduce runs in place, "
                    "with send == recv)",
                    where());
  }
}

void Collectives::checkAcrossRanks(const Call& c, Deadline deadline) {
  Signature mine{};
  mine.op = static_cast<int32_t>(c.op);
  mine.dtype = static_cast<int32_t>(c.dtype);
  mine.root = hasRoot(c.op) ? c.root : -1;
  mine.badPeer = -1;
  mine.count = static_cast<int64_t>(c.count);
  if (c.op == CollOp::kAlltoallv) {
    std::vector<int64_t> out(c.sendCounts.begin(), c.sendCounts.end()), in(size_);
    alltoallCounts(c.op, out, in, deadline);
    for (int i = 0; i < size_; ++i) {
      if (in[i] != static_cast<int64_t>(c.recvCounts[i])) {
        mine.badPeer = i;
        mine.badPeerSends = in[i];
        mine.badPeerExpects = static_cast<int64_t>(c.recvCounts[i]);
        break;
      }
    }
    mine.count = 0;
  }
  if (c.op == CollOp::kAllgatherv) mine.countsHash = hashCounts(c.counts);
  setLabel(mine, label_);
  std::vector<Signature> all(size_);
  allgatherBytes(c.op, &mine, sizeof mine, all.data(), deadline);

  const char* op = collOpName(c.op);
  auto differs = [&](auto field) {
    return std::any_of(all.begin(), all.end(),
                       [&](const Signature& s) { return field(s) != field(all[0]); });
  };
  // First: members on different tensors also disagree on everything else,
  // and this says why.
  if (differs([](const Signature& s) { return s.labelHash; }))
    throw Error(
        ErrorCode::kMismatch,
        fmt::format(
            "{} on group '{}' (rank {} of {}): the members are not running the same thing: {}; "
            "every worker must run the same tensors in the same order",
            op, name_, rank_, size_, listValues(all, [](const Signature& s) {
              return s.label[0] ? std::string(s.label) : std::string("an unlabeled call");
            })));
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::kMismatch,
                fmt::format("{} on group '{}' (rank {} of {}): the members disagree on {}; every member must call "
                            "the same operation with matching arguments",
                            op, name_, rank_, size_, what));
  };
  if (differs([](const Signature& s) { return s.op; }))
    fail("the operation: " + listValues(all, [](const Signature& s) {
           return std::string(collOpName(static_cast<CollOp>(s.op)));
         }));
  if (differs([](const Signature& s) { return s.dtype; }))
    fail("the dtype: " +
         listValues(all, [](const Signature& s) { return std::string(dtypeName(static_cast<DType>(s.dtype))); }));
  if (differs([](const Signature& s) { return s.root; }))
    fail("the root: " + listValues(all, [](const Signature& s) { return std::to_string(s.root); }));
  switch (c.op) {
    case CollOp::kAllgatherv:
      // Equal lists everywhere first, so that every rank reaches the same
      // verdict on each rank's count below.
      if (differs([](const Signature& s) { return s.countsHash; }))
        fail(fmt::format("the counts list (this rank passes {}; {})", formatCounts(c.counts),
                         listValues(all, [&](const Signature& s) {
                           return s.countsHash == all[0].countsHash ? std::string("as rank 0")
                                                                    : std::string("differs from rank 0");
                         })));
      for (int r = 0; r < size_; ++r) {
        if (static_cast<int64_t>(c.counts[r]) != all[r].count)
          fail(fmt::format("rank {}'s count: it sends {} but counts[{}] = {}", r, all[r].count, r, c.counts[r]));
      }
      break;
    case CollOp::kGatherv: {
      // Only the root reads counts: it judges, and tells everyone.
      RootVerdict v{-1, 0, 0};
      if (rank_ == c.root) {
        for (int r = 0; r < size_; ++r) {
          if (static_cast<int64_t>(c.counts[r]) != all[r].count) {
            v = RootVerdict{r, all[r].count, static_cast<int64_t>(c.counts[r])};
            break;
          }
        }
      }
      std::vector<RootVerdict> verdicts(size_);
      allgatherBytes(c.op, &v, sizeof v, verdicts.data(), deadline);
      const RootVerdict& rv = verdicts[c.root];
      if (rv.badRank >= 0)
        fail(fmt::format("rank {}'s count: it sends {} but the root's (rank {}) counts[{}] = {}", rv.badRank,
                         rv.sends, c.root, rv.badRank, rv.expected));
      break;
    }
    case CollOp::kAlltoallv:
      for (int r = 0; r < size_; ++r) {
        if (all[r].badPeer >= 0)
          fail(fmt::format("the counts between ranks {} and {}: rank {} sends {} elements to rank {}, whose "
                           "recvCounts[{}] = {}",
                           all[r].badPeer, r, all[r].badPeer, all[r].badPeerSends, r, all[r].badPeer,
                           all[r].badPeerExpects));
      }
      break;
    default:
      if (differs([](const Signature& s) { return s.count; }))
        fail("the count: " + listValues(all, [](const Signature& s) { return std::to_string(s.count); }));
  }
}

void Collectives::dispatch(const Call& call, Deadline deadline) {
  checkUsable(call.op);
  checkLocal(call);
  checkMemory(call);
  if (checkArguments_ && size_ > 1) checkAcrossRanks(call, deadline);
  run(call, deadline);
}

void Collectives::allreduce(const void* send, void* recv, size_t count, DType dtype, Deadline deadline) {
  Call c{CollOp::kAllreduce, dtype};
  c.send = send, c.recv = recv, c.count = count;
  dispatch(c, deadline);
}

void Collectives::reduceScatter(const void* send, void* recv, size_t recvCount, DType dtype, Deadline deadline) {
  Call c{CollOp::kReduceScatter, dtype};
  c.send = send, c.recv = recv, c.count = recvCount;
  dispatch(c, deadline);
}

void Collectives::allgather(const void* send, size_t count, void* recv, DType dtype, Deadline deadline) {
  Call c{CollOp::kAllgather, dtype};
  c.send = send, c.recv = recv, c.count = count;
  dispatch(c, deadline);
}

void Collectives::allgatherv(const void* send, size_t count, void* recv, std::span<const size_t> counts, DType dtype,
                             Deadline deadline) {
  Call c{CollOp::kAllgatherv, dtype};
  c.send = send, c.recv = recv, c.count = count, c.counts = counts;
  dispatch(c, deadline);
}

void Collectives::alltoall(const void* send, void* recv, size_t countPerPeer, DType dtype, Deadline deadline) {
  Call c{CollOp::kAlltoall, dtype};
  c.send = send, c.recv = recv, c.count = countPerPeer;
  dispatch(c, deadline);
}

void Collectives::alltoallv(const void* send, std::span<const size_t> sendCounts, void* recv,
                            std::span<const size_t> recvCounts, DType dtype, Deadline deadline) {
  Call c{CollOp::kAlltoallv, dtype};
  c.send = send, c.recv = recv, c.sendCounts = sendCounts, c.recvCounts = recvCounts;
  dispatch(c, deadline);
}

void Collectives::reduce(const void* send, void* recv, size_t count, DType dtype, int root, Deadline deadline) {
  Call c{CollOp::kReduce, dtype, root};
  c.send = send, c.recv = recv, c.count = count;
  dispatch(c, deadline);
}

void Collectives::gather(const void* send, size_t count, void* recv, DType dtype, int root, Deadline deadline) {
  Call c{CollOp::kGather, dtype, root};
  c.send = send, c.recv = recv, c.count = count;
  dispatch(c, deadline);
}

void Collectives::gatherv(const void* send, size_t count, void* recv, std::span<const size_t> counts, DType dtype,
                          int root, Deadline deadline) {
  Call c{CollOp::kGatherv, dtype, root};
  c.send = send, c.recv = recv, c.count = count, c.counts = counts;
  dispatch(c, deadline);
}

void Collectives::broadcast(void* buf, size_t count, DType dtype, int root, Deadline deadline) {
  Call c{CollOp::kBroadcast, dtype, root};
  c.send = buf, c.recv = buf, c.count = count;
  dispatch(c, deadline);
}

}  // namespace cortado::collective
