// Multi-node control-plane tests in one process: a Scheduler on its own
// thread, each ControlClient connecting on its own thread, all over loopback.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "core/control/auth.h"
#include "core/plan/plan.h"
#include "core/plan/profile_report.h"
#include "tests/scheduler/test_util.h"

namespace cortado::testing {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using control::ClientOptions;
using control::ControlClient;
using control::Group;
using control::TensorDecl;
using namespace std::chrono_literals;

std::vector<ClientOptions> jobOptions(int port, int workers, int servers) {
  std::vector<ClientOptions> v;
  for (int s = 0; s < servers; ++s) v.push_back(clientOptions(port, Role::kServer));
  for (int w = 0; w < workers; ++w) v.push_back(clientOptions(port, Role::kWorker));
  return v;
}

// Finishes every worker and checks that the job ends in order.
void finishJob(std::vector<Connected>& nodes, SchedulerRunner& sched) {
  for (auto& n : nodes)
    if (n.client->self().role == Role::kWorker) n.client->finish();
  for (auto& n : nodes) EXPECT_TRUE(n.client->waitShutdown(Deadline::after(5s)));
  auto st = sched.result(5s);
  ASSERT_TRUE(st.has_value()) << "the scheduler did not return after every worker finished";
  EXPECT_TRUE(st->ok()) << st->message();
  for (auto& n : nodes) EXPECT_EQ(n.probe->calls(), 0) << n.client->self().toString();
}

template <typename F>
ErrorCode codeOf(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

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

// A registered worker that sends a declaration with a malformed field (one
// that ControlClient never sends) is closed as a malformed peer: the job ends
// with kPeerDead naming the field and the tensor, at once, on every node.
TEST(ControlPlane, MalformedDeclarationFieldsEndTheJobNamingTheField) {
  LogCapture log;
  struct Case {
    const char* field;
    control::Json value;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"incarnation", -1, "field 'incarnation' of the declaration of tensor 'bad' is not a count"},
      {"incarnation", "1", "field 'incarnation' of the declaration of tensor 'bad' is not a count"},
      {"incarnation", 1.5, "field 'incarnation' of the declaration of tensor 'bad' is not a count"},
      {"incarnation", uint64_t(1) << 32,
       "field 'incarnation' of the declaration of tensor 'bad' is not a count"},
      {"contributors", -2, "field 'contributors' of the declaration of tensor 'bad' is not a count"},
      {"errorFeedback", "yes",
       "field 'errorFeedback' of the declaration of tensor 'bad' is not a boolean"},
      {"dtype", 999, "unknown dtype 999 for tensor 'bad'"},
      {"numElements", -8, "field 'numElements' is missing or not an unsigned integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} = {}", c.field, c.value.dump()));
    SchedulerRunner sched(schedulerOptions(1, 1));
    auto server = std::async(std::launch::async, [&] {
      return connectAll({clientOptions(sched.port(), Role::kServer)});
    });
    RawWorker w(sched.port());
    w.waitForAddressBook();
    auto nodes = server.get();
    // A well-formed declaration first: answered with its key.
    control::Json good = {{"req", 1},         {"name", "good"},          {"dtype", 0},
                          {"numElements", 8}, {"codec", ""},             {"errorFeedback", false},
                          {"contributors", 0}, {"incarnation", 0}};
    w.send(control::MsgType::kDeclare, good);
    auto declared = w.expect(control::MsgType::kDeclared);
    EXPECT_EQ(declared["req"], 1);
    EXPECT_EQ(declared["key"], 0);
    control::Json bad = good;
    bad["req"] = 2;
    bad["name"] = "bad";
    bad[c.field] = c.value;
    w.send(control::MsgType::kDeclare, bad);
    EXPECT_TRUE(closedByPeer(w.socket(), 3s)) << "the scheduler kept the connection open";
    auto st = sched.result(5s);
    ASSERT_TRUE(st.has_value()) << "the job did not end";
    EXPECT_EQ(st->code(), ErrorCode::kPeerDead) << st->message();
    EXPECT_NE(st->message().find("sent a malformed message"), std::string::npos) << st->message();
    EXPECT_NE(st->message().find(c.says), std::string::npos) << st->message();
    auto told = nodes[0].probe->waitFor(3s);
    ASSERT_TRUE(told.has_value()) << "the server was not told";
    EXPECT_EQ(told->code(), ErrorCode::kPeerDead) << told->message();
    EXPECT_NE(told->message().find(c.says), std::string::npos) << told->message();
  }
}

