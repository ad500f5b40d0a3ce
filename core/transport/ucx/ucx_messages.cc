// The UCX transport's messages (see ucx_transport.cc for the wire format and
// threads): send() and the two layouts on the wire (packed, one big part),
// receive with rendezvous into pooled buffers, and in-order delivery of each
// stream.
#include <cstring>

#include "core/common/logging.h"
#include "core/transport/ucx/ucx_transport_impl.h"

namespace cortado::transport::ucx::detail {
void UcxTransport::send(const NodeId& peer, Message msg) {
  const bool onLoop = onLoopThread();
  if (!onLoop && sendDirect(peer, &msg, 1)) return;
  queue_.send(onLoop, peer, std::move(msg),
              [this](const NodeId& p, Message& m) { return sendFromLoop(p, m); });
}

void UcxTransport::sendAll(const NodeId& peer, std::vector<Message> msgs) {
  const bool onLoop = onLoopThread();
  if (!onLoop && sendDirect(peer, msgs.data(), msgs.size())) return;
  queue_.sendAll(onLoop, peer, std::move(msgs),
                 [this](const NodeId& p, Message& m) { return sendFromLoop(p, m); });
}

bool UcxTransport::sendDirect(const NodeId& peer, Message* msgs, size_t n) {
  std::unique_lock<std::mutex> lk(loopMu_, std::try_to_lock);
  if (!lk.owns_lock() || stop_ || !batch_.empty() || !queue_.idle()) return false;
  auto it = peers_.find(peer);
  if (it == peers_.end() || !it->second.dataEp || it->second.reported) return false;
  for (size_t i = 0; i < n; ++i) sendTo(peer, std::move(msgs[i]));
  // What the sleeping loop must see to at once: a send still in progress
  // (a full FIFO, a rendezvous), which progress completes, or a failure.
  // And the send was a UCX call on the direct worker, which the loop armed
  // before it went to sleep: UCX may have taken events off it, which would
  // then not signal the event fd the loop sleeps on before the loop's next
  // timeout (10 ms). So the workers are armed again here, and the loop
  // woken where that finds work.
  cmArmed_ = false;
  if (!inflight_.empty() || !failures_.empty() || !armWorkers()) queue_.wakeLoop();
  return true;
}

bool UcxTransport::sendFromLoop(const NodeId& peer, Message& msg) {
  if (!queue_.mayWriteNow(peer) || !batch_.empty()) return false;
  sendTo(peer, std::move(msg));
  return true;
}

void UcxTransport::onSendDone(void* request, ucs_status_t status, void* user) {
  auto* ctx = static_cast<SendCtx*>(user);
  ctx->t->sendDone(ctx, status);
  ucp_request_free(request);
}

void UcxTransport::onRecvDone(void* request, ucs_status_t status, size_t, void* user) {
  auto* ctx = static_cast<RecvCtx*>(user);
  ctx->t->recvDone(ctx, status);
  ucp_request_free(request);
}

ucs_status_t UcxTransport::onAm(void* arg, const void* header, size_t headerLength, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  return t->receive(t->worker_, header, headerLength, data, length, param);
}

ucs_status_t UcxTransport::onAmDirect(void* arg, const void* header, size_t headerLength,
                                      void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  return t->receive(t->directWorker_, header, headerLength, data, length, param);
}

void UcxTransport::sendTo(const NodeId& peer, Message msg) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    held_.hold(peer, std::move(msg), options_.connectTimeout);
    return;
  }
  if (it->second.reported) {
    CORTADO_LOG_DEBUG("ucx {}: dropping a message to {}: its endpoint failed", self_, peer);
    return;
  }
  Peer& p = it->second;
  const bool large = msg.totalBytes() >= kPeerSendBytes;
  if (!p.waiting.empty() || mustWait(p, large)) {
    p.waiting.push_back(std::move(msg));
    return;
  }
  startData(peer, p, std::move(msg), large);
}

