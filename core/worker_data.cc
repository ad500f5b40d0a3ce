// The worker's data path (worker_impl.h): the dispatcher that sends chunks
// in priority order within the credits, each chunk on the wire, the servers'
// answers (decoded where compressed), and the loss of a peer.
#include "core/worker_impl.h"

namespace cortado::detail {

void WorkerImpl::closeAll() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    closed_ = true;
  }
  cv_.notify_all();
  if (dispatcher_.joinable()) dispatcher_.join();
  if (transport_) transport_->close();
  if (receiver_) receiver_->detach();
  if (control_) control_->close();
  failAll(Status(ErrorCode::kClosed, "the worker was shut down"));
}

void WorkerImpl::dispatchLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  auto fits = [&] {
    return inFlightBytes_ == 0 || inFlightBytes_ + queue_.top().bytes <= opts_.maxBytesInFlight;
  };
  // No chunk answered or sent for creditStall while chunks wait for credits:
  // one goes past the window (WorkerOptions::creditStall).
  auto stallAt = [&] { return lastProgress_ + opts_.creditStall; };
  const bool mayStall = opts_.creditStall.count() > 0;
  for (;;) {
    if (closed_) return;
    // A chunk whose server has no room in this worker's share of its push
    // budget waits for that server's acknowledgements (which come as the
    // server sums, whatever the other workers do), and the chunks behind it
    // wait too: the priority order holds. The credit stall does not pass it.
    if (!queue_.empty() && serverRoomLocked(queue_.top()) &&
        (fits() || (mayStall && Clock::now() >= stallAt()))) {
      if (!fits())
        CORTADO_LOG_DEBUG(
            "worker {}: nothing answered or sent for {} ms with {} bytes in flight: chunk {} of "
            "'{}' goes past the credit window",
            self_.rank, opts_.creditStall.count(), inFlightBytes_, queue_.top().chunk,
            queue_.top().task->tensor->name);
      ChunkOp op = queue_.top();
      queue_.pop();
      if (!failure_.ok()) continue;  // failAll() completed its handle
      inFlightBytes_ += op.bytes;
      serverUnsummed_[op.task->tensor->chunks[op.chunk].server] += op.budgeted;
      totalUnsummed_ += op.budgeted;
      lastProgress_ = Clock::now();
      uint32_t id = nextRequest_++;
      if (nextRequest_ == 0) nextRequest_ = 1;  // 0 means "no request" in replies
      pending_.emplace(id, op);
      lk.unlock();
      sendChunk(op, id);
      lk.lock();
      continue;
    }
    if (peerLossAt_ && Clock::now() >= *peerLossAt_) {
      // The grace period passed and nobody named another cause.
      Status loss = peerLoss_;
      peerLossAt_.reset();
      lk.unlock();
      failAll(loss);
      lk.lock();
      continue;
    }
    // Woken by a new chunk, an answer, close() or a peer's loss; or at the
    // end of the grace period, or when a full window stalls.
    std::optional<Clock::time_point> until = peerLossAt_;
    if (!queue_.empty() && mayStall && (!until || stallAt() < *until)) until = stallAt();
    if (until)
      cv_.wait_until(lk, *until);
    else
      cv_.wait(lk);
  }
}

void WorkerImpl::dispatchOrSend(const std::shared_ptr<Task>& task) {
  std::optional<ChunkOp> mine;
  uint32_t id = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // The dispatcher's rule (dispatchLoop's ready()), for this task's chunk
    // only: first in priority order and within the credits.
    if (opts_.inlineBytes > 0 && !closed_ && failure_.ok() && task->tensor->chunks.size() == 1 &&
        !queue_.empty() && queue_.top().task == task && queue_.top().bytes <= opts_.inlineBytes &&
        serverRoomLocked(queue_.top()) &&
        (inFlightBytes_ == 0 || inFlightBytes_ + queue_.top().bytes <= opts_.maxBytesInFlight)) {
      mine = queue_.top();
      queue_.pop();
      inFlightBytes_ += mine->bytes;
      serverUnsummed_[task->tensor->chunks[mine->chunk].server] += mine->budgeted;
      totalUnsummed_ += mine->budgeted;
      lastProgress_ = Clock::now();
      id = nextRequest_++;
      if (nextRequest_ == 0) nextRequest_ = 1;  // 0 means "no request" in replies
      pending_.emplace(id, *mine);
    }
  }
  if (!mine) {
    cv_.notify_all();
    return;
  }
  sendChunk(*mine, id);
}

