#include "core/worker.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <unordered_map>

#include "compressor/error_feedback.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "compressor/registry.h"
#include "core/common/logging.h"
#include "core/common/reduce.h"
#include "core/partition.h"
#include "core/shm/shm_segment.h"
#include "core/wire/data_message.h"

namespace cortado {

struct Handle::State {
  std::string name;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  size_t remaining = 0;  // chunks not yet back; guarded by mu

  // Completes once; the first error wins.
  void complete(const Status& s) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (done) return;
      done = true;
      status = s;
    }
    cv.notify_all();
  }
};

bool Handle::poll() const {
  CORTADO_ENFORCE(state_, ErrorCode::kInvalidArgument, "poll() on an empty handle");
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->done;
}

Status Handle::wait(Deadline deadline) const {
  CORTADO_ENFORCE(state_, ErrorCode::kInvalidArgument, "wait() on an empty handle");
  std::unique_lock<std::mutex> lk(state_->mu);
  if (!state_->cv.wait_until(lk, deadline.at(), [&] { return state_->done; })) {
    return Status(ErrorCode::kTimeout,
                  fmt::format("push_pull of tensor '{}' did not complete before the deadline "
                              "(a worker that never pushes it, or a slow peer?)",
                              state_->name));
  }
  return state_->status;
}

const std::string& Handle::tensorName() const { return state_->name; }

namespace {

using transport::Message;
using wire::DataHeader;
using wire::Op;

struct TensorEntry {
  std::string name;
  DType dtype;
  uint64_t numElements;
  uint64_t key;
  std::vector<Chunk> chunks;
  std::vector<shm::Region> regions;  // per chunk; data == nullptr: send bytes
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
};

struct ChunkOp {
  std::shared_ptr<Task> task;
  size_t chunk;
  uint64_t seq;
  uint64_t bytes;
};

struct ByPriority {
  bool operator()(const ChunkOp& a, const ChunkOp& b) const {
    if (a.task->priority != b.task->priority) return a.task->priority < b.task->priority;
    return a.seq > b.seq;  // FIFO among equals
  }
};

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(WorkerOptions opts, std::unique_ptr<transport::Transport> t)
      : opts_(std::move(opts)), transport_(std::move(t)) {
    codecs_ = opts_.codecs;
    if (!codecs_) {
      auto r = std::make_shared<compressor::Registry>();
      compressor::registerCpuCodecs(*r);
      codecs_ = std::move(r);
    }
  }

  ~WorkerImpl() override { closeAll(); }

  void start(control::ClientOptions copts, Deadline deadline) {
    transport_->setCallbacks([this](Message&& m) { onMessage(std::move(m)); },
                             [this](const NodeId& peer, const Status& s) { onPeerError(peer, s); });
    copts.role = Role::kWorker;
    copts.dataAddress = transport_->listen(opts_.listenAddress);
    control_ = control::ControlClient::create(copts);
    control_->setFailureCallback([this](const Status& s) { failAll(s); });
    book_ = control_->connect(deadline);
    self_ = control_->self();
    CORTADO_ENFORCE(!book_.servers.empty(), ErrorCode::kInvalidArgument,
                    "the job has no servers: start at least one (CORTADO_NUM_SERVERS >= 1)");
    for (const auto& s : book_.servers) transport_->connect(s.id, s.dataAddress);
    placement_ = std::make_unique<ServerPlacement>(static_cast<int>(book_.servers.size()));
    if (opts_.sharedMemory) {
      const std::string prefix = shm::jobPrefix(copts.token);
      const std::string& myHost = book_.workers.at(self_.rank).hostname;
      for (const auto& s : book_.servers)
        sameHost_.push_back(s.sharedMemory && s.hostname == myHost);
      arena_ = std::make_unique<shm::Arena>(prefix, self_);
      peerShm_ = std::make_unique<shm::PeerMappings>(prefix);
    } else {
      sameHost_.assign(book_.servers.size(), false);
    }
    dispatcher_ = std::thread([this] { dispatchLoop(); });
    CORTADO_LOG_INFO("worker {} of {} ready, {} servers, transport {}", self_.rank,
                     book_.workers.size(), book_.servers.size(), transport_->name());
  }

  int rank() const override { return self_.rank; }
  int size() const override { return static_cast<int>(book_.workers.size()); }
  int numServers() const override { return static_cast<int>(book_.servers.size()); }
  const control::AddressBook& addressBook() const override { return book_; }
  control::ControlClient& controlClient() override { return *control_; }

