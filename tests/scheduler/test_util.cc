#include "tests/scheduler/test_util.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <unistd.h>

#include <thread>

#include "core/common/logging.h"
#include "core/control/auth.h"

namespace cortado::testing {

namespace asio = boost::asio;
using asio::ip::tcp;

struct LogCapture::State {
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::vector<std::string> lines;
};

namespace {
class CaptureSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit CaptureSink(std::shared_ptr<LogCapture::State> st) : st_(std::move(st)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    {
      std::lock_guard<std::mutex> lk(st_->mu);
      st_->lines.emplace_back(msg.payload.data(), msg.payload.size());
    }
    st_->cv.notify_all();
  }
  void flush_() override {}

 private:
  std::shared_ptr<LogCapture::State> st_;
};
}  // namespace

LogCapture::LogCapture() : state_(std::make_shared<State>()) {
  auto logger = std::make_shared<spdlog::logger>(
      "control-test",
      spdlog::sinks_init_list{std::make_shared<CaptureSink>(state_),
                              std::make_shared<spdlog::sinks::stderr_color_sink_mt>()});
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

LogCapture::~LogCapture() {
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "control-test-plain", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
}

bool LogCapture::contains(const std::string& needle) const {
  std::lock_guard<std::mutex> lk(state_->mu);
  for (const auto& l : state_->lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

bool LogCapture::waitFor(const std::vector<std::string>& needles, Millis timeout) const {
  std::unique_lock<std::mutex> lk(state_->mu);
  return state_->cv.wait_for(lk, timeout, [&] {
    for (const auto& l : state_->lines) {
      bool all = true;
      for (const auto& n : needles) all = all && l.find(n) != std::string::npos;
      if (all) return true;
    }
    return false;
  });
}

std::string LogCapture::all() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  std::string s;
  for (const auto& l : state_->lines) s += l + "\n";
  return s;
}

control::ControlClient::FailureCallback FailureProbe::callback() {
  return [this](const Status& st) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++calls_;
      if (!status_) status_ = st;
    }
    cv_.notify_all();
  };
}

std::optional<Status> FailureProbe::waitFor(Millis timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [this] { return status_.has_value(); });
  return status_;
}

int FailureProbe::calls() const {
  std::lock_guard<std::mutex> lk(mu_);
  return calls_;
}

scheduler::SchedulerOptions schedulerOptions(int workers, int servers) {
  scheduler::SchedulerOptions o;
  o.bindHost = "127.0.0.1";
  o.port = 0;
  o.token = kToken;
  o.numWorkers = workers;
  o.numServers = servers;
  o.heartbeatTimeout = Millis(2000);
  o.registrationTimeout = Millis(10000);
  o.handshakeTimeout = Millis(2000);
  return o;
}

SchedulerRunner::SchedulerRunner(scheduler::SchedulerOptions opts)
    : sched_(scheduler::Scheduler::create(std::move(opts))) {
  run_ = std::async(std::launch::async, [this] { return sched_->run(); });
}

SchedulerRunner::~SchedulerRunner() {
  sched_->stop();
  if (run_.valid()) run_.wait();
}

std::optional<Status> SchedulerRunner::result(Millis timeout) {
  if (result_) return result_;
  if (run_.wait_for(timeout) != std::future_status::ready) return std::nullopt;
  result_ = run_.get();
  return result_;
}

control::ClientOptions clientOptions(int port, Role role, int requestedRank) {
  control::ClientOptions o;
  o.schedulerHost = "127.0.0.1";
  o.schedulerPort = port;
  o.token = kToken;
  o.role = role;
  o.requestedRank = requestedRank;
  static std::atomic<int> next{0};
  o.dataAddress = fmt::format("tcp://127.0.0.1:{}", 20000 + next++);
  o.connectTimeout = Millis(10000);
  o.heartbeatInterval = Millis(100);
  o.schedulerTimeout = Millis(5000);
  return o;
}

std::vector<Connected> connectAll(const std::vector<control::ClientOptions>& opts,
                                  Millis timeout) {
  std::vector<Connected> nodes(opts.size());
  std::vector<std::future<void>> fs;
  for (size_t i = 0; i < opts.size(); ++i) {
    nodes[i].client = control::ControlClient::create(opts[i]);
    nodes[i].probe = std::make_shared<FailureProbe>();
    nodes[i].client->setFailureCallback(nodes[i].probe->callback());
    fs.push_back(std::async(std::launch::async, [&nodes, i, timeout] {
      nodes[i].book = nodes[i].client->connect(Deadline::after(timeout));
    }));
  }
  std::exception_ptr first;
  for (auto& f : fs) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return nodes;
}

std::vector<control::ClientOptions> jobOptions(int port, int workers, int servers) {
  std::vector<control::ClientOptions> v;
  for (int s = 0; s < servers; ++s) v.push_back(clientOptions(port, Role::kServer));
  for (int w = 0; w < workers; ++w) v.push_back(clientOptions(port, Role::kWorker));
  return v;
}