void WorkerImpl::sendChunk(const ChunkOp& op, uint32_t id) {
  if (op.task->tensor->zen) return sendSparseChunk(op, id);
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
  if (op.budgeted > 0) h.flags |= wire::kFlagAck;
  try {
    h.op = Op::kPush;
    Message push;
    const bool compressed =
        c.numElements > 0 && (task.exchange ? !task.payloads.empty() : t.codec != nullptr);
    // Same host: a region of the pool for this send, ours again once the
    // server has answered (finishChunk). Out of shared memory: bytes.
    shm::Region region;
    if (!compressed && pushesThroughShm(t, c)) {
      try {
        region = pushPool_->take(c.numElements * esz);
        op.task->pushRegions[op.chunk] = region;
      } catch (const Error& e) {
        if (!shmFullNoted_.exchange(true))
          CORTADO_LOG_WARN("worker {}: pushes go over the socket while shared memory is short: {}",
                           self_.rank, e.what());
      }
    }
    if (compressed && task.exchange) {
      const Buffer& payloads = task.payloads[op.chunk];
      Buffer body = compressedBody(
          t, *op.task,
          {reinterpret_cast<const std::byte*>(payloads.data()), payloads.size()});
      h.flags |= wire::kFlagCompressed;
      if (!task.answers) h.flags |= wire::kFlagDenseAnswer;
      if (t.options.errorFeedback) h.flags |= wire::kFlagErrorFeedback;
      h.bodyBytes = body.size();
      push.parts.push_back(wire::encodeHeader(h));
      push.parts.push_back(std::move(body));
    } else if (compressed) {
      // Encoded here, so the input is not needed after this call. Top-k and
      // DGC encode into a scratch buffer that compressedBody() compacts;
      // the other codecs straight into the push.
      const bool compact = opts_.compactSparse && compressor::listsIndices(t.codec->id());
      const size_t pre = compact ? 0 : wire::compressedPreambleBytes(t.codecSpec, t.name);
      const size_t payloadBytes = t.codec->payloadBytes(c.numElements);
      Buffer body = Buffer::allocate(pre + payloadBytes);
      if (!compact) wire::writeCompressedPreamble(body.data(), t.codecSpec, t.name);
      std::span<std::byte> out(reinterpret_cast<std::byte*>(body.data() + pre), payloadBytes);
      const float* in = reinterpret_cast<const float*>(op.task->input) + c.offset;
      compressor::EncodeContext ctx;
      ctx.seed = encodeSeed(t, c.key, op.task->round);
      size_t wrote = t.ef ? t.ef->encode(op.chunk, in, c.numElements, out, ctx)
                          : t.codec->encode(in, c.numElements, out, ctx);
      CORTADO_ENFORCE(wrote == payloadBytes, ErrorCode::kInternal,
                      "codec '{}' wrote {} bytes for {} elements, declared {}", t.codecSpec,
                      wrote, c.numElements, payloadBytes);
      if (compact)
        body = compressedBody(t, *op.task, out);
      else
        countPushed(*op.task, payloadBytes);
      h.flags |= wire::kFlagCompressed;
      if (t.options.errorFeedback) h.flags |= wire::kFlagErrorFeedback;
      h.bodyBytes = body.size();
      push.parts.push_back(wire::encodeHeader(h));
      push.parts.push_back(std::move(body));
    } else if (region.data) {
      // Same host: the server sums straight from our shared memory.
      std::memcpy(region.data, op.task->input + c.offset * esz, c.numElements * esz);
      countPushed(*op.task, c.numElements * esz);
      shm::Descriptor d{region.segment, 0, region.offset};
      h.flags |= wire::kFlagShm;
      h.bodyBytes = sizeof(d);
      push.parts.push_back(wire::encodeHeader(h));
      push.parts.push_back(Buffer::copyOf(&d, sizeof(d)));
    } else {
      h.bodyBytes = c.numElements * esz;
      countPushed(*op.task, h.bodyBytes);
      push.parts.push_back(wire::encodeHeader(h));
      // Zero-copy: the caller keeps the input alive until the handle completes.
      push.parts.push_back(Buffer::wrap(const_cast<uint8_t*>(op.task->input) + c.offset * esz,
                                        h.bodyBytes, op.task));
    }
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
    // Together: one wake-up of the transport's thread for both.
    std::vector<Message> both;
    both.push_back(std::move(push));
    both.push_back(std::move(pull));
    transport_->sendAll(server, std::move(both));
  } catch (const Error& e) {
    finishChunk(id, Status(e.code(), fmt::format("push_pull of tensor '{}' to {}: {}", t.name,
                                                 server.toString(), e.what())),
                nullptr);
  }
}

