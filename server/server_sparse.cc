// A sparse (Zen) key's rounds on its shard (server_shard.h; docs/zen.md):
// each worker pushes the (index, value) pairs of the indices this server
// owns; once every worker has pushed, the sum is answered to every pull as
// a hash bitmap over the server's index list or as an index list, whichever
// is smaller (compressor/zen/zen_sum.h).
// A malformed push (indices out of range, not owned here, listed twice, a
// truncated pair list) is refused to its sender naming the tensor and the
// sender, and leaves the sum as it was.
#include "server/server_shard.h"

namespace cortado::server {

namespace zen = compressor::zen;

void ServerEngine::Shard::processSparse(KeyState& k, const DataHeader& h, Message& msg) {
  const bool sparse = h.flags & wire::kFlagSparse;
  const std::string from = msg.from.toString();
  CORTADO_ENFORCE(!engine->opts_.async, ErrorCode::kMismatch,
                  "key {}: {} sent a sparse message to a server in async mode; sparse tensors "
                  "need sync mode",
                  h.key, from);
  CORTADO_ENFORCE(sparse == (k.zen != nullptr) || !k.initialized, ErrorCode::kMismatch,
                  "{}: {} sent a {} message, but the key holds a {} tensor (workers declared the "
                  "tensor differently?)",
                  k.describe(h.key), from, sparse ? "sparse" : "dense", k.zen ? "sparse" : "dense");
  const int W = engine->opts_.numWorkers;
  if (h.op == Op::kPull) {
    CORTADO_ENFORCE(k.initialized, ErrorCode::kProtocol,
                    "key {}: {} pulled a key that nobody has pushed", h.key, from);
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.pulls;
    }
    if (h.round == k.doneRound) {
      sendResult(msg.from, h.requestId, h.key, k.doneRound, k, k.result, wire::kFlagSparse);
    } else if (h.round == k.round) {
      addWaiting(k, {msg.from, h.requestId, false, false});
    } else {
      throw Error(
          ErrorCode::kProtocol,
          fmt::format("{}: {} pulled round {}, but the server has completed round {} "
                      "and is summing round {}",
                      k.describe(h.key), from, h.round,
                      k.doneRound == kNoRound ? std::string("none") : std::to_string(k.doneRound),
                      k.round));
    }
    return;
  }
  CORTADO_ENFORCE(h.op == Op::kPush, ErrorCode::kProtocol,
                  "key {}: a server does not accept {} from {}", h.key, wire::opName(h.op), from);
  wire::CompressedPush p;
  try {
    p = wire::parseCompressedPush(msg.parts[1].data(), msg.parts[1].size());
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol,
                fmt::format("key {}: malformed sparse push from {}: {}", h.key, from, e.what()));
  }
  const std::string what = p.tensorName.empty()
                               ? fmt::format("key {}", h.key)
                               : fmt::format("tensor '{}' (key {})", p.tensorName, h.key);
  CORTADO_ENFORCE(p.codecSpec == "zen", ErrorCode::kProtocol,
                  "{}: {} pushed a sparse message with codec '{}'; sparse pushes name 'zen'", what,
                  from, p.codecSpec);
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(p.payload), p.payloadBytes);
  if (!k.initialized) {
    // The first push fixes the key: its partition of the tensor, from the
    // payload's header, which must name this server.
    zen::ZenHeader zh;
    try {
      zh = zen::parseZenHeader(payload);
    } catch (const Error& e) {
      throw Error(ErrorCode::kProtocol,
                  fmt::format("{}: malformed sparse push from {}: {}", what, from, e.what()));
    }
    const auto self = static_cast<uint32_t>(engine->opts_.self.rank);
    CORTADO_ENFORCE(zh.server == self && zh.numel == h.numElements && h.dtype == DType::kFloat32,
                    ErrorCode::kProtocol,
                    "{}: {} pushed the pairs of server {} of {} ({} elements of {}) to server {} "
                    "(message: {} elements)",
                    what, from, zh.server, zh.servers, zh.numel, dtypeName(h.dtype), self,
                    h.numElements);
    CORTADO_ENFORCE(h.contributors <= static_cast<uint32_t>(W), ErrorCode::kProtocol,
                    "{}: {} says {} workers push this key, but the job has {} workers", what, from,
                    h.contributors, W);
    k.zen = std::make_unique<zen::ServerSum>(zen::Ownership(zh.numel, zh.servers, zh.seed), self);
    k.initialized = true;
    k.dtype = DType::kFloat32;
    k.numElements = h.numElements;
    k.pushedBy.assign(W, false);
    k.expected = h.contributors == 0 ? W : static_cast<int>(h.contributors);
    k.tensorName = std::string(p.tensorName);
  }
  CORTADO_ENFORCE(
      p.tensorName == k.tensorName && h.numElements == k.numElements, ErrorCode::kMismatch,
      "{}: {} pushed sparse tensor '{}' of {} elements, but this key holds tensor '{}' "
      "of {} elements (workers declared the tensor differently?)",
      k.describe(h.key), from, p.tensorName, h.numElements, k.tensorName, k.numElements);
  const int w = msg.from.rank;
  CORTADO_ENFORCE(h.round == k.round, ErrorCode::kProtocol,
                  "{}: {} pushed round {} but the server is summing round {}", k.describe(h.key),
                  from, h.round, k.round);
  CORTADO_ENFORCE(!k.pushedBy[w], ErrorCode::kProtocol, "{}: {} pushed round {} twice",
                  k.describe(h.key), from, h.round);
  try {
    k.zen->add(payload);
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol,
                fmt::format("{}: malformed sparse push from {} (round {}): {}", k.describe(h.key),
                            from, h.round, e.what()));
  }
  if (k.pushes == 0) {
    k.roundStart = std::chrono::steady_clock::now();
    k.stallReported = false;
  }
  k.pushedBy[w] = true;
  ++k.pushes;
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.pushes;
  }
  if (k.pushes < k.expected) return;
  // The round is complete: one answer, shared by every pull.
  std::vector<std::byte> answer = k.zen->answer();
  k.result = Buffer::copyOf(answer.data(), answer.size());
  k.doneRound = k.round;
  ++k.round;
  k.pushes = 0;
  std::fill(k.pushedBy.begin(), k.pushedBy.end(), false);
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.roundsCompleted;
  }
  for (const auto& q : takeWaiting(k))
    sendResult(q.from, q.requestId, h.key, k.doneRound, k, k.result, wire::kFlagSparse);
}

}  // namespace cortado::server
