// The UCX transport (see factory.h). Wire format: active message kAmData with
// a WireHeader (magic, version, sender's NodeId::toWire(), stream, sequence
// number, layout) in the AM header and one of two layouts:
// - kLayoutPacked: the payload is
//     [u64 part count n] [u64 size of part 0] ... [u64 size of part n-1] [parts...]
//   copied into one buffer (small messages, or several large parts).
// - kLayoutOneBig: a message with one large part and a few small ones (a push
//   or a pull answer: a small wire header and the tensor bytes). The AM header
//   carries, after the WireHeader, the same part table and the bytes of the
//   small parts; the payload is the large part alone, contiguous, so that UCX
//   moves it by zero-copy rendezvous (a contiguous buffer is what its
//   rendezvous protocols register and read directly; an iovec is not).
// kAmHello (no payload, sent with UCP_AM_SEND_FLAG_REPLY) is a client
// endpoint's first message: its completion says the endpoint is up, and the
// listener answers it with kAmWelcome over the accepted endpoint: its host id
// and, with UcxOptions::sameHostDirect, the address of its direct worker (a
// second UCP context and worker whose transports are UCX's shared-memory
// FIFOs), from which a same-host client makes a direct endpoint that then
// carries the data (same stream, same numbering). UCX may hand over active messages from one
// endpoint out of order (those sent while it was still wiring up come late), so every client
// endpoint is a stream with its own random id, its messages are numbered, and the receiver delivers
// each stream in order. kAmBye is sent by a closing node over the endpoints that peers opened to
// it, so that they learn of an orderly close at once.
//
// Threads: the UCP contexts, workers, listener and endpoints belong to the loop
// thread, which progresses both workers and sleeps on both event fds, and
// holds loopMu_ while it works. Other threads queue Ops and write an eventfd
// that the loop waits on next to the worker's event fd; a send that finds
// loopMu_ free (the loop asleep) and nothing queued before it starts on the
// calling thread instead (sendDirect), so the workers run in
// UCS_THREAD_MODE_SERIALIZED. UCX callbacks only record what happened; user
// callbacks run on the loop thread after ucp_worker_progress() returns,
// never inside it.
//
// This file: construction, the loop thread and close (init, loop, shutdown)
// and create(). Endpoints are in ucx_endpoints.cc, messages in
// ucx_messages.cc; the class is declared in ucx_transport_impl.h.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>

#include "core/common/deadline.h"
#include "core/common/logging.h"
#include "core/transport/ucx/factory.h"
#include "core/transport/ucx/ucx_transport_impl.h"

extern char** environ;

namespace cortado::transport::ucx::detail {
namespace {

// The UCX_* variables in force, for error messages.
std::string ucxEnvironment() {
  std::string s;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "UCX_", 4) == 0) s += (s.empty() ? "" : ", ") + std::string(*e);
  }
  return s.empty() ? "none set (UCX picks its transports itself)" : s;
}

// This machine's identity, to tell same-host peers: the kernel's boot id and
// the host name. The boot id alone would join the emulated hosts of
// tests/testbed (network and UTS namespaces of one kernel) and carry their
// traffic past the shaped links; the host name is also what core/shm goes by.
std::string hostId() {
  char boot[64] = {};
  FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return {};
  size_t n = std::fread(boot, 1, sizeof(boot) - 1, f);
  std::fclose(f);
  while (n > 0 && (boot[n - 1] == '\n' || boot[n - 1] == ' ')) --n;
  char host[64] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return {};
  std::string id = std::string(boot, n) + "/" + host;
  return id.size() < kHostIdBytes ? id : std::string();
}

// Closed transports' listener, worker and context, kept alive for a while:
// a connection request already under way when a listener is destroyed can
// reach it later from UCX's own thread and crash the process (see
// UcxTransport::shutdown). Each close parks its connection-manager worker,
// and the oldest are destroyed once more than kMaxParked wait (by then long
// closed: no peer still connects to them; peers of a closed node fail through
// the control plane).
//
// None may outlive the process's exit handlers: while a UCP worker exists,
// UCX's async thread keeps serving its sockets (the listener, and the
// connection manager's endpoints that peers disconnect as they close), and
// it does so while the libraries' destructors run and free the state it
// uses (libucs frees the table of async handlers that the thread looks up
// and edits): the heap corruption of docs/transports.md. The first park
// registers releaseParkedAtExit, which runs before those destructors.
struct ParkedUcp {
  ucp_context_h context;
  ucp_worker_h worker;
  ucp_listener_h listener;
  ListenerCtx* listenerCtx;  // owned; its transport pointer is null
};

