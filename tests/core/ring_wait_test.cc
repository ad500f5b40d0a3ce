// Workers and servers with shared-memory rings in front of the in-process
// transport (core/transport/shmring), as on one host: a thread that waits on
// a handle takes the answers from its worker's ring itself
// (Transport::receiveWhileWaiting, WaitReceiver in core/worker_impl.h).
// Sums are checked against plain sums; a watching wrapper counts which
// answers were taken on the test's waiting threads.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <functional>
#include <thread>

#include <unistd.h>

#include "core/shm/job_threads.h"
#include "core/transport/shmring/factory.h"
#include "core/worker.h"
#include "engine_job.h"
#include "tests/common/forwarding_transport.h"

namespace cortado {
namespace {

using test::Job;

Deadline soon() { return Deadline::after(Millis(20000)); }

// Set on the test's threads that wait on handles.
thread_local bool tlsWaiter = false;

// A worker's transport, watched: counts the messages delivered on a waiting
// thread of the test and on other threads (the ring thread, the in-process
// transport's).
class CountDeliveries final : public test::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override {
    inner().setCallbacks(
        [this, onRecv = std::move(onRecv)](transport::Message&& m) {
          ++(tlsWaiter ? onWaiter : onOthers);
          onRecv(std::move(m));
        },
        std::move(onError));
  }

  std::atomic<uint64_t> onWaiter{0}, onOthers{0};
};

// A server's transport, watched: keeps a copy of the engine's expecting()
// (Transport::setExpecting) for the test to call.
class KeepExpecting final : public test::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  void setExpecting(std::function<bool()> e) override {
    expecting = e;
    inner().setExpecting(std::move(e));
  }

  std::function<bool()> expecting;
};

// The polls: the servers' ring threads' while a worker waits for an answer
// (RingOptions::pollWhileExpecting) and the workers' waiting threads'
// (RingOptions::waiterPoll), each with its gate (spareCpu).
struct Polls {
  std::chrono::microseconds bound{0};
  std::function<bool()> serverSpare, waiterSpare;  // nullptr: the machine's gate
  bool yieldPolls = false;  // RingOptions::yieldPolls
};

// A job whose nodes all have rings (one host), each worker's and server's
// watched.
struct RingJob {
  std::string prefix;
  std::vector<CountDeliveries*> watch;
  std::vector<KeepExpecting*> servers;
  std::unique_ptr<Job> job;

  RingJob(int W, int S, const WorkerOptions& wo, bool waiterReceives, Polls poll = {})
      : watch(W, nullptr), servers(S, nullptr) {
    static std::atomic<int> jobs{0};
    prefix = fmt::format("/cortado-ringwait-{}-{}", ::getpid(), jobs++);
    auto ring = [this, waiterReceives, poll](std::unique_ptr<transport::Transport> t,
                                             bool server) {
      transport::shmring::RingOptions o;
      o.prefix = prefix;
      o.host = "ring-wait-test";
      o.waiterReceives = waiterReceives;
      o.pollWhileExpecting = server ? poll.bound : std::chrono::microseconds(0);
      o.waiterPoll = server ? std::chrono::microseconds(0) : poll.bound;
      o.spareCpu = server ? poll.serverSpare : poll.waiterSpare;
      o.yieldPolls = poll.yieldPolls;
      return transport::shmring::create(std::move(t), o);
    };
    job = std::make_unique<Job>(
        W, S, wo, /*async=*/false, /*shm=*/true, server::ServerEngineOptions{}.inlineBytes,
        /*serverCompact=*/true,
        [this, ring](int w, std::unique_ptr<transport::Transport> t) {
          auto c = std::make_unique<CountDeliveries>(ring(std::move(t), false));
          watch[w] = c.get();
          return c;
        },
        /*serverPushBudget=*/0, [this, ring](int s, std::unique_ptr<transport::Transport> t) {
          auto k = std::make_unique<KeepExpecting>(ring(std::move(t), true));
          servers[s] = k.get();
          return k;
        });
  }
  Job& operator*() { return *job; }
};