  uint64_t declare(const std::string& name, DType dtype, uint64_t numElements,
                   const TensorOptions& options, Deadline deadline) override {
    auto entry = std::make_unique<TensorEntry>();
    entry->name = name;
    entry->dtype = dtype;
    entry->numElements = numElements;
    entry->options = options;
    if (!options.codec.empty()) setUpCodec(*entry);
    const bool ef = entry->codec && options.errorFeedback;
    {
      std::lock_guard<std::mutex> lk(mu_);
      checkFailedLocked();
      if (auto it = tensors_.find(name); it != tensors_.end() && it->second->released) {
        // Declared again after its release: a new tensor under the old name
        // (any shape), with a new key, so that nothing of the old one's
        // server state, freed or not yet, is reused.
        entry->incarnation = it->second->incarnation + 1;
      } else if (it != tensors_.end()) {
        const auto& t = *it->second;
        CORTADO_ENFORCE(t.dtype == dtype && t.numElements == numElements,
                        ErrorCode::kInvalidArgument,
                        "worker {}: tensor '{}' was declared with {} elements of {}, now with {} "
                        "elements of {}: a name must keep its shape",
                        self_.rank, name, t.numElements, dtypeName(t.dtype), numElements,
                        dtypeName(dtype));
        CORTADO_ENFORCE(t.codecSpec == entry->codecSpec && (t.ef != nullptr) == ef,
                        ErrorCode::kInvalidArgument,
                        "worker {}: tensor '{}' was declared with codec '{}'{}, now with codec "
                        "'{}'{}: a name must keep its compression",
                        self_.rank, name, t.codecSpec.empty() ? "none" : t.codecSpec,
                        t.ef ? " and error feedback" : "",
                        entry->codecSpec.empty() ? "none" : entry->codecSpec,
                        ef ? " and error feedback" : "");
        return t.key;
      }
    }
    control::TensorDecl decl{name, dtype, numElements, entry->codecSpec, ef};
    decl.incarnation = entry->incarnation;
    uint64_t key = control_->declare(decl, deadline);
    entry->key = key;
    if (ef) entry->ef = std::make_unique<compressor::ErrorFeedback>(entry->codec);
    std::lock_guard<std::mutex> lk(mu_);
    // Placement runs in declaration order, the same on every worker.
    entry->chunks = placement_->place(key, numElements, dtypeSize(dtype), opts_.partitionBytes);
    entry->regions.resize(entry->chunks.size());
    for (size_t i = 0; i < entry->chunks.size(); ++i) {
      const Chunk& c = entry->chunks[i];
      // Compressed chunks travel as bytes: their payloads are small.
      if (!sameHost_[c.server] || c.numElements == 0 || entry->codec) continue;
      try {
        entry->regions[i] = arena_->allocate(c.numElements * dtypeSize(dtype));
      } catch (const Error& e) {
        // Out of shared memory: this chunk travels as bytes instead.
        CORTADO_LOG_WARN("worker {}: tensor '{}' chunk {} goes over the socket: {}", self_.rank,
                         name, i, e.what());
      }
    }
    tensors_[name] = std::move(entry);
    return key;
  }