void WorkerImpl::countPushed(Task& task, uint64_t bytes) {
  task.handle->pushedBytes.fetch_add(bytes, std::memory_order_relaxed);
  pushedBytes_.fetch_add(bytes, std::memory_order_relaxed);
}

Buffer WorkerImpl::compressedBody(const TensorEntry& t, Task& task,
                                  std::span<const std::byte> payloads) {
  const size_t pre = wire::compressedPreambleBytes(t.codecSpec, t.name);
  const bool compact = opts_.compactSparse && compressor::listsIndices(t.codec->id());
  const size_t bytes = compact ? compressor::compactedRunBytes(payloads) : payloads.size();
  Buffer body = Buffer::allocate(pre + bytes);
  wire::writeCompressedPreamble(body.data(), t.codecSpec, t.name);
  std::span<std::byte> out(reinterpret_cast<std::byte*>(body.data() + pre), bytes);
  if (bytes != payloads.size())
    compressor::compactRun(payloads, out);
  else if (!payloads.empty())
    std::memcpy(out.data(), payloads.data(), payloads.size());
  countPushed(task, bytes);
  return body;
}

Buffer WorkerImpl::plainAnswer(const Buffer& body, const NodeId& from) {
  std::span<const std::byte> run(reinterpret_cast<const std::byte*>(body.data()), body.size());
  std::vector<std::byte> scratch;
  std::span<const std::byte> plain;
  try {
    plain = compressor::expandRun(run, scratch);
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol,
                fmt::format("malformed answer from {}: {}", from.toString(), e.what()));
  }
  if (plain.data() == run.data()) return body;
  return Buffer::copyOf(plain.data(), plain.size());
}

void WorkerImpl::onMessage(Message&& m) {
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
      onPushAck(h.requestId);
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

void WorkerImpl::onPushAck(uint32_t id) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Unknown: answered (or failed) before its acknowledgement came.
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    wake = settleLocked(it->second) && !queue_.empty();
  }
  if (wake) cv_.notify_all();
}

std::string WorkerImpl::tensorOfRequest(uint32_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = pending_.find(id);
  return it == pending_.end() ? std::string("?") : it->second.task->tensor->name;
}

