// The server engine (server_engine.h): its shards' threads, messages routed
// to the shard that owns the key, a shard's loop, dispatch and releases. A
// key's rounds are in server_rounds.cc.
#include "server/server_engine.h"

#include <algorithm>

#include "server/server_shard.h"

namespace cortado::server {

ServerEngine::ServerEngine(ServerEngineOptions opts, transport::Transport& transport)
    : opts_(std::move(opts)), transport_(transport) {
  CORTADO_ENFORCE(opts_.numWorkers >= 1, ErrorCode::kInvalidArgument,
                  "server needs at least one worker, got {}", opts_.numWorkers);
  codecs_ = opts_.codecs;
  if (!codecs_) {
    auto r = std::make_shared<compressor::Registry>();
    compressor::registerCpuCodecs(*r);
    codecs_ = std::move(r);
  }
  if (!opts_.shmPrefix.empty()) {
    arena_ = std::make_unique<shm::Arena>(opts_.shmPrefix, opts_.self);
    peers_ = std::make_unique<shm::PeerMappings>(opts_.shmPrefix);
  }
  int n = std::max(1, opts_.engineThreads);
  for (int i = 0; i < n; ++i) {
    auto s = std::make_unique<Shard>();
    s->engine = this;
    s->index = i;
    shards_.push_back(std::move(s));
  }
  for (auto& s : shards_) s->thread = std::thread([p = s.get()] { p->run(); });
  // While a worker waits for a round's answer, the pushes that complete it
  // are expected: the transport may poll for them instead of sleeping.
  transport_.setExpecting(
      [w = pullsWaiting_] { return w->load(std::memory_order_relaxed) > 0; });
}

ServerEngine::~ServerEngine() { stop(); }

void ServerEngine::stop() {
  for (auto& s : shards_) {
    {
      std::unique_lock<std::mutex> lk(s->mu);
      s->stop = true;
      // A message that the loop thread processes inline finishes first (as
      // join() below lets the shard's thread finish its message).
      s->cv.wait(lk, [&] { return !s->busy; });
    }
    s->cv.notify_all();
  }
  for (auto& s : shards_)
    if (s->thread.joinable()) s->thread.join();
}

ServerStats ServerEngine::stats() const {
  ServerStats total;
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lk(s->mu);
    total += s->stats;
  }
  total.unsummedBytes = unsummed_.load(std::memory_order_relaxed);
  total.unsummedPeak = unsummedPeak_.load(std::memory_order_relaxed);
  return total;
}

void ServerEngine::replyError(const NodeId& to, uint32_t requestId, uint64_t key,
                              const std::string& what) {
  CORTADO_LOG_WARN("key {}: refusing a message from {}: {}", key, to.toString(), what);
  DataHeader h;
  h.op = Op::kError;
  h.requestId = requestId;
  h.key = key;
  h.bodyBytes = what.size();
  Message m;
  m.parts.push_back(wire::encodeHeader(h));
  m.parts.push_back(Buffer::copyOf(what.data(), what.size()));
  try {
    transport_.send(to, std::move(m));
  } catch (const Error& e) {
    CORTADO_LOG_WARN("could not send an error to {}: {}", to.toString(), e.what());
  }
}

void ServerEngine::handle(Message&& msg) {
  if (msg.parts.size() != 2) {
    replyError(msg.from, 0, 0,
               fmt::format("data message has {} parts, expected 2 (header, body)", msg.parts.size()));
    return;
  }
  DataHeader h;
  try {
    h = wire::decodeHeader(msg.parts[0], msg.parts[1].size());
  } catch (const Error& e) {
    replyError(msg.from, 0, 0, e.what());
    return;
  }
  if (msg.from.role != Role::kWorker || msg.from.rank < 0 || msg.from.rank >= opts_.numWorkers) {
    replyError(msg.from, h.requestId, h.key,
               fmt::format("{} is not a worker of this job (it has {} workers)", msg.from.toString(),
                           opts_.numWorkers));
    return;
  }
  if (h.op == Op::kPush && (h.flags & wire::kFlagAck)) {
    const uint64_t now =
        unsummed_.fetch_add(msg.parts[1].size(), std::memory_order_relaxed) + msg.parts[1].size();
    uint64_t peak = unsummedPeak_.load(std::memory_order_relaxed);
    while (now > peak && !unsummedPeak_.compare_exchange_weak(peak, now)) {
    }
  }
  // Mix the key so consecutive chunk keys spread over the engine threads.
  uint64_t mixed = h.key * 0x9E3779B97F4A7C15ull;
  auto& shard = *shards_[(mixed >> 32) % shards_.size()];
  const bool small = opts_.inlineBytes > 0 && h.numElements <= opts_.inlineBytes &&
                     h.numElements * dtypeSize(h.dtype) <= opts_.inlineBytes;
  {
    std::lock_guard<std::mutex> lk(shard.mu);
    if (shard.stop) return;
    if (!small || shard.busy || !shard.queue.empty()) {
      shard.queue.emplace_back(h, std::move(msg));
      shard.cv.notify_one();
      return;
    }
    shard.busy = true;
    ++shard.stats.inlined;
  }
  shard.processOrRefuse(h, msg);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lk(shard.mu);
    shard.busy = false;
    // Only when someone waits for the token: the shard's thread when
    // messages came meanwhile (from another thread than this one), stop().
    // An idle shard thread is not woken for nothing.
    wake = shard.stop || !shard.queue.empty();
  }
  if (wake) shard.cv.notify_all();
}

