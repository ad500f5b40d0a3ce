// The UCX transport's endpoints (see ucx_transport.cc for the wire format and
// threads): the listener and accepted endpoints, connect() and client
// endpoints, the hello/welcome handshake and same-host direct endpoints, the
// peer's bye, failures and their reports, and closing endpoints.
#include <netdb.h>
#include <sys/socket.h>

#include <cstring>

#include "core/common/logging.h"
#include "core/transport/ucx/ucx_transport_impl.h"

namespace cortado::transport::ucx::detail {
namespace {

// "ucx://host:port" or "tcp://host:port" -> host, port.
std::pair<std::string, std::string> splitAddress(const NodeId& self, const std::string& address) {
  std::string rest;
  if (address.starts_with("ucx://") || address.starts_with("tcp://")) rest = address.substr(6);
  auto colon = rest.rfind(':');
  CORTADO_ENFORCE(!rest.empty() && colon != std::string::npos && colon > 0 && colon + 1 < rest.size(),
                  ErrorCode::kInvalidArgument,
                  "ucx {}: bad address '{}': expected ucx://host:port (or tcp://host:port)", self,
                  address);
  return {rest.substr(0, colon), rest.substr(colon + 1)};
}

sockaddr_storage resolve(const NodeId& self, const std::string& address, bool passive) {
  auto [host, port] = splitAddress(self, address);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host == "*" ? nullptr : host.c_str(), port.c_str(), &hints, &res);
  CORTADO_ENFORCE(rc == 0 && res, ErrorCode::kInvalidArgument, "ucx {}: cannot resolve {}: {}",
                  self, address, gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  return ss;
}

}  // namespace

std::string UcxTransport::listen(const std::string& address) {
  splitAddress(self_, address);
  return callOnLoop([this, address] { return startListener(address); },
                    "listen(" + address + ")");
}

void UcxTransport::connect(const NodeId& peer, const std::string& address) {
  // A listener returns ucx://; tcp:// is what a ZeroMQ node advertises.
  CORTADO_ENFORCE(!address.starts_with("tcp://"), ErrorCode::kInvalidArgument,
                  "ucx {}: {} is at {}, a ZeroMQ address: every node of a job must use the "
                  "same transport (CORTADO_TRANSPORT / --transport)",
                  self_, peer, address);
  splitAddress(self_, address);
  CORTADO_ENFORCE(queue_.postTask([this, peer, address] { connectPeer(peer, address); }),
                  ErrorCode::kClosed, "ucx {}: connect({}, {}) after close()", self_, peer,
                  address);
}

void UcxTransport::disconnect(const NodeId& peer) {
  queue_.postTask([this, peer] {
    held_.forget(peer);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    closeEp(it->second.dataEp, /*force=*/true);  // pending sends are dropped
    closeEp(it->second.ep);
    peers_.erase(it);
  });
}

void UcxTransport::onEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* ctx = static_cast<EpCtx*>(arg);
  ctx->t->epFailed(ctx, status);
}

void UcxTransport::onConnRequest(ucp_conn_request_h request, void* arg) {
  auto* ctx = static_cast<ListenerCtx*>(arg);
  if (ctx->t) {
    ctx->t->accept(request);
  } else {
    ucp_listener_reject(ctx->listener, request);  // closed: the listener is parked
  }
}

ucs_status_t UcxTransport::onBye(void* arg, const void* header, size_t headerLength, void*, size_t,
                                 const ucp_am_recv_param_t*) {
  auto* t = static_cast<UcxTransport*>(arg);
  if (auto from = senderOf(header, headerLength)) t->byes_.push_back(*from);
  return UCS_OK;
}

ucs_status_t UcxTransport::onHello(void* arg, const void* header, size_t headerLength, void*,
                                   size_t, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  WireHeader h;
  if (senderOf(header, headerLength, &h) && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    t->hellos_.push_back({param->reply_ep, h.stream});
  }
  return UCS_OK;
}