float value(int rank, int round, uint64_t i) {
  return float((rank * 7 + round * 3 + int(i % 11)) % 9) - 4;
}

// What every worker's push_pull of `n` elements sums to, by plain addition.
std::vector<float> plainSum(int W, int round, uint64_t n) {
  std::vector<float> s(n, 0.0f);
  for (int r = 0; r < W; ++r)
    for (uint64_t i = 0; i < n; ++i) s[i] += value(r, round, i);
  return s;
}

class RingWait : public ::testing::TestWithParam<bool> {};

// A 4 KiB tensor (one chunk, its messages in the rings), one of several
// chunks over both servers, and an fp16 one whose pushes and answers are
// too big for a slot (the fallback transport): every round's sums are the
// plain sums, and with waiterReceives the waiting threads took answers
// themselves (without it, none).
TEST_P(RingWait, PushPullAnswersSumExactly) {
  const bool waiterReceives = GetParam();
  const int W = 4;
  WorkerOptions wo;
  wo.partitionBytes = 4096;
  RingJob rj(W, 2, wo, waiterReceives);
  Job& job = *rj;
  struct T {
    const char* name;
    uint64_t n;
    const char* codec;
  };
  const T tensors[] = {{"small", 1024, ""}, {"chunks", 5000, ""}, {"half", 1024, "fp16"}};
  constexpr int kRounds = 60;
  job.onEveryWorker([&](int r) {
    tlsWaiter = true;
    Worker& w = *job.workers[r];
    for (const T& t : tensors)
      w.declare(t.name, DType::kFloat32, t.n, TensorOptions{.codec = t.codec}, soon());
    for (int round = 0; round < kRounds; ++round) {
      for (const T& t : tensors) {
        std::vector<float> in(t.n), out(t.n, -99.0f);
        for (uint64_t i = 0; i < t.n; ++i) in[i] = value(r, round, i);
        Status s = w.pushPull(t.name, DType::kFloat32, t.n, in.data(), out.data(), ReduceOp::kSum, 0)
                       .wait(soon());
        ASSERT_TRUE(s.ok()) << t.name << " round " << round << ": " << s.message();
        const std::vector<float> want = plainSum(W, round, t.n);
        for (uint64_t i = 0; i < t.n; ++i)
          ASSERT_EQ(out[i], want[i]) << t.name << " round " << round << " element " << i;
      }
    }
  });
  for (int r = 0; r < W; ++r) {
    EXPECT_GT(rj.watch[r]->onWaiter + rj.watch[r]->onOthers, 0u);
    if (waiterReceives) {
      EXPECT_GT(rj.watch[r]->onWaiter.load(), 0u)
          << "worker " << r << ": no answer was taken by the waiting thread";
    } else {
      EXPECT_EQ(rj.watch[r]->onWaiter.load(), 0u)
          << "worker " << r << ": waiterReceives off, yet the waiting thread took answers";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rings, RingWait, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("WaiterReceives")
                                          : std::string("RingThreadReceives");
                         });

// The servers' ring threads poll for the next push while a worker waits
// for a round's answer (the engine's expecting()), and the workers'
// waiting threads poll for their answers, here whenever asked (the gates
// always open) and never (always closed, so every poll gives up at its
// first look): every round's sums are the plain sums either way, both
// polls were made, and once every round is answered no server expects
// anything.
TEST(RingWait, ServersAndWaitersPollAndTheSumsHold) {
  for (const bool spare : {true, false}) {
    SCOPED_TRACE(spare ? "a CPU is spare" : "no CPU is spare");
    const int W = 4;
    std::atomic<uint64_t> serverAsked{0}, waiterAsked{0};
    WorkerOptions wo;
    wo.partitionBytes = 4096;
    RingJob rj(W, 2, wo, /*waiterReceives=*/true,
               Polls{std::chrono::microseconds(300),
                     [&serverAsked, spare] {
                       serverAsked.fetch_add(1, std::memory_order_relaxed);
                       return spare;
                     },
                     [&waiterAsked, spare] {
                       waiterAsked.fetch_add(1, std::memory_order_relaxed);
                       return spare;
                     }});
    Job& job = *rj;
    const struct {
      const char* name;
      uint64_t n;
    } tensors[] = {{"small", 1024}, {"chunks", 5000}};
    constexpr int kRounds = 60;
    job.onEveryWorker([&](int r) {
      tlsWaiter = true;
      Worker& w = *job.workers[r];
      for (const auto& t : tensors) w.declare(t.name, DType::kFloat32, t.n, soon());
      for (int round = 0; round < kRounds; ++round) {
        for (const auto& t : tensors) {
          std::vector<float> in(t.n), out(t.n, -99.0f);
          for (uint64_t i = 0; i < t.n; ++i) in[i] = value(r, round, i);
          Status s =
              w.pushPull(t.name, DType::kFloat32, t.n, in.data(), out.data(), ReduceOp::kSum, 0)
                  .wait(soon());
          ASSERT_TRUE(s.ok()) << t.name << " round " << round << ": " << s.message();
          const std::vector<float> want = plainSum(W, round, t.n);
          for (uint64_t i = 0; i < t.n; ++i)
            ASSERT_EQ(out[i], want[i]) << t.name << " round " << round << " element " << i;
        }
      }
    });
    // A server's gate is asked only while a pull waits (the poll looks at
    // expecting() first); 4 workers of 60 rounds of 3 keys leave plenty.
    EXPECT_GT(serverAsked.load(), 0u) << "no server's ring thread polled while a worker waited";
    EXPECT_GT(waiterAsked.load(), 0u) << "no waiting thread polled for its answer";
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(rj.servers[s]->expecting) << "server " << s << " never said what it expects";
      EXPECT_FALSE(rj.servers[s]->expecting())
          << "server " << s << " still expects pushes after every round was answered";
    }
  }
}

