// The server engine's shards (private to server/): one engine thread each,
// with the state of the keys it owns. server_engine.cc holds the engine and
// a shard's loop, message dispatch and releases; server_rounds.cc a key's
// rounds (sync and async sums, compressed pushes, the answers).
#pragma once

#include "server/server_engine.h"

#include <cstring>
#include <unordered_map>

#include "compressor/compact.h"
#include "compressor/error_feedback.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "compressor/sparse_sum.h"
#include "compressor/zen/zen_sum.h"
#include "core/common/logging.h"
#include "core/common/reduce.h"
#include "core/wire/data_message.h"

namespace cortado::server {

namespace detail {

inline constexpr uint64_t kNoRound = ~uint64_t(0);

struct PendingPull {
  NodeId from;
  uint32_t requestId;
  bool wantsShm;
  bool wantsCompressed = false;  // an uncompressed key's sum in answerCodec's form
};

// Everything the server knows about one key. Touched by one engine thread.
struct KeyState {
  bool initialized = false;
  DType dtype = DType::kFloat32;
  uint64_t numElements = 0;

  // Sync mode: the round being accumulated and the last completed one.
  uint64_t round = 0;
  int pushes = 0;
  std::vector<bool> pushedBy;
  // The stall check: when the round's first push came, and whether this
  // round was reported.
  std::chrono::steady_clock::time_point roundStart;
  bool stallReported = false;
  Buffer acc;                   // accumulator dtype
  uint64_t doneRound = kNoRound;
  Buffer result;                // tensor dtype; shared with replies in flight
  std::vector<PendingPull> waiting;
  // Shared-memory mode: two result regions, used by round parity (see
  // core/shm/shm_segment.h for why two suffice).
  shm::Region regions[2];
  shm::Region resultRegion;
  bool shmTried = false;

  // Async mode: the running value (accumulator dtype).
  Buffer store;

  // Compressed keys: fixed by the first push.
  bool compressed = false;
  compressor::CodecPtr codec;
  std::string codecSpec;
  std::string tensorName;
  bool resultCompressed = false;  // k.result is a codec payload
  // Top-k and DGC keys: the indices this round's payloads listed, while
  // `tracking`; at the round's end the answer is built from them and only
  // they are cleared, so `accZero` (acc is all zeros) holds for the next
  // round. Off for the round once the payloads listed more than a quarter of
  // the key's elements (duplicates included): then a scan is cheaper.
  bool tracking = false;
  bool accZero = false;
  compressor::IndexUnion touched;

  // Plan executor (core/executor/executor.h): pushes that complete a round (0 until the
  // first push fixes it), a compressed key answered dense, and an
  // uncompressed key's answer re-encoded for pulls that ask so.
  int expected = 0;
  bool denseAnswer = false;
  compressor::CodecPtr answerCodec;
  std::string answerSpec;
  uint64_t encodedRound = kNoRound;
  Buffer encoded;
  bool encodedCompressed = false;

  // Server-side error feedback (sync mode, pushes or a compressed pull with
  // kFlagErrorFeedback): the residual of the key's lossy re-encode, added to
  // the next round's sum before it is encoded. Created at the first lossy
  // re-encode; sparse codecs' answers are lossless and need none. A key has
  // either compressed pushes or a codec its pulls ask for, never both, so one
  // state serves either answer.
  bool errorFeedback = false;
  std::unique_ptr<compressor::ErrorFeedback> ef;
  // kFlagFlushResidual: a push of round flushRound asked for it (the key's
  // last round before a plan switch); flushedRound: the completed round whose
  // answer is dense with the residual added (then cleared).
  uint64_t flushRound = kNoRound;
  uint64_t flushedRound = kNoRound;

  // Sparse (Zen) keys: this server's sum of the pairs it owns and the
  // round's answer (bitmap or index list) in `result` (server_sparse.cc).
  std::unique_ptr<compressor::zen::ServerSum> zen;

  // Op::kRelease: the workers that released the key so far.
  std::vector<bool> releasedBy;
  int releases = 0;

