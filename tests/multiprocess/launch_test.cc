// Multi-process tests: real jobs started through `cortado launch` on
// loopback, checked against plain summation (see pushpull_check.cc), and the
// failure cases: killed servers and workers, a wrong job token, mismatched
// declarations, bad options and missing settings. Every run has a deadline.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "tests/multiprocess/run_command.h"

namespace cortado::test {
namespace {

const std::string kCortado = CORTADO_BIN;
const std::string kCheck = CHECK_BIN;
const std::string kCodecCheck = CODEC_CHECK_BIN;

std::string launchCmd(int w, int s, const std::string& args, const std::string& env = "") {
  return fmt::format("{} CORTADO_LOG_LEVEL=warn {} launch -w {} -s {} -- {} {}", env, kCortado, w, s,
                     kCheck, args);
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

struct Shape {
  int workers, servers;
};

class SumsMatch : public ::testing::TestWithParam<Shape> {};

TEST_P(SumsMatch, ManyTensorsAndIterations) {
  auto [w, s] = GetParam();
  auto r = runCommand(launchCmd(w, s, "--tensors 14 --iters 3 --max-elements 70000 --seed " +
                                          std::to_string(w * 10 + s)),
                      240);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "iterations of 14 tensors correct")) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Shapes, SumsMatch,
                         ::testing::Values(Shape{1, 1}, Shape{1, 2}, Shape{1, 3}, Shape{2, 1},
                                           Shape{2, 2}, Shape{2, 3}, Shape{4, 1}, Shape{4, 2},
                                           Shape{4, 3}),
                         [](const auto& info) {
                           return fmt::format("W{}S{}", info.param.workers, info.param.servers);
                         });

TEST(Launch, LargeTensorOf64MiB) {
  // 16 Mi float32 elements = 64 MiB, split into 4 MiB chunks over 3 servers.
  auto r = runCommand(launchCmd(2, 3, "--tensors 2 --iters 2 --big-elements 16777216"), 300);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
}

TEST(Launch, SmallPartitionsAndAverage) {
  // 4 KiB chunks: most tensors become many chunks, and a 16 KiB credit bound
  // keeps few in flight.
  auto r = runCommand(launchCmd(4, 2, "--tensors 10 --iters 3 --max-elements 20000 --average",
                                "CORTADO_PARTITION_BYTES=4K CORTADO_MAX_INFLIGHT_BYTES=16K"),
                      240);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
}

TEST(LaunchFailure, KilledWorkerStopsEveryoneAndIsNamed) {
  auto r = runCommand(
      launchCmd(3, 2, "--tensors 4 --iters 1000 --max-elements 1000 --slow-ms 20 --die-rank 1 --die-at 5",
                "CORTADO_HEARTBEAT_TIMEOUT_MS=5000"),
      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_TRUE(contains(r.output, "worker 1")) << r.output;
}

TEST(LaunchFailure, KilledServerStopsEveryoneAndIsNamed) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("cortado-kill-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string progress = (dir / "progress").string();
  auto job = std::async(std::launch::async, [&] {
    return runCommand(
        fmt::format("CORTADO_LOG_LEVEL=warn CORTADO_HEARTBEAT_TIMEOUT_MS=5000 {} launch -w 2 -s 2 "
                    "--pid-dir {} -- {} --tensors 4 --iters 100000 --max-elements 1000 --slow-ms 10 "
                    "--progress-file {}",
                    kCortado, dir.string(), kCheck, progress),
        90);
  });
  // Wait until the job is really running, then kill server 1.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (std::chrono::steady_clock::now() < deadline && !fs::exists(progress))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(fs::exists(progress)) << "the job never made progress";
  int pid = 0;
  std::ifstream(dir / "server.1.pid") >> pid;
  ASSERT_GT(pid, 0);
  auto killedAt = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  auto r = job.get();
  double afterKill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_LT(afterKill, 30) << r.output;
  EXPECT_TRUE(contains(r.output, "server 1")) << r.output;
  fs::remove_all(dir);
}

TEST(LaunchFailure, MismatchedDeclarationsFailEveryWorkerClearly) {
  auto r = runCommand(launchCmd(3, 1, "--tensors 3 --iters 2 --mismatch-rank 2"), 60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "t0")) << r.output;  // names the tensor
}

TEST(LaunchFailure, WrongJobTokenIsRefused) {
  // A scheduler started by hand with one token; a server with another.
  int port = freePort();
  std::string env = fmt::format("CORTADO_NUM_WORKERS=1 CORTADO_NUM_SERVERS=1 "
                                "CORTADO_SCHEDULER_HOST=127.0.0.1 CORTADO_SCHEDULER_PORT={} "
                                "CORTADO_CONNECT_TIMEOUT_MS=3000",
                                port);
  auto sched = std::async(std::launch::async, [&] {
    return runCommand(fmt::format("{} CORTADO_JOB_TOKEN=right-token timeout 8 {} scheduler", env,
                                  kCortado),
                      20);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto server = runCommand(
      fmt::format("{} CORTADO_JOB_TOKEN=wrong-token CORTADO_RANK=0 {} server", env, kCortado), 20);
  auto s = sched.get();
  ASSERT_FALSE(server.timedOut) << server.output;
  EXPECT_NE(server.exitCode, 0) << server.output;
  EXPECT_TRUE(contains(server.output, "token")) << server.output;
  EXPECT_TRUE(contains(s.output, "token")) << s.output;  // the scheduler logs the reason
}

// Compressed push-pull (issue 4): see codec_check.cc for the references.
std::string codecCmd(int w, int s, const std::string& args, const std::string& env = "") {
  return fmt::format("{} CORTADO_LOG_LEVEL=warn {} launch -w {} -s {} -- {} {}", env, kCortado, w,
                     s, kCodecCheck, args);
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

TEST(Compression, TopKWithErrorFeedbackConvergesOverManyRounds) {
  // 4 workers, 2 servers, 16 KiB chunks (so tensors span several chunks and
  // both servers), 300 rounds; every round is checked against a brute-force
  // replay and the running sums against the error-feedback bound.
  auto r = runCommand(codecCmd(4, 2, "--mode topk --ratio 0.05 --tensors 3 --iters 300 "
                                     "--max-elements 20000",
                               "CORTADO_PARTITION_BYTES=16K"),
                      300);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(count(r.output, "top-k tensors match the reference"), 4u) << r.output;
}

TEST(Compression, TopKAverageOnOneServer) {
  auto r = runCommand(codecCmd(3, 1, "--mode topk --ratio 0.01 --tensors 2 --iters 30 "
                                     "--max-elements 50000 --average"),
                      200);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(count(r.output, "top-k tensors match the reference"), 3u) << r.output;
}

TEST(Compression, Fp16MatchesTheReferenceBitForBit) {
  auto r = runCommand(codecCmd(4, 2, "--mode fp16 --tensors 4 --iters 5 --max-elements 100000"),
                      200);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(count(r.output, "fp16 tensors match the reference"), 4u) << r.output;
  auto a = runCommand(codecCmd(2, 3, "--mode fp16 --tensors 3 --iters 3 --average"), 200);
  ASSERT_FALSE(a.timedOut) << a.output;
  EXPECT_EQ(a.exitCode, 0) << a.output;
}

TEST(Compression, MismatchedCodecFailsEveryWorkerClearly) {
  auto r = runCommand(codecCmd(3, 1, "--mode topk --ratio 0.01 --iters 2 --mismatch-rank 2"), 60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  // Every worker's declare fails with the scheduler's verdict, which names the
  // tensor, the field and what each worker declared.
  EXPECT_EQ(count(r.output, "worker: error:"), 3u) << r.output;
  EXPECT_TRUE(contains(r.output, "declaration mismatch for tensor 'g0' (codec differs)")) << r.output;
  EXPECT_TRUE(contains(r.output, "worker 2 declared float32")) << r.output;
  EXPECT_TRUE(contains(r.output, "'topk:ratio=0.02'")) << r.output;
}

TEST(Compression, BenchRunsWithACodec) {
  auto r = runCommand(kCortado + " bench pushpull -w 2 -s 1 -b 64K -e 256K -n 3 --codec fp16", 120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "codec fp16")) << r.output;
  EXPECT_FALSE(contains(r.output, "WRONG")) << r.output;
  auto bad = runCommand(kCortado + " bench pushpull -w 1 -s 1 -b 4K -e 4K -n 1 --codec topk:ratio=7",
                        60);
  EXPECT_NE(bad.exitCode, 0) << bad.output;
  EXPECT_TRUE(contains(bad.output, "ratio")) << bad.output;
}

TEST(LaunchErrors, UnknownOptionIsNamed) {
  auto r = runCommand(kCortado + " launch -w 1 -s 1 --bogus-flag -- true", 20);
  EXPECT_NE(r.exitCode, 0);
  EXPECT_TRUE(contains(r.output, "bogus-flag")) << r.output;
}

TEST(LaunchErrors, MissingEnvironmentIsNamed) {
  auto r = runCommand("env -u CORTADO_NUM_WORKERS -u DMLC_NUM_WORKER " + kCortado + " server", 20);
  EXPECT_NE(r.exitCode, 0);
  EXPECT_TRUE(contains(r.output, "CORTADO_NUM_WORKERS")) << r.output;
}

TEST(LaunchErrors, UnreachableSchedulerTimesOut) {
  int port = freePort();  // nobody listens there
  auto r = runCommand(fmt::format("CORTADO_ROLE=worker CORTADO_NUM_WORKERS=1 CORTADO_NUM_SERVERS=1 "
                                  "CORTADO_SCHEDULER_PORT={} CORTADO_JOB_TOKEN=x CORTADO_RANK=0 "
                                  "CORTADO_CONNECT_TIMEOUT_MS=2000 {}",
                                  port, kCheck),
                      30);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(r.seconds, 15);
  EXPECT_TRUE(contains(r.output, std::to_string(port))) << r.output;
}

TEST(LaunchErrors, PortInUseIsNamed) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(s, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  auto r = runCommand(fmt::format("{} launch -w 1 -s 1 --port {} -- true", kCortado, port), 30);
  close(s);
  EXPECT_NE(r.exitCode, 0);
  EXPECT_TRUE(contains(r.output, std::to_string(port))) << r.output;
}

}  // namespace
}  // namespace cortado::test
