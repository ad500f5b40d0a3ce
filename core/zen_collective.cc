#include "core/zen_collective.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "compressor/format.h"
#include "compressor/zen/zen_payload.h"
#include "core/common/error.h"
#include "core/common/logging.h"

namespace cortado {

namespace zen = compressor::zen;

namespace {

// Every member derives the same seed from the tensor's name (FNV-1a, then
// the codecs' counter hash).
uint64_t seedOf(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return compressor::format::hash2(0x7a656e5f636f6c6cull, h);
}

std::vector<size_t> toSizes(const std::vector<int64_t>& v) {
  return std::vector<size_t>(v.begin(), v.end());
}

// The byte counts exchanged before a round's lists, the same way for the
// push and each hierarchical stage (`perPeer`: an alltoall of one count per
// peer) and for the pull (an allgather of this member's one count). A member
// that failed sends -1 for every count, so every member stops in the same
// call: the one that failed throws its own error, the others one naming it
// ("<where>: rank R <why>").
std::vector<int64_t> exchangeCounts(collective::Collectives& group, std::vector<int64_t> mine,
                                    bool perPeer, const std::optional<Error>& failed,
                                    const std::string& where, std::string_view why,
                                    Deadline deadline) {
  const size_t n = size_t(group.size());
  if (failed) std::fill(mine.begin(), mine.end(), -1);
  std::vector<int64_t> got(n, 0);
  if (perPeer)
    group.alltoall(mine.data(), got.data(), 1, DType::kInt64, deadline);
  else
    group.allgather(mine.data(), 1, got.data(), DType::kInt64, deadline);
  if (failed) throw *failed;
  for (size_t r = 0; r < n; ++r)
    CORTADO_ENFORCE(got[r] >= 0, ErrorCode::kInvalidArgument, "{}: rank {} {}", where, r, why);
  return got;
}

}  // namespace

struct ZenCollective::Input {
  std::span<const uint32_t> index;
  std::span<const float> value;
  const float* dense = nullptr;
  // A misuse found before the round (a null buffer): refused in the round's
  // first exchange, like bad input, so that no other member waits.
  const char* misuse = nullptr;
};

ZenCollective::ZenCollective(collective::Collectives& group, std::string tensor,
                             uint64_t numElements, ZenCollectiveOptions options)
    : group_(group),
      tensor_(std::move(tensor)),
      numElements_(numElements),
      options_(std::move(options)) {
  CORTADO_ENFORCE(numElements_ <= zen::kMaxElements, ErrorCode::kInvalidArgument,
                  "zen '{}': {} elements; indices are u32, so at most {}: split the tensor",
                  tensor_, numElements_, zen::kMaxElements);
  CORTADO_ENFORCE(group_.memory() == collective::MemoryKind::kHost, ErrorCode::kInvalidArgument,
                  "zen '{}': group {} works on CUDA memory; Zen's pairs are host buffers: give "
                  "it a host (MPI) group",
                  tensor_, group_.name());
  CORTADO_ENFORCE(options_.scheme || options_.profileRounds >= 1, ErrorCode::kInvalidArgument,
                  "zen '{}': profileRounds {} without a fixed scheme; measure at least one round",
                  tensor_, options_.profileRounds);
  CORTADO_ENFORCE(options_.bytesPerSecond > 0, ErrorCode::kInvalidArgument,
                  "zen '{}': bytesPerSecond {} must be positive", tensor_, options_.bytesPerSecond);
  own_ = zen::Ownership(numElements_, static_cast<uint32_t>(group_.size()),
                        options_.seed ? options_.seed : seedOf(tensor_));
}

ZenCollective::~ZenCollective() = default;

zen::Scheme ZenCollective::nextScheme() const {
  if (options_.scheme) return *options_.scheme;
  if (choice_) return choice_->scheme;
  return zen::Scheme::kHierarchicalCentralization;  // profiling: its stages measure gamma
}

void ZenCollective::allreduce(std::span<const uint32_t> index, std::span<const float> value,
                              float* out, ReduceOp op, Deadline deadline) {
  Input in;
  in.index = index;
  in.value = value;
  run(in, out, op, deadline);
}

void ZenCollective::allreduceDense(const float* dense, float* out, ReduceOp op, Deadline deadline) {
  static const float kNone = 0.0f;
  Input in;
  in.dense = dense ? dense : &kNone;
  if (!dense && numElements_ > 0) in.misuse = "null dense input";
  run(in, out, op, deadline);
}

void ZenCollective::run(const Input& given, float* out, ReduceOp op, Deadline deadline) {
  Input in = given;
  if (!in.misuse && numElements_ > 0 && !out) in.misuse = "null output";
  collective::CallLabel label(group_, "zen:" + tensor_);
  const zen::Scheme scheme = nextScheme();
  if (scheme == zen::Scheme::kBalancedParallelism)
    runBalanced(in, out, deadline);
  else
    runCentralized(in, out, deadline);
  last_.scheme = scheme;
  ++rounds_;
  if (!options_.scheme && !choice_ && rounds_ == uint64_t(options_.profileRounds))
    profile(deadline);
  if (op == ReduceOp::kAverage && group_.size() > 1) {
    const float n = float(group_.size());
    for (uint64_t i = 0; i < numElements_; ++i) out[i] /= n;
  }
}

void ZenCollective::agree(const std::string& stage, const std::optional<Error>& failed,
                          Deadline deadline) {
  const int64_t mine = failed ? 1 : 0;
  std::vector<int64_t> all(static_cast<size_t>(group_.size()));
  group_.allgather(&mine, 1, all.data(), DType::kInt64, deadline);
  if (failed) throw *failed;
  for (size_t r = 0; r < all.size(); ++r)
    CORTADO_ENFORCE(all[r] == 0, ErrorCode::kInvalidArgument,
                    "zen '{}' over {}: rank {} failed in the {} (its error says why)", tensor_,
                    group_.name(), r, stage);
}

// ---- balanced parallelism ----------------------------------------------------

void ZenCollective::runBalanced(const Input& in, float* out, Deadline deadline) {
  const int n = group_.size(), me = group_.rank();
  const std::string where = fmt::format("zen '{}' on rank {} of {}", tensor_, me, group_.name());
  std::optional<Error> failed;
  zen::Partitioned parts;
  std::vector<int64_t> sendCounts(size_t(n), -1);
  std::vector<std::byte> send;
  try {
    CORTADO_ENFORCE(!in.misuse, ErrorCode::kInvalidArgument, "{}", in.misuse ? in.misuse : "");
    CORTADO_ENFORCE(in.dense || in.index.size() == in.value.size(), ErrorCode::kInvalidArgument,
                    "{} indices but {} values", in.index.size(), in.value.size());
    if (!hash_) {
      // Delta-coded lists need each owner's indices ascending: the
      // placement reads its table out in that order.
      zen::PlacementOptions po = options_.placement;
      po.ascendingLists = po.ascendingLists || options_.compact;
      hash_ = std::make_unique<zen::HierarchicalHash>(own_, po);
    }
    if (in.dense)
      hash_->placeDense(in.dense, parts, options_.pool);
    else
      hash_->place(in.index, in.value, parts, options_.pool);
    std::vector<zen::PushForm> forms(size_t(n), zen::PushForm::kCoo);
    size_t total = 0;
    for (int p = 0; p < n; ++p) {
      const auto& idx = parts.indices[size_t(p)];
      forms[size_t(p)] = zen::choosePushForm(idx, options_.compact);
      total += zen::pushBytes(idx, forms[size_t(p)]);
    }
    send.resize(total);
    size_t at = 0;
    for (int p = 0; p < n; ++p) {
      const auto& idx = parts.indices[size_t(p)];
      const size_t bytes = zen::writePush(own_, uint32_t(p), idx, parts.values[size_t(p)],
                                          forms[size_t(p)], {send.data() + at, send.size() - at});
      sendCounts[size_t(p)] = int64_t(bytes);
      at += bytes;
    }
  } catch (const Error& e) {
    failed = Error(e.code(), fmt::format("{}: {}", where, e.what()));
  }
  // Push: the counts first (-1 from every rank that refused its input, so
  // that every rank stops here), then the lists.
  const std::vector<int64_t> recvCounts =
      exchangeCounts(group_, sendCounts, true, failed, where,
                     "refused its input for this round (its error says why)", deadline);
  size_t received = 0;
  for (int64_t c : recvCounts) received += size_t(c);
  std::vector<std::byte> recv(received);
  group_.alltoallv(send.data(), toSizes(sendCounts), recv.data(), toSizes(recvCounts),
                   DType::kUInt8, deadline);

  // Sum this rank's share.
  std::vector<std::byte> answer;
  try {
    if (!sum_) {
      sum_ = std::make_unique<zen::ServerSum>(own_, uint32_t(me));
      lists_ = std::make_unique<zen::IndexLists>(own_);
    }
    std::vector<std::span<const std::byte>> from;
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      from.emplace_back(recv.data() + at, size_t(recvCounts[size_t(r)]));
      at += size_t(recvCounts[size_t(r)]);
    }
    answer = sumShares(*sum_, from, tensor_);
  } catch (const Error& e) {
    failed = Error(e.code(), fmt::format("{}: {}", where, e.what()));
  }

