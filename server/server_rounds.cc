// A key's rounds on its shard (server_shard.h): the sync and async sums,
// compressed pushes checked and added, and the answers to pulls (re-encoded
// where asked, with the key's residual).
#include "server/server_shard.h"

namespace cortado::server {

void ServerEngine::Shard::processSync(KeyState& k, const DataHeader& h, Message& msg) {
  const int w = msg.from.rank;
  if (h.op == Op::kPush) {
    // One "server" event per push handled, when tracing.
    struct TraceGuard {
      Tracer* t;
      const KeyState& k;
      const DataHeader& h;
      int lane;
      double start;
      ~TraceGuard() {
        if (t)
          t->record("server", k.tensorName.empty() ? fmt::format("key {}", h.key) : k.tensorName,
                    int64_t(h.round), fmt::format("engine {}", lane), start, Tracer::now());
      }
    };
    Tracer* tr = engine->opts_.tracer && engine->opts_.tracer->wants(int64_t(h.round))
                     ? engine->opts_.tracer.get()
                     : nullptr;
    TraceGuard guard{tr, k, h, index, tr ? Tracer::now() : 0};
    CORTADO_ENFORCE(h.round == k.round, ErrorCode::kProtocol,
                    "key {}: {} pushed round {} but the server is summing round {}", h.key,
                    msg.from.toString(), h.round, k.round);
    CORTADO_ENFORCE(!k.pushedBy[w], ErrorCode::kProtocol,
                    "key {}: {} pushed round {} twice", h.key, msg.from.toString(), h.round);
    const DType accT = accumulatorDType(k.dtype);
    const size_t accBytes = k.numElements * dtypeSize(accT);
    const size_t outBytes = k.numElements * dtypeSize(k.dtype);
    const uint8_t* src = k.compressed ? nullptr : pushData(h, msg, k);
    if (engine->arena_ && !k.shmTried && k.numElements > 0 && !k.compressed) {
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
      // write into it. Recycling happens at completion (see below); a plain
      // key's sum comes from the engine's spares as its round begins.
      if (k.acc.size() != accBytes) {
        k.acc = !k.compressed && accT == k.dtype ? engine->takeSpare(accBytes)
                                                 : Buffer::allocate(accBytes);
        k.accZero = false;
      }
      acc = k.acc.data();
    }
    if (k.compressed) {
      // Decoded straight into the fp32 sum; a bad payload throws before it
      // writes anything, so the sum stays what the good pushes made it.
      if (k.pushes == 0) {
        if (!k.accZero) std::fill_n(reinterpret_cast<float*>(acc), k.numElements, 0.0f);
        k.accZero = false;
      }
      decompressInto(k, h, msg, reinterpret_cast<float*>(acc));
    } else if (k.pushes == 0) {
      loadAccumulator(k.dtype, acc, src, k.numElements);
    } else {
      accumulate(k.dtype, acc, src, k.numElements);
    }
    k.pushedBy[w] = true;
    if (k.pushes++ == 0) k.roundStart = std::chrono::steady_clock::now();
    if (h.flags & wire::kFlagFlushResidual) k.flushRound = k.round;
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.pushes;
    }
    // Summed: the push's bytes go now; its sender hears of it, unless this
    // push completes the round (the answer to its pull, next, says so).
    pushSummed(h, msg, k.dtype, (h.flags & wire::kFlagAck) && k.pushes < k.expected);
    if (k.pushes < k.expected) return;
    // Round complete: publish the sum, start the next round. Every worker
    // pushed this round only after it had pulled the previous one, so the old
    // result is free once the transport lets go of it.
    // A flushed round (kFlagFlushResidual on any push): a key that holds a
    // residual answers dense with it added, so the retiring plan's last
    // answer carries every bit the server still owed; keys without one
    // (sparse or lossless answers, no lossy round yet) answer as always.
    const bool flush = k.flushRound == k.round && k.ef != nullptr;
    if (flush) k.flushedRound = k.round;
    if (k.compressed && flush) {
      Buffer old = std::move(k.result);
      flushInto(k, reinterpret_cast<const float*>(k.acc.data()), k.result, std::move(old));
      k.resultCompressed = false;
    } else if (k.compressed && k.denseAnswer) {
      Buffer old = std::move(k.result);
      k.result = takeBuffer(old, accBytes);
      std::memcpy(k.result.data(), k.acc.data(), accBytes);
      k.resultCompressed = false;
    } else if (k.compressed) {
      Buffer old = std::move(k.result);
      encodeAnswer(k, h.key, reinterpret_cast<const float*>(k.acc.data()), std::move(old));
    } else if (useShm) {
      k.resultRegion = k.regions[k.round % 2];
      if (!direct) storeAccumulator(k.dtype, k.resultRegion.data, k.acc.data(), k.numElements);
      // Remote pullers get the region's bytes; no owner: the region outlives
      // every send (see core/shm/shm_segment.h).
      k.result = Buffer::wrap(k.resultRegion.data, outBytes, nullptr);
    } else {
      Buffer old = std::move(k.result);
      if (accT == k.dtype) {
        // The sum is the answer; the last answer becomes a spare for any
        // key's next round instead of this key's sum between rounds, so an
        // idle key holds its answer alone (1x its bytes, not 2x).
        k.result = std::move(k.acc);
        k.acc = Buffer();  // a moved-from Buffer keeps its size
        engine->keepSpare(std::move(old));
      } else {
        k.result = takeBuffer(old, outBytes);
        storeAccumulator(k.dtype, k.result.data(), k.acc.data(), k.numElements);
      }
    }
    if (k.compressed && k.tracking) {
      // Nothing else was written: clearing these makes the sum zero again.
      float* sum = reinterpret_cast<float*>(k.acc.data());
      for (uint32_t i : k.touched.merged()) sum[i] = 0.0f;
      k.accZero = true;
    }
    k.doneRound = k.round;
    ++k.round;
    k.pushes = 0;
    std::fill(k.pushedBy.begin(), k.pushedBy.end(), false);
    if (k.stallReported) {
      CORTADO_LOG_INFO(
          "{}: stalled round {} completed after {:.1f} s", k.describe(h.key), k.doneRound,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - k.roundStart).count());
      k.stallReported = false;
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.roundsCompleted;
    }
    for (const auto& p : takeWaiting(k)) answerPull(k, h.key, p);
    return;
  }
  // PULL
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.pulls;
  }
  const bool wantsShm = h.flags & wire::kFlagShm;
  const bool wantsCompressed = h.flags & wire::kFlagCompressed;
  if (wantsCompressed) answerCodecOf(k, h, msg);
  if (h.round == k.doneRound) {
    answerPull(k, h.key, PendingPull{msg.from, h.requestId, wantsShm, wantsCompressed});
  } else if (h.round == k.round) {
    addWaiting(k, {msg.from, h.requestId, wantsShm, wantsCompressed});
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
  if (h.op == Op::kPush && k.compressed) {
    if (k.store.empty() && k.numElements > 0) {
      k.store = Buffer::allocate(k.numElements * sizeof(float));
      std::fill_n(reinterpret_cast<float*>(k.store.data()), k.numElements, 0.0f);
    }
    decompressInto(k, h, msg, reinterpret_cast<float*>(k.store.data()));
  } else if (h.op == Op::kPush) {
    if (k.store.empty() && k.numElements > 0) {
      k.store = Buffer::allocate(k.numElements * dtypeSize(accumulatorDType(k.dtype)));
      loadAccumulator(k.dtype, k.store.data(), pushData(h, msg, k), k.numElements);
    } else {
      accumulate(k.dtype, k.store.data(), pushData(h, msg, k), k.numElements);
    }
  }
  if (h.op == Op::kPush) {
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.pushes;
    }
    pushSummed(h, msg, k.dtype, true);
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
  if (wantsShm && k.resultRegion.data != nullptr &&
      !(flags & (wire::kFlagAsync | wire::kFlagCompressed))) {
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

std::span<const std::byte> ServerEngine::Shard::compressedPayload(KeyState& k,
                                                                   const DataHeader& h,
                                                                   const Message& msg) {
  wire::CompressedPush p;
  try {
    p = wire::parseCompressedPush(msg.parts[1].data(), msg.parts[1].size());
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol, fmt::format("{}: malformed compressed push from {}: {}",
                                                  k.describe(h.key), msg.from.toString(),
                                                  e.what()));
  }
  if (!k.codec) {
    // The key's first push: the canonical spec names a codec we know.
    std::string spec(p.codecSpec);
    std::string name(p.tensorName);
    std::string what = name.empty() ? fmt::format("key {}", h.key)
                                    : fmt::format("tensor '{}' (key {})", name, h.key);
    try {
      std::string canonical = engine->codecs_->canonical(spec);
      CORTADO_ENFORCE(canonical == spec, ErrorCode::kProtocol,
                      "codec spec '{}' is not in canonical form ('{}')", spec, canonical);
      k.codec = engine->codecs_->create(spec);
    } catch (const Error& e) {
      throw Error(ErrorCode::kProtocol, fmt::format("{}: {} pushed with codec '{}', which this "
                                                    "server cannot build: {}",
                                                    what, msg.from.toString(), spec, e.what()));
    }
    CORTADO_ENFORCE(k.codec->id() != compressor::CodecId::kPowerSgd, ErrorCode::kProtocol,
                    "{}: {} pushed with powersgd, which push-pull does not run", what,
                    msg.from.toString());
    k.codecSpec = std::move(spec);
    k.tensorName = std::move(name);
  } else {
    CORTADO_ENFORCE(p.codecSpec == k.codecSpec && p.tensorName == k.tensorName,
                    ErrorCode::kMismatch,
                    "{}: {} pushed tensor '{}' with codec '{}', but this key holds tensor '{}' "
                    "with codec '{}' (workers declared the tensor differently?)",
                    k.describe(h.key), msg.from.toString(), p.tensorName, p.codecSpec,
                    k.tensorName, k.codecSpec);
  }
  return {reinterpret_cast<const std::byte*>(p.payload), p.payloadBytes};
}

void ServerEngine::Shard::decompressInto(KeyState& k, const DataHeader& h, const Message& msg,
                                         float* sum) {
  std::span<const std::byte> payload = compressedPayload(k, h, msg);  // sets k.codec
  if (k.pushes == 0) {
    k.tracking = compressor::listsIndices(k.codec->id());
    if (k.tracking) k.touched.reset(k.numElements);
  }
  // Top-k and DGC pushes may come compact: in their plain form from here on.
  if (compressor::listsIndices(k.codec->id())) {
    try {
      payload = compressor::expandRun(payload, scratch);
    } catch (const Error& e) {
      throw Error(ErrorCode::kProtocol,
                  fmt::format("{}: malformed {} payload from {} (round {}): {}",
                              k.describe(h.key), k.codecSpec, msg.from.toString(), h.round,
                              e.what()));
    }
  }
  // One payload, or (plan executor) several of the same chunk back to back.
  // Top-k and DGC payloads may list any number of elements (GraVAC's
  // messages, which the plan executor pushes as they are): each is sized by
  // its header. The other codecs' payloads have the codec's fixed size.
  std::vector<std::span<const std::byte>> payloads;
  const size_t one = k.codec->payloadBytes(k.numElements);
  if (compressor::listsIndices(k.codec->id())) {
    try {
      payloads = compressor::splitRun(payload);
    } catch (const Error& e) {
      throw Error(ErrorCode::kProtocol,
                  fmt::format("{}: malformed {} payload from {} (round {}): {}", k.describe(h.key),
                              k.codecSpec, msg.from.toString(), h.round, e.what()));
    }
    CORTADO_ENFORCE(!payloads.empty(), ErrorCode::kProtocol,
                    "{}: {} pushed no {} payload for {} elements", k.describe(h.key),
                    msg.from.toString(), k.codecSpec, k.numElements);
  } else {
    CORTADO_ENFORCE(one > 0 && !payload.empty() && payload.size() % one == 0, ErrorCode::kProtocol,
                    "{}: {} pushed {} payload bytes, not a whole number of {}-byte {} payloads "
                    "of {} elements",
                    k.describe(h.key), msg.from.toString(), payload.size(), one, k.codecSpec,
                    k.numElements);
    for (size_t at = 0; at < payload.size(); at += one)
      payloads.push_back(payload.subspan(at, one));
  }
  try {
    // Validate every payload (header and body) before adding any, so a push
    // refused for its last payload leaves the sum as the good pushes made it.
    // One payload checks itself in decompressAdd before it writes.
    for (size_t i = 0; payloads.size() > 1 && i < payloads.size(); ++i)
      k.codec->validate(payloads[i], k.numElements);
    // Top-k and DGC: every payload's indices first (checked in range), so
    // whatever the adds write is among them, and an index out of range in
    // any payload refuses the push before anything is added.
    for (size_t i = 0; k.tracking && i < payloads.size(); ++i) {
      k.touched.add(payloads[i]);
      if (k.touched.added() > k.numElements / 4) k.tracking = false;  // dense: scan at the end
    }
    for (const auto& p : payloads) k.codec->decompressAdd(p, sum, k.numElements);
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol,
                fmt::format("{}: malformed {} payload from {} (round {}): {}", k.describe(h.key),
                            k.codecSpec, msg.from.toString(), h.round, e.what()));
  }
}

