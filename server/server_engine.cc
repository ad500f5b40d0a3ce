#include "server/server_engine.h"

#include <cstring>
#include <unordered_map>

#include "core/common/logging.h"
#include "core/common/reduce.h"
#include "core/wire/data_message.h"

namespace cortado::server {
namespace {

using transport::Message;
using wire::DataHeader;
using wire::Op;

constexpr uint64_t kNoRound = ~uint64_t(0);

struct PendingPull {
  NodeId from;
  uint32_t requestId;
  bool wantsShm;
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
};

}  // namespace

struct ServerEngine::Shard {
  ServerEngine* engine = nullptr;
  int index = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<DataHeader, Message>> queue;
  bool stop = false;
  std::thread thread;
  std::unordered_map<uint64_t, KeyState> keys;
  ServerStats stats;  // guarded by mu

  void run();
  void process(const DataHeader& h, Message& msg);
  void processSync(KeyState& k, const DataHeader& h, Message& msg);
  void processAsync(KeyState& k, const DataHeader& h, Message& msg);
  void sendResult(const NodeId& to, uint32_t requestId, uint64_t key, uint64_t round,
                  const KeyState& k, const Buffer& body, uint8_t flags, bool wantsShm = false);
  Buffer takeBuffer(Buffer& recycled, size_t bytes);
  // The pushed elements: the body, or the worker's shared memory it names.
  const uint8_t* pushData(const DataHeader& h, const Message& msg, const KeyState& k);
};

ServerEngine::ServerEngine(ServerEngineOptions opts, transport::Transport& transport)
    : opts_(opts), transport_(transport) {
  CORTADO_ENFORCE(opts_.numWorkers >= 1, ErrorCode::kInvalidArgument,
                  "server needs at least one worker, got {}", opts_.numWorkers);
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
}

ServerEngine::~ServerEngine() { stop(); }

void ServerEngine::stop() {
  for (auto& s : shards_) {
    {
      std::lock_guard<std::mutex> lk(s->mu);
      s->stop = true;
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
    total.pushes += s->stats.pushes;
    total.pulls += s->stats.pulls;
    total.roundsCompleted += s->stats.roundsCompleted;
    total.errors += s->stats.errors;
  }
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
  // Mix the key so consecutive chunk keys spread over the engine threads.
  uint64_t mixed = h.key * 0x9E3779B97F4A7C15ull;
  auto& shard = *shards_[(mixed >> 32) % shards_.size()];
  {
    std::lock_guard<std::mutex> lk(shard.mu);
    if (shard.stop) return;
    shard.queue.emplace_back(h, std::move(msg));
  }
  shard.cv.notify_one();
}

void ServerEngine::Shard::run() {
  for (;;) {
    std::pair<DataHeader, Message> item;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return stop || !queue.empty(); });
      if (stop) return;
      item = std::move(queue.front());
      queue.pop_front();
    }
    try {
      process(item.first, item.second);
    } catch (const Error& e) {
      {
        std::lock_guard<std::mutex> lk(mu);
        ++stats.errors;
      }
      engine->replyError(item.second.from, item.first.requestId, item.first.key, e.what());
    }
  }
}