TEST(ControlPlane, WrongTokenIsRefusedAndTheJobGoesOn) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(1, 1));
  auto rogueOpts = clientOptions(sched.port(), Role::kWorker);
  rogueOpts.token = "not-the-job-token";
  FailureProbe rogueProbe;  // outlives the client
  auto rogue = ControlClient::create(rogueOpts);
  rogue->setFailureCallback(rogueProbe.callback());
  std::string msg;
  auto start = Clock::now();
  EXPECT_EQ(codeOf([&] { rogue->connect(Deadline::after(10s)); }, &msg), ErrorCode::kProtocol);
  EXPECT_LT(Clock::now() - start, 3s) << "a refused token must not be retried";
  EXPECT_NE(msg.find("job token refused"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("127.0.0.1:{}", sched.port())), std::string::npos) << msg;
  EXPECT_TRUE(log.waitFor({"[scheduler] refused 127.0.0.1:", "job token refused"}, 2s))
      << log.all();
  EXPECT_EQ(rogue->failure().code(), ErrorCode::kProtocol);
  EXPECT_EQ(codeOf([&] { rogue->barrier(Group::kAll, "x", Deadline::after(1s)); }),
            ErrorCode::kProtocol);

  auto nodes = connectAll(jobOptions(sched.port(), 1, 1));
  finishJob(nodes, sched);
}

TEST(ControlPlane, NodeRefusesASchedulerWithAnotherToken) {
  LogCapture log;
  auto so = schedulerOptions(1, 0);
  so.token = "another-jobs-token";
  SchedulerRunner sched(so);
  auto c = ControlClient::create(clientOptions(sched.port(), Role::kWorker));
  std::string msg;
  // Either side may notice first; neither retries.
  EXPECT_EQ(codeOf([&] { c->connect(Deadline::after(5s)); }, &msg), ErrorCode::kProtocol);
  EXPECT_NE(msg.find("job token"), std::string::npos) << msg;
}