ucs_status_t UcxTransport::onWelcome(void* arg, const void* header, size_t headerLength, void* data,
                                     size_t length, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  WireHeader h;
  auto from = senderOf(header, headerLength, &h);
  if (!from || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length < kHostIdBytes) {
    return UCS_OK;
  }
  const char* p = static_cast<const char*>(data);
  Welcome w;
  w.from = *from;
  w.stream = h.stream;
  w.host.assign(p, strnlen(p, kHostIdBytes));
  w.address.assign(p + kHostIdBytes, p + length);
  t->welcomes_.push_back(std::move(w));
  return UCS_OK;
}

std::string UcxTransport::startListener(const std::string& address) {
  CORTADO_ENFORCE(listener_ == nullptr, ErrorCode::kInvalidArgument,
                  "ucx {}: listen({}): this transport already listens", self_, address);
  sockaddr_storage ss = resolve(self_, address, true);
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  lp.sockaddr.addrlen = sizeof(sockaddr_in);
  auto ctx = std::make_unique<ListenerCtx>();
  ctx->t = this;
  lp.conn_handler.cb = &onConnRequest;
  lp.conn_handler.arg = ctx.get();
  ucs_status_t s = ucp_listener_create(worker_, &lp, &listener_);
  if (s != UCS_OK) {
    listener_ = nullptr;
    throw Error(ErrorCode::kUnavailable,
                fmt::format("ucx {}: cannot listen on {}: {}", self_, address,
                            s == UCS_ERR_BUSY ? "the address is in use (by another process or "
                                                "another node of this job); pick a free port, "
                                                "or port 0 to let the system choose one"
                                              : ucs_status_string(s)));
  }
  ctx->listener = listener_;
  listenerCtx_ = std::move(ctx);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_, &attr);
  CORTADO_ENFORCE(s == UCS_OK, ErrorCode::kInternal, "ucx {}: ucp_listener_query: {}", self_,
                  ucs_status_string(s));
  auto* sin = reinterpret_cast<const sockaddr_in*>(&attr.sockaddr);
  auto [host, port] = splitAddress(self_, address);
  std::string bound = fmt::format("ucx://{}:{}", host, ntohs(sin->sin_port));
  CORTADO_LOG_DEBUG("ucx {}: listening on {}", self_, bound);
  return bound;
}

void UcxTransport::accept(ucp_conn_request_h request) {
  cmQuiet_ = false;
  if (stop_) {
    // Closing: an endpoint accepted now would only be closed again, and one
    // accepted after the close's last round of endpoint closes would be
    // left in the parked worker. The peer learns at once that we are gone.
    ucp_listener_reject(listener_, request);
    return;
  }
  auto ctx = std::make_unique<EpCtx>();
  ctx->t = this;
  ctx->accepted = true;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &onEpError;
  ep.err_handler.arg = ctx.get();
  ucs_status_t s = ucp_ep_create(worker_, &ep, &ctx->ep);
  if (s != UCS_OK) {
    CORTADO_LOG_WARN("ucx {}: cannot accept a connection: {}", self_, ucs_status_string(s));
    return;
  }
  eps_.emplace(ctx->ep, std::move(ctx));
}

ucp_ep_h UcxTransport::createClientEp(const NodeId& peer, const std::string& address) {
  sockaddr_storage ss = resolve(self_, address, false);
  auto ctx = std::make_unique<EpCtx>();
  ctx->t = this;
  ctx->peer = peer;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  ep.sockaddr.addrlen = sizeof(sockaddr_in);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &onEpError;
  ep.err_handler.arg = ctx.get();
  ucs_status_t s = ucp_ep_create(worker_, &ep, &ctx->ep);
  CORTADO_ENFORCE(s == UCS_OK, ErrorCode::kUnavailable, "ucp_ep_create: {}",
                  ucs_status_string(s));
  ucp_ep_h h = ctx->ep;
  eps_.emplace(h, std::move(ctx));
  return h;
}