// A parked worker's active-message handler: what still arrives for a closed
// transport (a peer's data, hello or bye) is dropped; a rendezvous sender's
// send then completes (UCX drops the descriptor when the handler returns
// UCS_OK without receiving it).
ucs_status_t dropAm(void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
  return UCS_OK;
}

// Sets `cb` (with `arg`) as the handler of active message `id` on
// `worker`, receiving whole messages.
ucs_status_t setAmHandler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = id;
  hp.cb = cb;
  hp.arg = arg;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  return ucp_worker_set_am_recv_handler(worker, &hp);
}

void dropActiveMessages(ucp_worker_h worker) {
  for (unsigned id : {kAmData, kAmHello, kAmBye, kAmWelcome})
    setAmHandler(worker, id, &dropAm, nullptr);
}

// How a parked worker is let go: its pending work (connection requests,
// which ListenerCtx rejects now, and the disconnects of the endpoints that
// peers opened to it) is progressed until it has been quiet for kDrainQuiet,
// for at most `budget`, and then the listener, the worker and the context are
// destroyed. Progressing first narrows the window of the listener race to
// what arrives in the last kDrainQuiet.
constexpr Millis kDrainQuiet{20};

void drainAndDestroy(const ParkedUcp& p, Millis budget) {
  const Deadline deadline = Deadline::after(budget);
  int fd = -1;
  if (ucp_worker_get_efd(p.worker, &fd) != UCS_OK) fd = -1;
  auto lastWork = Clock::now();
  while (!deadline.expired()) {
    if (ucp_worker_progress(p.worker) != 0) {
      lastWork = Clock::now();
      continue;
    }
    if (Clock::now() - lastWork >= kDrainQuiet) break;
    if (fd < 0 || ucp_worker_arm(p.worker) == UCS_ERR_BUSY) continue;
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, 2);
  }
  ucp_listener_destroy(p.listener);
  ucp_worker_destroy(p.worker);
  ucp_cleanup(p.context);
  delete p.listenerCtx;
}

struct ParkedList {
  std::mutex mu;
  std::deque<ParkedUcp> parked;
  pid_t pid = 0;         // the process whose closes parked what is here
  bool exiting = false;  // the exit handler ran: later closes destroy at once
};

ParkedList& parkedList() {
  static auto* list = new ParkedList();  // never freed: the exit handler uses it
  return *list;
}

// Total time the exit handler lets parked workers drain (each gets what is
// left; usually each is quiet within kDrainQuiet).
constexpr Millis kExitDrainBudget{500};

void releaseParkedAtExit() {
  ParkedList& list = parkedList();
  std::lock_guard g(list.mu);
  // A forked child that parked nothing itself has its parent's handles but
  // not its parent's UCX threads: it must not touch them.
  if (list.pid != ::getpid()) return;
  list.exiting = true;
  const Deadline deadline = Deadline::after(kExitDrainBudget);
  while (!list.parked.empty()) {
    ParkedUcp p = list.parked.front();
    list.parked.pop_front();
    drainAndDestroy(p, std::max(deadline.remaining(), kDrainQuiet));
  }
}

void parkUcp(ParkedUcp p) {
  constexpr size_t kMaxParked = 4;
  ParkedList& list = parkedList();
  std::lock_guard g(list.mu);
  if (list.exiting) {
    drainAndDestroy(p, kDrainQuiet);
    return;
  }
  if (list.pid != ::getpid()) {
    // First park in this process. Anything parked already is a forked
    // parent's, whose UCX threads this process does not have: forgotten.
    list.parked.clear();
    list.pid = ::getpid();
    std::atexit(releaseParkedAtExit);
  }
  list.parked.push_back(p);
  while (list.parked.size() > kMaxParked) {
    ParkedUcp old = list.parked.front();
    list.parked.pop_front();
    drainAndDestroy(old, kDrainQuiet);
  }
}

