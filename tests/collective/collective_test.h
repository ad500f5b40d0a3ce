// The collective conformance suite: every Collectives backend passes the same
// tests (collective_test.cc), run under `mpirun -np 4` (see CMakeLists.txt).
// A backend joins with one line in its own file:
//
//   CORTADO_COLLECTIVE_CONFORMANCE(Mpi, mpiBackend());
//
// All ranks run the same tests in the same order; a backend that cannot run
// here must say so identically on every rank (skipReason), or the ranks would
// wait on each other.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/collective/collectives.h"
#include "core/collective/mpi/factory.h"

namespace cortado::collective::testing {

struct GroupOptions {
  InterGroups inter = InterGroups::kSameLocalRank;
  bool checkArguments = true;
};

struct Backend {
  std::string name;  // a test-name suffix: letters, digits and '_'
  // Empty when the backend can run here; otherwise why not (the test skips).
  std::function<std::string()> skipReason;
  // Forms the groups; every rank calls it with the same options.
  std::function<Groups(const GroupOptions&)> makeGroups;
  // Memory the backend's groups take (host memory or device memory).
  std::function<void*(size_t bytes)> alloc;
  std::function<void(void*)> free;
  std::function<void(void* dst, const void* hostSrc, size_t bytes)> upload;
  std::function<void(void* hostDst, const void* src, size_t bytes)> download;
  // Whether peers that arrive after another rank's timeout still complete
  // (MPI: yes, the timed-out request stays posted; NCCL: no, it is aborted).
  bool lateJoinCompletes = true;
};

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                       DType::kInt32,   DType::kInt64,   DType::kUInt8,   DType::kInt8};
inline constexpr size_t kSizes[] = {0, 1, 7, 1001};
inline constexpr Millis kOpDeadline{60000};

class CollectiveTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override;  // skips, or forms the default groups

  // Runs body(group, dtype, count) on every group, dtype and count.
  template <typename Body>
  void everyCase(Body body) {
    for (GroupKind k : {GroupKind::kWorld, GroupKind::kIntra, GroupKind::kInter}) {
      Collectives& g = groups_.get(k);
      for (DType t : kAllDTypes) {
        for (size_t n : kSizes) {
          SCOPED_TRACE(std::string("group ") + g.name() + " (rank " + std::to_string(g.rank()) + " of " +
                       std::to_string(g.size()) + "), dtype " + dtypeName(t) + ", count " + std::to_string(n));
          body(g, t, n);
          if (HasFatalFailure()) return;
        }
      }
    }
  }

  const Backend& backend() const { return GetParam(); }
  Deadline deadline() const { return Deadline::after(kOpDeadline); }

  Groups groups_;
  int seed_ = 1;
};

inline void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

inline std::string backendName(const ::testing::TestParamInfo<Backend>& info) { return info.param.name; }

// The MPI runtime that the test main owns (the NCCL bootstrap uses it too).
mpi::Runtime& mpiRuntime();
// The emulated machine size under test (CORTADO_FAKE_HOST_SIZE; 0 = real).
int fakeHostSize();

}  // namespace cortado::collective::testing

#define CORTADO_COLLECTIVE_CONFORMANCE(prefix, ...) \
  INSTANTIATE_TEST_SUITE_P(prefix, CollectiveTest, ::testing::Values(__VA_ARGS__), backendName)
