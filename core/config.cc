#include "core/config.h"

#include "compressor/error_feedback.h"

#include <cctype>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "core/common/env.h"
#include "core/common/error.h"

namespace cortado {

const std::vector<SettingInfo>& settingsTable() {
  static const std::vector<SettingInfo> table = {
      {"CORTADO_ROLE", "DMLC_ROLE", "(set by the launcher)", "scheduler, server or worker"},
      {"CORTADO_NUM_WORKERS", "DMLC_NUM_WORKER", "(required)", "number of workers in the job"},
      {"CORTADO_NUM_SERVERS", "DMLC_NUM_SERVER", "(required)", "number of servers in the job"},
      {"CORTADO_SCHEDULER_HOST", "DMLC_PS_ROOT_URI", "127.0.0.1", "scheduler address"},
      {"CORTADO_SCHEDULER_PORT", "DMLC_PS_ROOT_PORT", "(required)", "scheduler TCP port"},
      {"CORTADO_JOB_TOKEN", "", "(required; the launcher makes one)",
       "shared secret that every node proves it knows"},
      {"CORTADO_RANK", "DMLC_WORKER_ID", "(required for servers and workers; the launcher sets it)",
       "rank within the role, 0..N-1 (a worker under mpirun without it takes its MPI rank)"},
      {"CORTADO_TRANSPORT", "", "zmq", "data plane: zmq, ucx or auto (docs/transports.md)"},
      {"CORTADO_DATA_HOST", "DMLC_NODE_HOST", "127.0.0.1",
       "address the data plane listens on and advertises; `auto`: the local address that "
       "reaches the scheduler (what `cortado launch --hosts` sets)"},
      {"CORTADO_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "info",
       "trace, debug, info, warn, error, off (any case; Horovod's warning and fatal read as warn "
       "and error)"},
      {"CORTADO_PARTITION_BYTES", "BYTEPS_PARTITION_BYTES", "4MiB",
       "chunk size of large tensors; a compressed tensor is cut by its payload's size (one chunk "
       "per this many payload bytes or per server while each carries 64 KiB, each at most "
       "4 MiB of the tensor; docs/codecs.md, \"Push\"). A server answers a chunk once every "
       "worker pushed all of it, so each tensor's exchange starts and ends with links waiting "
       "about a chunk's time per worker. `cortado launch` gives a job whose roles span hosts "
       "(`--hosts`, Slurm nodes) 256 KiB chunks unless this names a size: across hosts at 1 "
       "Gbit/s, with the push window, 256 KiB moved 64 MiB at 88-92% of the link against 79-84% "
       "with 1 MiB (docs/benchmarks.md); where the CPU is the limit (10 Gbit/s on 2 cores) 1 MiB "
       "was faster; on one host (shared memory) 4 MiB is faster"},
      {"CORTADO_MAX_INFLIGHT_BYTES", "", "64MiB", "credit bound on a worker's bytes in flight"},
      {"CORTADO_SERVER_THREADS", "BYTEPS_SERVER_ENGINE_THREAD", "2", "engine threads per server"},
      {"CORTADO_SERVER_PUSH_BYTES", "", "32MiB",
       "a server's budget of pushes received and not yet summed, in bytes; each worker sends a "
       "server at most this over the workers (at least one chunk) ahead of the server's "
       "acknowledgements, so that without shared memory (another host, or `CORTADO_SHM=0`) a "
       "server holds its keys' answers, the sums of the rounds under way and at most this of "
       "pushes, instead of what the workers' credits allow (0: no budget; pushes through "
       "shared memory and of at most 64 KiB are not counted; docs/transports.md, \"Memory\")"},
      {"CORTADO_PUSH_WINDOW_CHUNKS", "", "8",
       "a worker's pushes to servers not yet summed there, all servers together, in chunks of "
       "CORTADO_PARTITION_BYTES (counted as the servers' budgets count them: not through shared "
       "memory, over 64 KiB, not sparse); the next push waits for a server's acknowledgement. "
       "Across hosts it keeps each link's queue short, so that the flows into one server "
       "share its link evenly: at 1 Gbit/s with servers on 4 other hosts and 256 KiB chunks "
       "88-92% of the link against 77-79% without it (1 MiB: 79-84% against 71-81%). It needs the "
       "servers' budget (CORTADO_SERVER_PUSH_BYTES), whose acknowledgements it waits for "
       "(0: no window; docs/transports.md, \"Push window\")"},
      {"CORTADO_ASYNC", "BYTEPS_ENABLE_ASYNC", "0", "servers apply each push at once"},
      {"CORTADO_SHM", "BYTEPS_ENABLE_IPC", "1",
       "same-host workers and servers exchange data through shared memory (/dev/shm)"},
      {"CORTADO_COMPACT_SPARSE", "", "1",
       "top-k and DGC payloads (pushes, the servers' sparse answers, the plan executor's "
       "collectives of payloads) and Zen's pushes (to the servers, and Zen over MPI's lists) go "
       "on the wire with their ascending indices as LEB128 varint gaps, about 5 bytes per kept "
       "element instead "
       "of 8, where that is smaller (0: always the plain form; either form is read whatever "
       "this says; docs/codecs.md, \"Compact index lists\"; docs/zen.md)"},
      {"CORTADO_EF_DTYPE", "", "fp32",
       "what the workers' error feedback keeps its residuals (and DGC's velocities) in: `fp32`, "
       "or `bf16` at half the memory, each round's state rounded once to bf16's 8 significant "
       "bits; the servers' residuals stay fp32 (docs/codecs.md, \"Error feedback in bf16\")"},
      {"CORTADO_STAGGER", "", "0",
       "1: each worker sends a tensor's chunks in a staggered order, worker r starting at server "
       "r's chunk and going round the servers (each server's chunks still in order), so that the "
       "workers do not all push their first chunk to one server at once; priorities across "
       "tensors are kept. Measured without effect on 4 emulated hosts, hence off "
       "(docs/running.md, \"Chunk order\")"},
      {"CORTADO_PLAN", "", "(none: BytePS's default plan)",
       "plan file (cortado plan ... --json) that the plan executor runs (docs/executor.md)"},
      {"CORTADO_FUSION_BYTES", "HOROVOD_FUSION_THRESHOLD", "64MiB",
       "plan executor: the tensors of a batch (`Executor::runBatch`) with the same uncompressed "
       "collective-only option run as one collective on a fusion buffer up to this many bytes "
       "(0: off; docs/executor.md, \"Tensor fusion\")"},
      {"CORTADO_PHASE_BYTES", "", "64MiB",
       "plan executor: the tensors of a batch that run alone go in phases of up to this many "
       "bytes: every tensor's encode, then every tensor's communication step, then every "
       "decode (0: one tensor after the other; docs/executor.md, \"Phases\")"},
      {"CORTADO_CODEC_THREADS", "", "0",
       "plan executor: threads of each worker's CPU encodes and decodes (the calling thread "
       "and a pool); 0: the machine's cores over twice its workers, at least 1, leaving half "
       "the cores to the servers and the training (docs/executor.md, \"Codec threads\")"},
      {"CORTADO_PIPELINE", "", "0",
       "plan executor: `1` runs the next execution of a batch (a tensor or a plan group: its wait "
       "for its gradients, gather and encode) on a second thread while this one communicates; the "
       "planner's simulator models it without fusion by size (docs/executor.md, \"Encode "
       "pipeline\")"},
      {"CORTADO_DEVICE", "", "host",
       "plan executor: where its buffers live and its codecs run: `host` (host memory, the CPU "
       "codecs, MPI) or `cuda` (CUDA buffers, the CUDA codecs, NCCL; a build with CUDA and NCCL;"
       " docs/executor.md, \"Devices\")"},
      {"CORTADO_EXECUTOR_MPI", "", "1",
       "Python binding: under mpirun (`cortado launch --mpi`) the plan executor takes MPI's "
       "collective groups, so plans may use collectives; `0`: push/pull plans only "
       "(docs/python.md)"},
      {"CORTADO_TRACE_DIR", "", "(none: no tracing)",
       "every worker and server writes a Chrome trace of its stages here at the end of the job "
       "(`cortado launch --trace DIR`; docs/tracing.md)"},
      {"CORTADO_TRACE_ITERATIONS", "", "all",
       "iterations traced: `10:19`, `5:` or `all` (an iteration is a tensor's run count)"},
      {"CORTADO_PROFILE_WINDOW", "", "0",
       "online re-planning: iterations per profiling window (0: off); workers that call "
       "beginIteration report each window and the scheduler re-plans (docs/planner.md)"},
      {"CORTADO_REPLAN_CODEC", "", "dgc:ratio=0.01",
       "online re-planning: the codec the planner may compress with"},
      {"CORTADO_REPLAN_AHEAD", "", "10",
       "online re-planning: a new plan takes effect this many iterations after its window"},
      {"CORTADO_REPLAN_THRESHOLD", "", "0.25",
       "online re-planning: relative change of a link's time for the same messages that makes the "
       "scheduler re-plan"},
      {"CORTADO_REPLAN_MIN_GAIN", "", "0.05",
       "online re-planning: a new plan (the first window's too) is sent only when it is "
       "predicted this much faster (relative) than the plan the workers run under the same "
       "refitted costs"},
      {"CORTADO_REPLAN_CONFIRM", "", "2",
       "online re-planning: consecutive windows a link must be beyond `CORTADO_REPLAN_THRESHOLD`"
       " in before the scheduler re-plans (1: the first such window; more: fewer decisions on "
       "noise)"},
      {"CORTADO_UCX_DIRECT", "", "1",
       "ucx: same-host peers move data over UCX shared memory (sysv/posix FIFOs, no cma unless "
       "`UCX_TLS` names it); 0: over the connection manager's endpoints (TCP on one host) "
       "(docs/transports.md)"},
      {"CORTADO_UCX_PEER_SENDS", "", "1",
       "ucx: at most this many messages of 64 KiB or more in flight to one peer, later ones "
       "wait their turn (0: no bound). UCX moves all of an endpoint's large messages together, "
       "so without it a server gets every chunk of a push at its end and answers none before "
       "(docs/transports.md)"},
      {"CORTADO_INLINE_BYTES", "", "64KiB",
       "latency: a worker sends a tensor of at most this many bytes (one chunk) from the calling"
       " thread, and a server sums a key of at most this size on its transport's thread, instead"
       " of handing either to another thread (0: always hand off; docs/transports.md, "
       "\"Latency\")"},
      {"CORTADO_BUSY_POLL_US", "", "0",
       "latency: the transports' loops and push_pull's waits poll this many microseconds for "
       "the next message before they sleep (0: never poll, the default; at most 10000). Each "
       "polling thread keeps a core busy: only where the roles have cores to spare "
       "(docs/transports.md, \"Latency\")"},
      {"CORTADO_SHM_MESSAGES", "", "1",
       "latency: with `CORTADO_SHM=1`, messages between a worker and a server on the same host "
       "go through a shared-memory ring and a futex doorbell instead of the transport's sockets "
       "and threads (small ones: push and pull requests, answers; the rest, and everything "
       "across hosts, keep the transport; 0: everything through the transport; "
       "docs/transports.md, \"Latency\")"},
      {"CORTADO_SHM_SPIN_US", "", "0",
       "latency: with `CORTADO_SHM_MESSAGES=1`, each role's ring thread (or the thread that "
       "waits on a handle in its place: `CORTADO_SHM_WAITER_RECEIVES`) polls this many "
       "microseconds after its last message before it sleeps (0: sleeps at once; at most "
       "10000), yielding the core between looks"},
      {"CORTADO_SHM_SERVER_POLL_US", "", "50",
       "latency: with `CORTADO_SHM_MESSAGES=1`, a server's ring thread that has handed "
       "messages over polls its rings this many microseconds for the next one before it "
       "sleeps, but only while a worker waits for one of its rounds' answers (with "
       "`CORTADO_SHM_YIELD_POLLS=1`: after every batch) and only while no thread of the "
       "machine waits for a CPU (the runnable threads in /proc/loadavg at most the CPUs, "
       "looked at every 5 us; with `CORTADO_SHM_YIELD_POLLS=1`, or all of them the job's); 0: "
       "sleeps at once; at most 10000 (docs/transports.md, \"Latency\")"},
      {"CORTADO_SHM_WAITER_POLL_US", "", "50",
       "latency: with `CORTADO_SHM_WAITER_RECEIVES=1`, a thread that waits on a push_pull's "
       "handle polls its worker's rings this many microseconds for the answer before it sleeps "
       "(again after each message that did not complete it), but only while no thread of the "
       "machine waits for a CPU, as `CORTADO_SHM_SERVER_POLL_US`; 0: sleeps at once; at most "
       "10000"},
      {"CORTADO_SHM_WAITER_RECEIVES", "", "1",
       "latency: with `CORTADO_SHM_MESSAGES=1`, a thread that waits on a push_pull's handle "
       "takes the worker's ring messages itself while it waits (the ring thread parks), so "
       "that the answer wakes it directly instead of the ring thread, which would then wake it; "
       "the answers are copied and decoded on that thread (0: the ring thread takes every "
       "message; docs/transports.md, \"Latency\")"},
      {"CORTADO_SHM_YIELD_POLLS", "", "1",
       "latency: with `CORTADO_SHM_MESSAGES=1`, the polls of `CORTADO_SHM_SERVER_POLL_US` and "
       "`CORTADO_SHM_WAITER_POLL_US` also go on while the threads that wait for a CPU are all "
       "the job's own (its roles on this machine count their awake threads in a shared-memory "
       "segment), yielding the CPU between looks so that a role of the job with work runs "
       "first; a runnable thread outside the job still stops them within 5 us (0: they stop "
       "whenever any thread waits for a CPU; docs/transports.md, \"Latency\")"},
      {"CORTADO_TIMEOUT_MS", "", "120000", "deadline of blocking calls (push_pull waits, declare)"},
      {"CORTADO_STALL_CHECK_MS", "", "60000",
       "a server round that some workers pushed and others have not for this long is reported "
       "in the scheduler's log, naming the tensor and the workers (0: never); when unset, "
       "Horovod's HOROVOD_STALL_CHECK_TIME_SECONDS (seconds) and HOROVOD_STALL_CHECK_DISABLE=1 "
       "are read"},
      {"CORTADO_DECLARE_CHECK_MS", "", "10000",
       "when every worker has waited this long in a declaration that some other worker has not "
       "made (workers that declare different tensors: another model, name prefix or fusion "
       "setting), the job fails naming each worker's declaration, instead of the declarations "
       "failing at `CORTADO_TIMEOUT_MS` (0: never)"},
      {"CORTADO_REPORT_MEMORY", "", "0",
       "1: each server prints the memory it owns against the bytes of its keys when the job "
       "ends, and `cortado bench pushpull`'s workers theirs against the gradients' bytes (the "
       "benchmark sets it; docs/transports.md, \"Memory\")"},
      {"CORTADO_MALLOC_KEEP_BYTES", "", "1GiB",
       "Python workers: `cortado.init()` makes glibc's malloc serve blocks up to 32 MiB from the"
       " heap and keep up to this many freed bytes there, so that fresh tensors every step reuse"
       " memory instead of faulting in new pages (0: leave malloc alone; also left alone where "
       "`MALLOC_*_` or `GLIBC_TUNABLES` configure it; docs/python.md, \"Fresh tensors\")"},
      {"CORTADO_CONNECT_TIMEOUT_MS", "", "60000",
       "deadline to reach the scheduler and for every node to register"},
      {"CORTADO_HEARTBEAT_INTERVAL_MS", "", "1000", "heartbeat period"},
      {"CORTADO_HEARTBEAT_TIMEOUT_MS", "", "10000", "silence after which a node is declared dead"},
  };
  return table;
}

void JobConfig::validate() const {
  auto bad = [](const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); };
  if (numWorkers < 1) bad(fmt::format("CORTADO_NUM_WORKERS must be at least 1, got {}", numWorkers));
  if (numServers < 1) bad(fmt::format("CORTADO_NUM_SERVERS must be at least 1, got {}", numServers));
  if (schedulerPort < 0 || schedulerPort > 65535)
    bad(fmt::format("CORTADO_SCHEDULER_PORT {} is not a TCP port", schedulerPort));
  const int roleSize = role == Role::kServer ? numServers : numWorkers;
  if (role != Role::kScheduler && rank >= roleSize)
    bad(fmt::format("CORTADO_RANK {} is out of range for a {} of a job with {} of them", rank,
                    roleName(role), roleSize));
  if (transport != "zmq" && transport != "ucx" && transport != "auto")
    bad(fmt::format("CORTADO_TRANSPORT '{}' is unknown: valid are zmq, ucx, auto", transport));
  if (partitionBytes < 16)
    bad(fmt::format("CORTADO_PARTITION_BYTES {} is too small (at least 16)", partitionBytes));
  if (maxInflightBytes < partitionBytes)
    bad(fmt::format("CORTADO_MAX_INFLIGHT_BYTES {} is below the partition size {}",
                    maxInflightBytes, partitionBytes));
  if (serverThreads < 1 || serverThreads > 256)
    bad(fmt::format("CORTADO_SERVER_THREADS {} is out of range 1..256", serverThreads));
  if (profileWindow > 0 && (replanAhead < 1 || replanAhead > 100000))
    bad(fmt::format("CORTADO_REPLAN_AHEAD {} is out of range 1..100000", replanAhead));
  if (profileWindow > 0 && replanCodec.empty())
    bad("CORTADO_REPLAN_CODEC is empty: name a codec (e.g. dgc:ratio=0.01)");
  if (!(replanThreshold > 0 && replanThreshold < 100))
    bad(fmt::format("CORTADO_REPLAN_THRESHOLD {} must be in (0, 100) (0.25: re-plan when the same "
                    "messages take 25% longer, or 1/1.25 of the time)",
                    replanThreshold));
  if (profileWindow > 0 && (replanConfirm < 1 || replanConfirm > 1000))
    bad(fmt::format("CORTADO_REPLAN_CONFIRM {} is out of range 1..1000", replanConfirm));
  if (!(replanMinGain >= 0 && replanMinGain < 1))
    bad(fmt::format("CORTADO_REPLAN_MIN_GAIN {} must be in [0, 1) (0.05: switch only for a "
                    "predicted gain of 5% or more)",
                    replanMinGain));
  auto upTo = [&](const char* name, int value, int max) {
    if (value < 0 || value > max) bad(fmt::format("{} {} is out of range 0..{}", name, value, max));
  };
  upTo("CORTADO_UCX_PEER_SENDS", ucxPeerSends, kMaxUcxPeerSends);
  upTo("CORTADO_PUSH_WINDOW_CHUNKS", pushWindowChunks, kMaxPushWindowChunks);
  upTo("CORTADO_BUSY_POLL_US", busyPollUs, kMaxBusyPollUs);
  upTo("CORTADO_SHM_SPIN_US", shmSpinUs, kMaxBusyPollUs);
  upTo("CORTADO_SHM_SERVER_POLL_US", shmServerPollUs, kMaxBusyPollUs);
  upTo("CORTADO_SHM_WAITER_POLL_US", shmWaiterPollUs, kMaxBusyPollUs);
  if (stallCheck.count() < 0)
    bad(fmt::format("CORTADO_STALL_CHECK_MS {} is negative (0 turns the stall check off)",
                    stallCheck.count()));
  if (declareCheck.count() < 0)
    bad(fmt::format("CORTADO_DECLARE_CHECK_MS {} is negative (0 turns the check off)",
                    declareCheck.count()));
  if (opTimeout.count() <= 0 || connectTimeout.count() <= 0 || heartbeatInterval.count() <= 0 ||
      heartbeatTimeout <= heartbeatInterval)
    bad("timeouts must be positive, and CORTADO_HEARTBEAT_TIMEOUT_MS must exceed "
        "CORTADO_HEARTBEAT_INTERVAL_MS");
}