// With the job's threads counted (RingOptions::yieldPolls) and the
// machine's own gate, servers and waiting threads poll (spinning, yielding
// to the job's other threads, or not at all, as the machine's load has it):
// every round's sums are the plain sums; while the job runs, every worker
// and server has registered in the job's segment and the threads that took
// messages claimed slots in it; once the job is gone the segment is too.
TEST(RingWait, WithTheJobsThreadsCountedTheSumsHoldAndNothingStays) {
  const int W = 4, S = 2;
  WorkerOptions wo;
  wo.partitionBytes = 4096;
  auto rj = std::make_unique<RingJob>(W, S, wo, /*waiterReceives=*/true,
                                      Polls{std::chrono::microseconds(50), nullptr, nullptr,
                                            /*yieldPolls=*/true});
  const std::string segment = shm::JobThreads::segmentName(rj->prefix);
  Job& job = **rj;
  constexpr int kRounds = 200;
  const uint64_t n = 1024;
  job.onEveryWorker([&](int r) {
    tlsWaiter = true;
    Worker& w = *job.workers[r];
    w.declare("t", DType::kFloat32, n, soon());
    for (int round = 0; round < kRounds; ++round) {
      std::vector<float> in(n), out(n, -99.0f);
      for (uint64_t i = 0; i < n; ++i) in[i] = value(r, round, i);
      Status s = w.pushPull("t", DType::kFloat32, n, in.data(), out.data(), ReduceOp::kSum, 0)
                     .wait(soon());
      ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.message();
      const std::vector<float> want = plainSum(W, round, n);
      for (uint64_t i = 0; i < n; ++i)
        ASSERT_EQ(out[i], want[i]) << "round " << round << " element " << i;
    }
  });
  {
    auto seen = shm::JobThreads::open(rj->prefix);
    ASSERT_TRUE(seen);
    // W + S transports registered, this object too, and at least the
    // servers' ring threads and the workers' waiting threads took slots.
    EXPECT_GE(seen->claimed(), uint32_t(W + S + 1 + W + 1));
  }
  uint64_t onWaiters = 0;
  for (int r = 0; r < W; ++r) onWaiters += rj->watch[r]->onWaiter;
  EXPECT_GT(onWaiters, 0u) << "no waiting thread took an answer";
  rj.reset();
  EXPECT_NE(::access(("/dev/shm" + segment).c_str(), F_OK), 0)
      << segment << " stayed after every transport of the job closed";
}