// Receive buffers that a closed transport's cancelled rendezvous may still
// be written into (UcxTransport::shutdown): kept until the process ends.
void quarantineReceiveBuffer(const Buffer& b) {
  if (b.size() == 0) return;
  static std::mutex mu;
  static auto* kept = new std::vector<Buffer>();  // never freed, on purpose
  std::lock_guard g(mu);
  kept->push_back(b);
  CORTADO_LOG_DEBUG("ucx: a receive of {} bytes was in progress at close; its buffer is kept",
                    b.size());
}

// The user's UCX_TLS as UCX reads it: a comma-separated list of transport
// names, or "^" and the names to leave out. Empty when it is unset.
struct UserTls {
  bool set = false;
  bool negate = false;
  std::set<std::string> names;
  bool has(const char* n) const { return names.count(n) != 0; }
};

UserTls userTls() {
  UserTls t;
  const char* tls = std::getenv("UCX_TLS");
  if (!tls || !*tls) return t;
  t.set = true;
  std::string v(tls);
  t.negate = v[0] == '^';
  if (t.negate) v = v.substr(1);
  for (size_t start = 0; start <= v.size();) {
    size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    t.names.insert(v.substr(start, comma - start));
    start = comma + 1;
  }
  return t;
}

// Whether UCX_TLS leaves UCX a shared-memory transport (posix, sysv, cma).
bool tlsAllowsSharedMemory() {
  const UserTls t = userTls();
  if (!t.set) return true;
  if (t.negate) return !(t.has("sm") || t.has("shm") || t.has("mm") || (t.has("posix") && t.has("sysv")));
  return t.has("all") || t.has("sm") || t.has("shm") || t.has("mm") || t.has("posix") || t.has("sysv");
}

// Whether the user's UCX_TLS lets UCX use cma (single-copy reads of a peer's
// memory); unset counts as no, since then the direct context picks its own.
bool userTlsAllowsCma() {
  const UserTls t = userTls();
  if (!t.set) return false;
  bool named = t.has("cma") || t.has("sm") || t.has("shm") || t.has("all");
  return t.negate ? !named : named;
}

// The transports of the direct context when the user has not set UCX_TLS:
// UCX's shared-memory FIFOs and no cma. A cma rendezvous reads the peer's
// memory with process_vm_readv, and when the peer dies mid-read UCX 1.13
// aborts the reader on an endpoint without peer-failure handling; the FIFOs
// only ever touch segments this process has mapped, which outlive the peer.
// No tcp either: UCX would add loopback TCP as a second bandwidth lane and
// split large messages over it (docs/benchmarks.md "Transports", round 3).
constexpr const char* kDirectTls = "sysv,posix,self";

// Settings of the direct context that we choose where the user has not set
// the UCX_* variable: {variable, ucp_config_modify key, value}.
struct DirectDefault {
  const char* var;
  const char* key;
  const char* value;
};
const DirectDefault kDirectDefaults[] = {
    {"UCX_MM_FIFO_SIZE", "MM_FIFO_SIZE", "1024"},
};

}  // namespace

UcxTransport::UcxTransport(NodeId self, UcxOptions options) : self_(self), options_(options) {
  auto ready = std::make_shared<std::promise<Status>>();
  auto result = ready->get_future();
  thread_ = std::thread([this, ready] {
    Status s = init();
    bool ok = s.ok();
    if (!ok) releaseAfterFailedInit();
    ready->set_value(std::move(s));
    if (ok) loop();
  });
  loopId_ = thread_.get_id();
  Status s = result.wait_for(kLoopCallTimeout) == std::future_status::ready
                 ? result.get()
                 : Status(ErrorCode::kTimeout,
                          fmt::format("ucx {}: UCX did not initialize within {} ms", self_,
                                      kLoopCallTimeout.count()));
  if (!s.ok()) {
    // An init that finishes after the timeout must not enter the loop for
    // good (the join below would then wait forever): with stop_ set, loop()
    // shuts UCX down at once.
    stop_ = true;
    queue_.closeAndClear();
    thread_.join();
    s.check();
  }
}

UcxTransport::~UcxTransport() {
  close();
  if (thread_.joinable()) thread_.detach();  // destroyed from its own callback
}

void UcxTransport::setCallbacks(RecvCallback onRecv, ErrorCallback onError) {
  queue_.postTask([this, onRecv = std::move(onRecv), onError = std::move(onError)]() mutable {
    onRecv_ = std::move(onRecv);
    onError_ = std::move(onError);
  });
}

