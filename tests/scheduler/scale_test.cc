// The control plane at cluster scale, in one process: a scheduler and 512
// real ControlClients (each with its own connection and io thread, as 512
// processes would have) register, exchange heartbeats at the default
// settings, and when one of them goes silent every other node is told within
// 30 s (the default heartbeat timeout is 10 s). The figures it prints
// (registration time, detection time) are for the reader, not asserted
// beyond the 30 s bound: speed is the benchmarks' business.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "tests/scheduler/test_util.h"

namespace cortado::testing {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kServers = 64;
constexpr int kWorkers = 448;

TEST(ControlPlaneScale, FiveHundredTwelveNodesRegisterAndADeadOneIsReportedToEveryone) {
  LogCapture log;
  auto so = schedulerOptions(kWorkers, kServers);
  const scheduler::SchedulerOptions defaults;
  so.heartbeatTimeout = defaults.heartbeatTimeout;  // the settings a job runs with
  so.registrationTimeout = Millis(120000);
  SchedulerRunner sched(so);
  auto opts = jobOptions(sched.port(), kWorkers, kServers);
  const size_t silent = opts.size() - 1;  // the last worker
  opts[silent].heartbeatInterval = Millis(3600 * 1000);
  opts[silent].hostname = "silent-host";
  for (auto& o : opts) o.connectTimeout = Millis(120000);

  const auto start = Clock::now();
  auto nodes = connectAll(opts, Millis(120000));
  const auto registered = Clock::now();
  ASSERT_EQ(nodes.size(), size_t(kWorkers + kServers));
  // Every node has the whole address book, the same one.
  for (const auto& n : nodes) {
    ASSERT_EQ(n.book.servers.size(), size_t(kServers));
    ASSERT_EQ(n.book.workers.size(), size_t(kWorkers));
    EXPECT_EQ(n.book.workers.back().dataAddress, nodes[0].book.workers.back().dataAddress);
  }
  const NodeId silentId = nodes[silent].client->self();

  // Every other node hears that the silent one is dead, naming it.
  std::vector<double> toldAfter;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == silent) continue;
    auto left = std::chrono::duration_cast<Millis>(registered + 30s - Clock::now());
    auto st = nodes[i].probe->waitFor(std::max(left, Millis(1)));
    ASSERT_TRUE(st.has_value()) << nodes[i].client->self().toString()
                                << " was not told of the dead node within 30 s";
    EXPECT_EQ(st->code(), ErrorCode::kPeerDead) << st->message();
    EXPECT_NE(st->message().find(silentId.toString()), std::string::npos) << st->message();
    EXPECT_NE(st->message().find("silent-host"), std::string::npos) << st->message();
    toldAfter.push_back(std::chrono::duration<double>(Clock::now() - registered).count());
  }
  const double last = *std::max_element(toldAfter.begin(), toldAfter.end());
  EXPECT_LT(last, 30.0);
  std::printf(
      "[ scale    ] %d nodes registered in %.2f s; every other node told of the silent "
      "one %.2f s after registration (heartbeat timeout %lld ms)\n",
      kWorkers + kServers, std::chrono::duration<double>(registered - start).count(), last,
      static_cast<long long>(so.heartbeatTimeout.count()));
  auto st = sched.result(10s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
}

}  // namespace
}  // namespace cortado::testing