std::vector<std::pair<std::string, std::string>> JobConfig::toEnv() const {
  return {
      {"CORTADO_ROLE", roleName(role)},
      {"CORTADO_NUM_WORKERS", std::to_string(numWorkers)},
      {"CORTADO_NUM_SERVERS", std::to_string(numServers)},
      {"CORTADO_SCHEDULER_HOST", schedulerHost},
      {"CORTADO_SCHEDULER_PORT", std::to_string(schedulerPort)},
      {"CORTADO_JOB_TOKEN", token},
      {"CORTADO_RANK", std::to_string(rank)},
      {"CORTADO_TRANSPORT", transport},
      {"CORTADO_DATA_HOST", dataHost},
      {"CORTADO_LOG_LEVEL", logLevel},
      {"CORTADO_PARTITION_BYTES", std::to_string(partitionBytes)},
      {"CORTADO_MAX_INFLIGHT_BYTES", std::to_string(maxInflightBytes)},
      {"CORTADO_SERVER_THREADS", std::to_string(serverThreads)},
      {"CORTADO_SERVER_PUSH_BYTES", std::to_string(serverPushBytes)},
      {"CORTADO_PUSH_WINDOW_CHUNKS", std::to_string(pushWindowChunks)},
      {"CORTADO_ASYNC", async ? "1" : "0"},
      {"CORTADO_SHM", sharedMemory ? "1" : "0"},
      {"CORTADO_COMPACT_SPARSE", compactSparse ? "1" : "0"},
      {"CORTADO_EF_DTYPE", efDType},
      {"CORTADO_STAGGER", staggerChunks ? "1" : "0"},
      {"CORTADO_PLAN", planFile},
      {"CORTADO_FUSION_BYTES", std::to_string(fusionBytes)},
      {"CORTADO_PHASE_BYTES", std::to_string(phaseBytes)},
      {"CORTADO_CODEC_THREADS", std::to_string(codecThreads)},
      {"CORTADO_PIPELINE", pipeline ? "1" : "0"},
      {"CORTADO_DEVICE", device},
      {"CORTADO_TRACE_DIR", traceDir},
      {"CORTADO_TRACE_ITERATIONS", traceIterations},
      {"CORTADO_PROFILE_WINDOW", std::to_string(profileWindow)},
      {"CORTADO_REPLAN_CODEC", replanCodec},
      {"CORTADO_REPLAN_AHEAD", std::to_string(replanAhead)},
      {"CORTADO_REPLAN_THRESHOLD", fmt::format("{}", replanThreshold)},
      {"CORTADO_REPLAN_MIN_GAIN", fmt::format("{}", replanMinGain)},
      {"CORTADO_REPLAN_CONFIRM", std::to_string(replanConfirm)},
      {"CORTADO_UCX_DIRECT", ucxDirect ? "1" : "0"},
      {"CORTADO_UCX_PEER_SENDS", std::to_string(ucxPeerSends)},
      {"CORTADO_INLINE_BYTES", std::to_string(inlineBytes)},
      {"CORTADO_BUSY_POLL_US", std::to_string(busyPollUs)},
      {"CORTADO_SHM_MESSAGES", shmMessages ? "1" : "0"},
      {"CORTADO_SHM_SPIN_US", std::to_string(shmSpinUs)},
      {"CORTADO_SHM_SERVER_POLL_US", std::to_string(shmServerPollUs)},
      {"CORTADO_SHM_WAITER_POLL_US", std::to_string(shmWaiterPollUs)},
      {"CORTADO_SHM_WAITER_RECEIVES", shmWaiterReceives ? "1" : "0"},
      {"CORTADO_SHM_YIELD_POLLS", shmYieldPolls ? "1" : "0"},
      {"CORTADO_TIMEOUT_MS", std::to_string(opTimeout.count())},
      {"CORTADO_STALL_CHECK_MS", std::to_string(stallCheck.count())},
      {"CORTADO_DECLARE_CHECK_MS", std::to_string(declareCheck.count())},
      {"CORTADO_REPORT_MEMORY", reportMemory ? "1" : "0"},
      {"CORTADO_MALLOC_KEEP_BYTES", std::to_string(mallocKeepBytes)},
      {"CORTADO_CONNECT_TIMEOUT_MS", std::to_string(connectTimeout.count())},
      {"CORTADO_HEARTBEAT_INTERVAL_MS", std::to_string(heartbeatInterval.count())},
      {"CORTADO_HEARTBEAT_TIMEOUT_MS", std::to_string(heartbeatTimeout.count())},
  };
}