void UcxTransport::close() {
  // Set before the wake-up, so that the loop sees it once woken.
  stop_ = true;
  queue_.close();
  std::lock_guard g(closeMu_);
  if (!thread_.joinable() || loopId_ == std::this_thread::get_id()) return;
  thread_.join();
}

std::string UcxTransport::callOnLoop(std::function<std::string()> fn, const std::string& what) {
  if (onLoopThread()) return fn();
  return queue_.call(std::move(fn), what, kLoopCallTimeout);
}

ucs_status_t UcxTransport::createUcp(ucp_config_t* config, const std::string& name,
                                     ucp_context_h* context, ucp_worker_h* worker,
                                     const char** step) {
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = name.c_str();
  ucs_status_t s = ucp_init(&params, config, context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    *context = nullptr;
    *step = "ucp_init";
    return s;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time: the loop, or a sender holding loopMu_.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  s = ucp_worker_create(*context, &wp, worker);
  if (s != UCS_OK) {
    ucp_cleanup(*context);
    *context = nullptr;
    *worker = nullptr;
    *step = "ucp_worker_create";
  }
  return s;
}

Status UcxTransport::init() {
  efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd_ < 0) return Status(ErrorCode::kUnavailable, fmt::format("ucx {}: eventfd failed", self_));
  queue_.setWakeFd(efd_);
  auto fail = [&](const char* what, ucs_status_t s) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("ucx {}: {} failed: {}. UCX settings in force: {}. Check that "
                              "UCX_TLS names transports this machine has (`ucx_info -d` lists "
                              "them), or use the zmq transport",
                              self_, what, ucs_status_string(s), ucxEnvironment()));
  };
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);  // reads UCX_*
  if (s != UCS_OK) return fail("ucp_config_read", s);
  // UCX 1.13 leaves its shared-memory transports (posix, sysv, cma) out of
  // endpoints that ask for peer-failure handling, so on one machine our
  // connection-manager endpoints carry the data over TCP on loopback.
  // UCX_MM_ERROR_HANDLING=y brings sysv back, but never cma (rendezvous then
  // copies through the FIFO: 0.06 GB/s in the bench), and UCX 1.13 then
  // fails short sends ("Invalid am_short_iov length: 128 (expected: <=
  // 100)"). Same-host bytes take core/shm, or direct endpoints when asked
  // for (welcomed()); docs/transports.md.
  const char* step = nullptr;
  s = createUcp(config, "cortado-" + self_.toWire(), &context_, &worker_, &step);
  if (s != UCS_OK) return fail(step, s);
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  s = ucp_worker_query(worker_, &wa);
  if (s != UCS_OK) return fail("ucp_worker_query", s);
  maxInlineBytes_ = std::min(kMaxInlineBytes, wa.max_am_header);
  s = ucp_worker_get_efd(worker_, &workerFd_);
  if (s != UCS_OK) return fail("ucp_worker_get_efd", s);
  // What a Welcome carries: our host id and, where same-host peers may use
  // a direct endpoint, our worker address (which lists UCX's shared-memory
  // transports, unlike the connection manager's endpoints).
  welcome_.assign(kHostIdBytes, 0);
  std::string host = hostId();
  std::memcpy(welcome_.data(), host.data(), std::min(host.size(), kHostIdBytes - 1));
  host_ = host;
  direct_ = options_.sameHostDirect && !host.empty() && tlsAllowsSharedMemory();
  if (direct_) {
    Status ds = initDirect();
    if (!ds.ok()) {
      CORTADO_LOG_WARN("ucx {}: no same-host direct endpoints, the connection manager's "
                       "endpoints carry the data: {}",
                       self_, ds.message());
      releaseDirect();
      direct_ = false;
    }
  }
  for (auto [id, cb] : {std::pair<unsigned, ucp_am_recv_callback_t>{kAmData, &onAm},
                        {kAmHello, &onHello},
                        {kAmBye, &onBye},
                        {kAmWelcome, &onWelcome}}) {
    s = setAmHandler(worker_, id, cb, this);
    if (s != UCS_OK) return fail("ucp_worker_set_am_recv_handler", s);
  }
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = workerFd_;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, workerFd_, &ev);
  ev.data.fd = efd_;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, efd_, &ev);
  if (directWorker_) {
    ev.data.fd = directWorkerFd_;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, directWorkerFd_, &ev);
  }
  CORTADO_LOG_DEBUG("ucx {}: initialized (UCX settings: {}; same-host direct endpoints: {})",
                    self_, ucxEnvironment(), direct_ ? directTls_ : std::string("off"));
  return Status();
}

