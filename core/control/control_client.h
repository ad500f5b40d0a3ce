// The node side of the control plane: every server and worker holds one
// ControlClient, connected over TCP (Boost.Asio) to the job's scheduler.
//
// What it does
// - connect(): TCP connect with retries until the deadline, then mutual
//   challenge-response on the job token (HMAC-SHA256; the token never crosses
//   the wire), then registration (role, data address, hostname, pid). Returns
//   once the scheduler has every node and sends the address book.
// - Heartbeats every Options::heartbeatInterval on the client's own io thread.
// - declare(): the scheduler gathers every worker's declaration of a tensor
//   and answers all of them with the same key, or fails all of them with a
//   message naming the workers and the values that differ.
// - barrier(): returns when every node of the given group has entered it.
// - put()/get(): a job-wide key-value rendezvous held by the scheduler.
// - finish(): a worker says it is done; when all workers are done the
//   scheduler sends shutdown to every node, and waitShutdown() returns.
//
// Threads and errors
// - Methods are thread-safe and block up to their Deadline; a passed
//   deadline throws Error(kTimeout) naming the operation and the scheduler.
// - The failure callback runs on the client's io thread when the scheduler
//   reports a dead node (Status kPeerDead, message names role, rank, host and
//   address), aborts the job (kMismatch etc.), or becomes unreachable
//   (kPeerDead naming the scheduler). After a failure every blocking call
//   throws that Status as an Error.
// - The scheduler's stop() reaches nodes as a failure with kClosed.
// - connect() throws its failure and records it the same way (failure(),
//   the callback): the job token refused (kProtocol),
//   a rank refused (kInvalidArgument), the scheduler unreachable until the
//   deadline (kTimeout naming host:port), the registration deadline (the
//   scheduler's kTimeout naming the missing roles). None of them is retried.
// - The callback may call close(); it must not destroy the client.
// - The wire format, the handshake and the limits are in protocol.h and
//   auth.h next to this file.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/common/deadline.h"
#include "core/common/dtype.h"
#include "core/common/error.h"
#include "core/common/node.h"
#include "core/common/stall.h"

namespace cortado::control {

struct ClientOptions {
  std::string schedulerHost = "127.0.0.1";
  int schedulerPort = 0;
  std::string token;          // job token shared by every node of the job
  Role role = Role::kWorker;
  int requestedRank = -1;     // -1: the scheduler assigns ranks in arrival order
  std::string dataAddress;    // what this node's Transport::listen() returned
  std::string hostname;       // defaults to gethostname()
  bool sharedMemory = false;  // advertised: this node serves same-host shared memory
  uint64_t pushBudget = 0;    // advertised by a server: NodeInfo::pushBudget
  Millis connectTimeout{30000};  // connect() retries until min(its deadline, now + this)
  Millis heartbeatInterval{1000};
  // The scheduler pings every node (every SchedulerOptions::heartbeatTimeout/4);
  // silence longer than max(this, 3 pings) declares the scheduler dead.
  Millis schedulerTimeout{30000};
};

// Everyone in the job, as the scheduler sent it after registration.
struct AddressBook {
  std::vector<NodeInfo> servers;  // index == rank
  std::vector<NodeInfo> workers;  // index == rank
};

struct TensorDecl {
  std::string name;
  DType dtype = DType::kFloat32;
  uint64_t numElements = 0;
  std::string codec;  // "" = uncompressed; else a canonical codec spec such as "topk:ratio=0.01"
  bool errorFeedback = false;  // with a codec: workers keep error-feedback residuals
  // Pushes that complete a round of each of its keys; 0 = every worker (the
  // plan executor's hierarchical shard keys: one worker per machine).
  uint32_t contributors = 0;
  // How many times this worker declared the name before and released it
  // (Worker::release): each declaration after a release is a new tensor
  // with a new key, so that no server state of the old one is reused.
  uint32_t incarnation = 0;
  bool operator==(const TensorDecl&) const = default;
};

enum class Group { kAll, kWorkers, kServers };

// The scheduler's verdict on one profiling window (online re-planning): a
// new plan that every worker switches to at iteration `switchAt`, or, with
// version 0 and no plan, "keep the current plan".
struct PlanUpdate {
  uint64_t window = 0;
  uint64_t version = 0;  // 0: no new plan
  uint64_t switchAt = 0;
  std::string planJson;  // plan::Plan as JSON; empty when version is 0
};

class ControlClient {
 public:
  using FailureCallback = std::function<void(const Status&)>;

