// Cortado's two error channels (see STYLE.md §5): synchronous misuse throws
// cortado::Error with the compared values and context; asynchronous failures
// travel as a Status on the completion and are rethrown by the waiting thread.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace cortado {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // bad option, bad tensor, bad size
  kMismatch,         // workers disagree (declarations, sizes, dtypes)
  kTimeout,          // a deadline passed
  kPeerDead,         // a node stopped answering or closed its connection
  kProtocol,         // malformed or unauthenticated message
  kUnavailable,      // a resource (port, backend) cannot be had
  kClosed,           // the object was shut down
  kInternal,
};

const char* errorCodeName(ErrorCode code);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorCode code = ErrorCode::kInternal)
      : std::runtime_error(message), code_(code) {}
  Error(ErrorCode code, const std::string& message) : Error(message, code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// The error value of an asynchronous operation. Default-constructed is OK.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status fromError(const Error& e) { return Status(e.code(), e.what()); }

  bool ok() const noexcept { return code_ == ErrorCode::kOk; }
  explicit operator bool() const noexcept { return ok(); }
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // Throws cortado::Error when not OK.
  void check() const {
    if (!ok()) throw Error(code_, message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

}  // namespace cortado

// CORTADO_ENFORCE(cond, code, fmt, args...): throw Error(code, message) unless cond.
#define CORTADO_ENFORCE(cond, code, ...)                              \
  do {                                                                \
    if (!(cond)) throw ::cortado::Error((code), fmt::format(__VA_ARGS__)); \
  } while (0)

// CORTADO_ENFORCE_EQ(a, b, context...): names both values when they differ.
#define CORTADO_ENFORCE_EQ(a, b, code, ...)                                             \
  do {                                                                                  \
    const auto& cortado_a_ = (a);                                                       \
    const auto& cortado_b_ = (b);                                                       \
    if (!(cortado_a_ == cortado_b_))                                                    \
      throw ::cortado::Error((code), fmt::format("{}: expected {} == {}, got {} vs {}", \
                                                 fmt::format(__VA_ARGS__), #a, #b,      \
                                                 cortado_a_, cortado_b_));              \
  } while (0)