void ServerEngine::Shard::encodeAnswer(KeyState& k, uint64_t key, const float* sum,
                                       Buffer recycled) {
  std::span<const uint32_t> touched;
  if (k.tracking) touched = k.touched.merged();
  k.resultCompressed = encodeSum(k, k.codec, key, k.round, sum, k.numElements, k.result,
                                 std::move(recycled), k.tracking ? &touched : nullptr);
}

void ServerEngine::Shard::answerCodecOf(KeyState& k, const DataHeader& h, const Message& msg) {
  CORTADO_ENFORCE(!k.compressed && k.dtype == DType::kFloat32 && !(h.flags & wire::kFlagAsync),
                  ErrorCode::kProtocol,
                  "{}: {} asked for a compressed answer, which only uncompressed float32 keys in "
                  "sync mode give",
                  k.describe(h.key), msg.from.toString());
  wire::CompressedPush p;
  try {
    p = wire::parseCompressedPush(msg.parts[1].data(), msg.parts[1].size());
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol, fmt::format("{}: malformed compressed pull from {}: {}",
                                                  k.describe(h.key), msg.from.toString(), e.what()));
  }
  if (k.answerCodec) {
    CORTADO_ENFORCE(p.codecSpec == k.answerSpec, ErrorCode::kMismatch,
                    "{}: {} pulled in codec '{}', but earlier pulls asked for '{}'",
                    k.describe(h.key), msg.from.toString(), p.codecSpec, k.answerSpec);
    return;
  }
  std::string spec(p.codecSpec);
  try {
    k.answerCodec = engine->codecs_->create(spec);
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol, fmt::format("{}: {} pulled in codec '{}', which this server "
                                                  "cannot build: {}",
                                                  k.describe(h.key), msg.from.toString(), spec,
                                                  e.what()));
  }
  k.answerSpec = std::move(spec);
  k.errorFeedback = h.flags & wire::kFlagErrorFeedback;
  if (k.tensorName.empty()) k.tensorName = std::string(p.tensorName);
}

