// The server's aggregation engine. It owns the keys (tensor chunks) that
// workers push to this server: for each key and round it sums the pushes of
// every worker and answers their pulls once the round is complete (sync
// mode), or applies each push at once (async mode).
//
// Compressed keys (wire kFlagCompressed; docs/codecs.md): each push names its
// codec and tensor, and the first push of a key fixes them. Every push is
// validated and decompressed into the key's fp32 sum (never summed in
// compressed form); the round's answer is the sum re-encoded with the codec,
// or, for sparse codecs (top-k, DGC, random-k), the sum's nonzeros in top-k
// form, which is lossless, or the dense sum where that is smaller. The answer
// is encoded once per round and shared by every pull. Async mode answers
// dense. A malformed push is refused with an error to its sender that names
// the tensor, the key and the sender; the key's sum is left as it was.
//
// Error feedback at the re-encode (wire kFlagErrorFeedback, set by workers
// whose tensor has error feedback, and by the plan executor always): in sync
// mode a key keeps the residual of its lossy re-encodes (casts, sign codecs,
// quantizers; one fp32 per element of the key, created at the first such
// encode) and adds it to the next round's sum before encoding, so what the
// server sent over rounds 0..t sums to what it received minus one residual.
// Sparse codecs' answers are lossless and keep none. Async mode never
// re-encodes (it answers dense), so it keeps none either.
// A push with kFlagFlushResidual (the plan executor's last round of a shard
// key before a plan switch retires it) makes the round's answer, for a key
// that holds a residual, the dense fp32 sum plus the residual, and clears the
// residual: what the key sent over all its rounds then equals what it
// received. Keys without a residual answer as always.
//
// Release (wire Op::kRelease): a worker done with a key (the plan executor,
// for each shard key of a plan it replaced, after its last round's answer)
// says so; once every worker that pushes the key (its contributors) has, the
// server forgets the key and frees its buffers (sum, answer, residual).
// Every contributor releases only after its own pull of the last round was
// answered, so no pull of the key is left. A key released before any push
// reached this server is nothing to free. Its same-host shared-memory result
// regions go back to the arena for later keys of the same size.
//
// Stall check (ServerEngineOptions::stallAfter, CORTADO_STALL_CHECK_MS in a
// server role): a sync round that some workers pushed and others have not
// for that long is handed to onStall once, with the workers that pushed; the
// server role sends it to the scheduler (core/common/stall.h), which names
// the tensor and the missing workers. The engine threads look every quarter
// of that time (at most every second) while they wait for messages.
//
// Push budget (ServerEngineOptions::pushBudget, CORTADO_SERVER_PUSH_BYTES):
// without shared memory every push's bytes sit in this server from their
// arrival until they are summed, and the workers' credits alone would let
// them pile up to the workers' windows (4 workers x 64 MiB). The server
// advertises the budget when it registers; each worker keeps its share (the
// budget over the workers, at least one chunk) of pushes not yet summed here
// and flags them kFlagAck; the server drops a push's body as soon as it is
// summed and acknowledges it (PUSH_ACK; the last push of a round is answered
// by the round's answer instead), which lets the worker send the next. So a
// server holds at most max(budget, workers x largest chunk) of such pushes,
// counted from handle() to the sum (ServerStats::unsummedBytes and
// unsummedPeak). Pushes through shared memory, of at most 64 KiB, and of
// sparse tensors are not budgeted.
//
// Without shared memory a plain key (uncompressed, its sum in its own dtype)
// holds its sum only while a round is under way: the sum becomes the answer,
// and the previous answer, once no reply refers to it, goes to the engine's
// spares by size (at most 32 MiB or the push budget) for the next round of
// any key of that size. So an idle key costs its answer alone (1x its
// bytes), and a new round's sum costs no page faults.
//
// Threads: handle() is called on the transport's loop thread; it decodes the
// header and hands the message to one of `engineThreads` engine threads,
// chosen by key (a shard). A key of at most `inlineBytes` whose shard is idle
// (its thread holds none of its keys and has nothing queued) is processed
// right there on the loop thread instead, and its answers leave from there:
// for a small key the hand-off to the engine thread and back to the loop
// costs more than the sum. Either way one thread at a time touches a shard's
// keys (the shard's `busy` token, taken under its mutex), and a shard's
// messages are processed in the order they came. Replies are sent from
// whichever thread processed the message. While a pull waits for its
// round's pushes, the engine tells its transport that it expects messages
// (Transport::setExpecting), which may then poll for them for a bounded
// time instead of sleeping (the shared-memory rings: CORTADO_SHM_SERVER_POLL_US).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "compressor/registry.h"
#include "core/common/stall.h"
#include "core/common/trace.h"
#include "core/shm/shm_segment.h"
#include "core/transport/transport.h"

