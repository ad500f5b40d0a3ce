// Private to the UCX transport (factory.h is its public face): the wire
// constants and header, the contexts of UCX requests and endpoints, and the
// UcxTransport class, whose members are defined by concern in
// ucx_transport.cc (construction, the loop thread, close; the wire format and
// threads are described there), ucx_endpoints.cc (listener, connect,
// hello/welcome, direct endpoints, failures, close of endpoints) and
// ucx_messages.cc (send, receive, the message layouts, in-order delivery).
#pragma once

#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/common/deadline.h"
#include "core/transport/held_sends.h"
#include "core/transport/op_queue.h"
#include "core/transport/ucx/factory.h"

namespace cortado::transport::ucx::detail {

constexpr unsigned kAmData = 1;
constexpr unsigned kAmHello = 2;
constexpr unsigned kAmBye = 3;
constexpr unsigned kAmWelcome = 4;
// A Welcome's payload: the host id (boot id and host name, NUL-padded), then
// the UCP worker address.
constexpr size_t kHostIdBytes = 128;
constexpr uint32_t kMagic = 0x43545558;  // "CTUX"
constexpr uint8_t kLayoutPacked = 0;
constexpr uint8_t kLayoutOneBig = 1;
// A part this large is sent as the contiguous payload (kLayoutOneBig) ...
constexpr size_t kBigPartBytes = 16 << 10;
// ... when the other parts and the part table fit in this many header bytes.
constexpr size_t kMaxInlineBytes = 1024;
// A data message of at least this many bytes counts against its peer's
// UcxOptions::peerSends: UCX sends it by rendezvous.
constexpr size_t kPeerSendBytes = 64 << 10;
constexpr Millis kLoopCallTimeout{10000};
// Queued operations the loop runs between two rounds of UCX progress.
constexpr int kOpsPerTurn = 256;

struct WireHeader {
  uint32_t magic = kMagic;
  uint8_t version = 2;
  uint8_t idLen = 0;
  char id[18] = {};
  uint64_t stream = 0;
  uint64_t seq = 0;
  uint8_t layout = kLayoutPacked;
  uint8_t pad[3] = {};
  uint32_t bigIndex = 0;  // kLayoutOneBig: which part is the payload
};

// The WireHeader at the start of an AM header (more bytes may follow it).
inline std::optional<NodeId> senderOf(const void* header, size_t length,
                                      WireHeader* out = nullptr) {
  if (length < sizeof(WireHeader)) return std::nullopt;
  WireHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.magic != kMagic || h.version != 2 || h.idLen > sizeof(h.id)) return std::nullopt;
  if (h.layout == kLayoutPacked && length != sizeof(WireHeader)) return std::nullopt;
  if (h.layout != kLayoutPacked && h.layout != kLayoutOneBig) return std::nullopt;
  if (out) *out = h;
  return NodeId::fromWire(std::string_view(h.id, h.idLen));
}

// A WireHeader naming `self`, with no stream, number or layout yet.
inline WireHeader headerFor(const NodeId& self) {
  WireHeader h;
  std::string id = self.toWire();
  h.idLen = static_cast<uint8_t>(std::min(id.size(), sizeof(h.id)));
  std::memcpy(h.id, id.data(), h.idLen);
  return h;
}

// (sender, stream): the unit of ordering.
using StreamKey = std::pair<NodeId, uint64_t>;

// Receive buffers for rendezvous data, not zero-filled (UCX writes all of
// it), reused: a fresh multi-MiB allocation is mapped anew by the allocator
// (a loop thread's arena trims what is freed), and its page faults cost about
// as much as the copy itself (perf, docs/benchmarks.md "Transports"). A
// buffer returns here when the last Buffer that shares it goes, from any
// thread; the pool keeps one while the buffers it holds, free and out
// together, stay within kMaxBytes (a server's memory counts them: with 256
// MiB free a server over UCX held 4.1x its keys' bytes, with 32 MiB free
// beside the pushes in flight 3.2-3.9x; docs/benchmarks.md "Memory of the
// roles"), so that a server whose pushes in flight stay within its push
// budget reuses its buffers and holds no more than that, and outlives the
// transport while buffers are out. Buffers of kMappedBytes and more are mapped and
// unmapped per buffer, so that what the pool lets go leaves the process
// (through malloc, a heap block freed in the middle of the heap stays).
class RecvPool : public std::enable_shared_from_this<RecvPool> {
 public:
  static constexpr size_t kMaxBytes = 16ull << 20;
  static constexpr size_t kMappedBytes = 64ull << 10;