void ServerEngine::Shard::answerPull(KeyState& k, uint64_t key, const PendingPull& p) {
  if (!p.wantsCompressed) {
    sendResult(p.from, p.requestId, key, k.doneRound, k, k.result,
               k.resultCompressed ? wire::kFlagCompressed : 0, p.wantsShm);
    return;
  }
  if (k.encodedRound != k.doneRound) {
    Buffer old = std::move(k.encoded);
    if (k.flushedRound == k.doneRound) {
      // A raw key's flushed round (k.result is fp32: answerCodecOf checked).
      flushInto(k, reinterpret_cast<const float*>(k.result.data()), k.encoded, std::move(old));
      k.encodedCompressed = false;
    } else {
      k.encodedCompressed = encodeSum(k, k.answerCodec, key, k.doneRound,
                                      reinterpret_cast<const float*>(k.result.data()),
                                      k.numElements, k.encoded, std::move(old));
    }
    k.encodedRound = k.doneRound;
  }
  sendResult(p.from, p.requestId, key, k.doneRound, k, k.encoded,
             k.encodedCompressed ? wire::kFlagCompressed : 0, false);
}

void ServerEngine::Shard::flushInto(KeyState& k, const float* sum, Buffer& out,
                                    Buffer recycled) {
  const size_t n = k.numElements;
  out = takeBuffer(recycled, n * sizeof(float));
  float* dst = reinterpret_cast<float*>(out.data());
  std::memcpy(dst, sum, n * sizeof(float));
  if (k.ef) {
    auto r = k.ef->residual(0);
    for (size_t i = 0; i < r.size() && i < n; ++i) dst[i] += r[i];
    k.ef->reset(0);
  }
}

