// The job's configuration, read once per process from CORTADO_* environment
// variables (BytePS's DMLC_* names are accepted as aliases) and, for the
// role commands, overridden by flags. This is the single table of settings:
// docs/running.md ("Settings") documents it row by row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/common/deadline.h"
#include "core/common/node.h"

namespace cortado {

// The chunk size `cortado launch` gives a job whose roles span hosts when
// none was named (docs/running.md, CORTADO_PARTITION_BYTES).
constexpr uint64_t kMultiHostPartitionBytes = 256ull << 10;

struct JobConfig {
  Role role = Role::kWorker;
  int numWorkers = 0;
  int numServers = 0;
  std::string schedulerHost = "127.0.0.1";
  int schedulerPort = 0;
  std::string token;
  int rank = -1;                          // requested rank; -1: the scheduler assigns
  std::string transport = "zmq";          // zmq | ucx | auto
  std::string dataHost = "127.0.0.1";     // address this node's data plane listens on
  std::string logLevel = "info";
  uint64_t partitionBytes = 4ull << 20;
  // Whether CORTADO_PARTITION_BYTES (or --partition-bytes) named the chunk
  // size: `cortado launch` picks kMultiHostPartitionBytes for jobs across
  // hosts only where it did not.
  bool partitionBytesGiven = false;
  uint64_t maxInflightBytes = 64ull << 20;
  int serverThreads = 2;
  // CORTADO_SERVER_PUSH_BYTES: a server's budget of pushes received and not
  // yet summed (ServerEngineOptions::pushBudget); 0: none.
  uint64_t serverPushBytes = 32ull << 20;
  // CORTADO_PUSH_WINDOW_CHUNKS: a worker's pushes counted by the servers'
  // budgets and not yet summed, all servers together, at most this many
  // chunks of partitionBytes (WorkerOptions::pushWindow); 0: no window.
  int pushWindowChunks = 8;
  static constexpr int kMaxPushWindowChunks = 1024;
  bool async = false;
  bool sharedMemory = true;               // same-host shared-memory data path
  // CORTADO_COMPACT_SPARSE: top-k and DGC payloads (workers' pushes, the
  // servers' sparse answers, the plan executor's collectives of payloads)
  // go on the wire with their indices as varint gaps where that is smaller
  // (compressor/compact.h).
  bool compactSparse = true;
  // CORTADO_EF_DTYPE: what error feedback keeps its per-element state in on
  // the workers, "fp32" or "bf16" (compressor::StateDType; checked when read).
  std::string efDType = "fp32";
  // CORTADO_STAGGER: workers send a tensor's chunks in the staggered order
  // (WorkerOptions::staggerChunks, core/partition.h sendOrder).
  bool staggerChunks = false;
  // CORTADO_FUSION_BYTES: the plan executor's tensor fusion threshold
  // (Executor::runBatch, docs/executor.md); 0: off. 64 MiB, as Horovod's.
  uint64_t fusionBytes = 64ull << 20;
  // CORTADO_PHASE_BYTES: the plan executor runs the tensors of a batch that
  // run alone in phases of up to this many bytes, each step kind for all of
  // a phase's tensors in turn (Executor::setPhaseBytes); 0: one tensor after
  // the other.
  uint64_t phaseBytes = 64ull << 20;
  // CORTADO_CODEC_THREADS: threads of each worker's CPU codec calls in the
  // plan executor (an encode or a decode split over them, the caller one of
  // them; Executor::setCodecThreads); 0: auto, codecThreadsFor().
  int codecThreads = 0;
  static constexpr int kMaxCodecThreads = 256;
  // CORTADO_PIPELINE: the plan executor runs the next execution's leading
  // steps (its encode) on a second thread while this one communicates
  // (Executor::setPipeline); off by default.
  bool pipeline = false;
  // CORTADO_DEVICE: where the plan executor's buffers live and its codecs
  // run: "host" (host memory, the CPU codecs, MPI) or "cuda" (CUDA buffers,
  // the CUDA codecs, NCCL); core/device/device.h.
  std::string device = "host";
  std::string planFile;                   // CORTADO_PLAN: the plan executor's plan (empty: default)
  std::string traceDir;                   // CORTADO_TRACE_DIR: stage traces go here (empty: off)
  std::string traceIterations = "all";    // CORTADO_TRACE_ITERATIONS: "10:19", "5:" or "all"
  // Online re-planning (docs/planner.md): iterations per profiling window
  // (0: off); the scheduler's codec, switch distance and rate threshold.
  uint64_t profileWindow = 0;             // CORTADO_PROFILE_WINDOW
  std::string replanCodec = "dgc:ratio=0.01";  // CORTADO_REPLAN_CODEC
  uint64_t replanAhead = 10;              // CORTADO_REPLAN_AHEAD
  double replanThreshold = 0.25;          // CORTADO_REPLAN_THRESHOLD
  double replanMinGain = 0.05;            // CORTADO_REPLAN_MIN_GAIN
  int replanConfirm = 2;                  // CORTADO_REPLAN_CONFIRM
  bool ucxDirect = true;                  // ucx: same-host direct endpoints (UcxOptions)
  // ucx: large messages in flight to one peer (UcxOptions::peerSends; 0: no bound)
  int ucxPeerSends = 1;
  static constexpr int kMaxUcxPeerSends = 1024;
  // CORTADO_INLINE_BYTES: a worker sends a tensor of at most this many bytes
  // (one chunk) from the calling thread, and a server sums a key of at most
  // this many bytes on its transport's thread, instead of handing either to
  // another thread (docs/transports.md, "Latency"); 0: always hand off.
  uint64_t inlineBytes = 64ull << 10;
  // CORTADO_BUSY_POLL_US: how long the transports' loops and a push_pull's
  // wait poll before they sleep (0: never poll; at most kMaxBusyPollUs).
  int busyPollUs = 0;
  static constexpr int kMaxBusyPollUs = 10000;
  // CORTADO_SHM_MESSAGES: same-host messages go through shared-memory rings
  // in front of the transport (core/transport/shmring); needs CORTADO_SHM.
  bool shmMessages = true;
  // CORTADO_SHM_SPIN_US: how long a ring thread polls its rings after its
  // last message before it sleeps on the doorbell (at most kMaxBusyPollUs).
  int shmSpinUs = 0;
  // CORTADO_SHM_SERVER_POLL_US: how long a server's ring thread polls for
  // the next push while a worker waits for a round's answer and no thread
  // of the machine waits for a CPU (shmring::RingOptions::pollWhileExpecting;
  // at most kMaxBusyPollUs).
  int shmServerPollUs = 50;
  // CORTADO_SHM_WAITER_POLL_US: how long a thread waiting on a handle, as
  // its worker's ring consumer, polls for the answer before it sleeps, while
  // no thread of the machine waits for a CPU (RingOptions::waiterPoll).
  int shmWaiterPollUs = 50;
  // CORTADO_SHM_WAITER_RECEIVES: a thread waiting on a push_pull's handle
  // takes the worker's ring messages itself while it waits
  // (shmring::RingOptions::waiterReceives).
  bool shmWaiterReceives = true;
  // CORTADO_SHM_YIELD_POLLS: the polls' gate counts the job's own threads on
  // this machine (core/shm/job_threads.h) and lets the polls go on, yielding
  // the CPU between looks, while every runnable thread is one of the job's
  // (shmring::RingOptions::yieldPolls).
  bool shmYieldPolls = true;
  Millis opTimeout{120000};               // default deadline of blocking calls
  Millis stallCheck{60000};               // CORTADO_STALL_CHECK_MS: report rounds waiting this long
  // CORTADO_DECLARE_CHECK_MS: the job fails when every worker has waited
  // this long in declarations that other workers do not make
  // (scheduler::SchedulerOptions::declareCheck); 0: never.
  Millis declareCheck{10000};
  bool reportMemory = false;              // CORTADO_REPORT_MEMORY: roles print their memory at the end
  // CORTADO_MALLOC_KEEP_BYTES: a Python worker's glibc malloc serves blocks
  // up to 32 MiB from its heap and keeps up to this many freed bytes there
  // instead of returning them to the kernel (core/common/malloc_tuning.h);
  // 0: malloc as the process has it.
  uint64_t mallocKeepBytes = 1ull << 30;
  Millis connectTimeout{60000};  // 4 workers importing torch on 2 loaded cores can take 30 s
  Millis heartbeatInterval{1000};
  Millis heartbeatTimeout{10000};

  // Throws Error(kInvalidArgument) naming the setting when a value is out of range.
  void validate() const;
  // The environment that hands this configuration to a child process.
  std::vector<std::pair<std::string, std::string>> toEnv() const;
};

// One row of the settings table.
struct SettingInfo {
  const char* name;     // CORTADO_* variable
  const char* alias;    // aliases, space-separated (BytePS's, Horovod's), or ""
  const char* fallback; // default, as text
  const char* meaning;
};
const std::vector<SettingInfo>& settingsTable();

// Reads every CORTADO_* (and alias) variable that is set over `base`. Throws
// Error naming the variable for unparseable values. `requireJob`: fail when
// the variables a node needs to join a job are missing (role, counts,
// scheduler address, token), saying which and how to set them.
JobConfig readJobConfig(bool requireJob, JobConfig base = {});

}  // namespace cortado
