// Test main for the collective suite: owns MPI for the whole run, and keeps
// the report readable with 4 ranks: rank 0 prints GoogleTest's usual report,
// the others print only their failures, prefixed with their rank. mpirun
// fails when any rank fails.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "core/collective/mpi/factory.h"
#include "core/common/env.h"
#include "tests/collective/collective_test.h"

namespace cortado::collective::testing {

mpi::Runtime* runtime = nullptr;
int fakeSize = 0;

namespace {
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};
}  // namespace

mpi::Runtime& mpiRuntime() { return *runtime; }
int fakeHostSize() { return fakeSize; }

}  // namespace cortado::collective::testing

int main(int argc, char** argv) {
  namespace ct = cortado::collective::testing;
  namespace mpi = cortado::collective::mpi;
  ::testing::InitGoogleTest(&argc, argv);
  mpi::Runtime rt;
  ct::runtime = &rt;
  ct::fakeSize = mpi::Options::fromEnv().fakeHostSize;
  if (rt.worldRank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ct::FailurePrinter(rt.worldRank()));
  }
  int rc = RUN_ALL_TESTS();
  ct::runtime = nullptr;
  return rc;
}