void ServerEngine::Shard::run() {
  using Clock = std::chrono::steady_clock;
  const auto& o = engine->opts_;
  const bool checkStalls = o.stallAfter.count() > 0 && o.onStall && !o.async;
  // A stall is reported within a quarter of its time after it begins.
  const auto period = std::clamp<std::chrono::milliseconds>(
      o.stallAfter / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(1000));
  auto nextCheck = Clock::now() + period;
  for (;;) {
    std::pair<DataHeader, Message> item;
    bool got = false, checkNow = false;
    {
      std::unique_lock<std::mutex> lk(mu);
      // The keys are the loop thread's while it holds the token (`busy`).
      auto ready = [&] { return stop || (!busy && !queue.empty()); };
      if (checkStalls)
        cv.wait_until(lk, nextCheck, ready);
      else
        cv.wait(lk, ready);
      if (stop) return;
      checkNow = checkStalls && Clock::now() >= nextCheck;
      if (busy) {
        // The loop thread holds the keys for one small message: the stall
        // check goes a little later.
        if (checkNow) nextCheck = Clock::now() + std::chrono::milliseconds(1);
        continue;
      }
      if (!queue.empty()) {
        item = std::move(queue.front());
        queue.pop_front();
        got = true;
      }
      if (!got && !checkNow) continue;
      busy = true;
    }
    if (checkNow) {
      reportStalls();
      nextCheck = Clock::now() + period;
    }
    if (got) processOrRefuse(item.first, item.second);
    bool wake = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      busy = false;
      wake = stop;  // stop() waits for the token
    }
    if (wake) cv.notify_all();
  }
}

void ServerEngine::Shard::processOrRefuse(const DataHeader& h, Message& msg) {
  // handle() counted it; the sum settles it (pushSummed), or, below, the
  // refusal or a message that summed nothing.
  unsettled = h.op == Op::kPush && (h.flags & wire::kFlagAck) ? msg.parts[1].size() : 0;
  try {
    process(h, msg);
    settlePush();
  } catch (const Error& e) {
    settlePush();
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.errors;
    }
    engine->replyError(msg.from, h.requestId, h.key, e.what());
  } catch (const std::exception& e) {
    // An allocation a push asked for that the machine cannot give: refuse
    // it, keep serving.
    settlePush();
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.errors;
    }
    engine->replyError(msg.from, h.requestId, h.key,
                       fmt::format("key {}: {} elements: {}", h.key, h.numElements, e.what()));
  }
}

void ServerEngine::Shard::reportStalls() {
  const auto now = std::chrono::steady_clock::now();
  const auto& o = engine->opts_;
  for (auto& [key, k] : keys) {
    // pushes > 0: the round has begun and is not complete (completion resets it).
    if (k.pushes == 0 || k.stallReported || now - k.roundStart < o.stallAfter) continue;
    k.stallReported = true;
    StallReport r;
    r.key = key;
    r.round = k.round;
    for (size_t w = 0; w < k.pushedBy.size(); ++w)
      if (k.pushedBy[w]) r.pushed.push_back(int(w));
    r.expected = k.expected;
    r.waitedMs =
        uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(now - k.roundStart).count());
    r.tensor = k.tensorName;
    CORTADO_LOG_DEBUG("{}: round {} has {} of {} pushes after {} ms", k.describe(key), k.round,
                      k.pushes, k.expected, r.waitedMs);
    try {
      o.onStall(r);
    } catch (const std::exception& e) {
      CORTADO_LOG_WARN("{}: the stall report failed: {}", k.describe(key), e.what());
    }
  }
}