TEST(ControlPlane, UnreachableSchedulerTimesOutAtTheDeadline) {
  int port;
  {
    asio::io_context io;
    tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  auto c = ControlClient::create(clientOptions(port, Role::kServer));
  std::string msg;
  auto start = Clock::now();
  EXPECT_EQ(codeOf([&] { c->connect(Deadline::after(800ms)); }, &msg), ErrorCode::kTimeout);
  auto took = Clock::now() - start;
  EXPECT_GE(took, 700ms);
  EXPECT_LT(took, 2000ms);
  EXPECT_NE(msg.find(fmt::format("127.0.0.1:{}", port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("CORTADO_SCHEDULER_HOST"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CORTADO_SCHEDULER_PORT"), std::string::npos) << msg;
}

TEST(ControlPlane, PortInUseIsUnavailable) {
  SchedulerRunner first(schedulerOptions(1, 1));
  auto so = schedulerOptions(1, 1);
  so.port = first.port();
  try {
    scheduler::Scheduler::create(so);
    FAIL() << "a second scheduler bound a port in use";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find(fmt::format("127.0.0.1:{}", first.port())),
              std::string::npos)
        << e.what();
  }
  so.port = 0;
  so.token = "";
  EXPECT_EQ(codeOf([&] { scheduler::Scheduler::create(so); }), ErrorCode::kInvalidArgument);
}

TEST(ControlPlane, SilentNodeIsDeclaredDeadAndEveryoneIsTold) {
  LogCapture log;
  auto so = schedulerOptions(2, 1);
  so.heartbeatTimeout = Millis(400);
  SchedulerRunner sched(so);
  auto opts = jobOptions(sched.port(), 2, 1);
  opts[2].requestedRank = 1;
  opts[2].heartbeatInterval = Millis(3600 * 1000);  // this worker never heartbeats
  opts[2].hostname = "silent-host";
  auto nodes = connectAll(opts);
  auto start = Clock::now();
  for (size_t i : {0, 1}) {
    auto st = nodes[i].probe->waitFor(3s);
    ASSERT_TRUE(st.has_value()) << nodes[i].client->self().toString();
    EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
    EXPECT_NE(st->message().find("worker 1"), std::string::npos) << st->message();
    EXPECT_NE(st->message().find("silent-host"), std::string::npos) << st->message();
    EXPECT_NE(st->message().find(opts[2].dataAddress), std::string::npos) << st->message();
    EXPECT_NE(st->message().find("no heartbeat"), std::string::npos) << st->message();
  }
  EXPECT_LT(Clock::now() - start, 2s);
  // The silent node itself is told too, and every blocking call now throws.
  auto own = nodes[2].probe->waitFor(3s);
  ASSERT_TRUE(own.has_value());
  EXPECT_NE(own->message().find("declared dead"), std::string::npos) << own->message();
  EXPECT_EQ(codeOf([&] { nodes[0].client->waitShutdown(Deadline::after(1s)); }),
            ErrorCode::kPeerDead);
  auto st = sched.result(5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
  EXPECT_NE(st->message().find("worker 1"), std::string::npos) << st->message();
}

TEST(ControlPlane, ClosingBeforeFinishingIsDeath) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(2, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 2, 1));
  auto victim = nodes[1].client->self();
  nodes[1].client->close();
  for (size_t i : {0, 2}) {
    auto st = nodes[i].probe->waitFor(3s);
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
    EXPECT_NE(st->message().find(victim.toString()), std::string::npos) << st->message();
    EXPECT_NE(st->message().find("closed before it finished"), std::string::npos)
        << st->message();
  }
  EXPECT_EQ(nodes[1].probe->calls(), 0) << "close() is not a failure of the node itself";
  auto st = sched.result(5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
}

TEST(ControlPlane, ClosingAfterFinishingIsOrderly) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(2, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 2, 1));
  nodes[1].client->finish();
  nodes[1].client->close();
  std::this_thread::sleep_for(200ms);
  nodes[2].client->finish();
  EXPECT_TRUE(nodes[0].client->waitShutdown(Deadline::after(5s)));
  EXPECT_TRUE(nodes[2].client->waitShutdown(Deadline::after(5s)));
  auto st = sched.result(5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->ok()) << st->message();
  EXPECT_EQ(nodes[0].probe->calls(), 0);
}

TEST(ControlPlane, RegistrationDeadlineNamesTheMissingRoles) {
  LogCapture log;
  auto so = schedulerOptions(3, 1);
  so.registrationTimeout = Millis(500);
  SchedulerRunner sched(so);
  auto c = ControlClient::create(clientOptions(sched.port(), Role::kWorker));
  std::string msg;
  EXPECT_EQ(codeOf([&] { c->connect(Deadline::after(5s)); }, &msg), ErrorCode::kTimeout);
  EXPECT_NE(msg.find("2 workers and 1 server missing"), std::string::npos) << msg;
  auto st = sched.result(3s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kTimeout);
  EXPECT_EQ(st->message(), msg);
}

// cortado launch --hosts tells the scheduler how many workers each machine
// runs; workers counted by hostname that do not give those numbers (an MPI
// launcher that ran every rank on one host) fail the job at registration,
// saying where they are. Names are not compared, only the counts.
TEST(ControlPlane, WorkersOnOtherHostsThanPlacedFailTheJob) {
  {
    auto so = schedulerOptions(4, 1);
    so.workersPerHost = {2, 2};
    SchedulerRunner sched(so);
    auto opts = jobOptions(sched.port(), 4, 1);
    for (int w = 0; w < 4; ++w) opts[1 + w].hostname = w % 2 ? "node-b.example" : "node-a.example";
    auto nodes = connectAll(opts);  // placed as asked, under other names
    finishJob(nodes, sched);
  }
  LogCapture log;
  auto so = schedulerOptions(4, 1);
  so.workersPerHost = {1, 1, 1, 1};
  SchedulerRunner sched(so);
  auto opts = jobOptions(sched.port(), 4, 1);
  for (int w = 0; w < 4; ++w) opts[1 + w].hostname = "h1";
  std::string msg;
  EXPECT_EQ(codeOf([&] { connectAll(opts); }, &msg), ErrorCode::kInvalidArgument);
  for (const char* part : {"not where the job placed them", "4 workers on 4 machines (1, 1, 1, 1)",
                           "1 hostname (4 workers on h1)", "OMPI_MCA_plm"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  auto st = sched.result(5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(st->message(), msg);
}

TEST(ControlPlane, StopBeforeRunEndsRunAtOnce) {
  auto sched = scheduler::Scheduler::create(schedulerOptions(1, 1));
  sched->stop();
  auto start = Clock::now();
  Status st = sched->run();
  EXPECT_EQ(st.code(), ErrorCode::kClosed);
  EXPECT_LT(Clock::now() - start, 10s);  // returns at once, never waits out a deadline
  EXPECT_EQ(codeOf([&] { sched->run(); }), ErrorCode::kInvalidArgument);
}

TEST(ControlPlane, StopAbortsEveryNode) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(1, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 1, 1));
  sched.scheduler().stop();
  for (auto& n : nodes) {
    auto st = n.probe->waitFor(3s);
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->code(), ErrorCode::kClosed);
    EXPECT_NE(st->message().find("stopped"), std::string::npos) << st->message();
  }
  auto st = sched.result(3s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kClosed);
}

// The launcher's word that a role's process died: every node hears the cause,
// and a second word (or a later stop) does not replace it.
TEST(ControlPlane, FailTellsEveryNodeTheCause) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(2, 1));
  auto nodes = connectAll(jobOptions(sched.port(), 2, 1));
  sched.scheduler().fail(Status(ErrorCode::kPeerDead, "worker 7 (pid 42) failed: killed by signal 9"));
  sched.scheduler().fail(Status(ErrorCode::kInternal, "a later word"));
  sched.scheduler().stop();
  for (auto& n : nodes) {
    auto st = n.probe->waitFor(3s);
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
    EXPECT_NE(st->message().find("worker 7 (pid 42)"), std::string::npos) << st->message();
  }
  auto st = sched.result(3s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
  EXPECT_NE(st->message().find("killed by signal 9"), std::string::npos) << st->message();
}

// Bytes that are not Cortado frames: the scheduler logs the peer and the fault,
// closes that connection, and serves the job.
TEST(ControlPlane, MalformedFramesAreLoggedAndClosed) {
  LogCapture log;
  SchedulerRunner sched(schedulerOptions(1, 1));
  asio::io_context io;
  auto endpoint = tcp::endpoint(asio::ip::make_address("127.0.0.1"), sched.port());

  struct Case {
    std::string name;
    std::string bytes;
    std::string logged;
  };
  auto header = [](uint32_t magic, uint16_t version, uint16_t type, uint32_t len) {
    control::FrameHeader h{magic, version, type, len};
    std::string s(control::kFrameHeaderSize, '\0');
    control::encodeHeader(h, reinterpret_cast<uint8_t*>(s.data()));
    return s;
  };
  const uint16_t hello = static_cast<uint16_t>(control::MsgType::kHello);
  std::vector<Case> cases = {
      {"http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad magic"},
      {"oversize", header(control::kFrameMagic, 1, hello, 0xffffffffu), "over the limit"},
      {"over the pre-auth limit", header(control::kFrameMagic, 1, hello, 5000),
       "over the limit of 4096"},
      {"version", header(control::kFrameMagic, 9, hello, 0), "unsupported protocol version 9"},
      {"type", header(control::kFrameMagic, 1, 999, 0), "unknown message type 999"},
      {"not json", header(control::kFrameMagic, 1, hello, 9) + "not json{", "not a JSON object"},
      {"missing field", control::encodeFrame(control::MsgType::kHello, {{"version", 1}}),
       "bad Hello message: field 'nonce' is missing"},
      {"register before auth", control::encodeFrame(control::MsgType::kRegister, {{"role", 2}}),
       "unexpected Register"},
  };
  for (const auto& c : cases) {
    tcp::socket s(io);
    s.connect(endpoint);
    auto local = s.local_endpoint();
    std::string peer = fmt::format("127.0.0.1:{}", local.port());
    asio::write(s, asio::buffer(c.bytes));
    EXPECT_TRUE(closedByPeer(s, 3s)) << c.name << ": the scheduler kept the connection open";
    EXPECT_TRUE(log.waitFor({"[scheduler] closing the connection from " + peer, c.logged}, 2s))
        << c.name << "\n"
        << log.all();
  }
  // A truncated frame followed by a close is just a closed connection.
  {
    tcp::socket s(io);
    s.connect(endpoint);
    asio::write(s, asio::buffer(header(control::kFrameMagic, 1, hello, 100) + "{"));
    s.close();
  }
  auto nodes = connectAll(jobOptions(sched.port(), 1, 1));
  finishJob(nodes, sched);
}

TEST(ControlPlane, SilentPeerFailsTheHandshakeDeadline) {
  LogCapture log;
  auto so = schedulerOptions(1, 1);
  so.handshakeTimeout = Millis(300);
  SchedulerRunner sched(so);
  asio::io_context io;
  tcp::socket s(io);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), sched.port()));
  EXPECT_TRUE(closedByPeer(s, 3s));
  EXPECT_TRUE(log.waitFor({"did not authenticate and register within 300 ms"}, 1s)) << log.all();
}

