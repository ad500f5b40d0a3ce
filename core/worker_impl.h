// The worker's implementation (private to core/): the class and its tensor
// and task records, shared by worker.cc (declarations, push_pull and
// exchange, release, the worker's life) and worker_data.cc (the data path:
// the dispatcher, chunks on the wire, answers, peer losses).
#pragma once

#include "core/worker.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <unordered_map>

#include "compressor/compact.h"
#include "compressor/error_feedback.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "compressor/registry.h"
#include "compressor/sparse_sum.h"
#include "compressor/zen/zen_hash.h"
#include "compressor/zen/zen_payload.h"
#include "compressor/zen/zen_scheme.h"
#include "core/common/logging.h"
#include "core/common/reduce.h"
#include "core/partition.h"
#include "core/shm/shm_segment.h"
#include "core/wire/data_message.h"

namespace cortado {
namespace detail {

// A thread that waits on a handle takes the worker's incoming messages
// itself while it waits, where the transport can
// (Transport::receiveWhileWaiting: the shared-memory rings), so that the
// answer wakes it directly instead of the transport's thread, which would
// then wake it. Shared by the worker and its handles, which may outlive
// it: after detach() (the worker closes) receive() does nothing.
class WaitReceiver {
 public:
  explicit WaitReceiver(transport::Transport* t) : t_(t) {}

  // Takes messages on this thread until done() or `until`; false when the
  // transport does not, or the worker closed.
  bool receive(const std::function<bool()>& done, Clock::time_point until) {
    if (!enter()) return false;
    const bool r = t_->receiveWhileWaiting(done, until);
    leave();
    return r;
  }
  // After a done() of a thread in receive() turned true.
  void wake() {
    if (!enter()) return;
    t_->wakeWaiting();
    leave();
  }
  // After the transport closed (no thread is inside it then).
  void detach() {
    std::unique_lock<std::mutex> lk(mu_);
    gone_ = true;
    cv_.wait(lk, [&] { return users_ == 0; });
  }

 private:
  bool enter() {
    std::lock_guard<std::mutex> lk(mu_);
    if (gone_) return false;
    ++users_;
    return true;
  }
  void leave() {
    std::lock_guard<std::mutex> lk(mu_);
    if (--users_ == 0 && gone_) cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  transport::Transport* t_;
  int users_ = 0;
  bool gone_ = false;
};

}  // namespace detail

struct Handle::State {
  std::string name;
  uint64_t tensorKey = 0, round = 0;
  std::shared_ptr<const StallNotes> stalls;  // the control client's, for a timeout's message
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  size_t remaining = 0;  // chunks not yet back; guarded by mu
  // `done` for wait()'s busy polling, which reads it without the mutex.
  std::atomic<bool> doneFlag{false};
  std::chrono::microseconds busyPoll{0};  // WorkerOptions::busyPoll
  std::atomic<uint64_t> pushedBytes{0};   // Handle::pushedBytes
  // The worker's; null: wait() sleeps on cv alone.
  std::shared_ptr<detail::WaitReceiver> receiver;
  std::atomic<int> receiving{0};  // threads in wait() taking messages for it

  // Completes once; the first error wins.
  void complete(const Status& s) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (done) return;
      done = true;
      status = s;
    }
    // Sequentially consistent with wait()'s count of receiving threads and
    // its look at doneFlag: one of the two sees the other.
    doneFlag.store(true, std::memory_order_seq_cst);
    cv.notify_all();
    if (receiving.load(std::memory_order_seq_cst) > 0 && receiver) receiver->wake();
  }
};

