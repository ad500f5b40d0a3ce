#include "core/backends.h"

#include <algorithm>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "core/common/logging.h"
#include "core/common/net.h"
#include "core/device/host/factory.h"
#include "core/shm/shm_segment.h"
#include "core/transport/shmring/factory.h"
#include "core/transport/zmq/factory.h"
#include "cortado/config.h"
#if CORTADO_CUDA && CORTADO_NCCL
#include "core/collective/nccl/factory.h"
#include "core/device/cuda/factory.h"
#endif
#if CORTADO_UCX
#include "core/transport/ucx/factory.h"
#endif

extern char** environ;

namespace cortado {
namespace {

// "auto": the address of the interface that reaches the scheduler, which
// peers on other hosts reach too (the launcher's --hosts sets it).
std::string dataHostOf(const JobConfig& config) {
  return config.dataHost == "auto" ? net::localAddressToward(config.schedulerHost)
                                   : config.dataHost;
}

}  // namespace

control::ClientOptions controlOptions(const JobConfig& job, Role role) {
  control::ClientOptions co;
  co.schedulerHost = job.schedulerHost;
  co.schedulerPort = job.schedulerPort;
  co.token = job.token;
  co.role = role;
  co.requestedRank = job.rank;
  co.connectTimeout = job.connectTimeout;
  co.heartbeatInterval = job.heartbeatInterval;
  // A node cut off from the scheduler (a host whose link is down) hears
  // nothing; it gives up as soon as the scheduler would give up on it.
  co.schedulerTimeout = job.heartbeatTimeout;
  return co;
}

WorkerOptions workerOptions(const JobConfig& job) {
  WorkerOptions wo;
  wo.partitionBytes = job.partitionBytes;
  wo.maxBytesInFlight = job.maxInflightBytes;
  wo.async = job.async;
  wo.sharedMemory = job.sharedMemory;
  wo.inlineBytes = job.inlineBytes;
  wo.compactSparse = job.compactSparse;
  wo.errorFeedbackState = compressor::stateDTypeFromString(job.efDType, "CORTADO_EF_DTYPE");
  wo.staggerChunks = job.staggerChunks;
  wo.pushWindow = uint64_t(job.pushWindowChunks) * job.partitionBytes;
  wo.busyPoll = std::chrono::microseconds(job.busyPollUs);
  wo.listenAddress = dataListenAddress(job);
  return wo;
}

std::unique_ptr<Worker> startWorker(const JobConfig& job, Deadline deadline) {
  return Worker::start(workerOptions(job), controlOptions(job, Role::kWorker),
                       makeTransport(job, NodeId{Role::kWorker, job.rank}), deadline);
}
namespace {

// How long auto's probe lets a UCX endpoint take to carry its first message.
constexpr Millis kProbeTimeout{5000};

// The UCX_* variables in force, for messages.
std::string ucxSettings() {
  std::string s;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "UCX_", 4) == 0) s += (s.empty() ? "" : ", ") + std::string(*e);
  }
  return s.empty() ? "no UCX_* variables set" : s;
}

#if CORTADO_UCX
// Two UCX transports in this process: one listens on the job's data host, the
// other connects to it and sends one message. Returns "" when the message
// arrived, else why not.
std::string probeUcx(const JobConfig& config) {
  transport::ucx::UcxOptions o;
  o.connectTimeout = kProbeTimeout;
  o.closeTimeout = Millis(200);
  const NodeId listenerId{Role::kScheduler, 0}, clientId{Role::kScheduler, 1};
  std::mutex mu;
  std::condition_variable cv;
  bool arrived = false;
  std::string failure;
  try {
    auto listener = transport::ucx::create(listenerId, o);
    auto client = transport::ucx::create(clientId, o);
    listener->setCallbacks(
        [&](transport::Message&&) {
          std::lock_guard g(mu);
          arrived = true;
          cv.notify_all();
        },
        [](const NodeId&, const Status&) {});
    client->setCallbacks([](transport::Message&&) {},
                         [&](const NodeId&, const Status& s) {
                           std::lock_guard g(mu);
                           if (failure.empty()) failure = s.message();
                           cv.notify_all();
                         });
    std::string address = listener->listen(fmt::format("ucx://{}:0", dataHostOf(config)));
    client->connect(listenerId, address);
    client->send(listenerId, transport::Message{});
    std::unique_lock lk(mu);
    if (!cv.wait_for(lk, kProbeTimeout, [&] { return arrived || !failure.empty(); })) {
      failure = fmt::format("a probe endpoint to {} carried nothing within {} ms", address,
                            kProbeTimeout.count());
    }
    if (arrived) failure.clear();
    lk.unlock();
    client->close();
    listener->close();
  } catch (const Error& e) {
    failure = e.what();
  }
  return failure;
}
#endif

}  // namespace