bool ServerEngine::Shard::encodeSum(KeyState& k, const compressor::CodecPtr& codecPtr,
                                    uint64_t key, uint64_t round, const float* sum, size_t n,
                                    Buffer& result, Buffer recycled,
                                    const std::span<const uint32_t>* touched) {
  const compressor::Codec& codec = *codecPtr;
  const size_t denseBytes = n * sizeof(float);
  if (codec.sparse()) {
    // The sum of sparse payloads has at most W*k nonzeros: send all of them
    // (lossless, so the workers' error feedback stays exact), or the dense
    // sum when that is smaller. With the indices the payloads carried, only
    // those elements are read.
    const size_t nonzeros = touched ? compressor::countNonzeros(sum, *touched)
                                    : compressor::countNonzeros(sum, n);
    const size_t bytes = compressor::sparseSumBytes(nonzeros);
    // The compact form takes at least 5 bytes a nonzero: built (from the
    // plain one) only where it may beat the dense sum, sent where smaller.
    if (engine->opts_.compactSparse &&
        compressor::kHeaderBytes + 5 * nonzeros < std::min(bytes, denseBytes)) {
      scratch.resize(bytes);
      if (touched)
        compressor::encodeSparseSum(sum, n, *touched, nonzeros, scratch);
      else
        compressor::encodeSparseSum(sum, n, nonzeros, scratch);
      const size_t compact = compressor::compactBytes(scratch);
      if (compact > 0 && compact < std::min(bytes, denseBytes)) {
        result = takeBuffer(recycled, compact);
        compressor::compactSparsePayload(
            scratch, {reinterpret_cast<std::byte*>(result.data()), compact});
        return true;
      }
      if (bytes < denseBytes) {
        result = takeBuffer(recycled, bytes);
        std::memcpy(result.data(), scratch.data(), bytes);
        return true;
      }
    }
    if (bytes < denseBytes) {
      result = takeBuffer(recycled, bytes);
      std::span<std::byte> out{reinterpret_cast<std::byte*>(result.data()), bytes};
      if (touched)
        compressor::encodeSparseSum(sum, n, *touched, nonzeros, out);
      else
        compressor::encodeSparseSum(sum, n, nonzeros, out);
      return true;
    }
    result = takeBuffer(recycled, denseBytes);
    std::memcpy(result.data(), sum, denseBytes);
    return false;
  }
  // Casts and quantizers: the sum in the codec's form (fp16 and bf16 round
  // once; the stochastic ones draw from a seed of the key and round). With
  // error feedback (BytePS's server-side compression keeps it too) what this
  // encode drops stays in the key's residual and goes out with a later round:
  //   p = sum + e;  answer = encode(p);  e = p - decode(answer)
  // so the answers sent up to round t add up to the sums received minus e_t,
  // one round's residual, instead of losing a little every round. DGC's
  // momentum correction is the workers' (it is applied to gradients, not to
  // sums), and DGC answers losslessly above anyway: momentum 0 here.
  const size_t bytes = codec.payloadBytes(n);
  result = takeBuffer(recycled, bytes);
  compressor::EncodeContext ctx;
  ctx.seed = compressor::format::hash2(compressor::format::hash2(key, round), 0);
  std::span<std::byte> out{reinterpret_cast<std::byte*>(result.data()), bytes};
  // signsgd's answer is the majority vote, ±1 whatever the sum's magnitude:
  // not an approximation of the sum, so a residual would only pile up.
  if (k.errorFeedback && codec.id() != compressor::CodecId::kSignSgd) {
    if (!k.ef) k.ef = std::make_unique<compressor::ErrorFeedback>(codecPtr, 0.0f);
    k.ef->encode(0, sum, n, out, ctx);
  } else {
    codec.encode(sum, n, out, ctx);
  }
  return true;
}

}  // namespace cortado::server
