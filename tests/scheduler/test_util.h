// Helpers for the control-plane tests: a captured log, a failure-callback
// probe, a scheduler running on its own thread, and raw frame I/O for fake
// peers.
#pragma once

#include <utility>  // before asio: Boost 1.74 needs it in C++20
#include <boost/asio.hpp>

#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/control/control_client.h"
#include "core/control/protocol.h"
#include "scheduler/scheduler.h"

namespace cortado::testing {

inline const std::string kToken = "control-plane-test-token";

// Installs itself as the default logger's extra sink for its lifetime.
class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  bool contains(const std::string& needle) const;
  // Waits until a line contains every one of `needles`.
  bool waitFor(const std::vector<std::string>& needles, Millis timeout) const;
  std::string all() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Records the first failure callback; wait for it with a timeout.
class FailureProbe {
 public:
  control::ControlClient::FailureCallback callback();
  std::optional<Status> waitFor(Millis timeout);
  int calls() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Status> status_;
  int calls_ = 0;
};

scheduler::SchedulerOptions schedulerOptions(int workers, int servers);

class SchedulerRunner {
 public:
  explicit SchedulerRunner(scheduler::SchedulerOptions opts);
  ~SchedulerRunner();  // stop() and wait
  int port() const { return sched_->port(); }
  scheduler::Scheduler& scheduler() { return *sched_; }
  // run()'s result, or nullopt if it has not returned within the timeout.
  std::optional<Status> result(Millis timeout);

 private:
  std::unique_ptr<scheduler::Scheduler> sched_;
  std::future<Status> run_;
  std::optional<Status> result_;
};

control::ClientOptions clientOptions(int port, Role role, int requestedRank = -1);

// A node's view after connect().
// The probe is declared first so that it outlives the client's io thread.
struct Connected {
  std::shared_ptr<FailureProbe> probe;
  std::unique_ptr<control::ControlClient> client;
  control::AddressBook book;
};

// Connects every option set at once, each on its own thread; rethrows the
// first connect error.
std::vector<Connected> connectAll(const std::vector<control::ClientOptions>& opts,
                                  Millis timeout = Millis(10000));

// Options for a job of `workers` workers and `servers` servers (servers first).
std::vector<control::ClientOptions> jobOptions(int port, int workers, int servers);

// Finishes every worker and checks that the job ends in order.
void finishJob(std::vector<Connected>& nodes, SchedulerRunner& sched);

// The error code f() throws (kOk when none), and its message.
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

// Raw frames on a blocking socket, for fake peers.
void writeFrame(boost::asio::ip::tcp::socket& s, control::MsgType type,
                const control::Json& body);
// readFrame runs the socket's io_context (nothing else may run it) and throws
// Error(kTimeout) when no whole frame came within `timeout`.
std::pair<control::MsgType, control::Json> readFrame(boost::asio::ip::tcp::socket& s,
                                                     Millis timeout = Millis(5000));
// True when the peer closes the socket within `timeout` (reading and
// discarding what it sends first).
bool closedByPeer(boost::asio::ip::tcp::socket& s, Millis timeout);

// A worker that speaks the control protocol by hand, for messages that
// ControlClient never sends: it authenticates with kToken and registers in the
// constructor; every wait has a deadline.
class RawWorker {
 public:
  explicit RawWorker(int port);
  // Returns once every node registered (the scheduler's AddressBook).
  void waitForAddressBook();
  void send(control::MsgType type, const control::Json& body);
  // The next frame of `type` (pings skipped); throws on anything else.
  control::Json expect(control::MsgType type, Millis timeout = Millis(5000));
  boost::asio::ip::tcp::socket& socket() { return socket_; }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
};

}  // namespace cortado::testing
