// The worker (core/worker.h; the class in worker_impl.h): handles, tensor
// declarations, push_pull and exchange, release, and the worker's life. The
// data path is in worker_data.cc.
#include "core/worker_impl.h"

namespace cortado {

bool Handle::poll() const {
  CORTADO_ENFORCE(state_, ErrorCode::kInvalidArgument, "poll() on an empty handle");
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->done;
}

Status Handle::wait(Deadline deadline) const {
  CORTADO_ENFORCE(state_, ErrorCode::kInvalidArgument, "wait() on an empty handle");
  // Busy polling (WorkerOptions::busyPoll): the answer often comes within
  // microseconds, sooner than a sleeping thread wakes. Yielding lets the
  // threads that bring it run on a core this one shares.
  if (state_->busyPoll.count() > 0 && !state_->doneFlag.load(std::memory_order_acquire)) {
    const auto until = std::min(Clock::now() + state_->busyPoll, deadline.at());
    while (!state_->doneFlag.load(std::memory_order_acquire) && Clock::now() < until)
      std::this_thread::yield();
  }
  // The answer taken from the transport on this thread, where it can
  // (WaitReceiver; the shared-memory rings: CORTADO_SHM_WAITER_RECEIVES).
  if (state_->receiver && !state_->doneFlag.load(std::memory_order_acquire)) {
    State* s = state_.get();
    s->receiving.fetch_add(1, std::memory_order_seq_cst);
    s->receiver->receive([s] { return s->doneFlag.load(std::memory_order_seq_cst); },
                         deadline.at());
    s->receiving.fetch_sub(1, std::memory_order_seq_cst);
  }
  std::unique_lock<std::mutex> lk(state_->mu);
  if (!state_->cv.wait_until(lk, deadline.at(), [&] { return state_->done; })) {
    // The scheduler's word on this tensor's stalled round, when it came.
    auto note =
        state_->stalls ? state_->stalls->find(state_->tensorKey, state_->round) : std::nullopt;
    if (note)
      return Status(ErrorCode::kTimeout,
                    fmt::format("push_pull of tensor '{}' did not complete before the deadline. "
                                "The scheduler reported: {} Every worker must push the same "
                                "tensors in the same order.",
                                state_->name, *note));
    return Status(ErrorCode::kTimeout,
                  fmt::format("push_pull of tensor '{}' did not complete before the deadline: a "
                              "worker that never pushes it or pushes its tensors in another "
                              "order, or a slow peer (a round that waits longer than "
                              "CORTADO_STALL_CHECK_MS is reported in the scheduler's log with "
                              "the workers it waits for)",
                              state_->name));
  }
  return state_->status;
}

const std::string& Handle::tensorName() const { return state_->name; }

uint64_t Handle::pushedBytes() const {
  return state_ ? state_->pushedBytes.load(std::memory_order_relaxed) : 0;
}
                                      
