// A stalled round: a server key whose current round some workers pushed and
// the others have not, for longer than the stall check's time
// (CORTADO_STALL_CHECK_MS). The server's engine finds it
// (server/server_engine.h), the server sends it to the scheduler
// (ControlClient::reportStall), and the scheduler names the tensor and the
// workers it waits for in its log and tells the workers (StallNotes), whose
// waits that time out then say it too: the usual cause is a worker that
// skips a tensor the others push, or pushes its tensors in another order.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace cortado {

struct StallReport {
  uint64_t key = 0;         // the server key (partition.h: chunkKey(tensor key, chunk))
  uint64_t round = 0;       // the round that waits
  std::vector<int> pushed;  // ranks of the workers whose push of the round came, ascending
  int expected = 0;         // pushes that complete the round
  uint64_t waitedMs = 0;    // since the round's first push
  std::string tensor;       // the name a compressed push carries; else empty
};

// What the scheduler told a worker of stalled rounds: per tensor key, the
// latest stalled round and what the scheduler said of it (the latest kMax
// tensors). Thread-safe.
class StallNotes {
 public:
  static constexpr size_t kMax = 256;

  void add(uint64_t tensorKey, uint64_t round, std::string text) {
    std::lock_guard<std::mutex> lk(mu_);
    if (notes_.insert_or_assign(tensorKey, Note{round, std::move(text)}).second)
      order_.push_back(tensorKey);
    while (order_.size() > kMax) {
      notes_.erase(order_.front());
      order_.pop_front();
    }
  }
  // What was said of this round of the tensor, if anything.
  std::optional<std::string> find(uint64_t tensorKey, uint64_t round) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = notes_.find(tensorKey);
    if (it == notes_.end() || it->second.round != round) return std::nullopt;
    return it->second.text;
  }

 private:
  struct Note {
    uint64_t round;
    std::string text;
  };
  mutable std::mutex mu_;
  std::map<uint64_t, Note> notes_;
  std::deque<uint64_t> order_;  // insertion order, for the bound
};

}  // namespace cortado
