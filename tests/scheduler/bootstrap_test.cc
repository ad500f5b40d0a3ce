// The job-side bootstrap helpers of core/backends that NCCL needs when there
// is no MPI: the topology of the workers from the hostnames they registered
// with, and the unique-id exchange through the scheduler's key-value
// rendezvous, checked with real control clients against a real scheduler.
#include <gtest/gtest.h>

#include <thread>

#include "core/backends.h"
#include "tests/scheduler/test_util.h"

namespace cortado::testing {
namespace {

using namespace std::chrono_literals;

control::AddressBook bookOf(const std::vector<std::string>& hosts) {
  control::AddressBook book;
  for (size_t r = 0; r < hosts.size(); ++r) {
    NodeInfo n;
    n.id = NodeId{Role::kWorker, static_cast<int>(r)};
    n.hostname = hosts[r];
    book.workers.push_back(n);
  }
  return book;
}

TEST(Bootstrap, TopologyFollowsTheRegisteredHostnames) {
  // Interleaved ranks: machines are numbered by their lowest rank, local
  // ranks follow the world ranks within a machine. The reference is counted
  // here by brute force over the list.
  const std::vector<std::string> hosts = {"b", "a", "b", "c", "a", "b"};
  auto book = bookOf(hosts);
  const std::vector<int> machineOf = {0, 1, 0, 2, 1, 0};
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    auto t = workerTopology(book, r);
    int local = 0, localSize = 0;
    for (int q = 0; q < static_cast<int>(hosts.size()); ++q) {
      if (hosts[q] != hosts[r]) continue;
      localSize++;
      if (q < r) local++;
    }
    EXPECT_EQ(t.rank, r);
    EXPECT_EQ(t.size, 6);
    EXPECT_EQ(t.numMachines, 3);
    EXPECT_EQ(t.machine, machineOf[r]) << "rank " << r;
    EXPECT_EQ(t.localRank, local) << "rank " << r;
    EXPECT_EQ(t.localSize, localSize) << "rank " << r;
  }
  auto one = workerTopology(bookOf({"solo"}), 0);
  EXPECT_EQ(one.numMachines, 1);
  EXPECT_EQ(one.localSize, 1);
  try {
    workerTopology(book, 6);
    FAIL() << "rank 6 of 6 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("6 workers"), std::string::npos) << e.what();
  }
}

TEST(Bootstrap, UniqueIdReachesEveryRankThroughTheScheduler) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(4, 1));
  std::vector<control::ClientOptions> opts = {clientOptions(sched.port(), Role::kServer)};
  for (int w = 0; w < 4; ++w) opts.push_back(clientOptions(sched.port(), Role::kWorker, w));
  auto nodes = connectAll(opts);
  // An id of NCCL's size with every byte value that matters (zeros included).
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(255 - i);
  std::vector<std::string> got(4);
  std::vector<std::thread> ts;
  for (int w = 0; w < 4; ++w) {
    ts.emplace_back([&, w] {
      auto exchange = schedulerIdExchange(*nodes[1 + w].client);
      if (w == 3) std::this_thread::sleep_for(50ms);  // the others arrive late too
      if (w == 0) std::this_thread::sleep_for(150ms);  // rank 0 brings the id last
      got[w] = exchange("world", w == 0 ? id : std::string(), Deadline::after(5s));
    });
  }
  for (auto& t : ts) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(got[w], id) << "rank " << w;
  // A second communicator uses another key; one that rank 0 never brings
  // times out, naming it.
  auto exchange = schedulerIdExchange(*nodes[2].client);
  try {
    exchange("intra-1", "", Deadline::after(200ms));
    FAIL() << "a get of a key that nobody put returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("'nccl/intra-1'"), std::string::npos) << e.what();
  }
  for (auto& n : nodes)
    if (n.client->self().role == Role::kWorker) n.client->finish();
  for (auto& n : nodes) EXPECT_TRUE(n.client->waitShutdown(Deadline::after(5s)));
}

}  // namespace
}  // namespace cortado::testing