  // "tensor 'fc1' (key 1048576)" or "key 5" for error messages.
  std::string describe(uint64_t key) const {
    return tensorName.empty() ? fmt::format("key {}", key)
                              : fmt::format("tensor '{}' (key {})", tensorName, key);
  }
};

}  // namespace detail

using detail::KeyState;
using detail::kNoRound;
using detail::PendingPull;
using transport::Message;
using wire::DataHeader;
using wire::Op;

struct ServerEngine::Shard {
  ServerEngine* engine = nullptr;
  int index = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<DataHeader, Message>> queue;
  bool stop = false;
  // The token to touch `keys`: held by the shard's thread while it processes
  // a message or checks stalls, or by the loop thread while it processes a
  // small key inline (ServerEngine::handle). Guarded by mu.
  bool busy = false;
  std::thread thread;
  std::unordered_map<uint64_t, KeyState> keys;
  ServerStats stats;  // guarded by mu
  // Compact top-k and DGC pushes expanded, and a sparse answer in its plain
  // form before it is compacted (compressor/compact.h); the token's holder's.
  std::vector<std::byte> scratch;
  // The bytes of the budgeted push being processed that still count as
  // unsummed (ServerStats::unsummedBytes); the token's holder's.
  uint64_t unsettled = 0;

  void run();
  // The push being processed is summed (or refused): its bytes leave the
  // unsummed count, before its acknowledgement lets its sender send more.
  void settlePush() {
    if (unsettled == 0) return;
    engine->unsummed_.fetch_sub(unsettled, std::memory_order_relaxed);
    unsettled = 0;
  }
  // A push summed: drops its body (the receive buffer goes back now, not
  // when the message is done with), settles it, and acknowledges it when
  // its sender asked (kFlagAck) or in async mode (always).
  void pushSummed(const DataHeader& h, Message& msg, DType dtype, bool ack);
  // process() with its errors answered to the sender.
  void processOrRefuse(const DataHeader& h, Message& msg);
  // The stall check: reports each round waiting longer than stallAfter once.
  void reportStalls();
  void process(const DataHeader& h, Message& msg);
  // Op::kRelease: counts the sender; frees the key once every contributor has.
  void release(const DataHeader& h, const NodeId& from);
  void processSync(KeyState& k, const DataHeader& h, Message& msg);
  void processAsync(KeyState& k, const DataHeader& h, Message& msg);
  // A sparse key's push or pull (wire kFlagSparse), and the mismatches of
  // dense messages on a sparse key.
  void processSparse(KeyState& k, const DataHeader& h, Message& msg);
  void sendResult(const NodeId& to, uint32_t requestId, uint64_t key, uint64_t round,
                  const KeyState& k, const Buffer& body, uint8_t flags, bool wantsShm = false);
  Buffer takeBuffer(Buffer& recycled, size_t bytes);
  // The pushed elements: the body, or the worker's shared memory it names.
  const uint8_t* pushData(const DataHeader& h, const Message& msg, const KeyState& k);
  // Compressed keys: checks a push's preamble against the key (fixing the
  // key's codec on its first push) and returns the payload.
  std::span<const std::byte> compressedPayload(KeyState& k, const DataHeader& h,
                                               const Message& msg);
  // Adds a compressed push into sum[0..n); throws naming tensor and sender.
  void decompressInto(KeyState& k, const DataHeader& h, const Message& msg, float* sum);
  // The round's answer for a compressed key, from its fp32 sum.
  void encodeAnswer(KeyState& k, uint64_t key, const float* sum, Buffer recycled);
  // Encodes an n-element fp32 sum with `codec` into out (sparse codecs: the
  // lossless top-k form, or dense where smaller); returns whether it is a payload.
  // With k.errorFeedback a lossy encode goes through the key's residual.
  bool encodeSum(KeyState& k, const compressor::CodecPtr& codec, uint64_t key, uint64_t round,
                 const float* sum, size_t n, Buffer& out, Buffer recycled,
                 const std::span<const uint32_t>* touched = nullptr);
  // A pull with kFlagCompressed on an uncompressed key: fixes or checks the
  // codec it names.
  void answerCodecOf(KeyState& k, const DataHeader& h, const Message& msg);
  // A pull that waits for its round's pushes, counted in the engine's
  // pullsWaiting_ (the transport may poll for those pushes meanwhile:
  // Transport::setExpecting), and the waiting pulls taken off a key to be
  // answered (or refused), no longer counted.
  void addWaiting(KeyState& k, PendingPull p) {
    k.waiting.push_back(p);
    engine->pullsWaiting_->fetch_add(1, std::memory_order_relaxed);
  }
  std::vector<PendingPull> takeWaiting(KeyState& k) {
    std::vector<PendingPull> w = std::move(k.waiting);
    k.waiting.clear();
    engine->pullsWaiting_->fetch_sub(int64_t(w.size()), std::memory_order_relaxed);
    return w;
  }
  // Answers one pull of the completed round.
  void answerPull(KeyState& k, uint64_t key, const PendingPull& p);
  // A flushed round's answer: the dense fp32 sum plus the key's residual,
  // which is cleared (the residual's mass goes out once, in this answer).
  void flushInto(KeyState& k, const float* sum, Buffer& out, Buffer recycled);
};

}  // namespace cortado::server
