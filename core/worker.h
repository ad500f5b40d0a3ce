// The worker engine: what a training process (through a binding or the C++
// API) uses to sum tensors across workers.
//
// A tensor is declared once (name, dtype, element count); the scheduler checks
// that every worker declares the same thing and hands out a job-wide key. Each
// pushPull() splits the tensor into chunks, placed on servers with the bytes
// balanced, and queues the chunks by priority (higher first; bindings use
// -layer index so the layers that the next forward pass needs come first).
// A dispatcher thread sends chunks while the bytes in flight stay under the
// credit bound; responses are copied (and averaged) into the output on the
// transport's thread, and the handle completes when every chunk is back.
//
// Errors: misuse (undeclared tensor, wrong size or dtype, a second pushPull of
// a tensor that is still in flight) throws cortado::Error at once. Failures
// (a server's error reply, a dead peer, the job aborted by the scheduler)
// complete the handles with a Status that names the tensor and the peer.
#pragma once

#include <memory>
#include <string>

#include "core/common/deadline.h"
#include "core/common/dtype.h"
#include "core/common/error.h"
#include "core/control/control_client.h"
#include "core/transport/transport.h"

namespace cortado {

enum class ReduceOp { kSum, kAverage };

struct WorkerOptions {
  uint64_t partitionBytes = 4ull << 20;    // chunk size
  uint64_t maxBytesInFlight = 64ull << 20; // credits: pushed but not yet pulled
  bool async = false;                      // servers in async mode
  std::string listenAddress = "tcp://127.0.0.1:0";
  // Same-host servers get pushes and send sums through shared memory
  // (core/shm); servers on other hosts always get bytes.
  bool sharedMemory = true;
};

// The completion of one pushPull. Cheap to copy; all copies share the state.
class Handle {
 public:
  struct State;
  Handle() = default;
  explicit Handle(std::shared_ptr<State> s) : state_(std::move(s)) {}

  bool valid() const { return state_ != nullptr; }
  // True once the operation completed, successfully or not.
  bool poll() const;
  // Waits until completion or the deadline. Returns the operation's Status,
  // or kTimeout naming the tensor when the deadline passed first (the
  // operation goes on; wait again to see it finish).
  Status wait(Deadline deadline) const;
  const std::string& tensorName() const;

 private:
  std::shared_ptr<State> state_;
};

class Worker {
 public:
  // Listens on the transport, connects and registers with the scheduler,
  // and connects to every server. Throws Error on failure (timeout naming
  // the scheduler, a refused token, a port in use).
  static std::unique_ptr<Worker> start(WorkerOptions opts, control::ClientOptions control,
                                       std::unique_ptr<transport::Transport> transport,
                                       Deadline deadline);
  virtual ~Worker() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;  // number of workers
  virtual int numServers() const = 0;

  // Declares a tensor (blocks until every worker declared it). Declaring the
  // same name again with the same shape returns the same key; with another
  // shape it throws Error(kInvalidArgument).
  virtual uint64_t declare(const std::string& name, DType dtype, uint64_t numElements,
                           Deadline deadline) = 0;
  virtual bool isDeclared(const std::string& name) const = 0;

  // Sums `input` across workers into `output` (may be the same memory).
  // Both must hold the declared element count and stay valid and untouched
  // until the handle completes.
  virtual Handle pushPull(const std::string& name, DType dtype, uint64_t numElements,
                          const void* input, void* output, ReduceOp op, int priority) = 0;

  virtual void barrier(Deadline deadline) = 0;

  // The first failure, or OK.
  virtual Status failure() const = 0;

  // Orderly end: tells the scheduler this worker is done and waits for the
  // job's shutdown (every worker done) until the deadline, then closes.
  virtual void shutdown(Deadline deadline) = 0;
};

}  // namespace cortado
