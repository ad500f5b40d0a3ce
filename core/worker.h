// The worker engine: what a training process (through a binding or the C++
// API) uses to sum tensors across workers.
//
// A tensor is declared once (name, dtype, element count); the scheduler checks
// that every worker declares the same thing and hands out a job-wide key. Each
// pushPull() splits the tensor into chunks, placed on servers with the bytes
// balanced, and queues the chunks by priority (higher first; bindings use
// -layer index so the layers that the next forward pass needs come first).
// A dispatcher thread sends chunks while the bytes in flight stay under the
// credit bound; responses are copied (and averaged) into the output on the
// transport's thread (or, with the shared-memory rings, on a thread waiting
// in Handle::wait, which takes its worker's incoming messages itself while
// it waits: Transport::receiveWhileWaiting), and the handle completes when
// every chunk is back.
//
// Compression (docs/codecs.md): a tensor declared with TensorOptions::codec is
// encoded chunk by chunk before each push (with error feedback, whose residuals
// stay on this worker, per chunk), the servers decompress every push into an
// fp32 sum and answer with the sum in the codec's form (or in a lossless
// sparse form for top-k, DGC and random-k), and the worker decodes the answer
// into `output`. Encoding runs on the dispatcher thread, decoding where the
// answer is taken (the transport's thread, or a waiting thread, as above).
//
// Errors: misuse (undeclared tensor, wrong size or dtype, a second pushPull of
// a tensor that is still in flight) throws cortado::Error at once. Failures
// (a server's error reply, a dead peer, the job aborted by the scheduler)
// complete the handles with a Status that names the tensor and the peer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compressor/error_feedback.h"
#include "core/common/buffer.h"

#include "core/common/deadline.h"
#include "core/common/dtype.h"
#include "core/common/error.h"
#include "core/control/control_client.h"
#include "core/transport/transport.h"