void ServerEngine::Shard::release(const DataHeader& h, const NodeId& from) {
  auto it = keys.find(h.key);
  if (it == keys.end()) {
    CORTADO_LOG_DEBUG("key {}: released by {} before any push reached this server: nothing to free",
                      h.key, from.toString());
    return;
  }
  KeyState& k = it->second;
  const int W = engine->opts_.numWorkers;
  if (k.releasedBy.empty()) k.releasedBy.assign(W, false);
  if (!k.releasedBy[from.rank]) {
    k.releasedBy[from.rank] = true;
    ++k.releases;
  }
  const int need = k.initialized ? k.expected : (h.contributors == 0 ? W : int(h.contributors));
  if (k.releases < need) return;
  // A pull still waiting for a round that will never complete (a worker
  // that released without finishing it): answered with an error, not left.
  for (const auto& p : takeWaiting(k))
    engine->replyError(p.from, p.requestId, h.key,
                       fmt::format("{} was released by its {} contributors while this pull of "
                                   "round {} waited for pushes that will not come",
                                   k.describe(h.key), need, k.round));
  CORTADO_LOG_DEBUG("{}: released by its {} contributors; freed", k.describe(h.key), need);
  if (engine->arena_) {
    const size_t outBytes = k.numElements * dtypeSize(k.dtype);
    engine->arena_->free(k.regions[0], outBytes);
    engine->arena_->free(k.regions[1], outBytes);
  }
  const uint64_t bytes = k.initialized ? k.numElements * dtypeSize(k.dtype) : 0;
  keys.erase(it);
  std::lock_guard<std::mutex> lk(mu);
  ++stats.keysReleased;
  stats.keys = keys.size();
  stats.keyBytes -= bytes;
}

void ServerEngine::Shard::process(const DataHeader& h, Message& msg) {
  if (h.op == Op::kRelease) return release(h, msg.from);
  const int W = engine->opts_.numWorkers;
  auto [slot, added] = keys.try_emplace(h.key);
  if (added) {
    std::lock_guard<std::mutex> lk(mu);
    stats.keys = keys.size();
  }
  KeyState& k = slot->second;
  if ((h.flags & wire::kFlagSparse) || k.zen) return processSparse(k, h, msg);
  if (h.op == Op::kPush) {
    const bool compressed = h.flags & wire::kFlagCompressed;
    if (!k.initialized) {
      CORTADO_ENFORCE(!compressed || h.dtype == DType::kFloat32, ErrorCode::kProtocol,
                      "key {}: {} pushed a compressed {} tensor; codecs compress float32 only",
                      h.key, msg.from.toString(), dtypeName(h.dtype));
      CORTADO_ENFORCE(!compressed || !(h.flags & wire::kFlagShm), ErrorCode::kProtocol,
                      "key {}: {} pushed a compressed payload through shared memory",
                      h.key, msg.from.toString());
      k.initialized = true;
      k.compressed = compressed;
      k.dtype = h.dtype;
      k.numElements = h.numElements;
      k.pushedBy.assign(W, false);
      CORTADO_ENFORCE(h.contributors <= static_cast<uint32_t>(W), ErrorCode::kProtocol,
                      "key {}: {} says {} workers push this key, but the job has {} workers",
                      h.key, msg.from.toString(), h.contributors, W);
      k.expected = h.contributors == 0 ? W : static_cast<int>(h.contributors);
      k.denseAnswer = h.flags & wire::kFlagDenseAnswer;
      k.errorFeedback = (h.flags & wire::kFlagErrorFeedback) && !(h.flags & wire::kFlagAsync);
      std::lock_guard<std::mutex> lk(mu);
      stats.keyBytes += k.numElements * dtypeSize(k.dtype);
    }
    CORTADO_ENFORCE(h.dtype == k.dtype && h.numElements == k.numElements, ErrorCode::kMismatch,
                    "{}: {} pushed {} elements of {}, but this key holds {} elements of {} "
                    "(workers declared the tensor differently?)",
                    k.describe(h.key), msg.from.toString(), h.numElements, dtypeName(h.dtype),
                    k.numElements, dtypeName(k.dtype));
    CORTADO_ENFORCE(compressed == k.compressed, ErrorCode::kMismatch,
                    "{}: {} pushed {} data, but the key's first push was {} (workers declared "
                    "the tensor with different codecs?)",
                    k.describe(h.key), msg.from.toString(),
                    compressed ? "compressed" : "uncompressed",
                    k.compressed ? "compressed" : "uncompressed");
    const int expected = h.contributors == 0 ? W : static_cast<int>(h.contributors);
    CORTADO_ENFORCE(expected == k.expected, ErrorCode::kMismatch,
                    "{}: {} pushed for {} contributors, but the key's first push said {} (workers "
                    "run different plans for this tensor?)",
                    k.describe(h.key), msg.from.toString(), expected, k.expected);
    CORTADO_ENFORCE(!(h.flags & wire::kFlagShm) || engine->peers_, ErrorCode::kProtocol,
                    "key {}: {} pushed through shared memory, but this server has it off "
                    "(CORTADO_SHM=0 here and not on the worker?)",
                    h.key, msg.from.toString());
  } else if (h.op == Op::kPull) {
    CORTADO_ENFORCE(k.initialized, ErrorCode::kProtocol,
                    "key {}: {} pulled a key that nobody has pushed", h.key, msg.from.toString());
  } else {
    throw Error(ErrorCode::kProtocol, fmt::format("key {}: a server does not accept {} from {}",
                                                  h.key, wire::opName(h.op), msg.from.toString()));
  }
  if (h.op == Op::kPull && (h.flags & wire::kFlagShm))
    CORTADO_ENFORCE(engine->arena_, ErrorCode::kProtocol,
                    "key {}: {} asked for a shared-memory answer, but this server has it off",
                    h.key, msg.from.toString());
  bool async = h.flags & wire::kFlagAsync;
  CORTADO_ENFORCE(async == engine->opts_.async, ErrorCode::kMismatch,
                  "key {}: {} sent a {} message to a server in {} mode", h.key, msg.from.toString(),
                  async ? "async" : "sync", engine->opts_.async ? "async" : "sync");
  if (async)
    processAsync(k, h, msg);
  else
    processSync(k, h, msg);
}