                                      namespace detail {

WorkerImpl::WorkerImpl(WorkerOptions opts, std::unique_ptr<transport::Transport> t)
    : opts_(std::move(opts)), transport_(std::move(t)) {
  receiver_ = std::make_shared<WaitReceiver>(transport_.get());
  codecs_ = opts_.codecs;
  if (!codecs_) {
    auto r = std::make_shared<compressor::Registry>();
    compressor::registerCpuCodecs(*r);
    codecs_ = std::move(r);
  }
}

void WorkerImpl::start(control::ClientOptions copts, Deadline deadline) {
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
    pushPool_ = std::make_unique<shm::RegionPool>(*arena_, 0);  // limit: as tensors are declared
    peerShm_ = std::make_unique<shm::PeerMappings>(prefix);
  } else {
    sameHost_.assign(book_.servers.size(), false);
  }
  // Each server's push budget over the workers: this worker's share of it.
  for (const auto& s : book_.servers) {
    const uint64_t share = s.pushBudget / book_.workers.size();
    serverShare_.push_back(s.pushBudget == 0 ? 0 : std::max<uint64_t>(1, share));
  }
  serverUnsummed_.assign(book_.servers.size(), 0);
  dispatcher_ = std::thread([this] { dispatchLoop(); });
  CORTADO_LOG_INFO(
      "worker {} of {} ready, {} servers, transport {}, chunks in {} order, push window {}",
      self_.rank, book_.workers.size(), book_.servers.size(), transport_->name(),
      opts_.staggerChunks ? "staggered" : "index",
      opts_.pushWindow == 0 ? std::string("off") : fmt::format("{} KiB", opts_.pushWindow >> 10));
}

uint64_t WorkerImpl::declare(const std::string& name, DType dtype, uint64_t numElements,
                             const TensorOptions& options, Deadline deadline) {
  auto entry = std::make_unique<TensorEntry>();
  entry->name = name;
  entry->dtype = dtype;
  entry->numElements = numElements;
  entry->options = options;
  if (!options.codec.empty()) setUpCodec(*entry);
  if (options.sparse) setUpSparse(*entry);
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
  if (ef)
    entry->ef = std::make_unique<compressor::ErrorFeedback>(entry->codec, -1.0f,
                                                            opts_.errorFeedbackState);
  std::lock_guard<std::mutex> lk(mu_);
  if (options.sparse) {
    sparseChunks(*entry);  // one key per server, not placed by bytes
    tensors_[name] = std::move(entry);
    return key;
  }
  // Placement runs in declaration order, the same on every worker; a
  // compressed tensor's chunks are counted by its payload (chunkCount()).
  entry->chunks =
      placement_->place(key, numElements, dtypeSize(dtype), opts_.partitionBytes,
                        entry->codec ? entry->codec->payloadBytes(size_t(numElements)) : 0);
  // Raw chunks for same-host servers push through shared memory, from
  // regions taken per send (compressed ones travel as bytes: their payloads
  // are small).
  for (const Chunk& c : entry->chunks)
    if (pushesThroughShm(*entry, c))
      shmChunkBytes_ += shm::RegionPool::classBytes(c.numElements * dtypeSize(dtype));
  updatePushPoolLocked();
  tensors_[name] = std::move(entry);
  return key;
}

void WorkerImpl::updatePushPoolLocked() {
  // A region per chunk at most (what a tensor's own regions would hold), and
  // the credits' worth of regions, rounded up to their classes, with the
  // one chunk that a full window may let past (WorkerOptions::creditStall):
  // a limit below what is in flight would free and fault in regions every
  // round.
  const uint64_t credits = opts_.maxBytesInFlight;
  const uint64_t window =
      credits + credits / 8 + shm::RegionPool::classBytes(size_t(opts_.partitionBytes));
  if (pushPool_) pushPool_->setLimit(std::min(shmChunkBytes_, window));
}

void WorkerImpl::setUpCodec(TensorEntry& t) {
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

uint64_t WorkerImpl::sharedSeed(uint64_t chunkKey, uint64_t round) {
  return compressor::format::hash2(chunkKey, round);
}

uint64_t WorkerImpl::encodeSeed(const TensorEntry& t, uint64_t chunkKey, uint64_t round) const {
  uint64_t shared = sharedSeed(chunkKey, round);
  if (t.codec->id() == compressor::CodecId::kRandomK) return shared;
  return compressor::format::hash2(shared, static_cast<uint64_t>(self_.rank) + 1);
}

bool WorkerImpl::isDeclared(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  return tensors_.count(name) > 0;
}

bool WorkerImpl::isReleased(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = tensors_.find(name);
  return it != tensors_.end() && it->second->released;
}

TensorEntry& WorkerImpl::tensorLocked(const std::string& name, const char* what) const {
  auto it = tensors_.find(name);
  CORTADO_ENFORCE(it != tensors_.end(), ErrorCode::kInvalidArgument,
                  "worker {}: {} of tensor '{}', which was never declared", self_.rank, what, name);
  return *it->second;
}

uint64_t WorkerImpl::budgetedBytesLocked(const TensorEntry& t, const Task& task, size_t chunk,
                                         uint64_t bytes) const {
  const Chunk& c = t.chunks[chunk];
  if (serverShare_[c.server] == 0 || t.zen || c.numElements == 0) return 0;
  // What the push's body carries (a compressed one at most its codec's
  // payload size; its preamble is small), as sendChunk() decides.
  const bool compressed = task.exchange ? !task.payloads.empty() : t.codec != nullptr;
  if (compressed)
    bytes = task.exchange ? task.payloads[chunk].size() : t.codec->payloadBytes(c.numElements);
  else if (pushesThroughShm(t, c))
    return 0;
  return bytes > kBudgetMinBytes ? bytes : 0;
}

void WorkerImpl::enqueueLocked(TensorEntry& t, const std::shared_ptr<Handle::State>& state,
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
  state->busyPoll = opts_.busyPoll;
  state->receiver = receiver_;
  state->tensorKey = t.key;
  state->round = task->round;
  state->stalls = control_->stallNotes();
  task->pushRegions.assign(t.chunks.size(), shm::Region());
  // Credits count the bytes a chunk pushes: a sparse tensor's pairs, not its
  // dense size.
  auto queueChunk = [&](size_t i) {
    const uint64_t bytes = task->sparse.empty() ? t.chunks[i].numElements * dtypeSize(t.dtype)
                                                : uint64_t(task->sparse[i].size());
    queue_.push(ChunkOp{task, i, seq_++, bytes, budgetedBytesLocked(t, *task, i, bytes)});
  };
  // The task's chunks take consecutive sequence numbers: the staggered order
  // (WorkerOptions::staggerChunks) reorders them among themselves only, and
  // other tasks keep their places by priority and arrival.
  if (opts_.staggerChunks && t.chunks.size() > 1) {
    for (size_t i : sendOrder(t.chunks, self_.rank, true)) queueChunk(i);
  } else {
    for (size_t i = 0; i < t.chunks.size(); ++i) queueChunk(i);
  }
}

Handle WorkerImpl::pushPull(const std::string& name, DType dtype, uint64_t numElements,
                            const void* input, void* output, ReduceOp op, int priority) {
  bool sparse = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = tensors_.find(name);
    sparse = it != tensors_.end() && it->second->zen;
  }
  if (sparse) {
    // A dense buffer of a sparse tensor: its non-zeros go as pairs.
    CORTADO_ENFORCE(dtype == DType::kFloat32, ErrorCode::kInvalidArgument,
                    "worker {}: push_pull of sparse tensor '{}' with {} data; it is float32",
                    self_.rank, name, dtypeName(dtype));
    {
      std::lock_guard<std::mutex> lk(mu_);
      const TensorEntry& t = tensorLocked(name, "push_pull");
      CORTADO_ENFORCE(t.numElements == numElements, ErrorCode::kInvalidArgument,
                      "worker {}: push_pull of sparse tensor '{}' with {} elements, but it was "
                      "declared with {}",
                      self_.rank, name, numElements, t.numElements);
    }
    SparseInput in;
    in.dense = static_cast<const float*>(input);
    return pushPullSparse(name, in, static_cast<float*>(output), op, priority);
  }
  auto state = std::make_shared<Handle::State>();
  state->name = name;
  std::shared_ptr<Task> task;
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
    task = std::make_shared<Task>();
    task->input = static_cast<const uint8_t*>(input);
    task->output = static_cast<uint8_t*>(output);
    task->op = op;
    task->priority = priority;
    enqueueLocked(t, state, task);
  }
  dispatchOrSend(task);
  return Handle(state);
}

