// Deadlines: every wait in Cortado has one (DESIGN.md, "Errors and failure").
#pragma once

#include <chrono>

namespace cortado {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

class Deadline {
 public:
  static Deadline after(Millis d) { return Deadline(Clock::now() + d); }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  Millis remaining() const {
    auto now = Clock::now();
    if (now >= at_) return Millis(0);
    if (at_ == Clock::time_point::max()) return Millis::max();
    return std::chrono::duration_cast<Millis>(at_ - now);
  }

 private:
  Clock::time_point at_;
};

}  // namespace cortado