bool WorkerImpl::finishChunk(uint32_t id, const Status& status, Message* m, const DataHeader* h) {
  ChunkOp op;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return false;
    op = std::move(it->second);
    pending_.erase(it);
    inFlightBytes_ -= op.bytes;
    settleLocked(op);
    lastProgress_ = Clock::now();
    ++writing_;  // abort() waits until this answer is written
    queued = !queue_.empty();
  }
  // The freed credits matter to the dispatcher only when chunks wait for
  // them: an idle dispatcher is not woken for nothing (a context switch per
  // answer).
  if (queued) cv_.notify_all();
  struct Written {
    WorkerImpl* w;
    ~Written() {
      bool wake = false;
      {
        std::lock_guard<std::mutex> lk(w->mu_);
        wake = --w->writing_ == 0 && w->abortWaits_;
      }
      if (wake) w->cv_.notify_all();
    }
  } written{this};
  Task& task = *op.task;
  TensorEntry& t = *task.tensor;
  const Chunk& c = t.chunks[op.chunk];
  // The push region back to the pool once the server has answered the pull
  // (it read the push before, which precedes the pull on its connection).
  // Without an answer the server may still read it: it is never reused.
  if (shm::Region& r = task.pushRegions[op.chunk]; r.data && m) {
    pushPool_->give(r, c.numElements * dtypeSize(t.dtype));
    r = shm::Region();
  }
  Status s = status;
  if (s.ok() && m) {
    const size_t esz = dtypeSize(t.dtype);
    pulledBytes_.fetch_add((h->flags & wire::kFlagShm) ? c.numElements * esz : m->parts[1].size(),
                           std::memory_order_relaxed);
    if (h->key != c.key || h->numElements != c.numElements || h->dtype != t.dtype ||
        (!opts_.async && h->round != task.round)) {
      s = Status(ErrorCode::kProtocol,
                 fmt::format("tensor '{}': {} answered key {} round {} ({} x {}) for key {} "
                             "round {} ({} x {})",
                             t.name, m->from.toString(), h->key, h->round, h->numElements,
                             dtypeName(h->dtype), c.key, task.round, c.numElements,
                             dtypeName(t.dtype)));
    } else if (t.zen) {
      try {
        takeSparseAnswer(t, task, op.chunk, *m, *h);
      } catch (const Error& e) {
        s = Status(e.code(), fmt::format("tensor '{}': {}", t.name, e.what()));
      }
    } else if (task.answers) {
      const bool compressed = (h->flags & wire::kFlagCompressed) != 0;
      try {
        (*task.answers)[op.chunk] =
            ExchangeAnswer{compressed ? plainAnswer(m->parts[1], m->from) : m->parts[1],
                           compressed};
      } catch (const Error& e) {
        s = Status(e.code(), fmt::format("tensor '{}': {}", t.name, e.what()));
      }
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
    if (t.zen && result.ok()) {
      try {
        assembleSparse(t, task);
        noteSparseRound(t, task);
      } catch (const Error& e) {
        result = Status(e.code(), fmt::format("tensor '{}': {}", t.name, e.what()));
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      t.inFlight = false;
    }
    task.handle->complete(result);
  }
  return true;
}

void WorkerImpl::decodeAnswer(const TensorEntry& t, const Task& task, const Chunk& c,
                              const Message& m) {
  CORTADO_ENFORCE(t.codec != nullptr, ErrorCode::kProtocol,
                  "{} answered with a compressed payload, but the tensor is uncompressed",
                  m.from.toString());
  const Buffer plain = plainAnswer(m.parts[1], m.from);
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(plain.data()),
                                     plain.size());
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

void WorkerImpl::onPeerError(const NodeId& peer, const Status& s) {
  if (peer.role != Role::kServer || closing_) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (!failure_.ok() || peerLossAt_) return;
  peerLoss_ = Status(ErrorCode::kPeerDead,
                     fmt::format("worker {} lost {}: {}", self_.rank, peer.toString(), s.message()));
  peerLossAt_ = Clock::now() + kPeerLossGrace;
  cv_.notify_all();
}

void WorkerImpl::failAll(const Status& s) {
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
    std::fill(serverUnsummed_.begin(), serverUnsummed_.end(), 0);
    totalUnsummed_ = 0;
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

}  // namespace cortado::detail