Status UcxTransport::initDirect() {
  auto fail = [&](const char* what, ucs_status_t s) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{} failed: {} (UCX settings in force: {})", what,
                              ucs_status_string(s), ucxEnvironment()));
  };
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return fail("ucp_config_read (direct)", s);
  const char* userTls = std::getenv("UCX_TLS");
  if (userTls && *userTls) {
    directTls_ = std::string("UCX_TLS=") + userTls;
    if (userTlsAllowsCma()) {
      CORTADO_LOG_WARN("ucx {}: UCX_TLS={} lets same-host direct endpoints use cma: UCX 1.13 "
                       "aborts this process if a peer dies while it reads the peer's memory "
                       "(unset UCX_TLS, or name sysv/posix without cma, to rule that out; "
                       "docs/transports.md)",
                       self_, userTls);
    }
  } else {
    s = ucp_config_modify(config, "TLS", kDirectTls);
    if (s != UCS_OK) {
      ucp_config_release(config);
      return fail("ucp_config_modify(TLS) (direct)", s);
    }
    directTls_ = kDirectTls;
  }
  // A deeper FIFO than UCX's 64 elements of 8 KiB: a rendezvous through
  // it moves 8 KiB per element, and a sender whose receiver is waiting for
  // a CPU stalls once the FIFO is full (docs/benchmarks.md "Transports",
  // round 3). 1024 elements are about 8 MiB of shared memory per process.
  for (const auto& [var, key, value] : kDirectDefaults) {
    const char* user = std::getenv(var);
    if (user && *user) continue;  // the user's setting stands
    s = ucp_config_modify(config, key, value);
    if (s != UCS_OK) {
      ucp_config_release(config);
      return fail(key, s);
    }
    directTls_ += fmt::format(", {}={}", key, value);
  }
  const char* step = nullptr;
  s = createUcp(config, "cortado-direct-" + self_.toWire(), &directContext_, &directWorker_,
                &step);
  if (s != UCS_OK) return fail(fmt::format("{} (direct)", step).c_str(), s);
  s = ucp_worker_get_efd(directWorker_, &directWorkerFd_);
  if (s != UCS_OK) return fail("ucp_worker_get_efd (direct)", s);
  s = setAmHandler(directWorker_, kAmData, &onAmDirect, this);
  if (s != UCS_OK) return fail("ucp_worker_set_am_recv_handler (direct)", s);
  ucp_address_t* address = nullptr;
  size_t addressLength = 0;
  s = ucp_worker_get_address(directWorker_, &address, &addressLength);
  if (s != UCS_OK) return fail("ucp_worker_get_address (direct)", s);
  auto* a = reinterpret_cast<const uint8_t*>(address);
  welcome_.insert(welcome_.end(), a, a + addressLength);
  ucp_worker_release_address(directWorker_, address);
  return Status();
}

void UcxTransport::releaseDirect() {
  if (directWorker_) ucp_worker_destroy(directWorker_);
  if (directContext_) ucp_cleanup(directContext_);
  directWorker_ = nullptr;
  directContext_ = nullptr;
  directWorkerFd_ = -1;
}

void UcxTransport::releaseAfterFailedInit() {
  releaseDirect();
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
  worker_ = nullptr;
  context_ = nullptr;
  if (epfd_ >= 0) ::close(epfd_);
  if (efd_ >= 0) ::close(efd_);
  epfd_ = efd_ = -1;
}

