// The conformance suite on the NCCL backend (device memory). Without a GPU
// every test skips, saying so. The ranks agree on the ncclUniqueId through the
// MPI backend's world broadcast, and take the topology from the MPI groups
// (so CORTADO_FAKE_HOST_SIZE emulates machines here too).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/collective/mpi/factory.h"
#include "core/collective/nccl/factory.h"
#include "core/common/error.h"
#include "tests/collective/collective_test.h"

namespace cortado::collective::testing {
namespace {

// NCCL refuses two ranks of one machine on one GPU ("Duplicate GPU
// detected"), which is right for jobs (createGroups reports it with a hint) but
// would leave a one-GPU machine unable to run this suite. There, before the
// first NCCL call, every rank tells NCCL it is a machine of its own
// (NCCL_HOSTID) and NCCL connects the ranks through its socket transport over
// loopback. The suite then runs every code path of the backend (grouped
// point-to-point, fp32 scratch sums, splits, deadlines) on real NCCL, but not
// NCCL's intra-machine transports (P2P, SHM, NVLink).
void emulateMachinePerRankWhenGpusAreShared() {
  static const bool once = [] {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranksHere = local ? std::atoi(local) : 1;
    const int gpus = nccl::deviceCount();
    if (ranksHere > gpus && gpus > 0 && !std::getenv("NCCL_HOSTID")) {
      const std::string id = "cortado-test-rank-" + std::to_string(mpiRuntime().worldRank());
      setenv("NCCL_HOSTID", id.c_str(), 1);
      setenv("NCCL_SOCKET_IFNAME", "lo", 0);
      if (mpiRuntime().worldRank() == 0)
        std::fprintf(stderr,
                     "nccl_test: %d ranks share %d GPU(s) on this machine: each rank is its own machine to NCCL "
                     "(NCCL_HOSTID), connected over loopback sockets\n",
                     ranksHere, gpus);
    }
    return true;
  }();
  (void)once;
}

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
    emulateMachinePerRankWhenGpusAreShared();
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

// Host memory handed to NCCL would fault on the GPU and poison the process's
// CUDA context; it is refused on every rank before anyone communicates, and the
// group stays usable.
TEST(NcclMemory, HostBuffersAreRefusedAndTheGroupStaysUsable) {
  Backend b = ncclBackend();
  if (std::string why = b.skipReason(); !why.empty()) GTEST_SKIP() << why;
  Groups g = b.makeGroups(GroupOptions{});
  const auto deadline = Deadline::after(Millis(60000));
  std::vector<float> host(8, 1.0f);
  try {
    g.world->allreduce(host.data(), host.data(), host.size(), DType::kFloat32, deadline);
    ADD_FAILURE() << "an allreduce of host memory was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("send buffer is host memory"), std::string::npos) << e.what();
  }
  void* d = b.alloc(host.size() * sizeof(float));
  b.upload(d, host.data(), host.size() * sizeof(float));
  g.world->allreduce(d, d, host.size(), DType::kFloat32, deadline);
  std::vector<float> sum(host.size());
  b.download(sum.data(), d, sum.size() * sizeof(float));
  b.free(d);
  for (float v : sum) EXPECT_EQ(v, static_cast<float>(g.world->size()));
}

}  // namespace
}  // namespace cortado::collective::testing