  // Validates the tensor's codec spec and builds the codec; throws
  // kInvalidArgument naming the tensor and what is valid.
  void setUpCodec(TensorEntry& t) {
    CORTADO_ENFORCE(t.dtype == DType::kFloat32, ErrorCode::kInvalidArgument,
                    "worker {}: tensor '{}' is {}, but codec '{}' compresses float32 tensors "
                    "only: declare it as float32 or without a codec",
                    self_.rank, t.name, dtypeName(t.dtype), t.options.codec);
    try {
      t.codecSpec = codecs_->canonical(t.options.codec);
      t.codec = codecs_->create(t.codecSpec);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("worker {}: tensor '{}': {}", self_.rank, t.name,
                                        e.what()));
    }
    CORTADO_ENFORCE(t.codec->id() != compressor::CodecId::kPowerSgd, ErrorCode::kInvalidArgument,
                    "worker {}: tensor '{}': powersgd needs a matrix shape and two reductions "
                    "per round, which push-pull does not run; choose another codec (e.g. "
                    "'topk:ratio=0.01' or 'fp16')",
                    self_.rank, t.name);
    wire::compressedPreambleBytes(t.codecSpec, t.name);  // checks the lengths
    if (t.codec->sparse()) t.sparseDecoder = codecs_->create("topk");
  }

  // Seeds of one chunk's round. Random-k needs the same one on every worker
  // (its indices follow from it, so payloads line up); the stochastic
  // quantizers need independent ones per worker.
  static uint64_t sharedSeed(uint64_t chunkKey, uint64_t round) {
    return compressor::format::hash2(chunkKey, round);
  }
  uint64_t encodeSeed(const TensorEntry& t, uint64_t chunkKey, uint64_t round) const {
    uint64_t shared = sharedSeed(chunkKey, round);
    if (t.codec->id() == compressor::CodecId::kRandomK) return shared;
    return compressor::format::hash2(shared, static_cast<uint64_t>(self_.rank) + 1);
  }

  bool isDeclared(const std::string& name) const override {
    std::lock_guard<std::mutex> lk(mu_);
    return tensors_.count(name) > 0;
  }

  // Under mu_: the declared tensor `name`, or kInvalidArgument naming `what`
  // (the operation asked for).
  TensorEntry& tensorLocked(const std::string& name, const char* what) const {
    auto it = tensors_.find(name);
    CORTADO_ENFORCE(it != tensors_.end(), ErrorCode::kInvalidArgument,
                    "worker {}: {} of tensor '{}', which was never declared", self_.rank, what, name);
    return *it->second;
  }

  // Under mu_: refuses a second operation on a tensor that has one in
  // flight, then gives `task` its handle, tensor and round and queues every
  // chunk of it.
  void enqueueLocked(TensorEntry& t, const std::shared_ptr<Handle::State>& state,
                     const std::shared_ptr<Task>& task) {
    CORTADO_ENFORCE(!t.inFlight, ErrorCode::kInvalidArgument,
                    "worker {}: tensor '{}' already has a push_pull in flight; wait for its "
                    "handle before starting another",
                    self_.rank, t.name);
    CORTADO_ENFORCE(!t.released, ErrorCode::kInvalidArgument,
                    "worker {}: tensor '{}' was released (its server state is freed); declare "
                    "it again to use the name for a new tensor",
                    self_.rank, t.name);
    t.inFlight = true;
    task->handle = state;
    task->tensor = &t;
    task->round = t.round++;
    state->remaining = t.chunks.size();
    for (size_t i = 0; i < t.chunks.size(); ++i)
      queue_.push(ChunkOp{task, i, seq_++, t.chunks[i].numElements * dtypeSize(t.dtype)});
  }

  Handle pushPull(const std::string& name, DType dtype, uint64_t numElements, const void* input,
                  void* output, ReduceOp op, int priority) override {
    auto state = std::make_shared<Handle::State>();
    state->name = name;
    {
      std::lock_guard<std::mutex> lk(mu_);
      checkFailedLocked();
      TensorEntry& t = tensorLocked(name, "push_pull");
      CORTADO_ENFORCE(t.dtype == dtype && t.numElements == numElements,
                      ErrorCode::kInvalidArgument,
                      "worker {}: push_pull of tensor '{}' with {} elements of {}, but it was "
                      "declared with {} elements of {}",
                      self_.rank, name, numElements, dtypeName(dtype), t.numElements,
                      dtypeName(t.dtype));
      CORTADO_ENFORCE(numElements == 0 || (input != nullptr && output != nullptr),
                      ErrorCode::kInvalidArgument, "push_pull of tensor '{}': null buffer", name);
      auto task = std::make_shared<Task>();
      task->input = static_cast<const uint8_t*>(input);
      task->output = static_cast<uint8_t*>(output);
      task->op = op;
      task->priority = priority;
      enqueueLocked(t, state, task);
    }
    cv_.notify_all();
    return Handle(state);
  }

  std::vector<ChunkSpan> chunks(const std::string& name) const override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<ChunkSpan> out;
    for (const Chunk& c : tensorLocked(name, "chunks").chunks) out.push_back({c.offset, c.numElements});
    return out;
  }

  Handle exchange(const std::string& name, Exchange ex, int priority) override {
    auto state = std::make_shared<Handle::State>();
    state->name = name;
    {
      std::lock_guard<std::mutex> lk(mu_);
      checkFailedLocked();
      TensorEntry& t = tensorLocked(name, "exchange");
      const bool compressedIn = !ex.payloads.empty();
      CORTADO_ENFORCE(compressedIn != (ex.rawInput != nullptr || t.numElements == 0),
                      ErrorCode::kInvalidArgument,
                      "worker {}: exchange of tensor '{}' needs raw input or payloads, not {}",
                      self_.rank, name, compressedIn ? "both" : "neither");
      CORTADO_ENFORCE((ex.answers != nullptr) != (ex.rawOutput != nullptr || t.numElements == 0),
                      ErrorCode::kInvalidArgument,
                      "worker {}: exchange of tensor '{}' needs a raw output or an answer list, "
                      "not {}",
                      self_.rank, name, ex.answers ? "both" : "neither");
      CORTADO_ENFORCE(!(compressedIn || ex.answers) || t.codec, ErrorCode::kInvalidArgument,
                      "worker {}: exchange of tensor '{}' with compressed data, but the tensor "
                      "was declared without a codec",
                      self_.rank, name);
      CORTADO_ENFORCE(!compressedIn || ex.payloads.size() == t.chunks.size(),
                      ErrorCode::kInvalidArgument,
                      "worker {}: exchange of tensor '{}' with payloads for {} chunks; it has {}",
                      self_.rank, name, ex.payloads.size(), t.chunks.size());
      CORTADO_ENFORCE(!opts_.async, ErrorCode::kInvalidArgument,
                      "worker {}: exchange of tensor '{}': plan execution needs the servers in "
                      "sync mode (CORTADO_ASYNC=0)",
                      self_.rank, name);
      auto task = std::make_shared<Task>();
      task->input = static_cast<const uint8_t*>(ex.rawInput);
      task->output = static_cast<uint8_t*>(ex.rawOutput);
      task->op = ReduceOp::kSum;
      task->priority = priority;
      task->exchange = true;
      task->payloads = std::move(ex.payloads);
      task->answers = ex.answers;
      task->flushResidual = ex.flushResidual;
      if (task->answers) task->answers->assign(t.chunks.size(), ExchangeAnswer{});
      enqueueLocked(t, state, task);
    }
    cv_.notify_all();
    return Handle(state);
  }

  void release(const std::string& name) override {
    std::vector<std::pair<NodeId, Message>> out;
    {
      std::lock_guard<std::mutex> lk(mu_);
      checkFailedLocked();
      TensorEntry& t = tensorLocked(name, "release");
      CORTADO_ENFORCE(!t.inFlight, ErrorCode::kInvalidArgument,
                      "worker {}: tensor '{}' has a push_pull in flight; wait for its handle "
                      "before releasing it",
                      self_.rank, name);
      if (t.released) return;
      t.released = true;
      t.ef.reset();  // its residuals: nothing pushes it again
      // Its push regions: the servers read them before they answered.
      for (size_t i = 0; arena_ && i < t.regions.size(); ++i)
        arena_->free(t.regions[i], t.chunks[i].numElements * dtypeSize(t.dtype));
      t.regions.assign(t.regions.size(), shm::Region());
      for (const Chunk& c : t.chunks) {
        DataHeader h;
        h.op = Op::kRelease;
        h.dtype = t.dtype;
        h.flags = opts_.async ? wire::kFlagAsync : wire::kFlagNone;
        h.key = c.key;
        h.round = t.round;
        h.numElements = c.numElements;
        h.contributors = t.options.contributors;
        Message m;
        m.parts.push_back(wire::encodeHeader(h));
        m.parts.push_back(Buffer());
        out.emplace_back(book_.servers[c.server].id, std::move(m));
      }
    }
    for (auto& [to, m] : out) {
      try {
        transport_->send(to, std::move(m));
      } catch (const std::exception& e) {
        // Only memory on that server is at stake, not a result.
        CORTADO_LOG_WARN("worker {}: could not tell {} that tensor '{}' is released: {}",
                         self_.rank, to.toString(), name, e.what());
      }
    }
  }

  void barrier(Deadline deadline) override {
    control_->barrier(control::Group::kWorkers, "worker-barrier", deadline);
  }

  Status failure() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return failure_;
  }

  void abort(const Status& why) override {
    failAll(why);
    // An answer popped before failAll() may still be being written; once
    // none is, no answer of this worker's operations touches memory again.
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::seconds(10), [this] { return writing_ == 0; })) {
      CORTADO_LOG_ERROR("worker {}: an answer was still being written 10 s after abort()",
                        self_.rank);
    }
  }

  void shutdown(Deadline deadline) override {
    // Servers go away as the job ends: that is no failure.
    closing_ = true;
    if (control_ && failure().ok()) {
      control_->finish();
      if (!control_->waitShutdown(deadline)) {
        CORTADO_LOG_WARN("worker {}: no shutdown from the scheduler before the deadline",
                         self_.rank);
      }
    }
    closeAll();
  }

 private:
  void checkFailedLocked() const {
    if (!failure_.ok()) throw Error(failure_.code(), failure_.message());
    if (closed_) throw Error(ErrorCode::kClosed, "the worker was shut down");
  }

  void closeAll() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    if (dispatcher_.joinable()) dispatcher_.join();
    if (transport_) transport_->close();
    if (control_) control_->close();
    failAll(Status(ErrorCode::kClosed, "the worker was shut down"));
  }

  // Sends chunks in priority order while the credits allow.
  void dispatchLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      auto ready = [&] {
        return closed_ || (!queue_.empty() &&
                           (inFlightBytes_ == 0 ||
                            inFlightBytes_ + queue_.top().bytes <= opts_.maxBytesInFlight));
      };
      if (peerLossAt_) {
        if (!cv_.wait_until(lk, *peerLossAt_, ready)) {
          // The grace period passed and nobody named another cause.
          Status loss = peerLoss_;
          peerLossAt_.reset();
          lk.unlock();
          failAll(loss);
          lk.lock();
          continue;
        }
      } else {
        cv_.wait(lk, ready);
      }
      if (closed_) return;
      ChunkOp op = queue_.top();
      queue_.pop();
      if (!failure_.ok()) continue;  // failAll() completed its handle
      inFlightBytes_ += op.bytes;
      uint32_t id = nextRequest_++;
      if (nextRequest_ == 0) nextRequest_ = 1;  // 0 means "no request" in replies
      pending_.emplace(id, op);
      lk.unlock();
      sendChunk(op, id);
      lk.lock();
    }
  }

  void sendChunk(const ChunkOp& op, uint32_t id) {
    const TensorEntry& t = *op.task->tensor;
    const Chunk& c = t.chunks[op.chunk];
    const size_t esz = dtypeSize(t.dtype);
    const NodeId server = book_.servers[c.server].id;
    DataHeader h;
    h.dtype = t.dtype;
    h.flags = opts_.async ? wire::kFlagAsync : wire::kFlagNone;
    if (op.task->flushResidual) h.flags |= wire::kFlagFlushResidual;
    h.requestId = id;
    h.key = c.key;
    h.round = op.task->round;
    h.numElements = c.numElements;
    h.contributors = t.options.contributors;
    const Task& task = *op.task;
    try {
      h.op = Op::kPush;
      Message push;
      const shm::Region& region = t.regions[op.chunk];
      const bool compressed =
          c.numElements > 0 && (task.exchange ? !task.payloads.empty() : t.codec != nullptr);
      if (compressed && task.exchange) {
        const size_t pre = wire::compressedPreambleBytes(t.codecSpec, t.name);
        const Buffer& payloads = task.payloads[op.chunk];
        Buffer body = Buffer::allocate(pre + payloads.size());
        wire::writeCompressedPreamble(body.data(), t.codecSpec, t.name);
        if (payloads.size() > 0) std::memcpy(body.data() + pre, payloads.data(), payloads.size());
        h.flags |= wire::kFlagCompressed;
        if (!task.answers) h.flags |= wire::kFlagDenseAnswer;
        if (t.options.errorFeedback) h.flags |= wire::kFlagErrorFeedback;
        h.bodyBytes = body.size();
        push.parts.push_back(wire::encodeHeader(h));
        push.parts.push_back(std::move(body));
      } else if (compressed) {
        // Encoded here, so the input is not needed after this call.
        const size_t pre = wire::compressedPreambleBytes(t.codecSpec, t.name);
        const size_t payloadBytes = t.codec->payloadBytes(c.numElements);
        Buffer body = Buffer::allocate(pre + payloadBytes);
        wire::writeCompressedPreamble(body.data(), t.codecSpec, t.name);
        std::span<std::byte> out(reinterpret_cast<std::byte*>(body.data() + pre), payloadBytes);
        const float* in = reinterpret_cast<const float*>(op.task->input) + c.offset;
        compressor::EncodeContext ctx;
        ctx.seed = encodeSeed(t, c.key, op.task->round);
        size_t wrote = t.ef ? t.ef->encode(op.chunk, in, c.numElements, out, ctx)
                            : t.codec->encode(in, c.numElements, out, ctx);
        CORTADO_ENFORCE(wrote == payloadBytes, ErrorCode::kInternal,
                        "codec '{}' wrote {} bytes for {} elements, declared {}", t.codecSpec,
                        wrote, c.numElements, payloadBytes);
        h.flags |= wire::kFlagCompressed;
        if (t.options.errorFeedback) h.flags |= wire::kFlagErrorFeedback;
        h.bodyBytes = body.size();
        push.parts.push_back(wire::encodeHeader(h));
        push.parts.push_back(std::move(body));
      } else if (region.data) {
        // Same host: the server sums straight from our shared memory. The
        // region is ours again once this round's answer is back.
        std::memcpy(region.data, op.task->input + c.offset * esz, c.numElements * esz);
        shm::Descriptor d{region.segment, 0, region.offset};
        h.flags |= wire::kFlagShm;
        h.bodyBytes = sizeof(d);
        push.parts.push_back(wire::encodeHeader(h));
        push.parts.push_back(Buffer::copyOf(&d, sizeof(d)));
      } else {
        h.bodyBytes = c.numElements * esz;
        push.parts.push_back(wire::encodeHeader(h));
        // Zero-copy: the caller keeps the input alive until the handle completes.
        push.parts.push_back(Buffer::wrap(const_cast<uint8_t*>(op.task->input) + c.offset * esz,
                                          h.bodyBytes, op.task));
      }
      transport_->send(server, std::move(push));
      h.op = Op::kPull;
      h.bodyBytes = 0;
      h.contributors = 0;
      // Ask a same-host server to answer through its shared memory too.
      h.flags = static_cast<uint8_t>(
          (opts_.async ? wire::kFlagAsync : wire::kFlagNone) |
          (sameHost_[c.server] && !compressed && !task.answers ? wire::kFlagShm : wire::kFlagNone));
      Buffer pullBody;
      if (task.answers && !compressed && c.numElements > 0) {
        // A raw key's sum in the codec's form: the pull names the codec.
        pullBody = Buffer::allocate(wire::compressedPreambleBytes(t.codecSpec, t.name));
        wire::writeCompressedPreamble(pullBody.data(), t.codecSpec, t.name);
        h.flags |= wire::kFlagCompressed;
        if (t.options.errorFeedback) h.flags |= wire::kFlagErrorFeedback;
        h.bodyBytes = pullBody.size();
      }
      Message pull;
      pull.parts.push_back(wire::encodeHeader(h));
      pull.parts.push_back(std::move(pullBody));
      transport_->send(server, std::move(pull));
    } catch (const Error& e) {
      finishChunk(id, Status(e.code(), fmt::format("push_pull of tensor '{}' to {}: {}", t.name,
                                                   server.toString(), e.what())),
                  nullptr);
    }
  }

  void onMessage(Message&& m) {
    if (m.parts.size() != 2) {
      CORTADO_LOG_WARN("worker {}: dropping a {}-part message from {}", self_.rank,
                       m.parts.size(), m.from.toString());
      return;
    }
    DataHeader h;
    try {
      h = wire::decodeHeader(m.parts[0], m.parts[1].size());
    } catch (const Error& e) {
      CORTADO_LOG_WARN("worker {}: malformed message from {}: {}", self_.rank, m.from.toString(),
                       e.what());
      return;
    }
    switch (h.op) {
      case Op::kPullResponse:
        finishChunk(h.requestId, Status(), &m, &h);
        return;
      case Op::kPushAck:
        return;
      case Op::kError: {
        std::string text(reinterpret_cast<const char*>(m.parts[1].data()), m.parts[1].size());
        std::string name = tensorOfRequest(h.requestId);
        Status s(ErrorCode::kMismatch, fmt::format("{} refused tensor '{}' (key {}): {}",
                                                   m.from.toString(), name, h.key, text));
        // A request id of 0 may not be ours: fail everything, the job is broken.
        if (!finishChunk(h.requestId, s, nullptr)) failAll(s);
        return;
      }
      default:
        CORTADO_LOG_WARN("worker {}: unexpected {} from {}", self_.rank, wire::opName(h.op),
                         m.from.toString());
    }
  }

  std::string tensorOfRequest(uint32_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pending_.find(id);
    return it == pending_.end() ? std::string("?") : it->second.task->tensor->name;
  }

  // Completes one chunk (with the response, or with an error). Returns false
  // when the request id is unknown.
  bool finishChunk(uint32_t id, const Status& status, Message* m, const DataHeader* h = nullptr) {
    ChunkOp op;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return false;
      op = std::move(it->second);
      pending_.erase(it);
      inFlightBytes_ -= op.bytes;
      ++writing_;  // abort() waits until this answer is written
    }
    cv_.notify_all();
    struct Written {
      WorkerImpl* w;
      ~Written() {
        {
          std::lock_guard<std::mutex> lk(w->mu_);
          --w->writing_;
        }
        w->cv_.notify_all();
      }
    } written{this};
    Task& task = *op.task;
    TensorEntry& t = *task.tensor;
    const Chunk& c = t.chunks[op.chunk];
    Status s = status;
    if (s.ok() && m) {
      const size_t esz = dtypeSize(t.dtype);
      if (h->key != c.key || h->numElements != c.numElements || h->dtype != t.dtype ||
          (!opts_.async && h->round != task.round)) {
        s = Status(ErrorCode::kProtocol,
                   fmt::format("tensor '{}': {} answered key {} round {} ({} x {}) for key {} "
                               "round {} ({} x {})",
                               t.name, m->from.toString(), h->key, h->round, h->numElements,
                               dtypeName(h->dtype), c.key, task.round, c.numElements,
                               dtypeName(t.dtype)));
      } else if (task.answers) {
        (*task.answers)[op.chunk] =
            ExchangeAnswer{m->parts[1], (h->flags & wire::kFlagCompressed) != 0};
      } else if (c.numElements > 0) {
        try {
          CORTADO_ENFORCE(!task.exchange || !(h->flags & wire::kFlagCompressed),
                          ErrorCode::kProtocol,
                          "{} answered a dense pull with a compressed payload", m->from.toString());
          const uint8_t* src = m->parts[1].data();
          if (h->flags & wire::kFlagCompressed) {
            decodeAnswer(t, task, c, *m);
            src = nullptr;
          } else if (h->flags & wire::kFlagShm) {
            CORTADO_ENFORCE(peerShm_ != nullptr, ErrorCode::kProtocol,
                            "{} answered through shared memory, which this worker has off",
                            m->from.toString());
            shm::Descriptor d;
            std::memcpy(&d, src, sizeof(d));
            src = peerShm_->resolve(m->from, d.segment, d.offset, c.numElements * esz);
          }
          uint8_t* dst = task.output + c.offset * esz;
          if (src == nullptr) {
            // decoded in place
          } else if (task.op == ReduceOp::kAverage) {
            divideInto(t.dtype, dst, src, c.numElements, size());
          } else {
            std::memcpy(dst, src, c.numElements * esz);
          }
        } catch (const Error& e) {
          s = Status(e.code(), fmt::format("tensor '{}': {}", t.name, e.what()));
        }
      }
    }
    // The handle completes when the last chunk is back, never earlier: a
    // chunk still on its way must not write into an output that the caller
    // already took back. The first error wins.
    bool last = false;
    Status result;
    {
      std::lock_guard<std::mutex> lk(task.handle->mu);
      if (!s.ok() && task.firstError.ok()) task.firstError = s;
      last = --task.handle->remaining == 0;
      result = task.firstError;
    }
    if (last) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        t.inFlight = false;
      }
      task.handle->complete(result);
    }
    return true;
  }

  // A compressed answer: the tensor's codec payload, or (sparse codecs) the
  // servers' lossless sparse sum in top-k form. Validated before anything is
  // written; throws kProtocol naming the server.
  void decodeAnswer(const TensorEntry& t, const Task& task, const Chunk& c, const Message& m) {
    CORTADO_ENFORCE(t.codec != nullptr, ErrorCode::kProtocol,
                    "{} answered with a compressed payload, but the tensor is uncompressed",
                    m.from.toString());
    std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(m.parts[1].data()),
                                       m.parts[1].size());
    compressor::PayloadHeader ph;
    try {
      ph = compressor::parseHeader(payload);
    } catch (const Error& e) {
      throw Error(ErrorCode::kProtocol,
                  fmt::format("malformed answer from {}: {}", m.from.toString(), e.what()));
    }
    const compressor::Codec* dec = nullptr;
    if (ph.codec == t.codec->id()) dec = t.codec.get();
    else if (ph.codec == compressor::CodecId::kTopK && t.sparseDecoder) dec = t.sparseDecoder.get();
    CORTADO_ENFORCE(dec != nullptr, ErrorCode::kProtocol,
                    "{} answered with a {} payload for a tensor compressed with '{}'",
                    m.from.toString(), compressor::codecIdName(ph.codec), t.codecSpec);
    float* dst = reinterpret_cast<float*>(task.output) + c.offset;
    try {
      dec->decode(payload, dst, c.numElements);
    } catch (const Error& e) {
      throw Error(ErrorCode::kProtocol,
                  fmt::format("malformed answer from {}: {}", m.from.toString(), e.what()));
    }
    if (task.op == ReduceOp::kAverage) divideInto(t.dtype, dst, dst, c.numElements, size());
  }

  // A server lost on the data plane is often an effect, not the cause: a
  // server exits when the scheduler declares another node dead, and its
  // sockets close before the scheduler's word reaches us. So the loss fails
  // the worker only after a grace period, unless the control plane names the
  // root cause first (failAll from its callback wins).
  static constexpr Millis kPeerLossGrace{3000};

  void onPeerError(const NodeId& peer, const Status& s) {
    if (peer.role != Role::kServer || closing_) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (!failure_.ok() || peerLossAt_) return;
    peerLoss_ = Status(ErrorCode::kPeerDead,
                       fmt::format("worker {} lost {}: {}", self_.rank, peer.toString(), s.message()));
    peerLossAt_ = Clock::now() + kPeerLossGrace;
    cv_.notify_all();
  }

  // Fails every pending and queued operation, and all later calls.
  void failAll(const Status& s) {
    std::vector<std::shared_ptr<Handle::State>> handles;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (failure_.ok() && s.code() != ErrorCode::kClosed) {
        failure_ = s;
        CORTADO_LOG_ERROR("worker {}: {}", self_.rank, s.message());
      }
      for (auto& [id, op] : pending_) handles.push_back(op.task->handle);
      pending_.clear();
      inFlightBytes_ = 0;
      while (!queue_.empty()) {
        handles.push_back(queue_.top().task->handle);
        queue_.pop();
      }
      for (auto& [n, t] : tensors_) t->inFlight = false;
    }
    cv_.notify_all();
    for (auto& h : handles) {
      h->complete(Status(s.code(), fmt::format("tensor '{}': {}", h->name, s.message())));
    }
  }

  WorkerOptions opts_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<control::ControlClient> control_;
  control::AddressBook book_;
  NodeId self_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<TensorEntry>> tensors_;
  std::unique_ptr<ServerPlacement> placement_;
  std::shared_ptr<const compressor::Registry> codecs_;
  std::vector<bool> sameHost_;                      // per server
  std::unique_ptr<shm::Arena> arena_;               // our push regions
  std::unique_ptr<shm::PeerMappings> peerShm_;      // servers' result regions
  std::priority_queue<ChunkOp, std::vector<ChunkOp>, ByPriority> queue_;
  std::unordered_map<uint32_t, ChunkOp> pending_;
  uint64_t inFlightBytes_ = 0;
  int writing_ = 0;  // answers popped from pending_ and not yet written
  uint64_t seq_ = 0;
  uint32_t nextRequest_ = 1;
  Status failure_;
  Status peerLoss_;                              // see onPeerError
  std::optional<Clock::time_point> peerLossAt_;
  bool closed_ = false;
  std::atomic<bool> closing_{false};
  std::thread dispatcher_;
};

}  // namespace

std::unique_ptr<Worker> Worker::start(WorkerOptions opts, control::ClientOptions control,
                                      std::unique_ptr<transport::Transport> transport,
                                      Deadline deadline) {
  CORTADO_ENFORCE(transport != nullptr, ErrorCode::kInvalidArgument, "worker needs a transport");
  auto w = std::make_unique<WorkerImpl>(std::move(opts), std::move(transport));
  w->start(std::move(control), deadline);
  return w;
}

}  // namespace cortado