void UcxTransport::loop() {
  // Held while the loop works; let go only while it sleeps or yields, when
  // another thread's send may take it (sendDirect).
  std::unique_lock<std::mutex> lk(loopMu_);
  while (!stop_) {
    bool busy = false;
    while (progressWorkers() != 0) busy = true;
    afterProgress();
    // Timers right after progress, so that a long batch of sends below
    // never expires an endpoint whose handshake completed meanwhile.
    expireTimers();
    if (batch_.empty()) queue_.takeAll(batch_);
    // A bounded turn, then progress again: a flood of sends must not
    // starve handshakes and completions (nor expire their timers).
    for (int i = 0; i < kOpsPerTurn && !batch_.empty() && !stop_; ++i) {
      busy = true;
      Op op = std::move(batch_.front());
      batch_.pop_front();
      if (op.task) {
        cmQuiet_ = false;  // connect, listen, disconnect: the connection manager's work
        op.task();
      } else {
        sendTo(op.peer, std::move(op.msg));
      }
    }
    if (stop_) continue;
    // Busy polling: right after work, progress again without sleeping.
    if (options_.busyPoll.count() > 0) {
      if (busy) pollUntil_ = Clock::now() + options_.busyPoll;
      if (Clock::now() < pollUntil_) {
        // Nothing came: let a thread that shares this core run.
        if (!busy) {
          lk.unlock();
          std::this_thread::yield();
          lk.lock();
        }
        continue;
      }
    }
    if (busy) continue;
    if (!armWorkers()) continue;
    epoll_event events[3];
    const int timeoutMs = waitTimeoutMs();
    lk.unlock();
    int n = ::epoll_wait(epfd_, events, 3, timeoutMs);
    lk.lock();
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == efd_) {
        uint64_t v;
        ssize_t r = ::read(efd_, &v, sizeof(v));
        (void)r;
      } else if (events[i].data.fd == workerFd_) {
        cmReadable_ = true;
      }
    }
  }
  shutdown();
}

unsigned UcxTransport::progressWorkers(bool all) {
  unsigned n = 0;
  const auto now = Clock::now();
  if (all || !cmQuiet_ || cmReadable_ || now >= cmDue_ || now < cmCarriesDataUntil_) {
    n = ucp_worker_progress(worker_);
    cmArmed_ = false;
    cmReadable_ = false;
    cmQuiet_ = n == 0;
    cmDue_ = now + kCmPollPeriod;
  }
  if (directWorker_) n += ucp_worker_progress(directWorker_);
  return n;
}

bool UcxTransport::armWorkers() {
  if (!cmArmed_) {
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) {
      cmQuiet_ = false;
      return false;
    }
    cmArmed_ = true;
  }
  return !directWorker_ || ucp_worker_arm(directWorker_) != UCS_ERR_BUSY;
}

int UcxTransport::waitTimeoutMs() const {
  int cap = 100;
  if (!inflight_.empty()) cap = 1;
  else if (directWorker_) cap = 10;
  auto next = Clock::time_point::max();
  for (const auto& [id, p] : peers_) {
    if (!p.up && !p.reported) next = std::min(next, p.deadline);
  }
  next = std::min(next, held_.nextDeadline());
  if (next == Clock::time_point::max()) return cap;
  auto now = Clock::now();
  if (next <= now) return 0;
  const int t = static_cast<int>(std::chrono::duration_cast<Millis>(next - now).count() + 1);
  return std::min(t, cap);
}

void UcxTransport::afterProgress() {
  auto epFailures = std::move(epFailures_);
  epFailures_.clear();
  for (auto& f : epFailures) {
    if (!f.ctx->accepted) {
      auto it = peers_.find(f.ctx->peer);
      if (it != peers_.end() && it->second.ep == f.ctx->ep && !it->second.reported) {
        fail(it->first, it->second, ErrorCode::kPeerDead,
             fmt::format("ucx {}: the endpoint to {} at {} failed: {} (the peer closed, "
                         "died or became unreachable)",
                         self_, it->first, it->second.address, ucs_status_string(f.status)));
      }
    }
    closeEp(f.ctx->ep);
  }
  auto hellos = std::move(hellos_);
  hellos_.clear();
  for (const auto& h : hellos) {
    if (eps_.count(h.replyEp)) startSend(NodeId{}, h.replyEp, kAmWelcome, {}, h.stream);
  }
  auto welcomes = std::move(welcomes_);
  welcomes_.clear();
  for (auto& w : welcomes) welcomed(w);
  auto byes = std::move(byes_);
  byes_.clear();
  for (const auto& from : byes) {
    auto it = peers_.find(from);
    if (it != peers_.end() && !it->second.reported) {
      fail(from, it->second, ErrorCode::kPeerDead,
           fmt::format("ucx {}: peer {} at {} closed", self_, from, it->second.address));
    }
  }
  auto failures = std::move(failures_);
  failures_.clear();
  for (auto& [peer, message] : failures) {
    auto it = peers_.find(peer);
    if (it != peers_.end() && !it->second.reported) {
      fail(peer, it->second, ErrorCode::kPeerDead, std::move(message));
    }
  }
  auto ready = std::move(ready_);
  ready_.clear();
  for (const auto& key : ready) deliver(key);
  reapClosing();
}

