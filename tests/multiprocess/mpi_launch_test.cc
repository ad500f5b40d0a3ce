// `cortado launch --mpi` (workers as the MPI processes of one local mpirun)
// and the launcher's argument errors for --hosts/--server-hosts/--agent.
// Jobs are checked against plain summation (pushpull_check) and MPI's own
// result check (mpi_allreduce_bench); the multi-host runs are in
// tests/testbed (they need root and network namespaces).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "tests/multiprocess/run_command.h"

namespace cortado::test {
namespace {

const std::string kCortado = CORTADO_BIN;
const std::string kCheck = CHECK_BIN;
const std::string kMpiBench = MPI_BENCH_BIN;

// Processes whose command line holds `marker` (a unique argument value).
int processesWith(const std::string& marker) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(f)), {});
    if (e.path().filename() != std::to_string(getpid()) && contains(cmd, marker)) ++n;
  }
  return n;
}

TEST(MpiLaunch, WorkersUnderMpirunGetSumsRight) {
  auto r = runCommand(fmt::format("CORTADO_LOG_LEVEL=warn {} launch --mpi -w 3 -s 2 -- {} "
                                  "--tensors 6 --iters 3 --max-elements 50000",
                                  kCortado, kCheck),
                      120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  // Ranks come from MPI: each of 0..2 exactly once.
  for (int w = 0; w < 3; ++w)
    EXPECT_TRUE(contains(r.output, fmt::format("worker {}: 3 iterations of 6 tensors correct", w)))
        << r.output;
}

TEST(MpiLaunch, MpiOnlyRunsAnMpiProgramAcrossTheRanks) {
  auto r = runCommand(fmt::format("{} launch --mpi-only -w 3 -- {} --min-bytes 4096 "
                                  "--max-bytes 65536 --iters 3",
                                  kCortado, kMpiBench),
                      120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\"size_bytes\": 65536")) << r.output;
  EXPECT_FALSE(contains(r.output, "\"ok\": false")) << r.output;
}

TEST(MpiLaunch, KilledWorkerStopsEveryoneAndIsNamed) {
  const std::string marker = fmt::format("{}", 900000 + getpid() % 99999);
  auto r = runCommand(fmt::format("CORTADO_LOG_LEVEL=warn CORTADO_HEARTBEAT_TIMEOUT_MS=5000 {} "
                                  "launch --mpi -w 3 -s 2 -- {} --tensors 4 --iters 1000 "
                                  "--max-elements 1000 --slow-ms 20 --die-rank 1 --die-at 5 --seed {}",
                                  kCortado, kCheck, marker),
                      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_TRUE(contains(r.output, "job failed")) << r.output;
  EXPECT_TRUE(contains(r.output, "worker 1")) << r.output;
  EXPECT_EQ(processesWith(marker), 0) << "workers outlived the launcher";
}

// A killed mpirun cannot remove its session directory (OpenMPI's
// ompi.HOST.UID/pid.PID in /tmp) nor its ranks' shared-memory segments
// (/dev/shm/vader_segment.HOST.UID.JOBID.LOCALRANK); the launcher removes
// them. Each rank runs the MPI benchmark, waits for its segment, records
// both paths and kills mpirun.
TEST(MpiLaunch, KilledMpirunLeavesNoSessionDirectoryOrSegments) {
  const std::string record = fmt::format("{}/mpi_session_{}", testing::TempDir(), getpid());
  std::filesystem::remove(record);
  const std::string rank =
      fmt::format("{} --min-bytes 4096 --max-bytes 4096 --iters 100000000 >/dev/null & "
                  "seg=/dev/shm/vader_segment.$(hostname | cut -d. -f1).$(id -u)."
                  "$(printf %x $OMPI_MCA_ess_base_jobid).$OMPI_COMM_WORLD_LOCAL_RANK; "
                  "for i in $(seq 200); do [ -e $seg ] && break; sleep 0.05; done; "
                  "echo $seg >> {}; echo $PMIX_SERVER_TMPDIR >> {}; kill -9 $PPID; wait",
                  kMpiBench, record, record);
  auto r = runCommand(fmt::format("{} launch --mpi-only -w 2 -- sh -c '{}'", kCortado, rank), 60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "mpirun failed: killed by signal 9")) << r.output;
  std::ifstream f(record);
  std::vector<std::string> paths;
  for (std::string line; std::getline(f, line);) paths.push_back(line);
  std::filesystem::remove(record);
  ASSERT_FALSE(paths.empty()) << "no rank recorded its paths\n" << r.output;
  int segments = 0, sessions = 0;
  for (const auto& p : paths) {
    segments += contains(p, "/vader_segment.");
    sessions += contains(p, "/ompi.");
    EXPECT_FALSE(std::filesystem::exists(p)) << p << " outlived the job";
  }
  EXPECT_GE(segments, 1) << r.output;
  EXPECT_GE(sessions, 1) << r.output;
}

TEST(HostsErrors, BadArgumentsAreNamed) {
  struct Case {
    std::string args, want;
  };
  for (const auto& c : std::vector<Case>{
           {"--agent 'echo {host}' -w 1 -s 1", "--agent needs --hosts"},
           {"--hosts a,b,a -w 1 -s 1", "host 'a' is listed twice"},
           {"--hosts a,b --server-hosts b -w 1 -s 1", "host 'b' is listed twice"},
           {"--hosts 'a;rm' -w 1 -s 1", "'a;rm' is not a host name"},
           {"--hosts a, -w 1 -s 1", "is not a host name"},
           {"--server-hosts a -w 1 -s 1", "--server-hosts needs --hosts"},
           {"--hosts a,b --agent 'ssh -p 2222' -w 1 -s 1", "has no {host}"},
           {"--hosts a,b -w 1", "needs -s/--servers"},
           {"--hosts a,b --dedicated-servers -w 1 -s 1", "--dedicated-servers needs --server-hosts"},
       }) {
    auto r = runCommand(fmt::format("{} launch {} -- true", kCortado, c.args), 30);
    EXPECT_EQ(r.exitCode, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.want)) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace cortado::test
