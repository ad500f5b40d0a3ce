// Running a function on a transport's loop thread from another thread and
// waiting for its result, with a deadline: shared by the ZeroMQ and UCX
// transports, whose sockets and workers belong to their loop thread.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>

#include "core/common/error.h"

namespace cortado::transport {

// Runs `fn` on the loop through `post` (which queues a task for the loop
// thread and returns false once the transport is closed) and waits up to
// `timeout` for it. An Error (or another exception) thrown by `fn` travels
// back and is thrown again here, on the caller's thread. `who` names the
// transport in messages ("zmq w0"), `what` the call ("listen(tcp://...)").
// Throws kClosed when the transport is closed before or during the call,
// kTimeout when the loop does not run it in time.
inline std::string callOnLoopThread(const std::function<bool(std::function<void()>)>& post,
                                    std::function<std::string()> fn, const std::string& who,
                                    const std::string& what, std::chrono::milliseconds timeout) {
  struct Result {
    std::string value;
    Status status;
  };
  auto promise = std::make_shared<std::promise<Result>>();
  auto future = promise->get_future();
  auto task = [promise, fn = std::move(fn)] {
    Result r;
    try {
      r.value = fn();
    } catch (const Error& e) {
      r.status = Status::fromError(e);
    } catch (const std::exception& e) {
      r.status = Status(ErrorCode::kInternal, e.what());
    }
    promise->set_value(std::move(r));
  };
  if (!post(std::move(task)))
    throw Error(ErrorCode::kClosed, fmt::format("{}: {} after close()", who, what));
  if (future.wait_for(timeout) != std::future_status::ready) {
    throw Error(ErrorCode::kTimeout,
                fmt::format("{}: {} did not complete within {} ms: the loop thread is busy (a "
                            "callback that blocks?)",
                            who, what, timeout.count()));
  }
  Result r;
  try {
    r = future.get();
  } catch (const std::future_error&) {
    throw Error(ErrorCode::kClosed, fmt::format("{}: {} cut short by close()", who, what));
  }
  r.status.check();
  return std::move(r.value);
}

}  // namespace cortado::transport