void UcxTransport::connectPeer(const NodeId& peer, const std::string& address) {
  auto it = peers_.find(peer);
  if (it != peers_.end()) {
    if (it->second.address == address && !it->second.reported) return;
    closeEp(it->second.dataEp, /*force=*/true);
    closeEp(it->second.ep);
    peers_.erase(it);
  }
  Peer p;
  p.address = address;
  p.deadline = Clock::now() + options_.connectTimeout;
  try {
    p.ep = createClientEp(peer, address);
  } catch (const Error& e) {
    held_.forget(peer);
    report(peer, ErrorCode::kUnavailable,
           fmt::format("ucx {}: cannot connect to {} at {}: {}", self_, peer, address, e.what()));
    return;
  }
  p.stream = streamIds_();
  ucp_ep_h ep = p.ep;
  peers_.emplace(peer, std::move(p));
  startSend(peer, ep, kAmHello, {}, peers_[peer].stream);
  for (auto& m : held_.release(peer)) sendTo(peer, std::move(m));
}

void UcxTransport::welcomed(const Welcome& w) {
  auto it = peers_.find(w.from);
  if (it == peers_.end()) return;
  Peer& p = it->second;
  if (p.reported || p.stream != w.stream || !p.ep) return;
  p.up = true;
  if (p.dataEp || !direct_ || w.address.empty() || w.host != host_) return;
  auto ctx = std::make_unique<EpCtx>();
  ctx->t = this;
  ctx->direct = true;
  ctx->peer = w.from;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(w.address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ucs_status_t s = ucp_ep_create(directWorker_, &ep, &ctx->ep);
  if (s != UCS_OK) {
    CORTADO_LOG_DEBUG("ucx {}: no direct endpoint to {} (its client endpoint carries the data): {}",
                      self_, w.from, ucs_status_string(s));
    return;
  }
  p.dataEp = ctx->ep;
  CORTADO_LOG_DEBUG("ucx {}: direct endpoint to {} on this host", self_, w.from);
  eps_.emplace(ctx->ep, std::move(ctx));
}

void UcxTransport::fail(const NodeId& peer, Peer& p, ErrorCode code, std::string message) {
  p.reported = true;
  p.up = false;
  p.waiting.clear();  // never sent, as the sends that come after
  closeEp(p.dataEp, /*force=*/true);
  p.dataEp = nullptr;
  closeEp(p.ep);
  p.ep = nullptr;
  report(peer, code, std::move(message));
}

void UcxTransport::closeEp(ucp_ep_h ep, bool force) {
  if (!ep) return;
  auto it = eps_.find(ep);
  if (it == eps_.end()) return;  // closed already
  bool direct = it->second->direct;
  cmQuiet_ = false;  // the close may need the connection manager's progress
  closingCtx_.push_back(std::move(it->second));
  eps_.erase(it);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = direct && !force ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &rp);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
}

void UcxTransport::reapClosing() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) != UCS_INPROGRESS) {
      ucp_request_free(*it);
      it = closing_.erase(it);
    } else {
      ++it;
    }
  }
  // An endpoint's error handler may still name its EpCtx until its close
  // completes; after that nothing does.
  if (closing_.empty()) closingCtx_.clear();
}

void UcxTransport::expireTimers() {
  auto now = Clock::now();
  for (auto& [id, p] : peers_) {
    if (p.up || p.reported || p.deadline > now) continue;
    fail(id, p, ErrorCode::kUnavailable,
         fmt::format("ucx {}: cannot reach {} at {}: no connection within {} ms (is it "
                     "running and listening there?)",
                     self_, id, p.address, options_.connectTimeout.count()));
  }
  held_.expire(now, [&](const NodeId& id, size_t dropped) {
    report(id, ErrorCode::kUnavailable,
           fmt::format("ucx {}: cannot send to {}: connect() did not name its address within "
                       "{} ms ({} messages dropped)",
                       self_, id, options_.connectTimeout.count(), dropped));
  });
}

void UcxTransport::report(const NodeId& peer, ErrorCode code, std::string message) {
  CORTADO_LOG_WARN("{}", message);
  if (stop_ || !onError_) return;
  try {
    onError_(peer, Status(code, std::move(message)));
  } catch (const std::exception& e) {
    CORTADO_LOG_ERROR("ucx {}: the error callback threw: {}", self_, e.what());
  }
}

}  // namespace cortado::transport::ucx::detail
