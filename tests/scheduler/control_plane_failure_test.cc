// Control-plane failures in one process (control_plane_test.cc has the
// job's normal flow): malformed messages and fields, wrong tokens, deadlines,
// dead and silent peers on either side, stop and fail.
#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <thread>

#include "core/control/auth.h"
#include "tests/scheduler/test_util.h"

namespace cortado::testing {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using control::ControlClient;
using control::Group;
using namespace std::chrono_literals;

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
  // A port bound here and not listening: connections to it are refused for
  // the whole test, and no other test's scheduler can take it meanwhile (a
  // port closed again before the connect was taken by one under ctest -j2).
  asio::io_context io;
  tcp::socket held(io);
  held.open(tcp::v4());
  held.bind(tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const int port = held.local_endpoint().port();
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
      {"oversize", header(control::kFrameMagic, control::kProtocolVersion, hello, 0xffffffffu),
       "over the limit"},
      {"over the pre-auth limit",
       header(control::kFrameMagic, control::kProtocolVersion, hello, 5000),
       "over the limit of 4096"},
      {"version", header(control::kFrameMagic, 9, hello, 0), "unsupported protocol version 9"},
      {"type", header(control::kFrameMagic, control::kProtocolVersion, 999, 0),
       "unknown message type 999"},
      {"not json", header(control::kFrameMagic, control::kProtocolVersion, hello, 9) + "not json{",
       "not a JSON object"},
      {"missing field",
       control::encodeFrame(control::MsgType::kHello, {{"version", control::kProtocolVersion}}),
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
    asio::write(
        s, asio::buffer(header(control::kFrameMagic, control::kProtocolVersion, hello, 100) + "{"));
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
