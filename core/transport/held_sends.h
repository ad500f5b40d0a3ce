// Messages sent to a peer before connect() named its address: held until it
// does, and dropped, once, when it has not within the connect timeout. Shared
// by the ZeroMQ and UCX transports; used on their loop thread only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/common/deadline.h"
#include "core/transport/transport.h"

namespace cortado::transport {

class HeldSends {
 public:
  // Holds `msg` for `peer`; the peer's first held message starts its
  // deadline, `timeout` from now. Returns false, and drops `msg`, once that
  // deadline has passed (expire()) until forget() or release().
  bool hold(const NodeId& peer, Message msg, Millis timeout) {
    auto [h, inserted] = held_.try_emplace(peer);
    if (inserted) h->second.deadline = Clock::now() + timeout;
    if (h->second.failed) return false;
    h->second.msgs.push_back(std::move(msg));
    return true;
  }

  // connect() named `peer`: its held messages, in the order sent, and the
  // peer is forgotten here.
  std::deque<Message> release(const NodeId& peer) {
    auto h = held_.find(peer);
    if (h == held_.end()) return {};
    auto msgs = std::move(h->second.msgs);
    held_.erase(h);
    return msgs;
  }

  void forget(const NodeId& peer) { held_.erase(peer); }
  void clear() { held_.clear(); }

  // The earliest deadline still running; Clock::time_point::max() if none.
  Clock::time_point nextDeadline() const {
    auto next = Clock::time_point::max();
    for (const auto& [id, h] : held_) {
      if (!h.failed) next = std::min(next, h.deadline);
    }
    return next;
  }

  // For each peer whose deadline passed by `now`: drops its messages and
  // calls onExpired(peer, how many were dropped), once per peer. The calls
  // come after the walk over the held peers, so that a callback may send
  // (hold() for a new peer) or connect (release()) without disturbing it.
  template <typename OnExpired>
  void expire(Clock::time_point now, OnExpired&& onExpired) {
    std::vector<std::pair<NodeId, size_t>> expired;
    for (auto& [id, h] : held_) {
      if (h.failed || h.deadline > now) continue;
      h.failed = true;
      expired.emplace_back(id, h.msgs.size());
      h.msgs.clear();
    }
    for (const auto& [id, dropped] : expired) onExpired(id, dropped);
  }

 private:
  struct Held {
    std::deque<Message> msgs;
    Clock::time_point deadline;
    bool failed = false;  // reported; later sends are dropped until connect()
  };

  std::unordered_map<NodeId, Held> held_;
};

}  // namespace cortado::transport