  // Pull: every share's answer to every rank.
  const std::vector<int64_t> sizes =
      exchangeCounts(group_, {int64_t(answer.size())}, false, failed, where,
                     "refused a list sent to it (its error names the sender)", deadline);
  size_t all = 0;
  for (int64_t s : sizes) all += size_t(s);
  std::vector<std::byte> answers(all);
  group_.allgatherv(answer.data(), answer.size(), answers.data(), toSizes(sizes), DType::kUInt8,
                    deadline);

  RoundStats st;
  st.pairs = parts.pairs();
  std::vector<zen::CheckedAnswer> shares(static_cast<size_t>(n));
  size_t at = 0;
  for (int p = 0; p < n; ++p) {
    const std::span<const std::byte> a(answers.data() + at, size_t(sizes[size_t(p)]));
    at += a.size();
    try {
      zen::checkAnswer(a, own_, uint32_t(p), lists_->of(uint32_t(p)), shares[size_t(p)]);
    } catch (const Error& e) {
      // Every rank checks the same bytes, so every rank fails here alike,
      // before anything is written.
      throw Error(e.code(), fmt::format("{}: the answer of rank {}: {}", where, p, e.what()));
    }
    st.sumNonzeros += shares[size_t(p)].header.count;
    if (p != me) {
      st.bytesSent += size_t(sendCounts[size_t(p)]) + answer.size();
      st.bytesReceived += size_t(recvCounts[size_t(p)]) + a.size();
    }
  }
  // One pass over the output for every share's answer.
  if (numElements_ > 0) zen::assembleDense(shares, numElements_, 1.0f, out);
  last_ = st;
}