// Several threads of each worker wait at once, each on its own handle: one
// takes the answers, the others wait for the role or their completion; every
// sum is the plain sum and every wait returns.
TEST(RingWait, ConcurrentWaitersOnSeveralHandles) {
  const int W = 4, kTensors = 6, kRounds = 25;
  RingJob rj(W, 2, WorkerOptions{}, /*waiterReceives=*/true);
  Job& job = *rj;
  auto size = [](int t) { return uint64_t(256 + 250 * t); };
  job.onEveryWorker([&](int r) {
    Worker& w = *job.workers[r];
    for (int t = 0; t < kTensors; ++t)
      w.declare(fmt::format("c{}", t), DType::kFloat32, size(t), soon());
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::vector<float>> in(kTensors), out(kTensors);
      std::vector<Handle> hs;
      for (int t = 0; t < kTensors; ++t) {
        in[t].resize(size(t));
        out[t].assign(size(t), -99.0f);
        for (uint64_t i = 0; i < size(t); ++i) in[t][i] = value(r + t, round, i);
        hs.push_back(w.pushPull(fmt::format("c{}", t), DType::kFloat32, size(t), in[t].data(),
                                out[t].data(), ReduceOp::kSum, t % 3));
      }
      std::vector<std::future<Status>> waits;
      for (int t = 0; t < kTensors; ++t)
        waits.push_back(std::async(std::launch::async, [h = hs[t]] {
          tlsWaiter = true;
          return h.wait(soon());
        }));
      for (int t = 0; t < kTensors; ++t) {
        Status s = waits[t].get();
        ASSERT_TRUE(s.ok()) << "c" << t << " round " << round << ": " << s.message();
        for (uint64_t i = 0; i < size(t); ++i) {
          float want = 0;
          for (int q = 0; q < W; ++q) want += value(q + t, round, i);
          ASSERT_EQ(out[t][i], want) << "c" << t << " round " << round << " element " << i;
        }
      }
    }
  });
  uint64_t onWaiters = 0;
  for (int r = 0; r < W; ++r) onWaiters += rj.watch[r]->onWaiter;
  EXPECT_GT(onWaiters, 0u) << "no waiting thread took an answer";
}

// A wait whose deadline passes before the answer can come (the other
// workers have not pushed) returns kTimeout and hands the role back; the
// answer that comes afterwards, taken by the ring thread, is not lost: the
// next wait returns the plain sum.
TEST(RingWait, ATimedOutWaitLosesNothing) {
  const int W = 3;
  const uint64_t n = 1024;
  RingJob rj(W, 1, WorkerOptions{}, /*waiterReceives=*/true);
  Job& job = *rj;
  std::promise<void> timedOut;
  std::shared_future<void> late = timedOut.get_future().share();
  job.onEveryWorker([&](int r) {
    tlsWaiter = true;
    Worker& w = *job.workers[r];
    w.declare("late", DType::kFloat32, n, soon());
    std::vector<float> in(n), out(n, -99.0f);
    for (uint64_t i = 0; i < n; ++i) in[i] = value(r, 0, i);
    if (r != 0) {
      ASSERT_EQ(late.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    }
    Handle h = w.pushPull("late", DType::kFloat32, n, in.data(), out.data(), ReduceOp::kSum, 0);
    if (r == 0) {
      const auto start = Clock::now();
      Status s = h.wait(Deadline::after(Millis(50)));
      EXPECT_EQ(s.code(), ErrorCode::kTimeout) << s.message();
      EXPECT_GE(Clock::now() - start, Millis(50));
      timedOut.set_value();
      // The others push now; their answer reaches this worker while no
      // thread of it waits.
      std::this_thread::sleep_for(Millis(200));
    }
    Status s = h.wait(soon());
    ASSERT_TRUE(s.ok()) << s.message();
    const std::vector<float> want = plainSum(W, 0, n);
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], want[i]) << "element " << i;
  });
}

}  // namespace
}  // namespace cortado