bool UcxTransport::mustWait(const Peer& p, bool large) const {
  return large && options_.peerSends > 0 && p.largeInFlight >= options_.peerSends;
}

void UcxTransport::startData(const NodeId& peer, Peer& p, Message msg, bool large) {
  if (large) ++p.largeInFlight;
  // Same stream and numbering on both endpoints: the receiver puts the
  // messages sent before the direct endpoint existed in order with those
  // after.
  ucp_ep_h ep = p.dataEp ? p.dataEp : p.ep;
  startSend(peer, ep, kAmData, std::move(msg.parts), p.stream, p.nextSeq++, large);
}

void UcxTransport::startWaiting(const NodeId& peer, Peer& p, bool all) {
  // A send that completes at once comes back here through sendDone(): the
  // outer call goes on where it left.
  if (startingWaiting_) return;
  startingWaiting_ = true;
  while (!p.waiting.empty() && !p.reported) {
    const bool large = p.waiting.front().totalBytes() >= kPeerSendBytes;
    if (!all && mustWait(p, large)) break;
    Message msg = std::move(p.waiting.front());
    p.waiting.pop_front();
    startData(peer, p, std::move(msg), large);
  }
  startingWaiting_ = false;
}

void UcxTransport::startSend(const NodeId& peer, ucp_ep_h ep, unsigned am,
                             std::vector<Buffer> parts, uint64_t stream, uint64_t seq,
                             bool large) {
  auto* ctx = new SendCtx;
  ctx->t = this;
  ctx->large = large;
  ctx->peer = peer;
  ctx->ep = ep;
  ctx->am = am;
  ctx->header = wireHeader_;
  ctx->header.stream = stream;
  ctx->header.seq = seq;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = &onSendDone;
  rp.user_data = ctx;
  if (am == kAmHello) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;  // the peer answers on the endpoint it came on
  }
  const void* buffer = nullptr;
  size_t count = 0;
  const void* head = &ctx->header;
  size_t headLength = sizeof(ctx->header);
  if (am == kAmData && packOneBig(ctx, parts)) {
    ctx->parts = std::move(parts);
    const Buffer& big = ctx->parts[ctx->header.bigIndex];
    head = ctx->head.data();
    headLength = ctx->head.size();
    buffer = big.data();
    count = big.size();  // contiguous: count is in bytes
  } else if (am == kAmWelcome) {
    ctx->packed = welcome_;
    buffer = ctx->packed.data();
    count = ctx->packed.size();
  } else if (am == kAmData) {
    // Packed: one contiguous copy. UCX 1.13 aborts on iovec sends over its
    // shared-memory transports (proto_am.inl "max_iov > 1"), and messages
    // here are small or rare (several large parts).
    size_t total = sizeof(uint64_t) * (parts.size() + 1);
    for (const auto& b : parts) total += b.size();
    ctx->packed.resize(total);
    uint8_t* p = ctx->packed.data();
    uint64_t n = parts.size();
    std::memcpy(p, &n, sizeof(n));
    p += sizeof(n);
    for (const auto& b : parts) {
      uint64_t size = b.size();
      std::memcpy(p, &size, sizeof(size));
      p += sizeof(size);
    }
    for (const auto& b : parts) {
      if (b.empty()) continue;
      std::memcpy(p, b.data(), b.size());
      p += b.size();
    }
    buffer = ctx->packed.data();
    count = ctx->packed.size();
  }
  auto epIt = eps_.find(ep);
  if (epIt == eps_.end() || !epIt->second->direct) {
    // On the connection manager's worker: the loop progresses it now.
    cmQuiet_ = false;
    if (am == kAmData) cmCarriesDataUntil_ = Clock::now() + kCmDataWindow;
  }
  inflight_.insert(ctx);
  if (am == kAmBye) ++byesInFlight_;
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, am, head, headLength, buffer, count, &rp);
  if (r == nullptr) {
    sendDone(ctx, UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    sendDone(ctx, UCS_PTR_STATUS(r));
  }
}