std::vector<ChunkSpan> WorkerImpl::chunks(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<ChunkSpan> out;
  for (const Chunk& c : tensorLocked(name, "chunks").chunks) out.push_back({c.offset, c.numElements});
  return out;
}

Handle WorkerImpl::exchange(const std::string& name, Exchange ex, int priority) {
  auto state = std::make_shared<Handle::State>();
  state->name = name;
  std::shared_ptr<Task> task;
  {
    std::lock_guard<std::mutex> lk(mu_);
    checkFailedLocked();
    TensorEntry& t = tensorLocked(name, "exchange");
    CORTADO_ENFORCE(!t.zen, ErrorCode::kInvalidArgument,
                    "worker {}: exchange of sparse tensor '{}': use push_pull or "
                    "push_pull_sparse",
                    self_.rank, name);
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
    task = std::make_shared<Task>();
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
  dispatchOrSend(task);
  return Handle(state);
}

void WorkerImpl::release(const std::string& name, bool tellServers) {
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
    // Its push regions went back to the pool as the servers answered.
    for (const Chunk& c : t.chunks)
      if (pushesThroughShm(t, c))
        shmChunkBytes_ -= shm::RegionPool::classBytes(c.numElements * dtypeSize(t.dtype));
    updatePushPoolLocked();
    // Not a pusher (releaseHere): its servers count only their pushers'.
    if (tellServers) {
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

void WorkerImpl::barrier(Deadline deadline) {
  control_->barrier(control::Group::kWorkers, "worker-barrier", deadline);
}

Status WorkerImpl::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void WorkerImpl::abort(const Status& why) {
  failAll(why);
  // An answer popped before failAll() may still be being written; once
  // none is, no answer of this worker's operations touches memory again.
  std::unique_lock<std::mutex> lk(mu_);
  abortWaits_ = true;
  if (!cv_.wait_for(lk, std::chrono::seconds(10), [this] { return writing_ == 0; })) {
    CORTADO_LOG_ERROR("worker {}: an answer was still being written 10 s after abort()",
                      self_.rank);
  }
}

void WorkerImpl::shutdown(Deadline deadline) {
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

void WorkerImpl::checkFailedLocked() const {
  if (!failure_.ok()) throw Error(failure_.code(), failure_.message());
  if (closed_) throw Error(ErrorCode::kClosed, "the worker was shut down");
}

}  // namespace detail

std::unique_ptr<Worker> Worker::start(WorkerOptions opts, control::ClientOptions control,
                                      std::unique_ptr<transport::Transport> transport,
                                      Deadline deadline) {
  CORTADO_ENFORCE(transport != nullptr, ErrorCode::kInvalidArgument, "worker needs a transport");
  auto w = std::make_unique<detail::WorkerImpl>(std::move(opts), std::move(transport));
  w->start(std::move(control), deadline);
  return w;
}

}  // namespace cortado