std::vector<std::byte> sumShares(zen::ServerSum& sum,
                                 std::span<const std::span<const std::byte>> payloads,
                                 const std::string& tensor) {
  for (size_t r = 0; r < payloads.size(); ++r) {
    try {
      sum.add(payloads[r]);
    } catch (const Error& e) {
      sum.answer();  // drop what the round added so far: the next round starts clean
      throw Error(e.code(),
                  fmt::format("tensor '{}': the list from rank {}: {}", tensor, r, e.what()));
    }
  }
  return sum.answer();
}

// ---- hierarchical centralization ---------------------------------------------

zen::CooList parseStageList(std::span<const std::byte> bytes, uint64_t numElements,
                            const std::string& tensor, int peer) {
  try {
    return zen::parseStageList(bytes, numElements);
  } catch (const Error& e) {
    throw Error(e.code(),
                fmt::format("tensor '{}': the list from rank {}: {}", tensor, peer, e.what()));
  }
}

void ZenCollective::runCentralized(const Input& in, float* out, Deadline deadline) {
  const int n = group_.size(), me = group_.rank();
  const std::string where = fmt::format("zen '{}' on rank {} of {}", tensor_, me, group_.name());
  std::optional<Error> failed;
  zen::CooList mine;
  try {
    CORTADO_ENFORCE(!in.misuse, ErrorCode::kInvalidArgument, "{}", in.misuse ? in.misuse : "");
    if (in.dense) {
      for (uint64_t i = 0; i < numElements_; ++i)
        if (in.dense[i] != 0.0f) {
          mine.index.push_back(uint32_t(i));
          mine.value.push_back(in.dense[i]);
        }
    } else {
      CORTADO_ENFORCE(in.index.size() == in.value.size(), ErrorCode::kInvalidArgument,
                      "{} indices but {} values", in.index.size(), in.value.size());
      for (size_t i = 0; i < in.index.size(); ++i)
        CORTADO_ENFORCE(in.index[i] < numElements_, ErrorCode::kInvalidArgument,
                        "sparse tensor of {} elements: index #{} is {}, out of range", numElements_,
                        i, in.index[i]);
      mine.index.assign(in.index.begin(), in.index.end());
      mine.value.assign(in.value.begin(), in.value.end());
    }
  } catch (const Error& e) {
    failed = Error(e.code(), fmt::format("{}: {}", where, e.what()));
    mine = {};
  }
  RoundStats st;
  // One stage: every rank sends the byte count for each peer (-1 to all
  // from a rank that failed, so that every rank stops in the same stage),
  // then the lists in one alltoallv.
  auto exchange = [&](int peer, const zen::CooList& list) -> zen::CooList {
    std::vector<int64_t> sc(size_t(n), 0);
    if (peer >= 0) sc[size_t(peer)] = int64_t(8 * list.index.size());
    const std::vector<int64_t> rc =
        exchangeCounts(group_, sc, true, failed, where,
                       "failed in an earlier stage (its error says why)", deadline);
    const std::vector<std::byte> send =
        peer >= 0 ? zen::encodeStageList(list) : std::vector<std::byte>{};
    size_t total = 0;
    for (int64_t c : rc) total += size_t(c);
    std::vector<std::byte> recv(total);
    group_.alltoallv(send.data(), toSizes(sc), recv.data(), toSizes(rc), DType::kUInt8, deadline);
    if (peer < 0) {
      // Nothing is sent to a rank that sits a stage out; anything else is a peer's fault.
      if (total != 0)
        failed = Error(ErrorCode::kProtocol,
                       fmt::format("{}: {} bytes in a stage it sits out", where, total));
      return {};
    }
    st.bytesSent += send.size();
    st.bytesReceived += total;
    try {
      CORTADO_ENFORCE(total == size_t(rc[size_t(peer)]), ErrorCode::kProtocol,
                      "tensor '{}': {} bytes from ranks other than its partner {}", tensor_,
                      total - size_t(rc[size_t(peer)]), peer);
      return parseStageList(recv, numElements_, tensor_, peer);
    } catch (const Error& e) {
      failed = Error(e.code(), fmt::format("{}: {}", where, e.what()));
      return {};
    }
  };
  std::vector<uint64_t> stages;
  zen::HcOptions hc;
  hc.everyStage = true;
  hc.stageSizes = &stages;
  zen::CooList sum = zen::hierarchicalCentralization(me, n, std::move(mine), exchange, hc);
  // A list refused in the last stage is known only where it arrived.
  agree("hierarchical centralization", failed, deadline);

  if (numElements_ > 0) std::memset(out, 0, numElements_ * sizeof(float));
  for (size_t i = 0; i < sum.index.size(); ++i) out[sum.index[i]] = sum.value[i];
  st.pairs = stages.empty() ? 0 : stages.front();
  st.sumNonzeros = sum.index.size();
  last_ = st;

  if (!options_.scheme && !choice_) {
    // Profiling: [pairs, contributes, stage 1 .. log2 p sizes, sum non-zeros].
    int p = 1, logp = 0;
    while (p * 2 <= n) p *= 2, ++logp;
    if (measured_.empty()) measured_.assign(size_t(3 + logp), 0.0);
    measured_[0] += double(st.pairs);
    if (me < p) {
      measured_[1] += 1;
      for (int i = 1; i <= logp && size_t(i) < stages.size(); ++i)
        measured_[size_t(1 + i)] += double(stages[size_t(i)]);
    }
    measured_.back() += double(st.sumNonzeros);
  }
}

