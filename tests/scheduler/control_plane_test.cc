// Multi-node control-plane tests in one process: a Scheduler on its own
// thread, each ControlClient connecting on its own thread, all over loopback.
// The job's normal flow; its failures are in control_plane_failure_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/partition.h"
#include "core/plan/plan.h"
#include "core/plan/profile_report.h"
#include "tests/scheduler/test_util.h"

namespace cortado::testing {
namespace {

using control::ControlClient;
using control::Group;
using control::TensorDecl;
using namespace std::chrono_literals;

TEST(ControlPlane, RegistersRanksAndSendsTheAddressBook) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(4, 3));
  auto opts = jobOptions(sched.port(), 4, 3);
  opts[3 + 1].requestedRank = 3;  // one worker asks for rank 3, the rest take arrival order
  opts[0].requestedRank = 2;      // one server asks for rank 2
  auto nodes = connectAll(opts);

  std::set<NodeId> ids;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    NodeId me = n.client->self();
    ids.insert(me);
    EXPECT_EQ(me.role, opts[i].role);
    ASSERT_EQ(n.book.servers.size(), 3u);
    ASSERT_EQ(n.book.workers.size(), 4u);
    const auto& mine = me.role == Role::kServer ? n.book.servers : n.book.workers;
    ASSERT_GE(me.rank, 0);
    EXPECT_EQ(mine[me.rank].dataAddress, opts[i].dataAddress) << me.toString();
    EXPECT_EQ(mine[me.rank].id, me);
    // Every node got the same book.
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(n.book.servers[r].dataAddress, nodes[0].book.servers[r].dataAddress);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(n.book.workers[r].dataAddress, nodes[0].book.workers[r].dataAddress);
  }
  EXPECT_EQ(ids.size(), 7u);
  EXPECT_EQ(nodes[4].client->self(), (NodeId{Role::kWorker, 3}));
  EXPECT_EQ(nodes[0].client->self(), (NodeId{Role::kServer, 2}));
  finishJob(nodes, sched);
}