namespace cortado::server {

struct ServerEngineOptions {
  int numWorkers = 1;
  int engineThreads = 2;
  // Messages of keys up to this many bytes (elements x dtype) are processed
  // on the transport's loop thread when their shard is idle; 0: never
  // (CORTADO_INLINE_BYTES).
  uint64_t inlineBytes = 64ull << 10;
  bool async = false;
  // Same-host shared-memory data path (core/shm): the job's segment prefix
  // and this server's id, or an empty prefix to serve bytes only.
  std::string shmPrefix;
  NodeId self{Role::kServer, 0};
  // The codecs compressed pushes may name; nullptr: the CPU codecs.
  std::shared_ptr<const compressor::Registry> codecs;
  // Sparse answers (top-k, DGC, random-k keys) go out with their indices as
  // varint gaps where that is smaller (compressor/compact.h;
  // CORTADO_COMPACT_SPARSE). Pushes in that form are read either way.
  bool compactSparse = true;
  // Records the work of every push in sync mode (receive, decode, sum, and
  // the round's answer on the last push) as a "server" stage, the iteration
  // being the key's round (docs/tracing.md). nullptr: off.
  std::shared_ptr<Tracer> tracer;
  // Stall check (sync mode): a round that is still incomplete this long
  // after its first push is handed to onStall once (on an engine thread;
  // keep it short). Zero or no onStall: no check.
  std::chrono::milliseconds stallAfter{0};
  std::function<void(const StallReport&)> onStall;
  // The budget of pushes received and not yet summed, in bytes (0: none).
  // The workers keep to it (above); the role advertises it to them.
  uint64_t pushBudget = 0;
};

struct ServerStats {
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  uint64_t roundsCompleted = 0;
  uint64_t errors = 0;
  uint64_t keys = 0;          // keys held now
  uint64_t keysReleased = 0;  // keys freed by their contributors' releases
  uint64_t keyBytes = 0;      // the tensor bytes of the keys held now (elements x dtype)
  uint64_t inlined = 0;       // messages processed on the transport's thread (inlineBytes)
  // Budgeted pushes (kFlagAck): their bytes received and not yet summed, now
  // and at most so far (per server: a sum over servers adds the peaks).
  uint64_t unsummedBytes = 0;
  uint64_t unsummedPeak = 0;

  ServerStats& operator+=(const ServerStats& o) {
    pushes += o.pushes, pulls += o.pulls, roundsCompleted += o.roundsCompleted;
    errors += o.errors, keys += o.keys, keysReleased += o.keysReleased;
    keyBytes += o.keyBytes, inlined += o.inlined;
    unsummedBytes += o.unsummedBytes, unsummedPeak += o.unsummedPeak;
    return *this;
  }
};

class ServerEngine {
 public:
  ServerEngine(ServerEngineOptions opts, transport::Transport& transport);
  ~ServerEngine();
  ServerEngine(const ServerEngine&) = delete;
  ServerEngine& operator=(const ServerEngine&) = delete;

  // Entry point for every data-plane message (transport loop thread).
  void handle(transport::Message&& msg);

  // Stops the engine threads; messages not yet handled are dropped.
  void stop();

  ServerStats stats() const;

 private:
  struct Shard;
  void replyError(const NodeId& to, uint32_t requestId, uint64_t key, const std::string& what);

  ServerEngineOptions opts_;
  transport::Transport& transport_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<shm::Arena> arena_;          // results, when shmPrefix is set
  std::unique_ptr<shm::PeerMappings> peers_;   // workers' push regions
  std::shared_ptr<const compressor::Registry> codecs_;
  // Pulls waiting for their round's pushes, across the shards: the
  // transport's expecting() (Transport::setExpecting), which may outlive
  // the engine.
  std::shared_ptr<std::atomic<int64_t>> pullsWaiting_ = std::make_shared<std::atomic<int64_t>>(0);
  // ServerStats::unsummedBytes and unsummedPeak.
  std::atomic<uint64_t> unsummed_{0}, unsummedPeak_{0};

  // Spare sum buffers (plain keys whose sum is their answer, without shared
  // memory): a completed round's previous answer, once nothing refers to it,
  // kept by size for the next round of any key of that size, so a key holds
  // no sum between its rounds and a new round's sum costs no page faults.
  // At most kSpareBytes or the push budget, whichever is more.
  Buffer takeSpare(size_t bytes);
  void keepSpare(Buffer b);
  static constexpr uint64_t kSpareBytes = 32ull << 20;
  std::mutex spareMu_;
  std::unordered_map<size_t, std::vector<Buffer>> spares_;
  uint64_t spareBytes_ = 0;
};

}  // namespace cortado::server