bool UcxTransport::packOneBig(SendCtx* ctx, const std::vector<Buffer>& parts) {
  int big = -1;
  size_t small = sizeof(uint64_t) * (parts.size() + 1);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].size() >= kBigPartBytes) {
      if (big >= 0) return false;
      big = static_cast<int>(i);
    } else {
      small += parts[i].size();
    }
  }
  if (big < 0 || sizeof(WireHeader) + small > maxInlineBytes_) return false;
  ctx->header.layout = kLayoutOneBig;
  ctx->header.bigIndex = static_cast<uint32_t>(big);
  auto& h = ctx->head;
  h.resize(sizeof(WireHeader) + small);
  uint8_t* p = h.data();
  std::memcpy(p, &ctx->header, sizeof(WireHeader));
  p += sizeof(WireHeader);
  uint64_t n = parts.size();
  std::memcpy(p, &n, sizeof(n));
  p += sizeof(n);
  for (const auto& b : parts) {
    uint64_t size = b.size();
    std::memcpy(p, &size, sizeof(size));
    p += sizeof(size);
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (static_cast<int>(i) == big || parts[i].empty()) continue;
    std::memcpy(p, parts[i].data(), parts[i].size());
    p += parts[i].size();
  }
  return true;
}

bool UcxTransport::unpackOneBig(const WireHeader& h, const void* header, size_t headerLength,
                                size_t bigSize, Pending& slot) {
  const uint8_t* p = static_cast<const uint8_t*>(header) + sizeof(WireHeader);
  size_t left = headerLength - sizeof(WireHeader);
  uint64_t n;
  if (left < sizeof(n)) return false;
  std::memcpy(&n, p, sizeof(n));
  p += sizeof(n);
  left -= sizeof(n);
  if (n > left / sizeof(uint64_t) || h.bigIndex >= n) return false;
  std::vector<uint64_t> sizes(n);
  std::memcpy(sizes.data(), p, n * sizeof(uint64_t));
  p += n * sizeof(uint64_t);
  left -= n * sizeof(uint64_t);
  if (sizes[h.bigIndex] != bigSize) return false;
  slot.parts.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (i == h.bigIndex || sizes[i] == 0) continue;
    if (sizes[i] > left) return false;
    slot.parts[i] = Buffer::copyOf(p, sizes[i]);
    p += sizes[i];
    left -= sizes[i];
  }
  if (left != 0) return false;
  slot.bigIndex = static_cast<int>(h.bigIndex);
  return true;
}

void UcxTransport::sendDone(SendCtx* ctx, ucs_status_t status) {
  inflight_.erase(ctx);
  if (ctx->am == kAmBye) --byesInFlight_;
  auto it = peers_.find(ctx->peer);
  bool current = it != peers_.end() && ctx->ep &&
                 (it->second.ep == ctx->ep || it->second.dataEp == ctx->ep);
  if (ctx->large && current && it->second.largeInFlight > 0) {
    --it->second.largeInFlight;
    if (!it->second.waiting.empty()) startWaiting(ctx->peer, it->second);
  }
  if (status == UCS_OK) {
    if (current && ctx->am == kAmHello) it->second.up = true;
  } else if (current && !it->second.reported && status != UCS_ERR_CANCELED) {
    size_t bytes = ctx->packed.size() + ctx->head.size();
    for (const auto& b : ctx->parts) bytes += b.size();
    failures_.push_back(
        {ctx->peer, fmt::format("ucx {}: cannot deliver a message of {} bytes ({} in the "
                                "header) to {} at {}: {}",
                                self_, bytes, ctx->head.size(), ctx->peer, it->second.address,
                                ucs_status_string(status))});
  }
  delete ctx;
}

