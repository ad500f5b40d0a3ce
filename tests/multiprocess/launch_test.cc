// Multi-process tests: real jobs started through `cortado launch` on
// loopback, checked against plain summation (see pushpull_check.cc), and the
// failure cases: killed servers and workers, a wrong job token, mismatched
// declarations, bad options and missing settings. Every run has a deadline.
//
// Each job runs on both real transports (ZeroMQ and UCX, where built). With
// same-host shared memory on (CORTADO_SHM=1, the default) the transport only
// carries descriptors, so the cases marked NoShm turn it off and make the
// transport carry every byte.
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

#include "cortado/config.h"
#include "tests/multiprocess/run_command.h"

namespace cortado::test {
namespace {

const std::string kCortado = CORTADO_BIN;
const std::string kCheck = CHECK_BIN;
const std::string kCodecCheck = CODEC_CHECK_BIN;

// A data plane for a job: the transport and whether same-host shared memory
// carries the bytes.
struct Mode {
  std::string transport;
  bool shm;
  // CORTADO_UCX_DIRECT: same-host UCX shared memory (the default); off, the
  // connection manager's endpoints carry the data, as between hosts.
  bool ucxDirect = true;
  std::string env() const {
    return fmt::format("CORTADO_TRANSPORT={} CORTADO_SHM={} CORTADO_UCX_DIRECT={}", transport,
                       shm ? 1 : 0, ucxDirect ? 1 : 0);
  }
  std::string name() const {
    std::string n = transport == "ucx" ? (ucxDirect ? "Ucx" : "UcxCm") : "Zmq";
    return shm ? n : n + "NoShm";
  }
  // What pushpull_check prints when it ran on this mode.
  std::string banner() const {
    return fmt::format("transport {}, shm {}", transport, shm ? "on" : "off");
  }
};

void PrintTo(const Mode& m, std::ostream* os) { *os << m.name(); }

const Mode kZmq{"zmq", true}, kZmqNoShm{"zmq", false};
const Mode kUcx{"ucx", true}, kUcxNoShm{"ucx", false}, kUcxCmNoShm{"ucx", false, false};

// The modes a test runs on: ZeroMQ always, UCX where this build has it.
std::vector<Mode> modes(std::initializer_list<Mode> wanted) {
  std::vector<Mode> out;
  for (const auto& m : wanted) {
    if (m.transport == "ucx" && !CORTADO_UCX) continue;
    out.push_back(m);
  }
  return out;
}

std::string launchCmd(int w, int s, const std::string& args, const std::string& env = "") {
  return fmt::format("{} CORTADO_LOG_LEVEL=warn {} launch -w {} -s {} -- {} {}", env, kCortado, w, s,
                     kCheck, args);
}

struct Shape {
  int workers, servers;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << "W" << s.workers << "S" << s.servers; }

class SumsMatch : public ::testing::TestWithParam<std::tuple<Mode, Shape>> {};

TEST_P(SumsMatch, ManyTensorsAndIterations) {
  auto [mode, shape] = GetParam();
  auto [w, s] = shape;
  auto r = runCommand(launchCmd(w, s,
                                "--tensors 14 --iters 3 --max-elements 70000 --seed " +
                                    std::to_string(w * 10 + s),
                                mode.env()),
                      240);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "iterations of 14 tensors correct")) << r.output;
  EXPECT_TRUE(contains(r.output, mode.banner())) << r.output;
}

std::string sumsName(const ::testing::TestParamInfo<std::tuple<Mode, Shape>>& info) {
  auto [mode, shape] = info.param;
  return fmt::format("{}_W{}S{}", mode.name(), shape.workers, shape.servers);
}

// Every shape on each transport with shared memory; the transports carrying
// the bytes on a subset of shapes (one server, several, more than workers).
INSTANTIATE_TEST_SUITE_P(Shapes, SumsMatch,
                         ::testing::Combine(::testing::ValuesIn(modes({kZmq, kUcx})),
                                            ::testing::Values(Shape{1, 1}, Shape{1, 2},
                                                              Shape{1, 3}, Shape{2, 1},
                                                              Shape{2, 2}, Shape{2, 3},
                                                              Shape{4, 1}, Shape{4, 2},
                                                              Shape{4, 3})),
                         sumsName);