void finishJob(std::vector<Connected>& nodes, SchedulerRunner& sched) {
  for (auto& n : nodes)
    if (n.client->self().role == Role::kWorker) n.client->finish();
  for (auto& n : nodes) EXPECT_TRUE(n.client->waitShutdown(Deadline::after(Millis(5000))));
  auto st = sched.result(Millis(5000));
  ASSERT_TRUE(st.has_value()) << "the scheduler did not return after every worker finished";
  EXPECT_TRUE(st->ok()) << st->message();
  for (auto& n : nodes) EXPECT_EQ(n.probe->calls(), 0) << n.client->self().toString();
}

void writeFrame(tcp::socket& s, control::MsgType type, const control::Json& body) {
  asio::write(s, asio::buffer(control::encodeFrame(type, body)));
}

std::pair<control::MsgType, control::Json> readFrame(tcp::socket& s, Millis timeout) {
  // Read asynchronously on the socket's own io_context (nothing else runs it
  // in these tests), so that the wait has a deadline.
  auto& io = static_cast<asio::io_context&>(s.get_executor().context());
  uint8_t h[control::kFrameHeaderSize];
  std::string body;
  boost::system::error_code failed;
  bool done = false;
  control::FrameHeader hd;
  asio::async_read(s, asio::buffer(h, sizeof(h)), [&](const boost::system::error_code& e, size_t) {
    if (e) {
      failed = e;
      done = true;
      return;
    }
    hd = control::decodeHeader(h);
    if (!control::checkHeader(hd, control::kMaxBody).empty()) {
      done = true;
      return;
    }
    body.resize(hd.bodyLength);
    asio::async_read(s, asio::buffer(body.data(), body.size()),
                     [&](const boost::system::error_code& e2, size_t) {
                       failed = e2;
                       done = true;
                     });
  });
  io.restart();
  io.run_for(timeout);
  if (!done) {
    s.cancel();
    io.restart();
    io.run();
    throw Error(ErrorCode::kTimeout,
                fmt::format("no whole frame from the peer within {} ms", timeout.count()));
  }
  if (failed) throw Error(ErrorCode::kPeerDead, "reading a frame: " + failed.message());
  std::string err = control::checkHeader(hd, control::kMaxBody);
  if (!err.empty()) throw Error(ErrorCode::kProtocol, err);
  return {static_cast<control::MsgType>(hd.type), control::Json::parse(body)};
}

RawWorker::RawWorker(int port) : socket_(io_) {
  socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)));
  const std::string nonce = control::makeNonce();
  writeFrame(socket_, control::MsgType::kHello,
             {{"version", control::kProtocolVersion},
              {"nonce", control::toHex(nonce)},
              {"role", static_cast<int>(Role::kWorker)}});
  auto challenge = expect(control::MsgType::kChallenge);
  auto schedulerNonce = control::fromHex(challenge["nonce"].get<std::string>(), control::kNonceSize);
  CORTADO_ENFORCE(schedulerNonce.has_value(), ErrorCode::kProtocol, "bad challenge nonce");
  writeFrame(socket_, control::MsgType::kProof,
             {{"mac", control::toHex(control::authProof(kToken, control::Prover::kNode, nonce,
                                                        *schedulerNonce))}});
  expect(control::MsgType::kWelcome);
  const auto o = clientOptions(port, Role::kWorker);
  writeFrame(socket_, control::MsgType::kRegister,
             {{"role", static_cast<int>(Role::kWorker)},
              {"requestedRank", -1},
              {"dataAddress", o.dataAddress},
              {"hostname", "localhost"},
              {"pid", static_cast<int>(getpid())},
              {"sharedMemory", false}});
}

void RawWorker::waitForAddressBook() { expect(control::MsgType::kAddressBook); }

void RawWorker::send(control::MsgType type, const control::Json& body) {
  writeFrame(socket_, type, body);
}

control::Json RawWorker::expect(control::MsgType type, Millis timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
    CORTADO_ENFORCE(left.count() > 0, ErrorCode::kTimeout, "no {} from the scheduler within {} ms",
                    control::msgTypeName(type), timeout.count());
    auto [t, body] = readFrame(socket_, left);
    if (t == type) return body;
    CORTADO_ENFORCE(t == control::MsgType::kPing || t == control::MsgType::kHeartbeat,
                    ErrorCode::kProtocol, "expected {} from the scheduler, got {}: {}",
                    control::msgTypeName(type), control::msgTypeName(t), body.dump());
  }
}

bool closedByPeer(tcp::socket& s, Millis timeout) {
  // Reads on a private io_context so that the wait has a deadline.
  asio::io_context io;
  tcp::socket mine(io);
  boost::system::error_code ec;
  mine.assign(tcp::v4(), s.release(), ec);
  if (ec) return false;
  bool closed = false;
  std::array<char, 4096> buf;
  std::function<void()> readMore = [&] {
    mine.async_read_some(asio::buffer(buf), [&](const boost::system::error_code& e, size_t) {
      if (e) {
        closed = true;
        return;
      }
      readMore();
    });
  };
  readMore();
  io.run_for(timeout);
  return closed;
}

}  // namespace cortado::testing