namespace detail {

using transport::Message;
using wire::DataHeader;
using wire::Op;

struct TensorEntry {
  std::string name;
  DType dtype;
  uint64_t numElements;
  uint64_t key;
  std::vector<Chunk> chunks;
  TensorOptions options;
  // Compression (null codec: none); codecSpec is canonical and travels in
  // every compressed push's preamble (core/wire).
  compressor::CodecPtr codec;
  compressor::CodecPtr sparseDecoder;  // top-k: the servers' sparse sums
  std::unique_ptr<compressor::ErrorFeedback> ef;  // residuals keyed by chunk index
  std::string codecSpec;
  uint64_t round = 0;      // rounds started so far
  bool inFlight = false;   // a pushPull has not completed yet
  bool released = false;   // release(): no more rounds
  uint32_t incarnation = 0;  // declarations of the name after a release before this one
  // Sparse (Zen) tensors: the ownership of every index (seeded by the key,
  // so alike on every node), each server's index list I_p for decoding the
  // answers, and the sparsity of the first rounds for the scheme choice.
  std::unique_ptr<compressor::zen::IndexLists> zen;
  uint64_t profiledPairs = 0, profiledUnion = 0;
  int profiledRounds = 0;
};

// One push_pull in progress.
struct Task {
  std::shared_ptr<Handle::State> handle;
  TensorEntry* tensor;
  uint64_t round;
  const uint8_t* input;
  uint8_t* output;
  ReduceOp op;
  int priority;
  Status firstError;  // guarded by handle->mu
  // exchange(): caller-prepared payloads per chunk (empty: raw input), and
  // where compressed answers go (null: dense into output).
  bool exchange = false;
  std::vector<Buffer> payloads;
  std::shared_ptr<std::vector<ExchangeAnswer>> answers;
  bool flushResidual = false;  // Exchange::flushResidual
  // Per chunk: the push region its send took from the pool (same-host
  // shared memory), given back when its server answers; data == nullptr:
  // none (sent as bytes, or not sent yet).
  std::vector<shm::Region> pushRegions;
  // pushPullSparse(): each server's COO payload, and its checked answer
  // (each chunk's thread writes its own; the last reads them all); the
  // pairs this worker sent and the non-zeros of the answers so far
  // (guarded by handle->mu).
  std::vector<Buffer> sparse;
  std::vector<Buffer> sparseAnswers;
  std::vector<compressor::zen::CheckedAnswer> sparseChecked;
  uint64_t sparsePairs = 0, sparseUnion = 0;
};

struct ChunkOp {
  std::shared_ptr<Task> task;
  size_t chunk;
  uint64_t seq;
  uint64_t bytes;
  // The bytes this push counts against its server's push budget until the
  // server acknowledges it (PUSH_ACK) or answers; 0: not budgeted (shared
  // memory, small, sparse, or a server without a budget).
  uint64_t budgeted = 0;
};

struct ByPriority {
  bool operator()(const ChunkOp& a, const ChunkOp& b) const {
    if (a.task->priority != b.task->priority) return a.task->priority < b.task->priority;
    return a.seq > b.seq;  // FIFO among equals
  }
};

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(WorkerOptions opts, std::unique_ptr<transport::Transport> t);

  ~WorkerImpl() override { closeAll(); }

  void start(control::ClientOptions copts, Deadline deadline);

  int rank() const override { return self_.rank; }
  int size() const override { return static_cast<int>(book_.workers.size()); }
  int numServers() const override { return static_cast<int>(book_.servers.size()); }
  const control::AddressBook& addressBook() const override { return book_; }
  control::ControlClient& controlClient() override { return *control_; }
  compressor::StateDType errorFeedbackState() const override { return opts_.errorFeedbackState; }

  uint64_t declare(const std::string& name, DType dtype, uint64_t numElements,
                   const TensorOptions& options, Deadline deadline) override;

  // Validates the tensor's codec spec and builds the codec; throws
  // kInvalidArgument naming the tensor and what is valid.
  void setUpCodec(TensorEntry& t);

  // Seeds of one chunk's round. Random-k needs the same one on every worker
  // (its indices follow from it, so payloads line up); the stochastic
  // quantizers need independent ones per worker.
  static uint64_t sharedSeed(uint64_t chunkKey, uint64_t round);
  uint64_t encodeSeed(const TensorEntry& t, uint64_t chunkKey, uint64_t round) const;

  bool isDeclared(const std::string& name) const override;
  bool isReleased(const std::string& name) const override;

  // Under mu_: the declared tensor `name`, or kInvalidArgument naming `what`
  // (the operation asked for).
  TensorEntry& tensorLocked(const std::string& name, const char* what) const;

  // Under mu_: refuses a second operation on a tensor that has one in
  // flight, then gives `task` its handle, tensor and round and queues every
  // chunk of it.
  void enqueueLocked(TensorEntry& t, const std::shared_ptr<Handle::State>& state,
                     const std::shared_ptr<Task>& task);