collective::Topology workerTopology(const control::AddressBook& book, int rank) {
  const auto& workers = book.workers;
  CORTADO_ENFORCE(rank >= 0 && static_cast<size_t>(rank) < workers.size(), ErrorCode::kInvalidArgument,
                  "worker rank {} is out of range: the job has {} workers", rank, workers.size());
  collective::Topology t;
  t.rank = rank;
  t.size = static_cast<int>(workers.size());
  std::vector<std::string> machines;  // hostnames in order of their lowest rank
  for (const auto& w : workers) {
    if (std::find(machines.begin(), machines.end(), w.hostname) == machines.end())
      machines.push_back(w.hostname);
  }
  const std::string& mine = workers[rank].hostname;
  t.numMachines = static_cast<int>(machines.size());
  t.machine = static_cast<int>(std::find(machines.begin(), machines.end(), mine) - machines.begin());
  t.localRank = 0;
  t.localSize = 0;
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r].hostname != mine) continue;
    if (static_cast<int>(r) < rank) ++t.localRank;
    ++t.localSize;
  }
  return t;
}

std::function<std::string(const std::string&, const std::string&, Deadline)> schedulerIdExchange(
    control::ControlClient& client) {
  return [&client](const std::string& key, const std::string& rootId, Deadline deadline) {
    const std::string k = "nccl/" + key;
    if (!rootId.empty()) {
      client.put(k, rootId, deadline);
      return rootId;
    }
    return client.get(k, deadline);
  };
}

bool ucxBuilt() { return CORTADO_UCX != 0; }

TransportChoice chooseTransport(const JobConfig& config) {
  const std::string& kind = config.transport;
  if (kind == "zmq") return {"zmq", "asked for (CORTADO_TRANSPORT / --transport)"};
  if (kind == "ucx") {
#if CORTADO_UCX
    try {
      // Initializes UCX (context and worker) and releases it again.
      transport::ucx::create(NodeId{Role::kScheduler, 0})->close();
    } catch (const Error& e) {
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("transport ucx was asked for (CORTADO_TRANSPORT / --transport) but "
                              "UCX does not initialize here: {}",
                              e.what()));
    }
    return {"ucx", "asked for (CORTADO_TRANSPORT / --transport)"};
#else
    throw Error(ErrorCode::kUnavailable,
                fmt::format("transport ucx was asked for (CORTADO_TRANSPORT / --transport) but "
                            "this build has no UCX transport ({}): install libucx-dev "
                            "(scripts/install_deps.sh) and reconfigure with "
                            "-DCORTADO_WITH_UCX=ON, or use --transport zmq or auto",
                            ucxSettings()));
#endif
  }
  if (kind == "auto") {
#if CORTADO_UCX
    std::string why = probeUcx(config);
    if (why.empty()) {
      return {"ucx", fmt::format("UCX initialized and a probe endpoint on {} connected ({})",
                                 config.dataHost, ucxSettings())};
    }
    return {"zmq", fmt::format("UCX is built but unusable here: {}", why)};
#else
    return {"zmq", "this build has no UCX transport (libucx-dev was not found at configure)"};
#endif
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("transport '{}' is unknown (CORTADO_TRANSPORT / --transport): valid are "
                          "zmq, ucx, auto",
                          kind));
}

namespace {

std::unique_ptr<transport::Transport> makeInnerTransport(const JobConfig& config,
                                                         const NodeId& self);

}  // namespace

std::unique_ptr<transport::Transport> makeTransport(const JobConfig& config, const NodeId& self) {
  auto inner = makeInnerTransport(config, self);
  if (!config.sharedMemory || !config.shmMessages || config.token.empty()) return inner;
  transport::shmring::RingOptions o;
  o.prefix = shm::jobPrefix(config.token);
  o.spin = std::chrono::microseconds(config.shmSpinUs);
  // Only a server expects messages (Transport::setExpecting); a worker's
  // ring thread is never told to.
  o.pollWhileExpecting = std::chrono::microseconds(config.shmServerPollUs);
  o.waiterPoll = std::chrono::microseconds(config.shmWaiterPollUs);
  o.waiterReceives = config.shmWaiterReceives;
  o.yieldPolls = config.shmYieldPolls;
  return transport::shmring::create(std::move(inner), o);
}

namespace {

std::unique_ptr<transport::Transport> makeInnerTransport(const JobConfig& config,
                                                         const NodeId& self) {
  std::string kind = config.transport;
  if (kind == "auto") {
    TransportChoice c = chooseTransport(config);
    if (c.kind == "zmq" && ucxBuilt()) {
      CORTADO_LOG_WARN("transport auto: using zmq: {}", c.reason);
    } else {
      CORTADO_LOG_INFO("transport auto: using {}: {}", c.kind, c.reason);
    }
    kind = c.kind;
  }
  if (kind == "zmq") {
    transport::zmq::ZmqOptions o;
    o.busyPoll = std::chrono::microseconds(config.busyPollUs);
    return transport::zmq::create(self, o);
  }
  if (kind == "ucx") {
#if CORTADO_UCX
    transport::ucx::UcxOptions o;
    o.connectTimeout = config.connectTimeout;
    o.sameHostDirect = config.ucxDirect;
    o.peerSends = config.ucxPeerSends;
    o.busyPoll = std::chrono::microseconds(config.busyPollUs);
    try {
      return transport::ucx::create(self, o);
    } catch (const Error& e) {
      throw Error(e.code(),
                  fmt::format("transport ucx was asked for (CORTADO_TRANSPORT / --transport) but "
                              "UCX does not initialize here: {}",
                              e.what()));
    }
#else
    chooseTransport(config);  // throws the "not built" error
#endif
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("transport '{}' is unknown (CORTADO_TRANSPORT / --transport): valid are "
                          "zmq, ucx, auto",
                          kind));
}

}  // namespace

