// NCCL backend of Collectives: operations enqueued on the group's stream and
// polled (cudaStreamQuery, ncclCommGetAsyncError) against the deadline; the
// v-variants, alltoall and gather are grouped point-to-point calls;
// float16/bfloat16 sums run in float32 device scratch.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

#include "core/collective/nccl/factory.h"
#include "core/collective/nccl/nccl_kernels.h"
#include "core/common/error.h"
#include "core/common/logging.h"

namespace cortado::collective::nccl {

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

namespace {

ncclDataType_t ncclType(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
    case DType::kInt8: return ncclInt8;
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("no NCCL datatype for dtype {}", static_cast<int>(t)));
}

bool halfType(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

void cudaCheck(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kInternal, fmt::format("{}: CUDA error: {}", what, cudaGetErrorString(e)));
}

// Polls a non-blocking communicator until its pending work (init, split,
// enqueue) is done. Returns ncclSuccess, an error, or ncclInProgress when the
// deadline passed.
ncclResult_t waitComm(ncclComm_t comm, Deadline deadline) {
  for (long spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (deadline.expired()) return ncclInProgress;
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

constexpr const char* kMissedDeadline =
    "did not complete by its deadline: a member has not joined (is it alive, and calling the same operations in the "
    "same order?); the communicator was aborted and the group is unusable from now on";

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(std::string name, ncclComm_t comm, int rank, int size, int device, bool checkArguments)
      : Collectives(std::move(name), rank, size, checkArguments), comm_(comm), device_(device) {
    cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
    cudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  ~NcclCollectives() override {
    if (comm_) {
      if (broken_.empty()) {
        ncclCommFinalize(comm_);
        waitComm(comm_, Deadline::after(Millis(10000)));
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    // After an abort NCCL no longer touches the buffers, so the scratch can go.
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  MemoryKind memory() const override { return MemoryKind::kCuda; }

 protected:
  size_t maxCount() const override { return static_cast<size_t>(INT_MAX); }

  void checkUsable(CollOp op) const override {
    CORTADO_ENFORCE(broken_.empty(), ErrorCode::kClosed,
                    "{} on group '{}' (rank {} of {}): the group is unusable after an earlier failure: {}",
                    collOpName(op), name(), rank(), size(), broken_);
  }

  void checkMemory(const Call& c) const override {
    auto check = [&](const void* p, const char* which) {
      if (p == nullptr) return;
      cudaPointerAttributes a{};
      if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();  // not sticky, but clear it for the next caller
        a.type = cudaMemoryTypeUnregistered;
      }
      CORTADO_ENFORCE(a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged, ErrorCode::kInvalidArgument,
                      "{} on group '{}' (rank {} of {}): the {} buffer is {} memory; the NCCL backend takes CUDA "
                      "device buffers (use the MPI backend for host buffers)",
                      collOpName(c.op), name(), rank(), size(), which,
                      a.type == cudaMemoryTypeHost ? "pinned host" : "host");
    };
    check(c.send, "send");
    check(c.recv, "receive");
  }

  void allgatherBytes(CollOp op, const void* mine, size_t bytes, void* all, Deadline deadline) override {
    const std::string what = fmt::format("{} (argument check)", collOpName(op));
    auto* d = static_cast<uint8_t*>(scratch(bytes * (size() + 1)));
    cudaCheck(cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, stream_), "argument check: copy");
    enqueue(what.c_str(), ncclAllGather(d, d + bytes, bytes, ncclUint8, comm_, stream_), deadline);
    wait(what.c_str(), deadline);
    cudaCheck(cudaMemcpy(all, d + bytes, bytes * size(), cudaMemcpyDeviceToHost), "argument check: copy back");
  }

  void alltoallCounts(CollOp op, std::span<const int64_t> send, std::span<int64_t> recv, Deadline deadline) override {
    const std::string what = fmt::format("{} (argument check)", collOpName(op));
    const size_t n = static_cast<size_t>(size());
    auto* d = static_cast<int64_t*>(scratch(2 * n * sizeof(int64_t)));
    cudaCheck(cudaMemcpyAsync(d, send.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice, stream_),
              "argument check: copy");
    ncclGroupStart();
    for (int p = 0; p < size(); ++p) {
      ncclSend(d + p, 1, ncclInt64, p, comm_, stream_);
      ncclRecv(d + n + p, 1, ncclInt64, p, comm_, stream_);
    }
    enqueue(what.c_str(), ncclGroupEnd(), deadline);
    wait(what.c_str(), deadline);
    cudaCheck(cudaMemcpy(recv.data(), d + n, n * sizeof(int64_t), cudaMemcpyDeviceToHost),
              "argument check: copy back");
  }

  void run(const Call& c, Deadline deadline) override {
    const char* what = collOpName(c.op);
    const ncclDataType_t t = ncclType(c.dtype);
    const size_t es = dtypeSize(c.dtype);
    const bool bf16 = c.dtype == DType::kBFloat16;
    const bool viaF32 = halfType(c.dtype) &&
                        (c.op == CollOp::kAllreduce || c.op == CollOp::kReduceScatter || c.op == CollOp::kReduce);
    auto at = [&](const void* base, size_t elems) {
      return static_cast<const uint8_t*>(base) + elems * es;
    };
    auto atw = [&](void* base, size_t elems) { return static_cast<uint8_t*>(base) + elems * es; };
    const int me = rank();
    const int n = size();

    switch (c.op) {
      case CollOp::kAllreduce:
      case CollOp::kReduce:
        if (viaF32) {
          auto* f = static_cast<float*>(scratch(c.count * sizeof(float)));
          cudaCheck(launchToFloat(bf16, c.send, f, c.count, stream_), what);
          enqueue(what, c.op == CollOp::kAllreduce
                            ? ncclAllReduce(f, f, c.count, ncclFloat32, ncclSum, comm_, stream_)
                            : ncclReduce(f, f, c.count, ncclFloat32, ncclSum, c.root, comm_, stream_),
                  deadline);
          if (c.op == CollOp::kAllreduce || me == c.root)
            cudaCheck(launchFromFloat(bf16, f, c.recv, c.count, stream_), what);
        } else if (c.op == CollOp::kAllreduce) {
          enqueue(what, ncclAllReduce(c.send, c.recv, c.count, t, ncclSum, comm_, stream_), deadline);
        } else {
          enqueue(what, ncclReduce(c.send, c.recv, c.count, t, ncclSum, c.root, comm_, stream_), deadline);
        }
        break;
      case CollOp::kReduceScatter:
        if (viaF32) {
          const size_t total = c.count * n;
          auto* f = static_cast<float*>(scratch((total + c.count) * sizeof(float)));
          cudaCheck(launchToFloat(bf16, c.send, f, total, stream_), what);
          enqueue(what, ncclReduceScatter(f, f + total, c.count, ncclFloat32, ncclSum, comm_, stream_), deadline);
          cudaCheck(launchFromFloat(bf16, f + total, c.recv, c.count, stream_), what);
        } else {
          enqueue(what, ncclReduceScatter(c.send, c.recv, c.count, t, ncclSum, comm_, stream_), deadline);
        }
        break;
      case CollOp::kAllgather:
        enqueue(what, ncclAllGather(c.send, c.recv, c.count, t, comm_, stream_), deadline);
        break;
      case CollOp::kBroadcast:
        enqueue(what, ncclBroadcast(c.recv, c.recv, c.count, t, c.root, comm_, stream_), deadline);
        break;
      case CollOp::kAllgatherv: {
        ncclGroupStart();
        size_t off = 0;
        for (int p = 0; p < n; ++p) {
          if (c.count) ncclSend(c.send, c.count, t, p, comm_, stream_);
          if (c.counts[p]) ncclRecv(atw(c.recv, off), c.counts[p], t, p, comm_, stream_);
          off += c.counts[p];
        }
        enqueue(what, ncclGroupEnd(), deadline);
        break;
      }
      case CollOp::kAlltoall:
      case CollOp::kAlltoallv: {
        ncclGroupStart();
        size_t so = 0, ro = 0;
        for (int p = 0; p < n; ++p) {
          size_t sc = c.op == CollOp::kAlltoall ? c.count : c.sendCounts[p];
          size_t rc = c.op == CollOp::kAlltoall ? c.count : c.recvCounts[p];
          if (sc) ncclSend(at(c.send, so), sc, t, p, comm_, stream_);
          if (rc) ncclRecv(atw(c.recv, ro), rc, t, p, comm_, stream_);
          so += sc;
          ro += rc;
        }
        enqueue(what, ncclGroupEnd(), deadline);
        break;
      }
      case CollOp::kGather:
      case CollOp::kGatherv: {
        ncclGroupStart();
        if (c.count) ncclSend(c.send, c.count, t, c.root, comm_, stream_);
        if (me == c.root) {
          size_t off = 0;
          for (int p = 0; p < n; ++p) {
            size_t k = c.op == CollOp::kGather ? c.count : c.counts[p];
            if (k) ncclRecv(atw(c.recv, off), k, t, p, comm_, stream_);
            off += k;
          }
        }
        enqueue(what, ncclGroupEnd(), deadline);
        break;
      }
    }
    wait(what, deadline);
  }

 private:
  void* scratch(size_t bytes) {
    if (bytes > scratchBytes_) {
      if (scratch_) {
        cudaCheck(cudaStreamSynchronize(stream_), "scratch: synchronize");
        cudaFree(scratch_);
        scratch_ = nullptr;
      }
      cudaCheck(cudaMalloc(&scratch_, bytes), fmt::format("group '{}': allocating {} bytes of scratch", name(), bytes));
      scratchBytes_ = bytes;
    }
    return scratch_;
  }

  void fail(ErrorCode code, const std::string& what, const std::string& detail) {
    broken_ = fmt::format("{} {}", what, detail);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw Error(code, fmt::format("{} on group '{}' (rank {} of {}) {}", what, name(), rank(), size(), detail));
  }

  // A non-blocking communicator may return ncclInProgress while it is still
  // putting the operation on the stream (connecting to peers the first time);
  // until it is ncclSuccess, work enqueued after it on the stream (the fp32
  // conversions) would run before it. So wait for the enqueue to finish.
  void enqueue(const char* what, ncclResult_t rc, Deadline deadline) {
    if (rc == ncclInProgress) rc = waitComm(comm_, deadline);
    if (rc == ncclInProgress)
      fail(ErrorCode::kTimeout, what, kMissedDeadline);
    if (rc != ncclSuccess)
      fail(ErrorCode::kInternal, what, fmt::format("failed in NCCL: {}", ncclGetErrorString(rc)));
  }

  // Polls the stream and the communicator's async error until the work is
  // done, or aborts the communicator when the deadline passes.
  void wait(const char* what, Deadline deadline) {
    for (long spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress)
        fail(ErrorCode::kInternal, what, fmt::format("failed in NCCL: {}", ncclGetErrorString(state)));
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess && state == ncclSuccess) return;
      if (q != cudaSuccess && q != cudaErrorNotReady)
        fail(ErrorCode::kInternal, what, fmt::format("failed in CUDA: {}", cudaGetErrorString(q)));
      if (deadline.expired())
        fail(ErrorCode::kTimeout, what, kMissedDeadline);
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  std::string broken_;
};

// Waits until `comm`'s pending operation (`rc` is what the call returned) has
// completed, or throws saying why not. The caller aborts what it formed.
void settle(ncclComm_t comm, ncclResult_t rc, Deadline deadline, const std::string& what, int device) {
  if (rc == ncclSuccess || rc == ncclInProgress) rc = comm ? waitComm(comm, deadline) : rc;
  if (rc == ncclSuccess) return;
  if (rc == ncclInProgress)
    throw Error(ErrorCode::kTimeout,
                fmt::format("forming the NCCL groups: {} did not complete by the deadline (is every rank calling "
                            "createGroups?)",
                            what));
  // NCCL's own reason ("Duplicate GPU detected : rank 1 and rank 0 both on
  // CUDA device ...") says more than the result code.
  const char* last = ncclGetLastError(comm);
  std::string reason = last && *last ? fmt::format(" ({})", last) : std::string();
  std::string hint;
  if (rc == ncclInvalidUsage)
    hint = fmt::format("; this rank is on CUDA device {} of {} visible: NCCL needs a GPU of its own for every rank of "
                       "a machine, so start at most as many workers per machine as it has GPUs (or give each a "
                       "different CUDA_VISIBLE_DEVICES)",
                       device, deviceCount());
  throw Error(rc == ncclInvalidUsage ? ErrorCode::kInvalidArgument : ErrorCode::kInternal,
              fmt::format("forming the NCCL groups: {} failed: {}{}{}", what, ncclGetErrorString(rc), reason, hint));
}

// Splits `parent`; nullptr for NCCL_SPLIT_NOCOLOR. A non-blocking split shows
// its progress on the parent, and NCCL sets the child's handle only once the
// split is complete, so the wait is on the parent.
ncclComm_t split(ncclComm_t parent, int color, int key, ncclConfig_t* config, Deadline deadline,
                 const std::string& what, int device) {
  ncclComm_t child = nullptr;
  ncclResult_t rc = ncclCommSplit(parent, color, key, &child, config);
  settle(parent, rc, deadline, what, device);
  if (color == NCCL_SPLIT_NOCOLOR) return nullptr;
  CORTADO_ENFORCE(child != nullptr, ErrorCode::kInternal,
                  "forming the NCCL groups: {} completed without a communicator", what);
  settle(child, ncclSuccess, deadline, what, device);
  return child;
}

}  // namespace

Groups createGroups(const Topology& topo, const UniqueIdExchange& exchange, const Options& options,
                    Deadline deadline) {
  CORTADO_ENFORCE(topo.size > 0 && topo.rank >= 0 && topo.rank < topo.size, ErrorCode::kInvalidArgument,
                  "NCCL groups: rank {} is not within a job of {} ranks", topo.rank, topo.size);
  CORTADO_ENFORCE(topo.localRank >= 0 && topo.localRank < topo.localSize && topo.machine >= 0 &&
                      topo.machine < topo.numMachines,
                  ErrorCode::kInvalidArgument,
                  "NCCL groups: inconsistent topology (machine {} of {}, local rank {} of {})", topo.machine,
                  topo.numMachines, topo.localRank, topo.localSize);
  CORTADO_ENFORCE(static_cast<bool>(exchange), ErrorCode::kInvalidArgument,
                  "NCCL groups: no UniqueIdExchange was given (the ranks cannot agree on an ncclUniqueId)");
  const int devices = deviceCount();
  CORTADO_ENFORCE(devices > 0, ErrorCode::kUnavailable,
                  "NCCL groups: no CUDA device is visible (cudaGetDeviceCount() == 0); use the MPI backend for host "
                  "buffers");
  const int device = options.device >= 0 ? options.device : topo.localRank % devices;
  CORTADO_ENFORCE(device < devices, ErrorCode::kInvalidArgument, "NCCL groups: device {} requested, {} visible",
                  device, devices);
  cudaCheck(cudaSetDevice(device), "cudaSetDevice");

  std::string rootId;
  if (topo.rank == 0) {
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id);
    CORTADO_ENFORCE(rc == ncclSuccess, ErrorCode::kInternal, "ncclGetUniqueId failed: {}", ncclGetErrorString(rc));
    rootId.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  std::string got = exchange("nccl/world", rootId, deadline);
  CORTADO_ENFORCE(got.size() == sizeof(ncclUniqueId), ErrorCode::kProtocol,
                  "NCCL groups: the exchange returned {} bytes for the ncclUniqueId, expected {}", got.size(),
                  sizeof(ncclUniqueId));
  ncclUniqueId id;
  std::memcpy(&id, got.data(), sizeof id);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t world = nullptr, intra = nullptr, inter = nullptr;
  try {
    ncclResult_t rc = ncclCommInitRankConfig(&world, topo.size, id, topo.rank, &config);
    settle(world, rc, deadline, "ncclCommInitRankConfig (world)", device);
    intra = split(world, topo.machine, topo.localRank, &config, deadline, "ncclCommSplit (intra-machine)", device);
    const int color = options.inter == InterGroups::kSameLocalRank ? topo.localRank
                                                                    : (topo.localRank == 0 ? 0 : NCCL_SPLIT_NOCOLOR);
    inter = split(world, color, topo.machine, &config, deadline, "ncclCommSplit (inter-machine)", device);
  } catch (...) {
    // Nothing formed so far is handed out: abort it all (peers waiting on it
    // are released by their own deadlines).
    for (ncclComm_t c : {inter, intra, world})
      if (c) ncclCommAbort(c);
    throw;
  }

  auto wrap = [&](std::string name, ncclComm_t c) {
    int r = 0, s = 0;
    ncclCommUserRank(c, &r);
    ncclCommCount(c, &s);
    return std::make_unique<NcclCollectives>(std::move(name), c, r, s, device, options.checkArguments);
  };
  Groups g;
  g.topology = topo;
  g.world = wrap("world", world);
  g.intra = wrap(fmt::format("intra[machine {}]", topo.machine), intra);
  if (inter != nullptr) {
    g.inter = wrap(options.inter == InterGroups::kSameLocalRank ? fmt::format("inter[local rank {}]", topo.localRank)
                                                                : std::string("inter[machine roots]"),
                   inter);
  }
  return g;
}

}  // namespace cortado::collective::nccl