// A fake scheduler that authenticates and registers one worker, then `after`
// decides what happens to the connection.
void fakeScheduler(tcp::acceptor& acceptor, const std::function<void(tcp::socket&)>& after) {
  tcp::socket s(acceptor.get_executor());
  acceptor.accept(s);
  auto [t1, hello] = readFrame(s);
  auto nodeNonce = *control::fromHex(hello["nonce"].get<std::string>(), control::kNonceSize);
  auto myNonce = control::makeNonce();
  writeFrame(s, control::MsgType::kChallenge,
             {{"nonce", control::toHex(myNonce)}, {"pingIntervalMs", 10}});
  auto [t2, proof] = readFrame(s);
  writeFrame(s, control::MsgType::kWelcome,
             {{"mac", control::toHex(control::authProof(kToken, control::Prover::kScheduler,
                                                        nodeNonce, myNonce))}});
  auto [t3, reg] = readFrame(s);
  NodeInfo me{{Role::kWorker, 0}, reg["dataAddress"], reg["hostname"], reg["pid"]};
  writeFrame(s, control::MsgType::kAddressBook,
             {{"rank", 0},
              {"servers", control::Json::array()},
              {"workers", control::Json::array({control::nodeInfoToJson(me)})}});
  after(s);
}

TEST(ControlPlane, LostSchedulerIsPeerDead) {
  LogCapture log;
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  int port = acceptor.local_endpoint().port();
  std::promise<void> closeNow;
  auto fake = std::async(std::launch::async, [&] {
    fakeScheduler(acceptor, [&](tcp::socket& s) {
      closeNow.get_future().wait_for(5s);
      s.close();
    });
  });
  auto opts = clientOptions(port, Role::kWorker);
  FailureProbe probe;  // outlives the client
  auto c = ControlClient::create(opts);
  c->setFailureCallback(probe.callback());
  auto book = c->connect(Deadline::after(5s));
  EXPECT_EQ(book.workers.size(), 1u);
  closeNow.set_value();
  auto st = probe.waitFor(3s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
  EXPECT_NE(st->message().find(fmt::format("scheduler at 127.0.0.1:{}", port)), std::string::npos)
      << st->message();
  EXPECT_EQ(codeOf([&] { c->barrier(Group::kAll, "b", Deadline::after(1s)); }),
            ErrorCode::kPeerDead);
  fake.get();
}

TEST(ControlPlane, SilentSchedulerIsPeerDead) {
  LogCapture log;
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  int port = acceptor.local_endpoint().port();
  std::promise<void> done;
  auto fake = std::async(std::launch::async, [&] {
    // Holds the connection open and says nothing more.
    fakeScheduler(acceptor, [&](tcp::socket&) { done.get_future().wait_for(5s); });
  });
  auto opts = clientOptions(port, Role::kWorker);
  opts.schedulerTimeout = Millis(300);
  FailureProbe probe;  // outlives the client
  auto c = ControlClient::create(opts);
  c->setFailureCallback(probe.callback());
  c->connect(Deadline::after(5s));
  auto st = probe.waitFor(3s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), ErrorCode::kPeerDead);
  EXPECT_NE(st->message().find("silent"), std::string::npos) << st->message();
  EXPECT_NE(st->message().find(fmt::format("127.0.0.1:{}", port)), std::string::npos);
  done.set_value();
  fake.get();
}

}  // namespace
}  // namespace cortado::testing