ucs_status_t UcxTransport::receive(ucp_worker_h worker, const void* header, size_t headerLength,
                                   void* data, size_t length, const ucp_am_recv_param_t* param) {
  if (worker == worker_) cmCarriesDataUntil_ = Clock::now() + kCmDataWindow;
  WireHeader h;
  auto from = senderOf(header, headerLength, &h);
  if (!from) {
    CORTADO_LOG_WARN("ucx {}: dropped an active message without a Cortado header", self_);
    return UCS_OK;
  }
  StreamKey key{*from, h.stream};
  auto& stream = inbound_[key];
  if (h.seq < stream.next || stream.slots.count(h.seq)) {
    CORTADO_LOG_WARN("ucx {}: dropped a duplicate message {} from {}", self_, h.seq, *from);
    return UCS_OK;
  }
  Pending& slot = stream.slots[h.seq];
  if (h.layout == kLayoutOneBig && !unpackOneBig(h, header, headerLength, length, slot)) {
    CORTADO_LOG_WARN("ucx {}: dropped a malformed message {} from {}", self_, h.seq, *from);
    slot.ready = true;
    slot.failed = true;
    ready_.insert(key);
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    slot.data = Buffer::copyOf(data, length);
    slot.ready = true;
    ready_.insert(key);
    return UCS_OK;
  }
  slot.data = recvPool_->take(length);
  auto* ctx = new RecvCtx{this, key, &slot, worker};
  recvs_.insert(ctx);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = &onRecvDone;
  rp.user_data = ctx;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker, data, slot.data.data(), length, &rp);
  if (r == nullptr) {
    recvDone(ctx, UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    recvDone(ctx, UCS_PTR_STATUS(r));
  } else {
    ctx->request = r;
  }
  return UCS_INPROGRESS;
}

void UcxTransport::recvDone(RecvCtx* ctx, ucs_status_t status) {
  recvs_.erase(ctx);
  ctx->slot->ready = true;
  ctx->slot->failed = status != UCS_OK;
  if (status != UCS_OK) {
    CORTADO_LOG_WARN("ucx {}: receiving a message from {} failed: {}", self_, ctx->key.first,
                     ucs_status_string(status));
  }
  ready_.insert(ctx->key);
  delete ctx;
}

void UcxTransport::deliver(const StreamKey& key) {
  auto it = inbound_.find(key);
  if (it == inbound_.end()) return;
  const NodeId& from = key.first;
  Stream& stream = it->second;
  while (!stream.slots.empty() && !stop_) {
    auto first = stream.slots.begin();
    if (first->first != stream.next || !first->second.ready) break;
    Pending slot = std::move(first->second);
    stream.slots.erase(first);
    ++stream.next;
    if (slot.failed) continue;
    Message msg;
    msg.from = from;
    if (slot.bigIndex >= 0) {
      msg.parts = std::move(slot.parts);
      msg.parts[slot.bigIndex] = std::move(slot.data);
    } else if (!parse(slot.data, msg.parts)) {
      CORTADO_LOG_WARN("ucx {}: dropped a malformed message from {} ({} bytes)", self_, from,
                       slot.data.size());
      continue;
    }
    if (!onRecv_) {
      CORTADO_LOG_WARN("ucx {}: dropped a message from {}: no receive callback set", self_, from);
      continue;
    }
    try {
      onRecv_(std::move(msg));
    } catch (const std::exception& e) {
      CORTADO_LOG_ERROR("ucx {}: the receive callback threw on a message from {}: {}", self_,
                        from, e.what());
    }
  }
}

bool UcxTransport::parse(const Buffer& data, std::vector<Buffer>& parts) {
  if (data.size() < sizeof(uint64_t)) return false;
  uint64_t n;
  std::memcpy(&n, data.data(), sizeof(n));
  if (n > (data.size() / sizeof(uint64_t)) - 1) return false;
  size_t offset = (n + 1) * sizeof(uint64_t);
  std::vector<uint64_t> sizes(n);
  if (n) std::memcpy(sizes.data(), data.data() + sizeof(uint64_t), n * sizeof(uint64_t));
  for (uint64_t s : sizes) {
    if (s > data.size() - offset) return false;
    parts.push_back(s ? data.slice(offset, s) : Buffer());
    offset += s;
  }
  return offset == data.size();
}

}  // namespace cortado::transport::ucx::detail