TEST(ControlPlane, DuplicateAndOutOfRangeRanksAreRefused) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(2, 1));
  auto first = clientOptions(sched.port(), Role::kWorker, 0);
  auto firstClient = ControlClient::create(first);
  auto firstUp = std::async(std::launch::async,
                            [&] { return firstClient->connect(Deadline::after(10s)); });
  ASSERT_TRUE(log.waitFor({"registered worker", "as rank 0"}, 5s)) << log.all();

  std::string msg;
  auto dup = ControlClient::create(clientOptions(sched.port(), Role::kWorker, 0));
  auto start = Clock::now();
  EXPECT_EQ(codeOf([&] { dup->connect(Deadline::after(10s)); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_LT(Clock::now() - start, 3s) << "a refusal must not be retried until the deadline";
  EXPECT_NE(msg.find("worker rank 0 is already taken"), std::string::npos) << msg;

  auto far = ControlClient::create(clientOptions(sched.port(), Role::kWorker, 5));
  EXPECT_EQ(codeOf([&] { far->connect(Deadline::after(10s)); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("rank 5 is out of range"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 workers"), std::string::npos) << msg;

  // The job still completes with valid nodes.
  auto rest = connectAll({clientOptions(sched.port(), Role::kWorker, 1),
                          clientOptions(sched.port(), Role::kServer)});
  Connected c0{std::make_shared<FailureProbe>(), std::move(firstClient), firstUp.get()};
  EXPECT_EQ(c0.client->self(), (NodeId{Role::kWorker, 0}));
  rest.push_back(std::move(c0));
  finishJob(rest, sched);
}

TEST(ControlPlane, BarriersWaitForTheWholeGroup) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(3, 2));
  auto nodes = connectAll(jobOptions(sched.port(), 3, 2));
  std::atomic<int64_t> lastEnter{0}, firstExit{INT64_MAX};
  auto stamp = [] { return Clock::now().time_since_epoch().count(); };
  std::vector<std::thread> ts;
  for (size_t i = 0; i < nodes.size(); ++i) {
    ts.emplace_back([&, i] {
      auto& c = *nodes[i].client;
      std::this_thread::sleep_for(Millis(30 * i));
      int64_t in = stamp();
      int64_t prev = lastEnter.load();
      while (in > prev && !lastEnter.compare_exchange_weak(prev, in)) {}
      c.barrier(Group::kAll, "everyone", Deadline::after(5s));
      int64_t out = stamp();
      prev = firstExit.load();
      while (out < prev && !firstExit.compare_exchange_weak(prev, out)) {}
      Group mine = c.self().role == Role::kWorker ? Group::kWorkers : Group::kServers;
      c.barrier(mine, "by-role", Deadline::after(5s));
      c.barrier(Group::kAll, "again", Deadline::after(5s));
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_GE(firstExit.load(), lastEnter.load()) << "a node left the barrier before the last entered";

  // A server is no member of the workers' group; a barrier that cannot
  // complete times out with a message naming it.
  std::string msg;
  auto& server = *nodes[0].client;
  ASSERT_EQ(server.self().role, Role::kServer);
  EXPECT_EQ(codeOf([&] { server.barrier(Group::kWorkers, "w", Deadline::after(2s)); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("not a member"), std::string::npos) << msg;
  auto start = Clock::now();
  EXPECT_EQ(codeOf([&] { server.barrier(Group::kServers, "lonely", Deadline::after(300ms)); },
                   &msg),
            ErrorCode::kTimeout);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_NE(msg.find("barrier 'lonely'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("127.0.0.1:{}", sched.port())), std::string::npos) << msg;
  finishJob(nodes, sched);
}

TEST(ControlPlane, KeyValueRendezvousHandsOnePutToEveryGet) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(3, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 3, 1));
  // Any bytes, as NCCL's unique id is: zeros, high bytes, not UTF-8.
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>((i * 37 + 200) & 0xff);

  // Gets that arrive before the put wait for it (workers 1 and 2, and the
  // server); worker 0 puts after a pause.
  std::vector<std::string> got(nodes.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == 1) continue;  // worker 0 (nodes[0] is the server)
    ts.emplace_back([&, i] { got[i] = nodes[i].client->get("nccl/world", Deadline::after(5s)); });
  }
  std::this_thread::sleep_for(100ms);
  nodes[1].client->put("nccl/world", id, Deadline::after(5s));
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == 1) continue;
    EXPECT_EQ(got[i], id) << "node " << i;
  }
  // A get after the put is answered at once; an empty value is a value.
  EXPECT_EQ(nodes[2].client->get("nccl/world", Deadline::after(2s)), id);
  nodes[2].client->put("empty", "", Deadline::after(2s));
  EXPECT_EQ(nodes[3].client->get("empty", Deadline::after(2s)), "");

  // Putting the same value again is fine; another value is refused, naming
  // the key, and the job goes on.
  nodes[3].client->put("nccl/world", id, Deadline::after(2s));
  std::string msg;
  EXPECT_EQ(codeOf([&] { nodes[3].client->put("nccl/world", "other", Deadline::after(2s)); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("'nccl/world'"), std::string::npos) << msg;

  // A key nobody puts times out at the caller's deadline, naming the key.
  auto start = Clock::now();
  EXPECT_EQ(codeOf([&] { nodes[2].client->get("never", Deadline::after(300ms)); }, &msg),
            ErrorCode::kTimeout);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_NE(msg.find("'never'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no node has put"), std::string::npos) << msg;
  // ... and a put that comes after the caller left answers nobody, harmlessly.
  nodes[1].client->put("never", "late", Deadline::after(2s));
  EXPECT_EQ(nodes[2].client->get("never", Deadline::after(2s)), "late");

  // Bad keys and oversized values are refused before anything is sent.
  EXPECT_EQ(codeOf([&] { nodes[1].client->put("", "x", Deadline::after(1s)); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(codeOf([&] { nodes[1].client->get(std::string(control::kMaxKvKey + 1, 'k'), Deadline::after(1s)); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(codeOf([&] {
              nodes[1].client->put("big", std::string(control::kMaxKvValue + 1, 'v'), Deadline::after(1s));
            }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("'big'"), std::string::npos) << msg;
  for (auto& n : nodes) EXPECT_TRUE(n.client->failure().ok()) << n.client->failure().message();
  finishJob(nodes, sched);
}

// Online re-planning's exchange: every report is acknowledged with the
// iteration a plan from its window would take effect at, and every window
// every worker reported gets a verdict: the plan, or "the plan stays" (no
// plan, a failed re-plan, a plan for the wrong iteration). A window never
// reported times out at the caller's deadline, naming it.
TEST(ControlPlane, EveryReportedWindowGetsAVerdict) {
  LogCapture log;
  auto so = schedulerOptions(2, 1);
  so.replanAhead = 3;
  std::atomic<int> calls{0};
  so.replanner = [&](const std::vector<plan::ProfileReport>& reports)
      -> std::optional<control::PlanUpdate> {
    ++calls;
    EXPECT_EQ(reports.size(), 2u);
    const uint64_t w = reports.front().window, end = reports.front().endIteration;
    if (w == 1) return std::nullopt;
    if (w == 2) throw Error(ErrorCode::kInvalidArgument, "no fit");
    plan::Plan p;
    p.version = w + 1;
    plan::TensorOption o;  // BytePS's default: H: i.rs x.push x.pull i.ag
    o.hierarchical = true;
    o.steps = {plan::Step::comm(plan::Scope::kIntra, plan::CommOp::kReduceScatter, false),
               plan::Step::comm(plan::Scope::kInter, plan::CommOp::kPush, false),
               plan::Step::comm(plan::Scope::kInter, plan::CommOp::kPull, false),
               plan::Step::comm(plan::Scope::kIntra, plan::CommOp::kAllgather, false)};
    p.tensors["t"] = o;
    control::PlanUpdate u;
    u.version = p.version;
    u.switchAt = w == 3 ? end + 1 : end + 3;  // window 3: not the acknowledged iteration
    u.planJson = plan::toJsonString(p);
    return u;
  };
  SchedulerRunner sched(std::move(so));
  auto nodes = connectAll(jobOptions(sched.port(), 2, 1));
  auto report = [](int rank, uint64_t window) {
    plan::ProfileReport r;
    r.rank = rank;
    r.machines = 2;
    r.window = window;
    r.firstIteration = 1 + 2 * window;
    r.endIteration = 3 + 2 * window;
    r.ready.push_back({"t", 16, 10.0});
    return plan::toJsonString(r);
  };
  for (uint64_t w = 0; w < 4; ++w)
    for (int i = 1; i <= 2; ++i)  // nodes[0] is the server
      EXPECT_EQ(nodes[i].client->sendProfile(report(nodes[i].client->self().rank, w),
                                             Deadline::after(5s)),
                3 + 2 * w + 3);
  for (int i = 1; i <= 2; ++i) {
    auto& c = *nodes[i].client;
    control::PlanUpdate u0 = c.waitVerdict(0, Deadline::after(5s));
    EXPECT_EQ(u0.window, 0u);
    EXPECT_EQ(u0.version, 1u);
    EXPECT_EQ(u0.switchAt, 6u);
    EXPECT_EQ(plan::planFromJsonString(u0.planJson).tensors.count("t"), 1u);
    for (uint64_t w = 1; w < 4; ++w) {
      control::PlanUpdate u = c.waitVerdict(w, Deadline::after(5s));
      EXPECT_EQ(u.window, w);
      EXPECT_EQ(u.version, 0u) << "window " << w;
      EXPECT_TRUE(u.planJson.empty());
    }
    std::string msg;
    auto start = Clock::now();
    EXPECT_EQ(codeOf([&] { c.waitVerdict(9, Deadline::after(300ms)); }, &msg), ErrorCode::kTimeout);
    EXPECT_LT(Clock::now() - start, 2s);
    EXPECT_NE(msg.find("window 9"), std::string::npos) << msg;
  }
  EXPECT_EQ(calls.load(), 4);
  EXPECT_TRUE(log.contains("no fit")) << log.all();
  EXPECT_TRUE(log.contains("not at 12")) << log.all();
  finishJob(nodes, sched);
}

// A decision runs off the scheduler's io thread: while the replanner works
// on window 0, reports are acknowledged and the key-value store answers
// (before, the io thread ran the search, and every message waited for it).
// The replanner returns only once a put and a get made during its run were
// answered (or after 10 s, and the test fails).
TEST(ControlPlane, TheControlPlaneIsServedWhileADecisionRuns) {
  auto so = schedulerOptions(2, 1);
  so.replanAhead = 3;
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, served = false, sawServed = false;
  so.replanner = [&](const std::vector<plan::ProfileReport>&) -> std::optional<control::PlanUpdate> {
    std::unique_lock g(mu);
    entered = true;
    cv.notify_all();
    sawServed = cv.wait_for(g, 10s, [&] { return served; });
    return std::nullopt;
  };
  SchedulerRunner sched(std::move(so));
  auto nodes = connectAll(jobOptions(sched.port(), 2, 1));
  plan::ProfileReport r;
  r.machines = 2;
  r.firstIteration = 1;
  r.endIteration = 3;
  r.ready.push_back({"t", 16, 10.0});
  for (int i = 1; i <= 2; ++i) {
    r.rank = nodes[i].client->self().rank;
    EXPECT_EQ(nodes[i].client->sendProfile(plan::toJsonString(r), Deadline::after(5s)), 6u);
  }
  {
    std::unique_lock g(mu);
    ASSERT_TRUE(cv.wait_for(g, 5s, [&] { return entered; })) << "the replanner was not called";
  }
  nodes[1].client->put("during", "the decision", Deadline::after(5s));
  EXPECT_EQ(nodes[2].client->get("during", Deadline::after(5s)), "the decision");
  {
    std::lock_guard g(mu);
    served = true;
  }
  cv.notify_all();
  for (int i = 1; i <= 2; ++i) {
    control::PlanUpdate u = nodes[i].client->waitVerdict(0, Deadline::after(15s));
    EXPECT_EQ(u.window, 0u);
    EXPECT_EQ(u.version, 0u);
  }
  {
    std::lock_guard g(mu);
    EXPECT_TRUE(sawServed) << "the replanner waited 10 s for a put and a get that did not come";
  }
  finishJob(nodes, sched);
}

// Without a replanner the scheduler acknowledges reports with 0: no verdict
// comes, and the workers do not wait for one.
TEST(ControlPlane, ReportsWithoutAReplannerAreAcknowledgedWithNoSwitch) {
  SchedulerRunner sched(schedulerOptions(1, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 1, 1));
  plan::ProfileReport r;
  r.endIteration = 3;
  r.ready.push_back({"t", 16, 10.0});
  EXPECT_EQ(nodes[1].client->sendProfile(plan::toJsonString(r), Deadline::after(5s)), 0u);
  finishJob(nodes, sched);
}

TEST(ControlPlane, DeclarationsAgreeOnOneKeyPerTensor) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(3, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 3, 1));
  const std::vector<TensorDecl> decls = {{"conv1.weight", DType::kFloat32, 1000, ""},
                                         {"fc.bias", DType::kFloat16, 10, "fp16"},
                                         {"embedding", DType::kBFloat16, 1 << 20, "topk:ratio=0.01"}};
  std::vector<std::vector<uint64_t>> keys(nodes.size());
  std::vector<std::thread> ts;
  for (size_t i = 1; i < nodes.size(); ++i) {
    ts.emplace_back([&, i] {
      for (const auto& d : decls) keys[i].push_back(nodes[i].client->declare(d, Deadline::after(5s)));
    });
  }
  for (auto& t : ts) t.join();
  for (size_t i = 2; i < nodes.size(); ++i) EXPECT_EQ(keys[i], keys[1]);
  // Keys follow worker 0's declaration order.
  EXPECT_EQ(keys[1], (std::vector<uint64_t>{0, 1, 2}));

  // Declaring again the same way is answered with the same key at once.
  auto& w = *nodes[1].client;
  EXPECT_EQ(w.declare(decls[1], Deadline::after(2s)), keys[1][1]);
  // Declaring again with another size is refused, naming both.
  std::string msg;
  TensorDecl bigger = decls[0];
  bigger.numElements = 2000;
  EXPECT_EQ(codeOf([&] { w.declare(bigger, Deadline::after(2s)); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("'conv1.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2000"), std::string::npos) << msg;
  // ... and the job goes on.
  EXPECT_TRUE(w.failure().ok());
  EXPECT_EQ(codeOf([&] { nodes[0].client->declare(decls[0], Deadline::after(1s)); }),
            ErrorCode::kInvalidArgument);  // servers do not declare
  finishJob(nodes, sched);
}

// ControlClient::reportStall: a server's stalled round is logged by the
// scheduler with the tensor's declared name (from the chunk key), the chunk,
// the workers that pushed and the ones the round waits for.
TEST(ControlPlane, AServersStallReportIsLoggedNamingTheTensorAndTheMissingWorkers) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(3, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 3, 1));
  const std::vector<TensorDecl> decls = {{"conv1.weight", DType::kFloat32, 1000, ""},
                                         {"fc.weight", DType::kFloat32, 5000000, ""}};
  std::vector<std::thread> ts;
  for (size_t i = 1; i < nodes.size(); ++i)
    ts.emplace_back([&, i] {
      for (const auto& d : decls) nodes[i].client->declare(d, Deadline::after(5s));
    });
  for (auto& t : ts) t.join();
  auto& server = *nodes[0].client;
  StallReport r;
  r.key = chunkKey(1, 2);  // fc.weight's third chunk
  r.round = 7;
  r.pushed = {0, 2};
  r.expected = 3;
  r.waitedMs = 61500;
  server.reportStall(r);
  EXPECT_TRUE(log.waitFor({"stall: tensor 'fc.weight' (chunk 2, on server 0)",
                           "round 7 has the pushes of workers 0 and 2 for 61.5 s",
                           "still waits for worker 1.", "CORTADO_TIMEOUT_MS"},
                          5000ms))
      << log.all();
  // Every worker hears it (ControlClient::stallNotes), for that round only.
  for (size_t i = 1; i < nodes.size(); ++i) {
    auto notes = nodes[i].client->stallNotes();
    std::optional<std::string> note;
    for (int tries = 0; tries < 500 && !(note = notes->find(1, 7)); ++tries)
      std::this_thread::sleep_for(10ms);
    ASSERT_TRUE(note.has_value()) << i;
    EXPECT_NE(note->find("tensor 'fc.weight' (chunk 2, on server 0): round 7"), std::string::npos)
        << *note;
    EXPECT_NE(note->find("still waits for worker 1."), std::string::npos) << *note;
    EXPECT_FALSE(notes->find(1, 6).has_value());
    EXPECT_FALSE(notes->find(0, 7).has_value());
  }
  // A key pushed by one worker per machine (the plan executor's shard keys):
  // how many more pushes the round needs.
  StallReport fewer;
  fewer.key = chunkKey(0, 0);
  fewer.pushed = {1};
  fewer.expected = 2;
  fewer.waitedMs = 2000;
  server.reportStall(fewer);
  EXPECT_TRUE(log.waitFor(
      {"stall: tensor 'conv1.weight' (chunk 0, on server 0)", "the pushes of worker 1 for 2.0 s",
       "still waits for 1 more of the workers that push it (2 per round)"},
      5000ms))
      << log.all();
  // The explanation comes with the first line only; another chunk of a
  // tensor and round already logged adds no line.
  EXPECT_EQ(log.all().find("CORTADO_TIMEOUT_MS"), log.all().rfind("CORTADO_TIMEOUT_MS"))
      << log.all();
  StallReport sibling = r;
  sibling.key = chunkKey(1, 3);
  server.reportStall(sibling);
  // A key no declaration has: the name its compressed pushes carry.
  StallReport unknown = r;
  unknown.key = chunkKey(40, 0);
  unknown.tensor = "x.weight";
  server.reportStall(unknown);
  EXPECT_TRUE(log.waitFor({"stall: tensor 'x.weight' (chunk 0, on server 0)"}, 5000ms))
      << log.all();
  EXPECT_EQ(log.all().find("(chunk 3"), std::string::npos) << log.all();
  // Only servers report; the job goes on.
  EXPECT_EQ(codeOf([&] { nodes[1].client->reportStall(r); }), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(server.failure().ok());
  finishJob(nodes, sched);
}

TEST(StallNotes, KeepTheLatestRoundPerTensorAndTheLatestTensors) {
  StallNotes n;
  n.add(3, 1, "first");
  n.add(3, 2, "second");
  EXPECT_EQ(n.find(3, 2), std::optional<std::string>("second"));
  EXPECT_FALSE(n.find(3, 1).has_value());  // an older round of it
  for (uint64_t k = 100; k < 100 + StallNotes::kMax; ++k) n.add(k, 0, "x");
  EXPECT_FALSE(n.find(3, 2).has_value());  // the oldest tensor made room
  EXPECT_TRUE(n.find(100, 0).has_value());
  EXPECT_TRUE(n.find(99 + StallNotes::kMax, 0).has_value());
}

TEST(ControlPlane, MismatchedDeclarationsFailEveryWorker) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(3, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 3, 1));
  std::vector<std::string> msgs(nodes.size());
  std::vector<ErrorCode> codes(nodes.size(), ErrorCode::kOk);
  std::vector<std::thread> ts;
  for (size_t i = 1; i < nodes.size(); ++i) {
    ts.emplace_back([&, i] {
      int rank = nodes[i].client->self().rank;
      TensorDecl d{"fc.weight", DType::kFloat32, rank == 2 ? 2048u : 1024u, ""};
      codes[i] = codeOf([&] { nodes[i].client->declare(d, Deadline::after(5s)); }, &msgs[i]);
    });
  }
  for (auto& t : ts) t.join();
  for (size_t i = 1; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], ErrorCode::kMismatch) << msgs[i];
    EXPECT_NE(msgs[i].find("'fc.weight'"), std::string::npos) << msgs[i];
    EXPECT_NE(msgs[i].find("numElements"), std::string::npos) << msgs[i];
    EXPECT_NE(msgs[i].find("1024"), std::string::npos) << msgs[i];
    EXPECT_NE(msgs[i].find("worker 2 declared float32 x 2048"), std::string::npos) << msgs[i];
  }
  for (auto& n : nodes) {
    auto st = n.probe->waitFor(3s);
    ASSERT_TRUE(st.has_value()) << n.client->self().toString();
    EXPECT_EQ(st->code(), ErrorCode::kMismatch);
  }
  auto st = sched.result(5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kMismatch);
  EXPECT_NE(st->message().find("'fc.weight'"), std::string::npos) << st->message();
}

// Workers that declare different tensors (another model, another name
// prefix, other fusion settings and so other group names) each wait for the
// others in a declaration that no other worker makes: the scheduler fails the
// job after SchedulerOptions::declareCheck, naming every worker's wait,
// instead of each declaration failing at its own deadline.
TEST(ControlPlane, WorkersWaitingInDeclarationsNoOtherMakesFailNamingEachWait) {
  LogCapture log;
  auto so = schedulerOptions(2, 1);
  so.declareCheck = Millis(300);
  SchedulerRunner sched(so);
  auto nodes = connectAll(jobOptions(sched.port(), 2, 1));
  std::vector<std::string> msgs(nodes.size());
  std::vector<ErrorCode> codes(nodes.size(), ErrorCode::kOk);
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (size_t i = 1; i < nodes.size(); ++i) {
    ts.emplace_back([&, i] {
      int rank = nodes[i].client->self().rank;
      TensorDecl d{rank == 0 ? "grad.0.group3.ab" : "grad.0.w", DType::kFloat32,
                   rank == 0 ? 336u : 128u, ""};
      codes[i] = codeOf([&] { nodes[i].client->declare(d, Deadline::after(20s)); }, &msgs[i]);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_LT(Clock::now() - t0, 10s);  // the check's 0.3 s, not the 20 s deadline
  for (size_t i = 1; i < nodes.size(); ++i) {
    EXPECT_EQ(codes[i], ErrorCode::kMismatch) << msgs[i];
    EXPECT_NE(msgs[i].find("the workers declare different tensors: worker 0 waits in its "
                           "declaration of 'grad.0.group3.ab' (float32 x 336, codec none), "
                           "which worker 1 has not declared; worker 1 waits in its declaration "
                           "of 'grad.0.w' (float32 x 128, codec none), which worker 0 has not "
                           "declared"),
              std::string::npos)
        << msgs[i];
    EXPECT_NE(msgs[i].find("fusion"), std::string::npos) << msgs[i];
  }
  auto st = sched.result(5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kMismatch);
}

// A worker may declare from several threads at once, in another order than
// the others: every worker then waits for a while, each in a declaration the
// others make later. The check waits declareCheck with no declaration agreed
// before it fails the job, so these agree.
TEST(ControlPlane, DeclarationsFromSeveralThreadsInAnotherOrderStillAgree) {
  LogCapture log;
  auto so = schedulerOptions(2, 1);
  so.declareCheck = Millis(2000);
  SchedulerRunner sched(so);
  auto nodes = connectAll(jobOptions(sched.port(), 2, 1));
  std::vector<std::map<std::string, uint64_t>> keys(nodes.size());
  std::mutex mu;
  std::vector<std::thread> ts;
  for (size_t i = 1; i < nodes.size(); ++i) {
    int rank = nodes[i].client->self().rank;
    // Worker 0 declares 'a' at once and 'b' 200 ms later; worker 1 the other way.
    for (int second = 0; second < 2; ++second) {
      std::string name = (rank == 0) == (second == 0) ? "a" : "b";
      ts.emplace_back([&, i, name, second] {
        if (second) std::this_thread::sleep_for(200ms);
        uint64_t key =
            nodes[i].client->declare({name, DType::kFloat32, 64, ""}, Deadline::after(10s));
        std::lock_guard<std::mutex> lk(mu);
        keys[i][name] = key;
      });
    }
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(keys[1].size(), 2u);
  EXPECT_EQ(keys[1], keys[2]);
  for (auto& n : nodes) EXPECT_TRUE(n.client->failure().ok()) << n.client->failure().message();
  finishJob(nodes, sched);
}

}  // namespace
}  // namespace cortado::testing