void ServerEngine::Shard::process(const DataHeader& h, Message& msg) {
  const int W = engine->opts_.numWorkers;
  KeyState& k = keys[h.key];
  if (h.op == Op::kPush) {
    if (!k.initialized) {
      k.initialized = true;
      k.dtype = h.dtype;
      k.numElements = h.numElements;
      k.pushedBy.assign(W, false);
    }
    CORTADO_ENFORCE(h.dtype == k.dtype && h.numElements == k.numElements, ErrorCode::kMismatch,
                    "key {}: {} pushed {} elements of {}, but this key holds {} elements of {} "
                    "(workers declared the tensor differently?)",
                    h.key, msg.from.toString(), h.numElements, dtypeName(h.dtype), k.numElements,
                    dtypeName(k.dtype));
    CORTADO_ENFORCE(!(h.flags & wire::kFlagCompressed), ErrorCode::kInvalidArgument,
                    "key {}: compressed pushes are not supported by this server", h.key);
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

void ServerEngine::Shard::processSync(KeyState& k, const DataHeader& h, Message& msg) {
  const int w = msg.from.rank;
  const int W = engine->opts_.numWorkers;
  if (h.op == Op::kPush) {
    CORTADO_ENFORCE(h.round == k.round, ErrorCode::kProtocol,
                    "key {}: {} pushed round {} but the server is summing round {}", h.key,
                    msg.from.toString(), h.round, k.round);
    CORTADO_ENFORCE(!k.pushedBy[w], ErrorCode::kProtocol,
                    "key {}: {} pushed round {} twice", h.key, msg.from.toString(), h.round);
    const DType accT = accumulatorDType(k.dtype);
    const size_t accBytes = k.numElements * dtypeSize(accT);
    const size_t outBytes = k.numElements * dtypeSize(k.dtype);
    const uint8_t* src = pushData(h, msg, k);
    if (engine->arena_ && !k.shmTried && k.numElements > 0) {
      k.shmTried = true;
      try {
        k.regions[0] = engine->arena_->allocate(outBytes);
        k.regions[1] = engine->arena_->allocate(outBytes);
      } catch (const Error& e) {
        // Out of shared memory: this key answers with bytes.
        CORTADO_LOG_WARN("key {}: results go over the socket: {}", h.key, e.what());
        k.regions[0] = k.regions[1] = shm::Region();
      }
    }
    const bool useShm = k.regions[1].data != nullptr;
    // In shared-memory mode a same-dtype sum accumulates straight into this
    // round's result region; otherwise into a private accumulator.
    const bool direct = useShm && accT == k.dtype;
    uint8_t* acc = nullptr;
    if (direct) {
      acc = k.regions[k.round % 2].data;
    } else {
      // The published result of the last round may still be pulled: never
      // write into it. Recycling happens at completion (see below).
      if (k.acc.size() != accBytes) k.acc = Buffer::allocate(accBytes);
      acc = k.acc.data();
    }
    if (k.pushes == 0)
      loadAccumulator(k.dtype, acc, src, k.numElements);
    else
      accumulate(k.dtype, acc, src, k.numElements);
    k.pushedBy[w] = true;
    ++k.pushes;
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.pushes;
    }
    if (k.pushes < W) return;
    // Round complete: publish the sum, start the next round. Every worker
    // pushed this round only after it had pulled the previous one, so the old
    // result is free once the transport lets go of it.
    if (useShm) {
      k.resultRegion = k.regions[k.round % 2];
      if (!direct) storeAccumulator(k.dtype, k.resultRegion.data, k.acc.data(), k.numElements);
      // Remote pullers get the region's bytes; no owner: the region outlives
      // every send (see core/shm/shm_segment.h).
      k.result = Buffer::wrap(k.resultRegion.data, outBytes, nullptr);
    } else {
      Buffer old = std::move(k.result);
      if (accT == k.dtype) {
        k.result = std::move(k.acc);
        k.acc = takeBuffer(old, accBytes);
      } else {
        k.result = takeBuffer(old, outBytes);
        storeAccumulator(k.dtype, k.result.data(), k.acc.data(), k.numElements);
      }
    }
    k.doneRound = k.round;
    ++k.round;
    k.pushes = 0;
    std::fill(k.pushedBy.begin(), k.pushedBy.end(), false);
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.roundsCompleted;
    }
    auto waiting = std::move(k.waiting);
    k.waiting.clear();
    for (const auto& p : waiting)
      sendResult(p.from, p.requestId, h.key, k.doneRound, k, k.result, 0, p.wantsShm);
    return;
  }
  // PULL
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.pulls;
  }
  const bool wantsShm = h.flags & wire::kFlagShm;
  if (h.round == k.doneRound) {
    sendResult(msg.from, h.requestId, h.key, h.round, k, k.result, 0, wantsShm);
  } else if (h.round == k.round) {
    k.waiting.push_back({msg.from, h.requestId, wantsShm});
  } else {
    throw Error(ErrorCode::kProtocol,
                fmt::format("key {}: {} pulled round {}, but the server has completed round {} "
                            "and is summing round {}",
                            h.key, msg.from.toString(), h.round,
                            k.doneRound == kNoRound ? std::string("none") : std::to_string(k.doneRound),
                            k.round));
  }
}

void ServerEngine::Shard::processAsync(KeyState& k, const DataHeader& h, Message& msg) {
  if (h.op == Op::kPush) {
    if (k.store.empty() && k.numElements > 0) {
      k.store = Buffer::allocate(k.numElements * dtypeSize(accumulatorDType(k.dtype)));
      loadAccumulator(k.dtype, k.store.data(), pushData(h, msg, k), k.numElements);
    } else {
      accumulate(k.dtype, k.store.data(), pushData(h, msg, k), k.numElements);
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.pushes;
    }
    DataHeader a;
    a.op = Op::kPushAck;
    a.flags = wire::kFlagAsync;
    a.requestId = h.requestId;
    a.key = h.key;
    a.round = h.round;
    a.dtype = k.dtype;
    Message m;
    m.parts.push_back(wire::encodeHeader(a));
    m.parts.push_back(Buffer());
    engine->transport_.send(msg.from, std::move(m));
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.pulls;
  }
  // A pull copies the running value: later pushes must not change a reply.
  Buffer out = Buffer::allocate(k.numElements * dtypeSize(k.dtype));
  if (!k.store.empty()) storeAccumulator(k.dtype, out.data(), k.store.data(), k.numElements);
  sendResult(msg.from, h.requestId, h.key, h.round, k, out, wire::kFlagAsync);
}

const uint8_t* ServerEngine::Shard::pushData(const DataHeader& h, const Message& msg,
                                             const KeyState& k) {
  if (!(h.flags & wire::kFlagShm)) return msg.parts[1].data();
  shm::Descriptor d;
  std::memcpy(&d, msg.parts[1].data(), sizeof(d));
  return engine->peers_->resolve(msg.from, d.segment, d.offset,
                                 k.numElements * dtypeSize(k.dtype));
}

void ServerEngine::Shard::sendResult(const NodeId& to, uint32_t requestId, uint64_t key,
                                     uint64_t round, const KeyState& k, const Buffer& body,
                                     uint8_t flags, bool wantsShm) {
  DataHeader r;
  r.op = Op::kPullResponse;
  r.flags = flags;
  r.requestId = requestId;
  r.key = key;
  r.round = round;
  r.dtype = k.dtype;
  r.numElements = k.numElements;
  Message m;
  if (wantsShm && k.resultRegion.data != nullptr && !(flags & wire::kFlagAsync)) {
    shm::Descriptor d{k.resultRegion.segment, 0, k.resultRegion.offset};
    r.flags |= wire::kFlagShm;
    r.bodyBytes = sizeof(d);
    m.parts.push_back(wire::encodeHeader(r));
    m.parts.push_back(Buffer::copyOf(&d, sizeof(d)));
  } else {
    r.bodyBytes = body.size();
    m.parts.push_back(wire::encodeHeader(r));
    m.parts.push_back(body);
  }
  engine->transport_.send(to, std::move(m));
}

}  // namespace cortado::server