// ---- the choice ------------------------------------------------------------------

void ZenCollective::profile(Deadline deadline) {
  const int n = group_.size();
  std::vector<double> total(measured_.size());
  group_.allreduce(measured_.data(), total.data(), measured_.size(), DType::kFloat64, deadline);
  const double rounds = double(options_.profileRounds);
  const double M = double(std::max<uint64_t>(numElements_, 1));
  zen::SparsityProfile prof;
  prof.numElements = numElements_;
  prof.workers = n;
  prof.density = total[0] / (double(n) * rounds) / M;
  const double base = prof.density * M;  // mean pairs of one rank
  auto gamma = [&](double pairs) { return base > 0 ? pairs / base : 1.0; };
  prof.groups.push_back(1);
  prof.gamma.push_back(1.0);
  int p = 1;
  for (size_t i = 2; i + 1 < total.size(); ++i) {
    p *= 2;
    prof.groups.push_back(p);
    prof.gamma.push_back(gamma(total[1] > 0 ? total[i] / total[1] : 0));
  }
  const double whole = gamma(total.back() / (double(n) * rounds));
  if (prof.groups.back() == n) {
    prof.gamma.back() = whole;
  } else {
    prof.groups.push_back(n);
    prof.gamma.push_back(whole);
  }
  choice_ = zen::chooseScheme(prof, options_.bytesPerSecond);
  CORTADO_LOG_INFO("zen '{}' over {} (rank {}): measured in {} rounds: {}", tensor_, group_.name(),
                   group_.rank(), options_.profileRounds, choice_->figures);
}

}  // namespace cortado