INSTANTIATE_TEST_SUITE_P(BytesOnTransport, SumsMatch,
                         ::testing::Combine(::testing::ValuesIn(modes({kZmqNoShm, kUcxNoShm,
                                                                       kUcxCmNoShm})),
                                            ::testing::Values(Shape{1, 1}, Shape{2, 3},
                                                              Shape{4, 2})),
                         sumsName);

class OnTransport : public ::testing::TestWithParam<Mode> {};
std::string modeName(const ::testing::TestParamInfo<Mode>& info) { return info.param.name(); }

class LargeJob : public OnTransport {};

TEST_P(LargeJob, TensorOf64MiB) {
  // 16 Mi float32 elements = 64 MiB, split into 4 MiB chunks over 3 servers.
  auto r = runCommand(launchCmd(2, 3, "--tensors 2 --iters 2 --big-elements 16777216",
                                GetParam().env()),
                      300);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, GetParam().banner())) << r.output;
}

TEST_P(LargeJob, SmallPartitionsAndAverage) {
  // 4 KiB chunks: most tensors become many chunks, and a 16 KiB credit bound
  // keeps few in flight.
  auto r = runCommand(launchCmd(4, 2, "--tensors 10 --iters 3 --max-elements 20000 --average",
                                GetParam().env() +
                                    " CORTADO_PARTITION_BYTES=4K CORTADO_MAX_INFLIGHT_BYTES=16K"),
                      240);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, GetParam().banner())) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Modes, LargeJob,
                         ::testing::ValuesIn(modes({kZmq, kUcx, kZmqNoShm, kUcxNoShm,
                                                    kUcxCmNoShm})),
                         modeName);

class KilledNode : public OnTransport {};