  static std::unique_ptr<ControlClient> create(ClientOptions opts);
  virtual ~ControlClient() = default;

  // Set before connect(). Called at most once.
  virtual void setFailureCallback(FailureCallback cb) = 0;

  // Authenticates, registers and waits for the address book.
  virtual AddressBook connect(Deadline deadline) = 0;
  virtual NodeId self() const = 0;  // valid after connect()

  // Returns the job-wide key of the tensor (the same on every worker): the
  // n-th distinct name that worker 0 declares gets key n. Declaring a name
  // again the same way returns its key; with other values it throws
  // kInvalidArgument. Workers that disagree fail the job with kMismatch.
  // Workers only.
  virtual uint64_t declare(const TensorDecl& decl, Deadline deadline) = 0;

  virtual void barrier(Group group, const std::string& name, Deadline deadline) = 0;

  // The job's key-value rendezvous, for what every node must agree on before
  // it can go on (NCCL's unique id is the first user). put() stores `value`
  // (any bytes) under `key` once for the whole job: putting the same value
  // again is a no-op, another value throws kInvalidArgument naming the key.
  // get() returns the value once some node has put it, waiting up to the
  // deadline (kTimeout naming the key and that no node has put it). Keys are
  // 1 to kMaxKvKey bytes, values at most kMaxKvValue bytes (protocol.h); the
  // scheduler holds at most kMaxKvEntries keys. Workers and servers alike.
  virtual void put(const std::string& key, const std::string& value, Deadline deadline) = 0;
  virtual std::string get(const std::string& key, Deadline deadline) = 0;

  // Workers: sends one profiling window's report (plan::ProfileReport as
  // JSON text) and waits for the scheduler's acknowledgement. Returns the
  // iteration at which a plan made from this window would take effect (the
  // window's end + CORTADO_REPLAN_AHEAD): the scheduler sends its verdict on
  // the window (waitVerdict) to every worker, and each must have it before
  // it runs the iteration before that one. 0: the scheduler does not
  // re-plan, no verdict comes. Throws kInvalidArgument when the report
  // exceeds plan::kMaxProfileBytes; the scheduler refuses a malformed report
  // with kProtocol naming the field.
  virtual uint64_t sendProfile(const std::string& reportJson, Deadline deadline) = 0;
  // Workers: the scheduler's verdict on profiling window `window`, waiting
  // for it up to the deadline (kTimeout naming the window); a verdict that
  // came earlier is returned at once, and forgotten with older windows'.
  // Thread-safe.
  virtual PlanUpdate waitVerdict(uint64_t window, Deadline deadline) = 0;

  // Servers: a round of one of this server's keys that waits for some
  // workers' pushes (core/common/stall.h); the scheduler logs it, naming the
  // tensor and those workers. Non-blocking, no answer; a no-op before
  // connect() returned and after a failure. Throws kInvalidArgument on a worker.
  virtual void reportStall(const StallReport& report) = 0;
  // Workers: what the scheduler said of stalled rounds, by tensor key (the
  // worker engine's waits that time out quote it). Lives as long as the
  // last holder.
  virtual std::shared_ptr<const StallNotes> stallNotes() const = 0;

  // Workers: this worker is done. Non-blocking; a no-op after a failure.
  // Throws kInvalidArgument on a server or before connect().
  virtual void finish() = 0;
  // True once the scheduler has told this node to shut down; false when the
  // deadline passes first; throws the failure when the job failed.
  virtual bool waitShutdown(Deadline deadline) = 0;

  // The first failure seen, or OK.
  virtual Status failure() const = 0;

  // Closes the connection; the scheduler treats a close after finish() as
  // orderly, and any other close as the death of this node.
  virtual void close() = 0;
};

}  // namespace cortado::control