std::string dataListenAddress(const JobConfig& config) {
  const std::string host = dataHostOf(config);
  if (config.transport == "ucx") return fmt::format("ucx://{}:0", host);
  return fmt::format("tcp://{}:0", host);
}

bool cudaDeviceBuilt() { return CORTADO_CUDA && CORTADO_NCCL; }

int cudaDeviceCount() {
#if CORTADO_CUDA && CORTADO_NCCL
  return device::cuda::deviceCount();
#else
  return 0;
#endif
}

std::shared_ptr<device::Device> makeDevice(const JobConfig& job,
                                           const collective::Groups* hostGroups,
                                           std::shared_ptr<const compressor::Registry> codecs,
                                           Deadline deadline) {
  const device::Kind kind = device::parseKind(job.device);
  if (kind == device::Kind::kHost) {
    device::host::Options o;
    o.groups = hostGroups;
    o.codecs = std::move(codecs);
    return device::host::create(o);
  }
#if CORTADO_CUDA && CORTADO_NCCL
  CORTADO_ENFORCE(hostGroups != nullptr && hostGroups->world, ErrorCode::kInvalidArgument,
                  "CORTADO_DEVICE=cuda needs the workers started under mpirun (cortado launch "
                  "--mpi): the NCCL groups are formed over the MPI groups' topology");
  const int gpus = device::cuda::deviceCount();
  CORTADO_ENFORCE(gpus > 0, ErrorCode::kUnavailable,
                  "CORTADO_DEVICE=cuda but no CUDA device is visible (cudaGetDeviceCount() == 0): "
                  "run on a GPU machine or use CORTADO_DEVICE=host");
  collective::Collectives* world = hostGroups->world.get();
  // This machine's ranks take its GPUs in turn (mpirun's local rank; the
  // emulated machines' where it is not set).
  const char* mpiLocal = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int gpu = (mpiLocal ? std::atoi(mpiLocal) : hostGroups->topology.localRank) % gpus;
  // NCCL refuses two ranks of one host on one GPU. Ranks that share a GPU
  // (more ranks than GPUs on a machine, or ranks in network namespaces or
  // containers of one machine, which NCCL takes for one host) become hosts
  // of their own to NCCL (NCCL_HOSTID) and connect through its sockets.
  {
    std::string uuid = device::cuda::deviceUuid(gpu);
    uuid.resize(16);
    std::string all(16 * size_t(world->size()), '\0');
    world->allgather(uuid.data(), uuid.size(), all.data(), DType::kUInt8, deadline);
    int sharing = 0;
    for (int r = 0; r < world->size(); ++r) sharing += all.compare(16 * size_t(r), 16, uuid) == 0;
    if (sharing > 1 && !std::getenv("NCCL_HOSTID")) {
      setenv("NCCL_HOSTID", fmt::format("cortado-rank-{}", world->rank()).c_str(), 1);
      // Ranks all on this machine (one mpirun host) reach each other over
      // loopback; in namespaces of their own NCCL's default interface does.
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
      if (local && std::atoi(local) == world->size()) setenv("NCCL_SOCKET_IFNAME", "lo", 0);
      if (world->rank() == 0 || hostGroups->topology.localRank == 0)
        CORTADO_LOG_INFO("rank {}: {} ranks share GPU {}: each is a host of its own to NCCL "
                         "(NCCL_HOSTID), over sockets",
                         world->rank(), sharing, gpu);
    }
  }
  collective::nccl::UniqueIdExchange exchange = [world](const std::string&,
                                                        const std::string& rootId, Deadline d) {
    std::string id(128, '\0');
    if (world->rank() == 0) id = rootId;
    id.resize(128);
    world->broadcast(id.data(), id.size(), DType::kUInt8, 0, d);
    return id;
  };
  collective::nccl::Options no;
  no.device = gpu;
  device::cuda::Options o;
  o.device = no.device;
  o.groups = collective::nccl::createGroups(hostGroups->topology, exchange, no, deadline);
  return device::cuda::create(std::move(o));
#else
  (void)hostGroups;
  (void)deadline;
  throw Error(ErrorCode::kUnavailable,
              "CORTADO_DEVICE=cuda but this build has no CUDA device (it needs CUDA and NCCL: "
              "configure with -DCORTADO_WITH_CUDA=ON -DCORTADO_WITH_NCCL=ON where nvcc and NCCL "
              "are installed), or use CORTADO_DEVICE=host");
#endif
}

}  // namespace cortado
