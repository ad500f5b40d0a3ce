// The conformance suite on the NCCL backend (device memory). Without a GPU
// every test skips, saying so. The ranks agree on the ncclUniqueId through the
// MPI backend's world broadcast, and take the topology from the MPI groups
// (so CORTADO_FAKE_HOST_SIZE emulates machines here too).
#include <cuda_runtime.h>

#include "core/collective/mpi/factory.h"
#include "core/collective/nccl/factory.h"
#include "core/common/error.h"
#include "tests/collective/collective_test.h"

namespace cortado::collective::testing {
namespace {

Backend ncclBackend() {
  Backend b;
  b.name = "Nccl";
  b.skipReason = [] {
    return nccl::deviceCount() == 0
               ? std::string("no CUDA device visible (cudaGetDeviceCount() == 0): the NCCL backend's conformance "
                             "tests need a GPU")
               : std::string();
  };
  b.makeGroups = [](const GroupOptions& g) {
    mpi::Options mo = mpi::Options::fromEnv();
    Groups host = mpi::createGroups(mpiRuntime(), mo, Deadline::after(Millis(60000)));
    Collectives* world = host.world.get();
    nccl::UniqueIdExchange exchange = [world](const std::string&, const std::string& rootId, Deadline d) {
      std::string id(128, '\0');
      if (world->rank() == 0) id = rootId;
      id.resize(128);
      world->broadcast(id.data(), id.size(), DType::kUInt8, 0, d);
      return id;
    };
    nccl::Options o;
    o.inter = g.inter;
    o.checkArguments = g.checkArguments;
    return nccl::createGroups(host.topology, exchange, o, Deadline::after(Millis(60000)));
  };
  b.alloc = [](size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) throw Error(ErrorCode::kUnavailable, "cudaMalloc failed");
    return p;
  };
  b.free = [](void* p) { cudaFree(p); };
  b.upload = [](void* dst, const void* src, size_t n) { if (n) cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice); };
  b.download = [](void* dst, const void* src, size_t n) { if (n) cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost); };
  b.lateJoinCompletes = false;
  return b;
}

CORTADO_COLLECTIVE_CONFORMANCE(Nccl, ncclBackend());

}  // namespace
}  // namespace cortado::collective::testing
