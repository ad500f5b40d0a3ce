// The queue through which other threads hand work to a transport's loop
// thread: sends and tasks, woken through an eventfd that the loop polls next
// to its sockets or workers. Shared by the ZeroMQ and UCX transports, whose
// sockets and workers belong to their loop thread; the loop takes the queue
// in batches and runs them in order.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/transport/loop_call.h"
#include "core/transport/transport.h"

namespace cortado::transport {

class OpQueue {
 public:
  // A send (task empty) or a task for the loop.
  struct Op {
    NodeId peer;
    Message msg;
    std::function<void()> task;
  };

  // `who` names the transport in messages ("zmq w0").
  explicit OpQueue(std::string who) : who_(std::move(who)) {}

  // The eventfd that the loop polls; the owner creates and closes it, and
  // sets it before anything is posted.
  void setWakeFd(int fd) { efd_ = fd; }

  // Queues `op` and wakes the loop; false (and `op` dropped) once closed.
  bool post(Op op) {
    std::lock_guard g(mu_);
    if (closed_) return false;
    // The loop reads the eventfd before it takes the queue, so a wake-up is
    // needed only when the queue was empty.
    bool wasEmpty = ops_.empty();
    ops_.push_back(std::move(op));
    if (wasEmpty) wake();
    return true;
  }

  bool postTask(std::function<void()> task) {
    Op op;
    op.task = std::move(task);
    return post(std::move(op));
  }

  // Transport::send(). On the loop thread (`onLoop`), `sendNow(peer, msg)`
  // goes first: it writes `msg` at once and returns true, or returns false
  // and leaves `msg` for the queue (see mayWriteNow()). Throws kClosed once
  // the queue is closed.
  template <typename SendNow>
  void send(bool onLoop, const NodeId& peer, Message msg, SendNow&& sendNow) {
    if (onLoop && sendNow(peer, msg)) return;
    Op op;
    op.peer = peer;
    op.msg = std::move(msg);
    CORTADO_ENFORCE(post(std::move(op)), ErrorCode::kClosed, "{}: send to {} after close()", who_,
                    peer);
  }

  // Transport::sendAll(): from the loop thread one send() each; from another
  // thread all of `msgs` under one lock and with at most one wake-up.
  template <typename SendNow>
  void sendAll(bool onLoop, const NodeId& peer, std::vector<Message> msgs, SendNow&& sendNow) {
    if (onLoop) {
      for (auto& m : msgs) send(true, peer, std::move(m), sendNow);
      return;
    }
    std::lock_guard g(mu_);
    CORTADO_ENFORCE(!closed_, ErrorCode::kClosed, "{}: send to {} after close()", who_, peer);
    const bool wasEmpty = ops_.empty();
    for (auto& m : msgs) {
      Op op;
      op.peer = peer;
      op.msg = std::move(m);
      ops_.push_back(std::move(op));
    }
    if (wasEmpty && !msgs.empty()) wake();
  }

  // For a send from the loop thread: true when nothing that other threads
  // posted earlier still waits here, so a message may be written at once
  // without overtaking them (order per sender is the contract; the owner
  // also checks the batch it is running). Throws kClosed once closed.
  bool mayWriteNow(const NodeId& peer) {
    std::lock_guard g(mu_);
    CORTADO_ENFORCE(!closed_, ErrorCode::kClosed, "{}: send to {} after close()", who_, peer);
    return ops_.empty();
  }

  // Runs `fn` on the loop from another thread and waits for it
  // (core/transport/loop_call.h); `what` names the call.
  std::string call(std::function<std::string()> fn, const std::string& what, Millis timeout) {
    return callOnLoopThread(
        [this](std::function<void()> task) { return postTask(std::move(task)); }, std::move(fn),
        who_, what, timeout);
  }

  // Whether nothing is queued (another thread may queue right after).
  bool idle() {
    std::lock_guard g(mu_);
    return ops_.empty();
  }

  // Wakes the loop without queueing anything.
  void wakeLoop() { wake(); }

  // The loop's side: everything queued so far, into the empty `batch`.
  void takeAll(std::deque<Op>& batch) {
    std::lock_guard g(mu_);
    batch.swap(ops_);
  }

  // Transport::close(): refuses further posts and wakes the loop. False when
  // the queue was closed already (nothing done).
  bool close() {
    std::lock_guard g(mu_);
    if (closed_) return false;
    closed_ = true;
    wake();
    return true;
  }

  // The loop's end (or a failed start): refuses further posts and drops what
  // is queued, which breaks the promise of a call() still waiting.
  void closeAndClear() {
    std::lock_guard g(mu_);
    closed_ = true;
    ops_.clear();
  }

 private:
  void wake() {
    uint64_t one = 1;
    ssize_t n = ::write(efd_, &one, sizeof(one));
    (void)n;  // only fails when the counter is saturated, which still wakes
  }

  const std::string who_;
  int efd_ = -1;
  std::mutex mu_;
  std::deque<Op> ops_;
  bool closed_ = false;
};

}  // namespace cortado::transport
