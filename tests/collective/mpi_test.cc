// The conformance suite on the MPI backend (host memory).
#include <cstdlib>
#include <cstring>

#include "core/collective/mpi/factory.h"
#include "tests/collective/collective_test.h"

namespace cortado::collective::testing {
namespace {

Backend mpiBackend() {
  Backend b;
  b.name = "Mpi";
  b.skipReason = [] { return std::string(); };
  b.makeGroups = [](const GroupOptions& g) {
    mpi::Options o = mpi::Options::fromEnv();
    o.inter = g.inter;
    o.checkArguments = g.checkArguments;
    return mpi::createGroups(mpiRuntime(), o, Deadline::after(Millis(60000)));
  };
  b.alloc = [](size_t bytes) { return std::malloc(bytes ? bytes : 1); };
  b.free = [](void* p) { std::free(p); };
  b.upload = [](void* dst, const void* src, size_t n) { if (n) std::memcpy(dst, src, n); };
  b.download = [](void* dst, const void* src, size_t n) { if (n) std::memcpy(dst, src, n); };
  b.lateJoinCompletes = true;
  return b;
}

CORTADO_COLLECTIVE_CONFORMANCE(Mpi, mpiBackend());

}  // namespace
}  // namespace cortado::collective::testing