  Buffer take(size_t size) {
    if (size == 0) return Buffer();
    void* p = nullptr;
    {
      std::lock_guard g(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        bytes_ -= size;
      }
      out_ += size;
    }
    if (!p) {
      try {
        p = allocate(size);
      } catch (...) {
        std::lock_guard g(mu_);
        out_ -= size;
        throw;
      }
    }
    std::shared_ptr<void> owner(p, [pool = shared_from_this(), size](void* q) { pool->give(q, size); });
    return Buffer::wrap(p, size, std::move(owner));
  }

  ~RecvPool() {
    for (auto& [size, list] : free_) {
      for (void* p : list) release(p, size);
    }
  }

 private:
  static void* allocate(size_t size) {
    if (size < kMappedBytes) return ::operator new(size, std::align_val_t(64));
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  static void release(void* p, size_t size) {
    if (size < kMappedBytes)
      ::operator delete(p, std::align_val_t(64));
    else
      munmap(p, size);
  }

  void give(void* p, size_t size) {
    {
      std::lock_guard g(mu_);
      out_ -= size;
      if (out_ + bytes_ + size <= kMaxBytes) {
        free_[size].push_back(p);
        bytes_ += size;
        return;
      }
    }
    release(p, size);
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t bytes_ = 0;  // free
  size_t out_ = 0;    // taken, not yet given back
};

class UcxTransport;

// Context of one UCX request; owns what the request reads until it completes.
struct SendCtx {
  UcxTransport* t = nullptr;
  NodeId peer;
  ucp_ep_h ep = nullptr;
  unsigned am = kAmData;
  WireHeader header;
  std::vector<uint8_t> head;    // kLayoutOneBig: WireHeader, part table, small parts
  std::vector<uint8_t> packed;  // kLayoutPacked: part table and parts
  std::vector<Buffer> parts;    // kLayoutOneBig: kept alive until sent
  bool large = false;           // counts in its peer's largeInFlight
};

struct Pending {
  Buffer data;                  // the payload
  std::vector<Buffer> parts;    // kLayoutOneBig: the parts, the big one empty
  int bigIndex = -1;            // kLayoutOneBig: where `data` goes
  bool ready = false;
  bool failed = false;
};

struct Stream {
  uint64_t next = 0;                 // the sequence number to deliver next
  std::map<uint64_t, Pending> slots;  // arrived or arriving, by sequence number
};

struct RecvCtx {
  UcxTransport* t = nullptr;
  StreamKey key;
  Pending* slot = nullptr;
  ucp_worker_h worker = nullptr;  // where the receive runs
  void* request = nullptr;        // its request while in progress (for the cancel at close)
};

// The argument of a listener's connection handler. While the transport is
// open, requests go to it (`t`); once it closed and parked the listener
// (ucx_transport.cc, parkUcp), `t` is null and requests are rejected. It
// lives as long as the listener, which may outlive the transport.
struct ListenerCtx {
  UcxTransport* t = nullptr;
  ucp_listener_h listener = nullptr;
};

// One endpoint: a client endpoint to a peer we connect()ed to, or one that a
// peer opened to our listener.
struct EpCtx {
  UcxTransport* t = nullptr;
  bool accepted = false;
  // A same-host data endpoint (from the peer's worker address, without
  // peer-failure handling); the peer's liveness comes from its client
  // endpoint, which has it.
  bool direct = false;
  NodeId peer;  // client and direct endpoints only
  ucp_ep_h ep = nullptr;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(NodeId self, UcxOptions options);
  ~UcxTransport() override;
  std::string name() const override { return "ucx"; }
  NodeId self() const override { return self_; }
  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override;
  std::string listen(const std::string& address) override;
  void connect(const NodeId& peer, const std::string& address) override;
  void send(const NodeId& peer, Message msg) override;
  void sendAll(const NodeId& peer, std::vector<Message> msgs) override;
  void disconnect(const NodeId& peer) override;
  void close() override;

  // ---- UCX callbacks (loop thread, inside ucp_worker_progress) ----

  static void onSendDone(void* request, ucs_status_t status, void* user);
  static void onRecvDone(void* request, ucs_status_t status, size_t, void* user);
  static void onEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void onConnRequest(ucp_conn_request_h request, void* arg);
  static ucs_status_t onAm(void* arg, const void* header, size_t headerLength, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t onAmDirect(void* arg, const void* header, size_t headerLength, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t onBye(void* arg, const void* header, size_t headerLength, void*, size_t,
                            const ucp_am_recv_param_t*);

  // A client endpoint's first message; answered with a Welcome over the
  // endpoint it came on (the accepted one), which carries our worker address.
  static ucs_status_t onHello(void* arg, const void* header, size_t headerLength, void*, size_t,
                              const ucp_am_recv_param_t* param);

  static ucs_status_t onWelcome(void* arg, const void* header, size_t headerLength, void* data,
                                size_t length, const ucp_am_recv_param_t* param);

 private:
  using Op = OpQueue::Op;

  struct Peer {
    std::string address;
    ucp_ep_h ep = nullptr;      // client endpoint (connection manager, peer-failure handling)
    ucp_ep_h dataEp = nullptr;  // same host: the direct endpoint that carries the data
    uint64_t stream = 0;
    uint64_t nextSeq = 0;
    bool up = false;
    bool reported = false;  // failed and reported; sends are dropped
    Clock::time_point deadline;
    // Large data messages started and not completed, and the messages that
    // wait, in order, because UcxOptions::peerSends of them are.
    int largeInFlight = 0;
    std::deque<Message> waiting;
  };

  struct EpFailure {
    EpCtx* ctx;
    ucs_status_t status;
  };

  struct Hello {
    ucp_ep_h replyEp;
    uint64_t stream;
  };

  struct Welcome {
    NodeId from;
    uint64_t stream = 0;
    std::string host;
    std::vector<uint8_t> address;  // empty: the peer offers no direct endpoint
  };

  // ---- any thread ----

  bool onLoopThread() const { return std::this_thread::get_id() == loopId_; }
  // On the loop thread: starts sending `msg` now when nothing that other
  // threads sent earlier is still queued (order per sender is the
  // contract), and returns true; false leaves `msg` for the queue.
  bool sendFromLoop(const NodeId& peer, Message& msg);
  // Off the loop thread: starts sending `msgs` on the calling thread, in
  // order, when the loop is asleep (loopMu_ free), nothing sent earlier
  // waits in the queue, and the peer is up on a same-host direct endpoint;
  // returns true. Saves waking the loop thread for a send (a worker's push
  // and pull). False leaves every message for the queue.
  bool sendDirect(const NodeId& peer, Message* msgs, size_t n);
  std::string callOnLoop(std::function<std::string()> fn, const std::string& what);

  // A UCP context with active messages and wake-ups, named `name`, from
  // `config` (released here), and its single-threaded worker. On failure both
  // handles stay null and `*step` names the call that failed.
  static ucs_status_t createUcp(ucp_config_t* config, const std::string& name,
                                ucp_context_h* context, ucp_worker_h* worker, const char** step);

  // ---- loop thread ----

  Status init();

  // The context and worker of same-host direct endpoints, and our Welcome's
  // worker address. UCX_TLS, when the user set it, decides their transports
  // as it does everywhere; otherwise kDirectTls (no cma) does.
  Status initDirect();

  void releaseDirect();
  void releaseAfterFailedInit();
  void loop();

  // Progresses the direct worker, and the connection manager's worker where
  // it may have work (below); `all`: both, always.
  unsigned progressWorkers(bool all = false);

  // Whether both workers are armed, i.e. the loop may sleep on their fds.
  // The connection manager's worker stays armed from one sleep to the next
  // while it has nothing to do.
  bool armWorkers();

  // How long the loop may sleep on the workers' fds: until the next timer,
  // and never long while shared memory is in use. UCX 1.13's shared-memory
  // transports can miss a wake-up: a send queued on a full FIFO completes
  // when the peer drains it, which no fd reports, and a receiver armed while
  // a message lands can sleep past it. Sleeping without a timeout, 2 runs in
  // 18 with 6 at once on 2 cores stalled a 5000-message stream at ~3900 for
  // good (TransportTest.ManyMessagesFromOneSenderArriveInOrder/ucx_direct);
  // polling sends in flight every 1 ms left 2 in 36 stalled at 4957-4981 (a
  // receiver's wake-up); with 10 ms otherwise, none in 72. Without direct
  // endpoints (TCP only) at most 100 ms: the same stream stalled once over
  // the connection manager's endpoints alone (.../ucx, 2026-11-29, under
  // ctest -j2, after the connection manager's worker began to stay armed
  // across sleeps; not seen again in 10 runs), so a missed wake-up there
  // costs a tenth of a second, not the stream.
  int waitTimeoutMs() const;

  std::string startListener(const std::string& address);
  void accept(ucp_conn_request_h request);
  ucp_ep_h createClientEp(const NodeId& peer, const std::string& address);
  void connectPeer(const NodeId& peer, const std::string& address);
  void sendTo(const NodeId& peer, Message msg);
  // Starts `peer`'s waiting messages, in order, while the peerSends bound
  // allows (all of them with `all`, at shutdown).
  void startWaiting(const NodeId& peer, Peer& p, bool all = false);
  // Whether a message (`large`: kPeerSendBytes or more) to `p` must wait
  // behind the UcxOptions::peerSends bound.
  bool mustWait(const Peer& p, bool large) const;
  // Starts a data message on the peer's current endpoint.
  void startData(const NodeId& peer, Peer& p, Message msg, bool large);

  // Starts one active message on `ep`; the SendCtx lives until it completes.
  void startSend(const NodeId& peer, ucp_ep_h ep, unsigned am, std::vector<Buffer> parts,
                 uint64_t stream = 0, uint64_t seq = 0, bool large = false);

  // Chooses kLayoutOneBig when exactly one part is large and the rest fit in
  // the AM header; then fills ctx->head.
  bool packOneBig(SendCtx* ctx, const std::vector<Buffer>& parts);

  // Reads a kLayoutOneBig header's part table and small parts; `bigSize` is
  // the payload's length, which must match the table.
  static bool unpackOneBig(const WireHeader& h, const void* header, size_t headerLength,
                           size_t bigSize, Pending& slot);

  void sendDone(SendCtx* ctx, ucs_status_t status);

  // `worker`: the one the message came on, which owns its rendezvous.
  ucs_status_t receive(ucp_worker_h worker, const void* header, size_t headerLength, void* data,
                       size_t length, const ucp_am_recv_param_t* param);

  void recvDone(RecvCtx* ctx, ucs_status_t status);
  void epFailed(EpCtx* ctx, ucs_status_t status) { epFailures_.push_back({ctx, status}); }

  // User callbacks, endpoint clean-up: after ucp_worker_progress() returns.
  void afterProgress();

  // A peer's Welcome: on the same host, a direct endpoint to its worker
  // address takes over the data (UCX then picks shared memory: posix or sysv
  // for active messages, cma for rendezvous). It asks for no peer-failure
  // handling, which in UCX 1.13 would leave shared memory out; the client
  // endpoint keeps it and watches the peer: when that endpoint fails, or the
  // peer says Bye, both are closed and the peer is reported.
  void welcomed(const Welcome& w);

  void fail(const NodeId& peer, Peer& p, ErrorCode code, std::string message);

  // Hands over, in the order sent, the messages of a stream that are complete.
  void deliver(const StreamKey& key);

  static bool parse(const Buffer& data, std::vector<Buffer>& parts);

  // Endpoints with peer-failure handling are closed by force (their sends
  // are cancelled). A direct endpoint has none, and UCX documents forcing
  // such an endpoint as undefined for a peer that is alive, so it is flushed
  // unless `force` says the peer failed; close() bounds the flush.
  void closeEp(ucp_ep_h ep, bool force = false);

  void reapClosing();
  void expireTimers();
  void report(const NodeId& peer, ErrorCode code, std::string message);

  // Progresses until `done` or the deadline.
  template <typename Done>
  void progressUntil(Done done, Deadline deadline);

  void shutdown();

  const NodeId self_;
  const UcxOptions options_;
  const WireHeader wireHeader_ = headerFor(self_);  // every message's, before stream and number
  int efd_ = -1;

  OpQueue queue_{"ucx " + self_.toString()};
  std::atomic<bool> stop_{false};

  // The loop's state (everything below "Loop thread only") belongs to the
  // holder of loopMu_: the loop thread, except while it sleeps or yields,
  // when sendDirect may take it.
  std::mutex loopMu_;
  std::mutex closeMu_;
  std::thread thread_;
  std::thread::id loopId_;

  // Loop thread only.
  std::deque<Op> batch_;         // taken from queue_, not yet run
  Clock::time_point pollUntil_;  // busy polling goes on until then
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  // Same-host direct endpoints live on their own context and worker, whose
  // transports may differ from the connection manager's (kDirectTls).
  ucp_context_h directContext_ = nullptr;
  ucp_worker_h directWorker_ = nullptr;
  int directWorkerFd_ = -1;
  ucp_listener_h listener_ = nullptr;
  std::unique_ptr<ListenerCtx> listenerCtx_;  // the listener's handler argument
  int workerFd_ = -1;
  // When the connection manager's worker is progressed. With same-host
  // direct endpoints it carries no data, and progressing it costs a system
  // call (UCX's TCP interface polls its sockets), which a small message's
  // round trip paid on every turn of the loop, on each side. It is
  // progressed when its fd is readable, after this loop did something on it
  // (a send on one of its endpoints, an endpoint closed, a connect, listen or
  // disconnect), until a progress finds nothing (`cmQuiet_`), at least every
  // kCmPollPeriod while the loop is awake (UCX's keepalive, events its async
  // thread left to progress), and on every turn for a while after it carried
  // data (peers on other hosts). Otherwise it stays armed across sleeps.
  static constexpr std::chrono::milliseconds kCmPollPeriod{1};
  static constexpr std::chrono::milliseconds kCmDataWindow{100};
  bool cmArmed_ = false;     // armed, and not progressed since
  bool cmReadable_ = false;  // the last epoll_wait reported its fd
  bool cmQuiet_ = false;     // its last progress found nothing, and nothing was asked of it since
  Clock::time_point cmDue_{};
  Clock::time_point cmCarriesDataUntil_{};
  size_t maxInlineBytes_ = 0;  // AM header bytes kLayoutOneBig may use
  int epfd_ = -1;
  RecvCallback onRecv_;
  ErrorCallback onError_;
  std::unordered_map<NodeId, Peer> peers_;
  HeldSends held_;  // sends to peers that connect() has not named yet
  bool startingWaiting_ = false;  // startWaiting() runs (a send completed inside it)
  std::unordered_map<ucp_ep_h, std::unique_ptr<EpCtx>> eps_;
  std::vector<std::unique_ptr<EpCtx>> closingCtx_;
  std::vector<void*> closing_;
  std::unordered_set<SendCtx*> inflight_;
  std::unordered_set<RecvCtx*> recvs_;  // rendezvous receives in progress
  size_t byesInFlight_ = 0;
  std::map<StreamKey, Stream> inbound_;
  std::set<StreamKey> ready_;
  std::mt19937_64 streamIds_{std::random_device{}()};
  std::vector<NodeId> byes_;
  std::vector<Hello> hellos_;
  std::vector<Welcome> welcomes_;
  std::vector<uint8_t> welcome_;  // our Welcome's payload
  std::shared_ptr<RecvPool> recvPool_ = std::make_shared<RecvPool>();
  std::string host_;
  bool direct_ = false;  // same-host peers may open direct endpoints to us, and we to them
  std::string directTls_;  // the direct context's transports, for the log
  std::vector<EpFailure> epFailures_;
  std::vector<std::pair<NodeId, std::string>> failures_;
};

}  // namespace cortado::transport::ucx::detail