TEST_P(KilledNode, WorkerStopsEveryoneAndIsNamed) {
  auto r = runCommand(
      launchCmd(3, 2, "--tensors 4 --iters 1000 --max-elements 1000 --slow-ms 20 --die-rank 1 --die-at 5",
                GetParam().env() + " CORTADO_HEARTBEAT_TIMEOUT_MS=5000"),
      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_TRUE(contains(r.output, "worker 1")) << r.output;
}

TEST_P(KilledNode, ServerStopsEveryoneAndIsNamed) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() /
                 fmt::format("cortado-kill-{}-{}", getpid(), GetParam().name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string progress = (dir / "progress").string();
  auto job = std::async(std::launch::async, [&] {
    return runCommand(
        fmt::format("{} CORTADO_LOG_LEVEL=warn CORTADO_HEARTBEAT_TIMEOUT_MS=5000 {} launch -w 2 -s 2 "
                    "--pid-dir {} -- {} --tensors 4 --iters 100000 --max-elements 1000 --slow-ms 10 "
                    "--progress-file {}",
                    GetParam().env(), kCortado, dir.string(), kCheck, progress),
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

// With the transport carrying the bytes too, so that a pending transfer (not
// just a descriptor) meets the dead peer.
// UcxNoShm: the direct endpoints (the default) carry the data and the
// connection manager's endpoints notice the death; UcxCmNoShm: the connection
// manager's endpoints do both (as between hosts). Large transfers meeting a
// killed peer: tests/transport/killed_peer_test.cc.
INSTANTIATE_TEST_SUITE_P(Modes, KilledNode,
                         ::testing::ValuesIn(modes({kZmq, kUcx, kZmqNoShm, kUcxNoShm,
                                                    kUcxCmNoShm})),
                         modeName);

// Nothing of a job stays after a kill -9 of any of its processes: the
// launcher (which hosts the scheduler; its shared-memory reaper removes the
// segments, launcher/shm_reaper.h), a server or a worker (the launcher
// removes what they left). The job runs with same-host shared memory, so it
// has segments to leave.
struct Victim {
  std::string pidFile;  // in --pid-dir
  std::string name;
};
void PrintTo(const Victim& v, std::ostream* os) { *os << v.name; }

class KilledProcessLeavesNothing : public ::testing::TestWithParam<std::tuple<Mode, Victim>> {};

// Names in /dev/shm of the segments whose name starts with `prefix` (from
// --pid-dir's shm-prefix, "/cortado-<hash>").
std::vector<std::string> segmentsOf(const std::string& prefix) {
  std::vector<std::string> found;
  const std::string stem = prefix.substr(1) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(stem, 0) == 0) found.push_back(e.path().filename());
  return found;
}

// A process that exists and is not a zombie.
bool running(int pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

TEST_P(KilledProcessLeavesNothing, NoSegmentAndNoRoleRemain) {
  namespace fs = std::filesystem;
  const auto& [mode, victim] = GetParam();
  fs::path dir = fs::temp_directory_path() /
                 fmt::format("cortado-leave-{}-{}-{}", getpid(), mode.name(), victim.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string progress = (dir / "progress").string();
  auto job = std::async(std::launch::async, [&] {
    return runCommand(
        fmt::format("{} CORTADO_LOG_LEVEL=warn CORTADO_HEARTBEAT_TIMEOUT_MS=5000 {} launch -w 2 -s 2 "
                    "--pid-dir {} -- {} --tensors 4 --iters 100000 --max-elements 100000 "
                    "--slow-ms 10 --progress-file {}",
                    mode.env(), kCortado, dir.string(), kCheck, progress),
        90);
  });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (std::chrono::steady_clock::now() < deadline && !fs::exists(progress))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(fs::exists(progress)) << "the job never made progress";
  std::string prefix;
  std::ifstream(dir / "shm-prefix") >> prefix;
  ASSERT_EQ(prefix.rfind("/cortado-", 0), 0u) << "shm-prefix: '" << prefix << "'";
  // The job has segments to leave behind.
  ASSERT_FALSE(segmentsOf(prefix).empty()) << "the job made no shared-memory segment";
  std::vector<int> pids;
  for (const char* f : {"launcher.pid", "server.0.pid", "server.1.pid", "worker.0.pid", "worker.1.pid"}) {
    int pid = 0;
    std::ifstream(dir / f) >> pid;
    ASSERT_GT(pid, 0) << f;
    pids.push_back(pid);
  }
  int victimPid = 0;
  std::ifstream(dir / victim.pidFile) >> victimPid;
  ASSERT_GT(victimPid, 0);
  ASSERT_EQ(kill(victimPid, SIGKILL), 0);
  auto r = job.get();
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  // Every process of the job ends, and then no segment is left (the reaper
  // sweeps within about a second of the launcher's death).
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto anyRunning = [&] {
    for (int pid : pids)
      if (running(pid)) return true;
    return false;
  };
  while (std::chrono::steady_clock::now() < deadline && (anyRunning() || !segmentsOf(prefix).empty()))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int pid : pids) EXPECT_FALSE(running(pid)) << "pid " << pid << " still runs" << r.output;
  auto left = segmentsOf(prefix);
  EXPECT_TRUE(left.empty()) << left.size() << " segments left, e.g. " << left.front();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Roles, KilledProcessLeavesNothing,
    ::testing::Combine(::testing::ValuesIn(modes({kZmq, kUcx})),
                       ::testing::Values(Victim{"launcher.pid", "Launcher"},
                                         Victim{"server.1.pid", "Server"},
                                         Victim{"worker.1.pid", "Worker"})),
    [](const auto& info) {
      return std::get<0>(info.param).name() + std::get<1>(info.param).name;
    });

class LaunchFailure : public OnTransport {};

TEST_P(LaunchFailure, MismatchedDeclarationsFailEveryWorkerClearly) {
  auto r = runCommand(launchCmd(3, 1, "--tensors 3 --iters 2 --mismatch-rank 2", GetParam().env()),
                      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "t0")) << r.output;  // names the tensor
}

// A worker that leaves out a tensor the others push: the servers' stall check
// makes the scheduler name the tensor and the worker within
// CORTADO_STALL_CHECK_MS, and the others' waits fail at their deadline with
// an error that names the tensor; no hang.
TEST_P(LaunchFailure, AWorkerThatSkipsATensorIsNamedByTheStallCheck) {
  auto r = runCommand(
      launchCmd(3, 2, "--tensors 3 --iters 3 --skip-rank 1 --skip-at 1",
                GetParam().env() + " CORTADO_STALL_CHECK_MS=300 CORTADO_TIMEOUT_MS=5000"),
      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "stall: tensor 't2'")) << r.output;
  EXPECT_TRUE(contains(r.output, "round 1 has the pushes of workers 0 and 2")) << r.output;
  EXPECT_TRUE(contains(r.output, "still waits for worker 1.")) << r.output;
  // The waiting workers' errors quote the scheduler.
  EXPECT_TRUE(contains(r.output,
                       "push_pull of tensor 't2' did not complete before the deadline. The "
                       "scheduler reported: stall: tensor 't2' (chunk 0, on server"))
      << r.output;
  // And the launcher's last words repeat it after the failure they led to.
  EXPECT_TRUE(
      contains(r.output, "cortado launch: before that, the scheduler reported stall: tensor 't2'"))
      << r.output;
}

TEST_P(LaunchFailure, WrongJobTokenIsRefused) {
  // A scheduler started by hand with one token; a server with another.
  CommandResult server;
  auto s = withFreePort([&](int port) {
    std::string env = fmt::format("{} CORTADO_NUM_WORKERS=1 CORTADO_NUM_SERVERS=1 "
                                  "CORTADO_SCHEDULER_HOST=127.0.0.1 CORTADO_SCHEDULER_PORT={} "
                                  "CORTADO_CONNECT_TIMEOUT_MS=3000",
                                  GetParam().env(), port);
    auto sched = std::async(std::launch::async, [&] {
      return runCommand(fmt::format("{} CORTADO_JOB_TOKEN=right-token timeout 8 {} scheduler",
                                    env, kCortado),
                        20);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    server = runCommand(
        fmt::format("{} CORTADO_JOB_TOKEN=wrong-token CORTADO_RANK=0 {} server", env, kCortado),
        20);
    return sched.get();
  });
  ASSERT_FALSE(server.timedOut) << server.output;
  EXPECT_NE(server.exitCode, 0) << server.output;
  EXPECT_TRUE(contains(server.output, "token")) << server.output;
  EXPECT_TRUE(contains(s.output, "token")) << s.output;  // the scheduler logs the reason
}

TEST_P(LaunchFailure, UnreachableSchedulerTimesOut) {
  int port = freePort();  // nobody listens there
  auto r = runCommand(fmt::format("{} CORTADO_ROLE=worker CORTADO_NUM_WORKERS=1 "
                                  "CORTADO_NUM_SERVERS=1 CORTADO_SCHEDULER_PORT={} "
                                  "CORTADO_JOB_TOKEN=x CORTADO_RANK=0 "
                                  "CORTADO_CONNECT_TIMEOUT_MS=2000 {}",
                                  GetParam().env(), port, kCheck),
                      30);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(r.seconds, 15);
  EXPECT_TRUE(contains(r.output, std::to_string(port))) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Modes, LaunchFailure, ::testing::ValuesIn(modes({kZmq, kUcx})), modeName);

TEST(TransportSelection, FlagReachesEveryRole) {
  // --transport on the command line beats CORTADO_TRANSPORT in the environment.
  const std::string want = CORTADO_UCX ? "ucx" : "zmq";
  auto r = runCommand(fmt::format("CORTADO_LOG_LEVEL=warn CORTADO_TRANSPORT=bogus-is-overridden "
                                  "CORTADO_SHM=0 {} launch -w 2 -s 2 --transport {} -- {} "
                                  "--tensors 3 --iters 2",
                                  kCortado, want, kCheck),
                      120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "transport " + want + ", shm off")) << r.output;
}

TEST(TransportSelection, AutoPicksUcxWhereItWorks) {
  auto r = runCommand(fmt::format("CORTADO_LOG_LEVEL=info {} launch -w 2 -s 1 --transport auto -- "
                                  "{} --tensors 3 --iters 2",
                                  kCortado, kCheck),
                      120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  const std::string want = CORTADO_UCX ? "ucx" : "zmq";
  EXPECT_TRUE(contains(r.output, "transport auto: using " + want)) << r.output;  // logged, with why
  EXPECT_TRUE(contains(r.output, "transport " + want + ", shm on")) << r.output;
}

TEST(TransportSelection, AutoFallsBackToZmqWhenUcxCannotStartAndSaysWhy) {
  auto r = runCommand(fmt::format("UCX_TLS=bogus CORTADO_LOG_LEVEL=warn {} launch -w 2 -s 1 "
                                  "--transport auto -- {} --tensors 3 --iters 2",
                                  kCortado, kCheck),
                      120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "transport zmq, shm on")) << r.output;
  if (CORTADO_UCX) {
    EXPECT_TRUE(contains(r.output, "transport auto: using zmq")) << r.output;
    EXPECT_TRUE(contains(r.output, "UCX_TLS=bogus")) << r.output;
  }
}

TEST(TransportSelection, ExplicitUcxThatCannotStartIsAClearError) {
  // Not built, or built and failing to initialize: either way the message
  // says so and names the UCX_* settings in force.
  auto r = runCommand(fmt::format("UCX_TLS=bogus CORTADO_LOG_LEVEL=warn {} launch -w 1 -s 1 "
                                  "--transport ucx -- {} --tensors 1 --iters 1",
                                  kCortado, kCheck),
                      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "transport ucx was asked for")) << r.output;
  EXPECT_TRUE(contains(r.output, "UCX_TLS=bogus")) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

TEST(TransportSelection, ExplicitUcxInARoleStartedByHandIsAClearError) {
  // The same check where a role builds its own transport (no launcher).
  auto r = runCommand(fmt::format("UCX_TLS=bogus CORTADO_TRANSPORT=ucx CORTADO_ROLE=worker "
                                  "CORTADO_NUM_WORKERS=1 CORTADO_NUM_SERVERS=1 "
                                  "CORTADO_SCHEDULER_PORT={} CORTADO_JOB_TOKEN=x CORTADO_RANK=0 "
                                  "CORTADO_CONNECT_TIMEOUT_MS=2000 {}",
                                  freePort(), kCheck),
                      30);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "transport ucx was asked for")) << r.output;
  EXPECT_TRUE(contains(r.output, "UCX_TLS=bogus")) << r.output;
}

TEST(TransportSelection, UnknownTransportIsNamed) {
  auto env = runCommand(fmt::format("CORTADO_TRANSPORT=carrier-pigeon {} launch -w 1 -s 1 -- true",
                                    kCortado),
                        30);
  EXPECT_NE(env.exitCode, 0);
  EXPECT_TRUE(contains(env.output, "CORTADO_TRANSPORT 'carrier-pigeon'")) << env.output;
  auto flag = runCommand(kCortado + " launch -w 1 -s 1 --transport carrier-pigeon -- true", 30);
  EXPECT_NE(flag.exitCode, 0);
  EXPECT_TRUE(contains(flag.output, "carrier-pigeon")) << flag.output;
  EXPECT_TRUE(contains(flag.output, "--transport")) << flag.output;
}

TEST(TransportSelection, NodesOnDifferentTransportsFailNamingTheMismatch) {
  if (!CORTADO_UCX) GTEST_SKIP() << "this build has one real transport only";
  // Roles started by hand: the scheduler and the server on ZeroMQ, the worker
  // on UCX.
  CommandResult worker, srv;
  withFreePort([&](int port) {
    std::string env = fmt::format("CORTADO_LOG_LEVEL=warn CORTADO_NUM_WORKERS=1 "
                                  "CORTADO_NUM_SERVERS=1 CORTADO_SCHEDULER_PORT={} "
                                  "CORTADO_JOB_TOKEN=t CORTADO_CONNECT_TIMEOUT_MS=5000 "
                                  "CORTADO_HEARTBEAT_TIMEOUT_MS=3000",
                                  port);
    auto sched = std::async(std::launch::async, [&] {
      return runCommand(fmt::format("{} timeout 20 {} scheduler", env, kCortado), 30);
    });
    auto server = std::async(std::launch::async, [&] {
      return runCommand(
          fmt::format("{} CORTADO_TRANSPORT=zmq CORTADO_RANK=0 timeout 20 {} server", env,
                      kCortado),
          30);
    });
    worker = runCommand(fmt::format("{} CORTADO_TRANSPORT=ucx CORTADO_ROLE=worker "
                                    "CORTADO_RANK=0 timeout 20 {} --tensors 1 --iters 1",
                                    env, kCheck),
                        30);
    srv = server.get();
    return sched.get();
  });
  ASSERT_FALSE(worker.timedOut) << worker.output;
  EXPECT_NE(worker.exitCode, 0) << worker.output;
  EXPECT_TRUE(contains(worker.output + srv.output, "must use the same transport"))
      << worker.output << srv.output;
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

class Compression : public OnTransport {};

TEST_P(Compression, TopKWithErrorFeedbackConvergesOverManyRounds) {
  // 4 workers, 2 servers, 16 KiB chunks (so tensors span several chunks and
  // both servers), 300 rounds; every round is checked against a brute-force
  // replay and the running sums against the error-feedback bound.
  auto r = runCommand(codecCmd(4, 2, "--mode topk --ratio 0.05 --tensors 3 --iters 300 "
                                     "--max-elements 20000",
                               GetParam().env() + " CORTADO_PARTITION_BYTES=16K"),
                      300);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(count(r.output, "top-k tensors match the reference"), 4u) << r.output;
}

TEST_P(Compression, TopKAverageOnOneServer) {
  auto r = runCommand(codecCmd(3, 1, "--mode topk --ratio 0.01 --tensors 2 --iters 30 "
                                     "--max-elements 50000 --average",
                               GetParam().env()),
                      200);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(count(r.output, "top-k tensors match the reference"), 3u) << r.output;
}

TEST_P(Compression, Fp16MatchesTheReferenceBitForBit) {
  auto r = runCommand(codecCmd(4, 2, "--mode fp16 --tensors 4 --iters 5 --max-elements 100000",
                               GetParam().env()),
                      200);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(count(r.output, "fp16 tensors match the reference"), 4u) << r.output;
  auto a = runCommand(codecCmd(2, 3, "--mode fp16 --tensors 3 --iters 3 --average", GetParam().env()),
                      200);
  ASSERT_FALSE(a.timedOut) << a.output;
  EXPECT_EQ(a.exitCode, 0) << a.output;
}

TEST_P(Compression, MismatchedCodecFailsEveryWorkerClearly) {
  auto r = runCommand(codecCmd(3, 1, "--mode topk --ratio 0.01 --iters 2 --mismatch-rank 2",
                               GetParam().env()),
                      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_NE(r.exitCode, 0) << r.output;
  // Every worker's declare fails with the scheduler's verdict, which names the
  // tensor, the field and what each worker declared.
  EXPECT_EQ(count(r.output, "worker: error:"), 3u) << r.output;
  EXPECT_TRUE(contains(r.output, "declaration mismatch for tensor 'g0' (codec differs)")) << r.output;
  EXPECT_TRUE(contains(r.output, "worker 2 declared float32")) << r.output;
  EXPECT_TRUE(contains(r.output, "'topk:ratio=0.02'")) << r.output;
}

TEST_P(Compression, BenchRunsWithACodec) {
  auto r = runCommand(kCortado + " bench pushpull -w 2 -s 1 -b 64K -e 256K -n 3 --codec fp16 " +
                          "--transport " + GetParam().transport,
                      120);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "codec fp16")) << r.output;
  EXPECT_FALSE(contains(r.output, "WRONG")) << r.output;
  auto bad = runCommand(kCortado + " bench pushpull -w 1 -s 1 -b 4K -e 4K -n 1 --codec topk:ratio=7",
                        60);
  EXPECT_NE(bad.exitCode, 0) << bad.output;
  EXPECT_TRUE(contains(bad.output, "ratio")) << bad.output;
}

INSTANTIATE_TEST_SUITE_P(Modes, Compression, ::testing::ValuesIn(modes({kZmq, kUcx})), modeName);

// The benchmark's memory report (CORTADO_REPORT_MEMORY, which it sets): a
// line per server and per worker, with the bytes of what they hold counted
// from the sizes the benchmark declared, and the shared memory a node
// created (1 server owns every key: with shared memory on, its two result
// regions per key, at least 2x the keys).
TEST_P(OnTransport, BenchPushPullReportsEachRolesMemory) {
  const Mode& mode = GetParam();
  auto r =
      runCommand(fmt::format("{} {} bench pushpull -w 2 -s 1 -b 256K -e 1M -n 2 --transport {}",
                             mode.env(), kCortado, mode.transport),
                 120);
  ASSERT_FALSE(r.timedOut) << r.output;
  ASSERT_EQ(r.exitCode, 0) << r.output;
  // 256K + 512K + 1M declared, plus the 4-byte check tensor on the server.
  const double mib = (256 + 512 + 1024) / 1024.0;
  EXPECT_TRUE(contains(r.output, fmt::format("memory: worker 0: gradients {:.1f} MiB;", mib)))
      << r.output;
  EXPECT_TRUE(contains(r.output, fmt::format("memory: worker 1: gradients {:.1f} MiB;", mib)))
      << r.output;
  EXPECT_TRUE(contains(r.output, fmt::format("memory: server 0: keys {:.1f} MiB;", mib)))
      << r.output;
  const std::string ownSegments =
      mode.shm ? "MiB of its own shared-memory segments" : "0.0 MiB of its own";
  EXPECT_TRUE(contains(r.output, ownSegments)) << r.output;
  auto pos = r.output.find("memory: server 0:");
  ASSERT_NE(pos, std::string::npos);
  auto line = r.output.substr(pos, r.output.find('\n', pos) - pos);
  auto x = line.find("x the keys");
  ASSERT_NE(x, std::string::npos) << line;
  const double ratio = std::stod(line.substr(line.rfind(' ', x - 1) + 1));
  if (mode.shm) {
    EXPECT_GE(ratio, 2.0) << line;  // the two result regions per key
  }
  EXPECT_LT(ratio, 50.0) << line;
}

INSTANTIATE_TEST_SUITE_P(Modes, OnTransport,
                         ::testing::ValuesIn(modes({kZmq, kZmqNoShm, kUcx})), modeName);

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

// Worker 0 fails before it registers; worker 1 never registers (a program
// that never reaches Cortado) and would wait forever: it cannot hear the
// job's end from the scheduler, so the launcher stops it at once instead of
// after its 10 s grace, and says why. The failure reported stays worker 0's.
TEST(LaunchErrors, RolesThatNeverRegisteredAreStoppedAtOnceWhenTheJobFails) {
  auto r = runCommand(fmt::format("CORTADO_LOG_LEVEL=warn {} launch -w 2 -s 1 -- sh -c "
                                  "'if [ \"$CORTADO_RANK\" = 0 ]; then sleep 0.3; exit 3; fi; "
                                  "exec sleep 120'",
                                  kCortado),
                      60);
  ASSERT_FALSE(r.timedOut) << r.output;
  EXPECT_EQ(r.exitCode, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "job failed: worker 0")) << r.output;
  EXPECT_TRUE(contains(r.output, "exit status 3")) << r.output;
  EXPECT_TRUE(contains(r.output, "never registered with the scheduler")) << r.output;
  EXPECT_TRUE(contains(r.output, "worker 1 (pid")) << r.output;
  EXPECT_FALSE(contains(r.output, "after the failure: sending SIGTERM")) << r.output;  // no grace
  EXPECT_LT(r.seconds, 30) << r.output;
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