template <typename Done>
void UcxTransport::progressUntil(Done done, Deadline deadline) {
  while (!done() && !deadline.expired()) {
    if (progressWorkers(/*all=*/true) != 0) continue;
    if (!armWorkers()) continue;
    epoll_event events[3];
    ::epoll_wait(epfd_, events, 3, static_cast<int>(std::min<int64_t>(deadline.remaining().count(), 10)));
  }
}

void UcxTransport::shutdown() {
  // The listener is not destroyed first: UCX 1.13 (and later, openucx/ucx
  // issue 11087) can deliver a connection request that was under way to a
  // destroyed listener, from its own thread, and crashes in
  // ucp_cm_server_conn_request_cb. Seen when a job failed at start-up (a
  // declaration mismatch) while peers were still connecting to a worker
  // that was closing: worker 0 died of SIGSEGV in 24 of 40 runs. Requests
  // that arrive during the close are rejected (accept()); at the end the
  // listener, its worker and context are parked (parkUcp).
  // What waits behind the peerSends bound goes now, ahead of the goodbyes.
  for (auto& [peer, p] : peers_) startWaiting(peer, p, /*all=*/true);
  // Tell the peers that connected to us, so they need not wait for a timeout.
  for (auto& [ep, ctx] : eps_) {
    if (ctx->accepted) startSend(NodeId{}, ep, kAmBye, {});
  }
  progressUntil([&] { return byesInFlight_ == 0; }, Deadline::after(options_.closeTimeout / 2));
  std::vector<ucp_ep_h> all;
  for (auto& [ep, ctx] : eps_) all.push_back(ep);
  for (ucp_ep_h ep : all) closeEp(ep);
  peers_.clear();
  held_.clear();
  progressUntil([&] {
    reapClosing();
    return closing_.empty() && inflight_.empty();
  }, Deadline::after(options_.closeTimeout / 2));
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
  // Receives still in progress (a rendezvous from a peer that died or
  // closed) are cancelled and completed now, while this object and their
  // slots exist: left in a parked worker, its later destruction would
  // complete them into freed memory (a SIGSEGV in onRecvDone under
  // ucp_worker_destroy, killed_peer_test WhileStreamingBothWays, 1 run).
  //
  // Their buffers are never freed: whether a cancelled rendezvous stops a
  // peer that is writing into it (a put over shared memory or CMA) is not
  // something UCX documents, and a write into memory the allocator has
  // reused corrupts the heap far from here. Only receives still in
  // progress at a close are kept, for the rest of the process.
  for (RecvCtx* c : recvs_) {
    quarantineReceiveBuffer(c->slot->data);
    if (c->request) ucp_request_cancel(c->worker, c->request);
  }
  progressUntil([&] { return recvs_.empty(); }, Deadline::after(options_.closeTimeout / 4));
  queue_.closeAndClear();
  batch_.clear();
  releaseDirect();
  if (listener_ && inflight_.empty() && closing_.empty() && recvs_.empty() && eps_.empty()) {
    // Nothing of ours is left in UCX (no request, no endpoint). Connection
    // requests from now on are rejected (ListenerCtx) and active messages
    // dropped, so the parked worker, which is progressed again when it is
    // let go (drainAndDestroy), never calls back into this object.
    listenerCtx_->t = nullptr;
    dropActiveMessages(worker_);
    parkUcp({context_, worker_, listener_, listenerCtx_.release()});
  } else {
    if (listener_) ucp_listener_destroy(listener_);
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  listener_ = nullptr;
  listenerCtx_.reset();
  // What UCX did not complete is released now: the senders' buffers with it.
  for (SendCtx* ctx : inflight_) delete ctx;
  inflight_.clear();
  closingCtx_.clear();
  eps_.clear();
  inbound_.clear();
  ::close(epfd_);
  ::close(efd_);
  CORTADO_LOG_DEBUG("ucx {}: closed", self_);
}

}  // namespace cortado::transport::ucx::detail

namespace cortado::transport::ucx {

std::unique_ptr<Transport> create(const NodeId& self, const UcxOptions& options) {
  return std::make_unique<detail::UcxTransport>(self, options);
}

}  // namespace cortado::transport::ucx