  Handle pushPull(const std::string& name, DType dtype, uint64_t numElements, const void* input,
                  void* output, ReduceOp op, int priority) override;

  Handle pushPullSparse(const std::string& name, const SparseInput& input, float* output,
                        ReduceOp op, int priority) override;

  std::vector<ChunkSpan> chunks(const std::string& name) const override;

  Handle exchange(const std::string& name, Exchange ex, int priority) override;

  void release(const std::string& name) override { release(name, true); }
  void releaseHere(const std::string& name) override { release(name, false); }

  void barrier(Deadline deadline) override;

  Status failure() const override;

  void abort(const Status& why) override;

  uint64_t pushedBytes() const override { return pushedBytes_.load(std::memory_order_relaxed); }
  uint64_t pulledBytes() const override { return pulledBytes_.load(std::memory_order_relaxed); }

  void shutdown(Deadline deadline) override;

 private:
  // release() and releaseHere(): `tellServers` sends each chunk's server its
  // release.
  void release(const std::string& name, bool tellServers);

  void checkFailedLocked() const;

  void closeAll();

  // Sends chunks in priority order while the credits allow.
  void dispatchLoop();

  // The server's push budget (NodeInfo::pushBudget, server_engine.h): each
  // worker keeps at most its share (the budget over the workers) of pushes
  // to that server not yet summed there, counted from the send to the
  // server's PUSH_ACK or answer. Pushes of at most kBudgetMinBytes (summed
  // on the server's transport thread as they come: inlineBytes), through
  // shared memory, or of sparse tensors are not counted. A chunk larger than
  // the share goes alone.
  static constexpr uint64_t kBudgetMinBytes = 64ull << 10;
  uint64_t budgetedBytesLocked(const TensorEntry& t, const Task& task, size_t chunk,
                               uint64_t bytes) const;
  // Under mu_: whether op fits this worker's push window (all servers
  // together, WorkerOptions::pushWindow) and its server's share.
  bool serverRoomLocked(const ChunkOp& op) const {
    if (op.budgeted == 0) return true;
    const uint32_t s = op.task->tensor->chunks[op.chunk].server;
    if (opts_.pushWindow > 0 && totalUnsummed_ > 0 &&
        totalUnsummed_ + op.budgeted > opts_.pushWindow)
      return false;
    return serverUnsummed_[s] == 0 || serverUnsummed_[s] + op.budgeted <= serverShare_[s];
  }
  // Under mu_: op's bytes no longer count against its server (acknowledged,
  // answered or failed); returns whether any did.
  bool settleLocked(ChunkOp& op) {
    if (op.budgeted == 0) return false;
    serverUnsummed_[op.task->tensor->chunks[op.chunk].server] -= op.budgeted;
    totalUnsummed_ -= op.budgeted;
    op.budgeted = 0;
    return true;
  }
  // A PUSH_ACK: the server summed push `id`.
  void onPushAck(uint32_t id);

  // Whether chunk c of t pushes through shared memory (raw, a same-host
  // server, elements to send).
  bool pushesThroughShm(const TensorEntry& t, const Chunk& c) const {
    return pushPool_ && sameHost_[c.server] && c.numElements > 0 && !t.codec && !t.zen;
  }
  // Under mu_: the pool's limit after shmChunkBytes_ changed.
  void updatePushPoolLocked();

  // After enqueueLocked() (mu_ released): the calling thread sends a small
  // task's only chunk itself when the dispatcher would send it now (first in
  // the queue, within the credits), saving the hand-off to the dispatcher
  // thread (WorkerOptions::inlineBytes); otherwise it wakes the dispatcher.
  void dispatchOrSend(const std::shared_ptr<Task>& task);

  void sendChunk(const ChunkOp& op, uint32_t id);

  // A compressed push's body: the preamble, then `payloads` (one or more
  // back to back), their top-k and DGC payloads compacted where that is
  // smaller and WorkerOptions::compactSparse is on. Counts the payload
  // bytes as pushed by `task`.
  Buffer compressedBody(const TensorEntry& t, Task& task, std::span<const std::byte> payloads);
  // Counts bytes pushed by `task` (and by this worker).
  void countPushed(Task& task, uint64_t bytes);
  // A compressed answer in its plain form: `body` itself, or the expansion
  // of its compact payloads. Throws kProtocol naming the server.
  Buffer plainAnswer(const Buffer& body, const NodeId& from);

