// A process's exit after it used UCX transports (ucx_exit_peer.cc, in its own
// process since the exit is what is tested): every closed transport's UCX
// worker must be gone before the libraries' destructors run, with nothing
// left of UCX's async thread, and a connection request that reached a
// closed transport must be rejected, the connecting node told.
#include <gtest/gtest.h>

#include "tests/multiprocess/run_command.h"

namespace cortado::test {
namespace {

const std::string kPeer = UCX_EXIT_PEER_BIN;

TEST(UcxExit, NoUcxThreadIsLeftWhenTheDestructorsRun) {
  auto r = runCommand(kPeer + " exchange", 120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "closed")) << r.output;
  EXPECT_TRUE(contains(r.output, "UCX async threads at exit: 0")) << r.output;
}

TEST(UcxExit, AConnectionRequestToAClosedTransportIsRejected) {
  auto r = runCommand(kPeer + " connect-to-closed", 120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "connecting node's error: ucx worker 0:")) << r.output;
  EXPECT_TRUE(contains(r.output, "rejected by remote peer")) << r.output;
  EXPECT_TRUE(contains(r.output, "UCX async threads at exit: 0")) << r.output;
}

}  // namespace
}  // namespace cortado::test