namespace cortado {
namespace compressor {
class Registry;
}

enum class ReduceOp { kSum, kAverage };

struct WorkerOptions {
  uint64_t partitionBytes = 4ull << 20;    // chunk size
  uint64_t maxBytesInFlight = 64ull << 20; // credits: pushed but not yet pulled
  // A full window whose chunks all wait for other workers' pushes of the
  // same chunks, while those workers' windows hold other chunks, answers
  // nothing: when no chunk was answered or sent for this long and chunks
  // wait, the dispatcher sends the next one past the window (one per
  // interval), so that every worker gets to the chunks the others hold.
  // 0: never past the window.
  Millis creditStall{100};
  bool async = false;                      // servers in async mode
  std::string listenAddress = "tcp://127.0.0.1:0";
  // Same-host servers get pushes and send sums through shared memory
  // (core/shm); servers on other hosts always get bytes.
  bool sharedMemory = true;
  // The codecs that TensorOptions::codec names; nullptr: the CPU codecs
  // (compressor::registerCpuCodecs). Servers must know the same codecs.
  std::shared_ptr<const compressor::Registry> codecs;
  // Latency (docs/transports.md, "Latency"): a push_pull or exchange of a
  // tensor of one chunk of at most this many bytes is sent by the calling
  // thread when the credits allow it and nothing of higher priority waits,
  // instead of by the dispatcher thread (0: always the dispatcher).
  uint64_t inlineBytes = 64ull << 10;
  // Handle::wait() polls for the completion this long before it sleeps on
  // its condition variable (0: it sleeps at once). It keeps a core busy.
  std::chrono::microseconds busyPoll{0};
  // Top-k and DGC payloads, and the pushes of sparse (Zen) tensors, go on
  // the wire with their indices as varint gaps where that is smaller
  // (compressor/compact.h, compressor/zen/zen_payload.h;
  // CORTADO_COMPACT_SPARSE). Answers in that form are read either way.
  bool compactSparse = true;
  // The order of a tensor's chunks (core/partition.h, sendOrder): false,
  // index order on every worker; true, staggered: worker r starts at
  // server r's chunk and goes round the servers, so that at the start of a
  // push_pull each server's in-link is fed by one worker instead of every
  // worker pushing chunk 0 to one server (CORTADO_STAGGER). Priorities
  // across tensors are not affected.
  bool staggerChunks = false;
  // The push window: this worker's pushes that the servers' budgets count
  // (not through shared memory, over 64 KiB, not sparse) and that are not
  // yet summed, all servers together, at most this many bytes; a push that
  // does not fit waits for an acknowledgement, and a larger one goes alone
  // (0: no window; CORTADO_PUSH_WINDOW_CHUNKS times the chunk size). Across
  // hosts the short queues it keeps let the flows into one server share its
  // link evenly (docs/transports.md, "Push window").
  uint64_t pushWindow = 0;
  // What error feedback keeps its residuals (and DGC's velocities) in, for
  // this worker's pushes and the plan executors that run on it: fp32, or
  // bf16 at half the memory (compressor/error_feedback.h; CORTADO_EF_DTYPE).
  compressor::StateDType errorFeedbackState = compressor::StateDType::kFloat32;
};

// How one tensor travels. The default is uncompressed.
struct TensorOptions {
  // "" = uncompressed; else a codec spec of the registry, e.g. "fp16",
  // "topk:ratio=0.01", "qsgd:levels=15" ("name" or "name:key=value,...";
  // docs/codecs.md lists them). Float32 tensors only. PowerSGD needs two
  // reductions per round and is refused here.
  std::string codec;
  // With a codec: fold each round's compression error into the next round's
  // push (compressor::ErrorFeedback, with DGC's momentum correction for dgc).
  // Without it top-k and the sign codecs lose what they do not send.
  bool errorFeedback = true;
  // How many workers push each round; 0 = all of them. The plan executor
  // (core/executor/executor.h) declares its hierarchical shard keys with one pusher per
  // machine. Every worker must declare the same value (the scheduler checks).
  uint32_t contributors = 0;
  // Zen (docs/zen.md): a float32 tensor that is mostly zeros (an embedding's
  // gradient) travels as (index, value) pairs, each index to the server that
  // the tensor's ownership hash names, and comes back as each server's hash
  // bitmap. Every server holds one key of it. Sync mode, no codec, at most
  // 2^32 - 1 elements. pushPull() scans its input for the non-zeros;
  // pushPullSparse() takes the pairs.
  bool sparse = false;
};

// The input of Worker::pushPullSparse: (index, value) pairs, or a dense
// buffer of the declared element count to scan for non-zeros. It is read
// before pushPullSparse returns.
struct SparseInput {
  const uint32_t* indices = nullptr;  // `count` of them; an index may repeat (values add up)
  const float* values = nullptr;
  uint64_t count = 0;
  const float* dense = nullptr;  // instead of the pairs
};

// One chunk of a declared tensor: elements [offset, offset + numElements).
struct ChunkSpan {
  uint64_t offset = 0;
  uint64_t numElements = 0;
};

// A chunk's answer to exchange() when kept in compressed form.
struct ExchangeAnswer {
  Buffer bytes;             // a codec payload (or top-k sparse sum), or dense fp32
  bool compressed = false;  // false: bytes are the dense fp32 sum of the chunk
};

// One round of push and pull with data the caller prepared (the plan
// executor's inter-machine push/pull steps). Exactly one input and one output.
struct Exchange {
  // Push raw elements (the declared count and dtype), or, for a tensor
  // declared with a codec, per chunk (chunks()) one or more payloads of that
  // codec for the chunk, back to back; the servers decode and add each.
  const void* rawInput = nullptr;
  std::vector<Buffer> payloads;
  // Pull the dense sum into rawOutput, or, for a tensor declared with a codec,
  // the servers' answer per chunk into *answers (re-encoded with the codec, or
  // top-k's lossless sparse sum, or dense where that is smaller).
  void* rawOutput = nullptr;
  // Shared with the operation, so that an answer arriving after the caller
  // gave up (a timeout) lands in memory that still exists.
  std::shared_ptr<std::vector<ExchangeAnswer>> answers;
  // The key's last round (a plan switch retires it next): servers that hold
  // an error-feedback residual for it answer this round dense with the
  // residual added and clear it (wire kFlagFlushResidual), so the answer
  // may be dense where `answers` would otherwise hold payloads.
  bool flushResidual = false;
};

// The completion of one pushPull. Cheap to copy; all copies share the state.
class Handle {
 public:
  struct State;
  Handle() = default;
  explicit Handle(std::shared_ptr<State> s) : state_(std::move(s)) {}

  bool valid() const { return state_ != nullptr; }
  // True once the operation completed, successfully or not.
  bool poll() const;
  // Waits until completion or the deadline. Where the worker's transport
  // lets it (the shared-memory rings), the waiting thread takes the worker's
  // incoming messages itself meanwhile, running the work that answers need
  // (any handle's) on this thread. Returns the operation's Status,
  // or kTimeout naming the tensor when the deadline passed first (the
  // operation goes on; wait again to see it finish).
  Status wait(Deadline deadline) const;
  const std::string& tensorName() const;
  // Bytes of tensor data this operation pushed (Worker::pushedBytes counts
  // the same for every operation); final once it completed.
  uint64_t pushedBytes() const;

 private:
  std::shared_ptr<State> state_;
};

class Worker {
 public:
  // Listens on the transport, connects and registers with the scheduler,
  // and connects to every server. Throws Error on failure (timeout naming
  // the scheduler, a refused token, a port in use).
  static std::unique_ptr<Worker> start(WorkerOptions opts, control::ClientOptions control,
                                       std::unique_ptr<transport::Transport> transport,
                                       Deadline deadline);
  virtual ~Worker() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;  // number of workers
  virtual int numServers() const = 0;
  // The job as the scheduler described it at registration (every node's
  // rank, hostname and data address), and this worker's control-plane client
  // (its key-value rendezvous bootstraps NCCL: core/backends.h).
  virtual const control::AddressBook& addressBook() const = 0;
  virtual control::ControlClient& controlClient() = 0;
  // WorkerOptions::errorFeedbackState: the plan executor keeps its encode
  // points' residuals in it too.
  virtual compressor::StateDType errorFeedbackState() const = 0;