namespace {

// The variable and its aliases (SettingInfo::alias: space-separated, BytePS's
// and Horovod's names), in the order they are looked up.
std::vector<std::string> names(const char* name) {
  for (const auto& s : settingsTable()) {
    if (std::string(s.name) == name) {
      std::vector<std::string> all = {s.name};
      std::istringstream aliases(s.alias);
      for (std::string a; aliases >> a;) all.push_back(a);
      return all;
    }
  }
  return {name};
}

// Log levels as CORTADO_LOG_LEVEL takes them: lower case, with Horovod's
// names for the levels that Cortado calls otherwise.
std::string normalizeLogLevel(std::string level) {
  for (char& ch : level) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (level == "warning") return "warn";
  if (level == "fatal") return "error";
  return level;
}

}  // namespace

JobConfig readJobConfig(bool requireJob, JobConfig c) {
  std::vector<std::string> missing;
  if (auto v = getEnv(names("CORTADO_ROLE"))) {
    auto r = parseRole(v->value);
    if (!r)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}='{}' is not a role: valid are scheduler, server, worker", v->name,
                              v->value));
    c.role = *r;
  } else if (requireJob) {
    missing.push_back("CORTADO_ROLE");
  }
  // torch.distributed's launchers (torchrun) start each worker with RANK,
  // WORLD_SIZE and MASTER_ADDR; a worker without the CORTADO_* ones takes
  // those (docs/launchers.md).
  const bool torchEnv = c.role == Role::kWorker && getEnvInt({"RANK"}) && getEnvInt({"WORLD_SIZE"});
  if (auto v = getEnvInt(names("CORTADO_NUM_WORKERS"))) c.numWorkers = static_cast<int>(*v);
  else if (torchEnv) c.numWorkers = static_cast<int>(*getEnvInt({"WORLD_SIZE"}));
  else if (requireJob && c.numWorkers == 0) missing.push_back("CORTADO_NUM_WORKERS");
  if (auto v = getEnvInt(names("CORTADO_NUM_SERVERS"))) c.numServers = static_cast<int>(*v);
  else if (requireJob && c.numServers == 0) missing.push_back("CORTADO_NUM_SERVERS");
  if (auto v = getEnv(names("CORTADO_SCHEDULER_HOST"))) c.schedulerHost = v->value;
  else if (auto m = getEnv({"MASTER_ADDR"}); m && torchEnv && !m->value.empty()) c.schedulerHost = m->value;
  if (auto v = getEnvInt(names("CORTADO_SCHEDULER_PORT"))) c.schedulerPort = static_cast<int>(*v);
  else if (requireJob && c.schedulerPort == 0) missing.push_back("CORTADO_SCHEDULER_PORT");
  if (auto v = getEnv(names("CORTADO_JOB_TOKEN"))) c.token = v->value;
  else if (requireJob && c.token.empty()) missing.push_back("CORTADO_JOB_TOKEN");
  if (auto v = getEnvInt(names("CORTADO_RANK"))) c.rank = static_cast<int>(*v);
  else if (torchEnv) c.rank = static_cast<int>(*getEnvInt({"RANK"}));
  // Workers that `cortado launch --mpi/--hosts` starts under mpirun take
  // their rank from MPI, so that worker rank r is MPI rank r.
  else if (auto m = getEnvInt({"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}); m && c.role == Role::kWorker)
    c.rank = static_cast<int>(*m);
  // Servers and workers that `cortado launch` starts as srun steps in a
  // Slurm allocation: the task's rank in its step.
  else if (auto p = getEnvInt({"SLURM_PROCID"}); p && c.role != Role::kScheduler)
    c.rank = static_cast<int>(*p);
  // A node's data-plane identity is its rank, fixed before it registers.
  else if (requireJob && c.rank < 0 && c.role != Role::kScheduler) missing.push_back("CORTADO_RANK");
  if (auto v = getEnv(names("CORTADO_TRANSPORT"))) c.transport = v->value;
  if (auto v = getEnv(names("CORTADO_DATA_HOST"))) c.dataHost = v->value;
  if (auto v = getEnv(names("CORTADO_LOG_LEVEL"))) c.logLevel = normalizeLogLevel(v->value);
  if (auto v = getEnv(names("CORTADO_PARTITION_BYTES"))) {
    c.partitionBytes = parseBytes(v->value);
    c.partitionBytesGiven = true;
  }
  if (auto v = getEnv(names("CORTADO_MAX_INFLIGHT_BYTES"))) c.maxInflightBytes = parseBytes(v->value);
  if (auto v = getEnvInt(names("CORTADO_SERVER_THREADS"))) c.serverThreads = static_cast<int>(*v);
  if (auto v = getEnvBool(names("CORTADO_ASYNC"))) c.async = *v;
  if (auto v = getEnvBool(names("CORTADO_SHM"))) c.sharedMemory = *v;
  if (auto v = getEnvBool(names("CORTADO_COMPACT_SPARSE"))) c.compactSparse = *v;
  if (auto v = getEnv(names("CORTADO_EF_DTYPE")))
    c.efDType = compressor::toString(compressor::stateDTypeFromString(v->value, v->name));
  if (auto v = getEnvBool(names("CORTADO_STAGGER"))) c.staggerChunks = *v;
  if (auto v = getEnv(names("CORTADO_PLAN"))) c.planFile = v->value;
  // A size in bytes that may be 0; a bad one is refused naming the variable and what to give.
  auto sizeSetting = [&](const char* name, uint64_t& field, const char* what) {
    auto v = getEnv(names(name));
    if (!v) return;
    try {
      CORTADO_ENFORCE(v->value.find('-') == std::string::npos, ErrorCode::kInvalidArgument,
                      "a size cannot be negative");
      field = parseBytes(v->value);
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}='{}': {}; {}", name, v->value, e.what(), what));
    }
  };
  sizeSetting("CORTADO_FUSION_BYTES", c.fusionBytes,
       "give the fusion threshold in bytes (e.g. 64MiB; 0 switches tensor fusion off)");
  sizeSetting("CORTADO_PHASE_BYTES", c.phaseBytes,
       "give a phase's size in bytes (e.g. 64MiB; 0 runs a batch's tensors one after the other)");
  if (auto v = getEnvBool(names("CORTADO_PIPELINE"))) c.pipeline = *v;
  if (auto v = getEnv(names("CORTADO_DEVICE"))) {
    if (v->value != "host" && v->value != "cuda")
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("CORTADO_DEVICE='{}': use host (host memory, the CPU codecs, MPI) or "
                              "cuda (CUDA buffers, the CUDA codecs, NCCL)",
                              v->value));
    c.device = v->value;
  }
  if (auto v = getEnv(names("CORTADO_TRACE_DIR"))) c.traceDir = v->value;
  if (auto v = getEnv(names("CORTADO_TRACE_ITERATIONS"))) c.traceIterations = v->value;
  if (auto v = getEnvInt(names("CORTADO_PROFILE_WINDOW"))) {
    if (*v < 0) throw Error(ErrorCode::kInvalidArgument,
                            fmt::format("CORTADO_PROFILE_WINDOW={} must be 0 (off) or a number of iterations", *v));
    c.profileWindow = uint64_t(*v);
  }
  if (auto v = getEnv(names("CORTADO_REPLAN_CODEC"))) c.replanCodec = v->value;
  if (auto v = getEnvInt(names("CORTADO_REPLAN_AHEAD"))) {
    if (*v < 1) throw Error(ErrorCode::kInvalidArgument,
                            fmt::format("CORTADO_REPLAN_AHEAD={} must be at least 1", *v));
    c.replanAhead = uint64_t(*v);
  }
  if (auto v = getEnvInt(names("CORTADO_REPLAN_CONFIRM"))) {
    if (*v < 1)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("CORTADO_REPLAN_CONFIRM={} must be at least 1 (windows in a row)", *v));
    c.replanConfirm = int(std::min<int64_t>(*v, 1000000));
  }
  auto getDouble = [&](const char* name, double& out, const char* example) {
    auto v = getEnv(names(name));
    if (!v) return;
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(v->value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v->value.size() || !std::isfinite(x))
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}='{}' is not a number (e.g. {})", v->name, v->value, example));
    out = x;
  };
  getDouble("CORTADO_REPLAN_THRESHOLD", c.replanThreshold, "0.25");
  getDouble("CORTADO_REPLAN_MIN_GAIN", c.replanMinGain, "0.05");
  if (auto v = getEnvBool(names("CORTADO_UCX_DIRECT"))) c.ucxDirect = *v;
  // An integer setting within 0..max; `what` says what it counts.
  auto rangeSetting = [&](const char* name, int& out, int max, const char* what) {
    auto n = getEnvInt(names(name));
    if (!n) return;
    if (*n < 0 || *n > max)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}={} is out of range 0..{} ({})", name, *n, max, what));
    out = static_cast<int>(*n);
  };
  rangeSetting("CORTADO_UCX_PEER_SENDS", c.ucxPeerSends, JobConfig::kMaxUcxPeerSends,
               "large messages in flight to one peer; 0: no bound");
  rangeSetting("CORTADO_PUSH_WINDOW_CHUNKS", c.pushWindowChunks, JobConfig::kMaxPushWindowChunks,
               "chunks of a worker's pushes not yet summed; 0: no window");
  rangeSetting("CORTADO_CODEC_THREADS", c.codecThreads, JobConfig::kMaxCodecThreads,
               "threads of a worker's CPU encodes and decodes; 0: auto");
  sizeSetting("CORTADO_SERVER_PUSH_BYTES", c.serverPushBytes,
       "give the budget in bytes (e.g. 16MiB; 0: no budget, the workers' credits alone)");
  sizeSetting("CORTADO_INLINE_BYTES", c.inlineBytes,
       "give a size in bytes (e.g. 64KiB; 0 hands every tensor and key to the "
       "dispatcher and engine threads)");
  rangeSetting("CORTADO_BUSY_POLL_US", c.busyPollUs, JobConfig::kMaxBusyPollUs,
               "microseconds a thread polls before it sleeps; 0: never poll");
  if (auto v = getEnvBool(names("CORTADO_SHM_MESSAGES"))) c.shmMessages = *v;
  rangeSetting("CORTADO_SHM_SPIN_US", c.shmSpinUs, JobConfig::kMaxBusyPollUs,
               "microseconds a ring thread polls before it sleeps; 0: never poll");
  rangeSetting("CORTADO_SHM_SERVER_POLL_US", c.shmServerPollUs, JobConfig::kMaxBusyPollUs,
               "microseconds a server's ring thread polls for the next push; 0: never poll");
  rangeSetting("CORTADO_SHM_WAITER_POLL_US", c.shmWaiterPollUs, JobConfig::kMaxBusyPollUs,
               "microseconds a waiting thread polls for its answer; 0: never poll");
  if (auto v = getEnvBool(names("CORTADO_SHM_WAITER_RECEIVES"))) c.shmWaiterReceives = *v;
  if (auto v = getEnvBool(names("CORTADO_SHM_YIELD_POLLS"))) c.shmYieldPolls = *v;
  if (auto v = getEnvInt(names("CORTADO_TIMEOUT_MS"))) c.opTimeout = Millis(*v);
  if (auto v = getEnvInt(names("CORTADO_STALL_CHECK_MS"))) c.stallCheck = Millis(*v);
  else if (auto off = getEnvBool({"HOROVOD_STALL_CHECK_DISABLE"}); off && *off)
    c.stallCheck = Millis(0);
  else if (auto s = getEnvInt({"HOROVOD_STALL_CHECK_TIME_SECONDS"}))
    c.stallCheck = Millis(*s * 1000);
  if (auto v = getEnvInt(names("CORTADO_DECLARE_CHECK_MS"))) c.declareCheck = Millis(*v);
  if (auto v = getEnvBool(names("CORTADO_REPORT_MEMORY"))) c.reportMemory = *v;
  sizeSetting("CORTADO_MALLOC_KEEP_BYTES", c.mallocKeepBytes,
       "give a size in bytes (e.g. 1GiB; 0 leaves malloc as the process has it)");
  if (auto v = getEnvInt(names("CORTADO_CONNECT_TIMEOUT_MS"))) c.connectTimeout = Millis(*v);
  if (auto v = getEnvInt(names("CORTADO_HEARTBEAT_INTERVAL_MS"))) c.heartbeatInterval = Millis(*v);
  if (auto v = getEnvInt(names("CORTADO_HEARTBEAT_TIMEOUT_MS"))) c.heartbeatTimeout = Millis(*v);
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("missing environment variable(s) {}: start this process with "
                            "`cortado launch -w W -s S -- CMD`, or set them as docs/running.md "
                            "(\"Settings\") describes",
                            list));
  }
  if (requireJob) c.validate();
  return c;
}

}  // namespace cortado