Buffer ServerEngine::takeSpare(size_t bytes) {
  {
    std::lock_guard<std::mutex> lk(spareMu_);
    auto it = spares_.find(bytes);
    if (it != spares_.end() && !it->second.empty()) {
      Buffer b = std::move(it->second.back());
      it->second.pop_back();
      spareBytes_ -= bytes;
      return b;
    }
  }
  return Buffer::allocate(bytes);
}

void ServerEngine::keepSpare(Buffer b) {
  // Still referred to (a reply in flight): it goes when that does.
  if (b.empty() || !b.unique()) return;
  std::lock_guard<std::mutex> lk(spareMu_);
  if (spareBytes_ + b.size() > std::max(kSpareBytes, opts_.pushBudget)) return;
  spareBytes_ += b.size();
  spares_[b.size()].push_back(std::move(b));
}

void ServerEngine::Shard::pushSummed(const DataHeader& h, Message& msg, DType dtype, bool ack) {
  msg.parts[1] = Buffer();
  settlePush();
  if (!ack) return;
  DataHeader a;
  a.op = Op::kPushAck;
  a.flags = h.flags & wire::kFlagAsync;
  a.requestId = h.requestId;
  a.key = h.key;
  a.round = h.round;
  a.dtype = dtype;
  Message m;
  m.parts.push_back(wire::encodeHeader(a));
  m.parts.push_back(Buffer());
  // The push is summed either way; a sender that cannot be reached is the
  // scheduler's to report.
  try {
    engine->transport_.send(msg.from, std::move(m));
  } catch (const Error& e) {
    CORTADO_LOG_WARN("key {}: could not acknowledge a push of {}: {}", h.key, msg.from.toString(),
                     e.what());
  }
}

Buffer ServerEngine::Shard::takeBuffer(Buffer& recycled, size_t bytes) {
  // Reuse the previous round's memory once no reply refers to it any more:
  // fresh pages cost a page fault each.
  if (recycled.size() == bytes && recycled.unique()) {
    Buffer b = std::move(recycled);
    recycled = Buffer();
    return b;
  }
  return Buffer::allocate(bytes);
}

}  // namespace cortado::server