  // Declares a tensor (blocks until every worker declared it). Declaring the
  // same name again with the same shape and options returns the same key;
  // with another shape or other options it throws Error(kInvalidArgument).
  // A codec spec that is unknown or has a bad parameter throws
  // kInvalidArgument listing what is valid, before anything is sent. Workers
  // that declare a tensor differently (shape, codec, error feedback) fail the
  // job: every worker's declare throws kMismatch naming the tensor and what
  // each worker declared.
  //
  //   w->declare("fc1.weight", DType::kFloat32, n,
  //              TensorOptions{.codec = "topk:ratio=0.01"}, Deadline::after(Millis(30000)));
  virtual uint64_t declare(const std::string& name, DType dtype, uint64_t numElements,
                           const TensorOptions& options, Deadline deadline) = 0;
  // Uncompressed.
  uint64_t declare(const std::string& name, DType dtype, uint64_t numElements,
                   Deadline deadline) {
    return declare(name, dtype, numElements, TensorOptions{}, deadline);
  }
  // Declared, released or not.
  virtual bool isDeclared(const std::string& name) const = 0;
  // Declared and released since (release()): no round of it may start until
  // the name is declared again, as a new tensor.
  virtual bool isReleased(const std::string& name) const = 0;

  // Sums `input` across workers into `output` (may be the same memory).
  // Both must hold the declared element count and stay valid and untouched
  // until the handle completes.
  virtual Handle pushPull(const std::string& name, DType dtype, uint64_t numElements,
                          const void* input, void* output, ReduceOp op, int priority) = 0;

  // Sums a sparse tensor (declared with TensorOptions::sparse) across
  // workers into `output`, the declared count of floats, which stays valid
  // and untouched until the handle completes; elements that no worker sent
  // are zero. The input is consumed before the call returns. An index out of
  // range throws kInvalidArgument naming the tensor and the position.
  virtual Handle pushPullSparse(const std::string& name, const SparseInput& input, float* output,
                                ReduceOp op, int priority) = 0;

  // The chunks a declared tensor is pushed in (placement order).
  virtual std::vector<ChunkSpan> chunks(const std::string& name) const = 0;

  // One round of a declared tensor with caller-prepared data (see Exchange):
  // no encoding, error feedback or averaging here. Buffers stay valid until
  // the handle completes. Misuse throws kInvalidArgument naming the tensor.
  virtual Handle exchange(const std::string& name, Exchange ex, int priority) = 0;

  // This worker is done with a declared tensor: no round of it is in flight
  // (throws kInvalidArgument otherwise) and none will start (a later
  // pushPull or exchange of it throws kInvalidArgument). Each of its chunks'
  // servers frees the chunk's state (sum, answer, residual) once every
  // worker that pushes it has released it, so call it only after this
  // worker's last round of the tensor completed. Its own error-feedback
  // residuals are dropped. The plan executor releases a replaced plan's
  // shard keys (Executor::setPlan). Releasing twice is harmless. Declaring
  // the name again afterwards makes a new tensor (any shape or codec) with a
  // new key: every worker that pushes it must release and declare it again,
  // in the same order as its other declarations.
  virtual void release(const std::string& name) = 0;
  // release() for a tensor that this worker declared but does not push (a
  // key of TensorOptions::contributors that other workers push, such as the
  // plan executor's shard key of another local rank): released on this
  // worker alone, nothing sent, since its servers count only its pushers'
  // releases. Every worker that declared a name must release it one way or
  // the other before any declares it again: a worker that did not would
  // take the old key while the others wait for it to agree on a new one.
  virtual void releaseHere(const std::string& name) = 0;

  virtual void barrier(Deadline deadline) = 0;

  // The first failure, or OK.
  virtual Status failure() const = 0;

  // Bytes of tensor data this worker put into pushes so far, and received
  // in the servers' answers: raw elements (through shared memory too), or
  // the codec payloads as they went on the wire (the compact form where it
  // was sent), or Zen's pair lists and answers. The messages' framing (the
  // data header, a compressed push's codec and tensor names) is not counted.
  virtual uint64_t pushedBytes() const = 0;
  virtual uint64_t pulledBytes() const = 0;

  // Fails every pending and queued operation and every later call with
  // `why` (the first failure wins), as a dead peer would. For a caller that
  // gave up on an operation (a timeout) and cannot let it finish later: its
  // answers are dropped from then on, so the buffers it named may be freed
  // once this returns.
  virtual void abort(const Status& why) = 0;

  // Orderly end: tells the scheduler this worker is done and waits for the
  // job's shutdown (every worker done) until the deadline, then closes.
  virtual void shutdown(Deadline deadline) = 0;
};

}  // namespace cortado