  // Sparse tensors (worker_sparse.cc): the declaration's checks and index
  // lists, the chunks' push and pull, the answers' decoding, and the log of
  // the scheme choice after the first rounds.
  void setUpSparse(TensorEntry& t);
  void sparseChunks(TensorEntry& t);
  void sendSparseChunk(const ChunkOp& op, uint32_t id);
  // A server's answer to a sparse pull: checked whole and kept; the last
  // one's thread writes them all into the output (assembleSparse).
  void takeSparseAnswer(const TensorEntry& t, Task& task, size_t chunk, const Message& m,
                        const DataHeader& h);
  void assembleSparse(const TensorEntry& t, Task& task);
  void noteSparseRound(TensorEntry& t, const Task& task);
  static constexpr int kProfileRounds = 3;

  void onMessage(Message&& m);

  std::string tensorOfRequest(uint32_t id);

  // Completes one chunk (with the response, or with an error). Returns false
  // when the request id is unknown.
  bool finishChunk(uint32_t id, const Status& status, Message* m, const DataHeader* h = nullptr);

  // A compressed answer: the tensor's codec payload, or (sparse codecs) the
  // servers' lossless sparse sum in top-k form. Validated before anything is
  // written; throws kProtocol naming the server.
  void decodeAnswer(const TensorEntry& t, const Task& task, const Chunk& c, const Message& m);

  // A server lost on the data plane is often an effect, not the cause: a
  // server exits when the scheduler declares another node dead, and its
  // sockets close before the scheduler's word reaches us. So the loss fails
  // the worker only after a grace period, unless the control plane names the
  // root cause first (failAll from its callback wins).
  static constexpr Millis kPeerLossGrace{3000};

  void onPeerError(const NodeId& peer, const Status& s);

  // Fails every pending and queued operation, and all later calls.
  void failAll(const Status& s);

  WorkerOptions opts_;
  std::unique_ptr<transport::Transport> transport_;
  std::shared_ptr<WaitReceiver> receiver_;  // the handles' way into the transport
  std::unique_ptr<control::ControlClient> control_;
  control::AddressBook book_;
  NodeId self_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<TensorEntry>> tensors_;
  std::unique_ptr<ServerPlacement> placement_;
  std::shared_ptr<const compressor::Registry> codecs_;
  std::vector<bool> sameHost_;                      // per server
  std::unique_ptr<shm::Arena> arena_;               // our push regions' segments
  std::unique_ptr<shm::RegionPool> pushPool_;       // the push regions, per send
  // The bytes of the declared chunks that may push through shared memory
  // (raw, same host), each rounded up to its region's class: the pool holds
  // at most this much, or the credits' worth (updatePushPoolLocked).
  uint64_t shmChunkBytes_ = 0;
  std::atomic<bool> shmFullNoted_{false};  // "goes over the socket", logged once
  std::unique_ptr<shm::PeerMappings> peerShm_;      // servers' result regions
  std::priority_queue<ChunkOp, std::vector<ChunkOp>, ByPriority> queue_;
  std::unordered_map<uint32_t, ChunkOp> pending_;
  uint64_t inFlightBytes_ = 0;
  // Per server: this worker's share of its push budget (0: no budget), and
  // the budgeted bytes sent to it and not yet summed there.
  std::vector<uint64_t> serverShare_;
  std::vector<uint64_t> serverUnsummed_;
  uint64_t totalUnsummed_ = 0;  // serverUnsummed_ summed: what the push window counts
  // The last answer or chunk sent: the credit window stalls creditStall after.
  Clock::time_point lastProgress_ = Clock::now();
  int writing_ = 0;  // answers popped from pending_ and not yet written
  bool abortWaits_ = false;  // abort() waits for writing_ == 0: notify cv_ when it gets there
  uint64_t seq_ = 0;
  uint32_t nextRequest_ = 1;
  Status failure_;
  Status peerLoss_;                              // see onPeerError
  std::optional<Clock::time_point> peerLossAt_;
  bool closed_ = false;
  std::atomic<bool> closing_{false};
  std::atomic<uint64_t> pushedBytes_{0}, pulledBytes_{0};  // pushedBytes(), pulledBytes()
  std::thread dispatcher_;
};

}  // namespace detail
}  // namespace cortado
