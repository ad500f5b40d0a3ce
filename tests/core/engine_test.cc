// The worker and server engines in one process: a real scheduler, S servers
// and W workers as threads, connected by the in-process transport (STYLE.md
// §10). Results are checked against plain summation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <unistd.h>

#include "core/common/half.h"
#include "core/shm/shm_segment.h"
#include "core/transport/inproc/factory.h"
#include "core/wire/data_message.h"
#include "compressor/compact.h"
#include "compressor/registry.h"
#include "core/partition.h"
#include "core/worker.h"
#include "engine_job.h"
#include "tests/common/forwarding_transport.h"
#include "tests/common/topk_reference.h"
#include "send_order_reference.h"
#include "scheduler/scheduler.h"
#include "server/server_engine.h"

namespace cortado {
namespace {

using test::Job;

const Deadline soon() { return Deadline::after(Millis(20000)); }

class EngineSums : public ::testing::TestWithParam<bool> {};

TEST_P(EngineSums, EveryDtypeAcrossWorkers) {
  const int W = 3;
  WorkerOptions wo;
  wo.partitionBytes = 1024;  // many chunks per tensor
  wo.maxBytesInFlight = 4096;
  Job job(W, 2, wo, /*async=*/false, /*shm=*/GetParam());
  const DType types[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                         DType::kBFloat16, DType::kInt32,   DType::kInt64};
  const uint64_t sizes[] = {1, 7, 256, 1000, 5003};
  auto value = [](int r, int it, uint64_t i) { return double((r * 7 + it * 3 + int(i % 11)) % 9) - 4; };
  job.onEveryWorker([&](int r) {
    Worker& w = *job.workers[r];
    for (DType t : types)
      for (uint64_t n : sizes) w.declare(fmt::format("{}.{}", dtypeName(t), n), t, n, soon());
    for (int it = 0; it < 3; ++it) {
      for (DType t : types) {
        for (uint64_t n : sizes) {
          const size_t esz = dtypeSize(t);
          std::vector<uint8_t> in(n * esz), out(n * esz);
          auto put = [&](std::vector<uint8_t>& v, uint64_t i, double x) {
            switch (t) {
              case DType::kFloat32: reinterpret_cast<float*>(v.data())[i] = float(x); break;
              case DType::kFloat64: reinterpret_cast<double*>(v.data())[i] = x; break;
              case DType::kFloat16: reinterpret_cast<uint16_t*>(v.data())[i] = floatToHalf(float(x)); break;
              case DType::kBFloat16: reinterpret_cast<uint16_t*>(v.data())[i] = floatToBf16(float(x)); break;
              case DType::kInt32: reinterpret_cast<int32_t*>(v.data())[i] = int32_t(x); break;
              case DType::kInt64: reinterpret_cast<int64_t*>(v.data())[i] = int64_t(x); break;
              default: break;
            }
          };
          for (uint64_t i = 0; i < n; ++i) put(in, i, value(r, it, i));
          Handle h = w.pushPull(fmt::format("{}.{}", dtypeName(t), n), t, n, in.data(), out.data(),
                                ReduceOp::kSum, 0);
          ASSERT_TRUE(h.wait(soon()).ok());
          EXPECT_TRUE(h.poll());
          std::vector<uint8_t> ref(n * esz);
          for (uint64_t i = 0; i < n; ++i) {
            double s = 0;
            for (int q = 0; q < W; ++q) s += value(q, it, i);
            put(ref, i, s);
          }
          ASSERT_EQ(ref, out) << dtypeName(t) << " n=" << n << " rank " << r;
        }
      }
    }
  });
  // Bytes: nobody made a segment. Shared memory: every worker and server did
  // (so the sums above really went through it).
  if (GetParam())
    EXPECT_GE(job.segments(), W + 2);
  else
    EXPECT_EQ(job.segments(), 0);
}

INSTANTIATE_TEST_SUITE_P(Engine, EngineSums, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "SharedMemory" : "Bytes"; });

// A worker's push regions are taken per send and kept for later sends:
// they hold about the bytes in flight (the credits), not a copy of every
// tensor declared. 8 tensors of 64 KiB in chunks of 16 KiB, a window of 64
// KiB, each pushed and pulled in turn twice with exact sums: each worker's
// segments hold 64 KiB (one tensor's four chunks, reused by every other
// tensor), where a region per chunk held 512 KiB. With a window larger
// than what is declared, the declared bytes bound them.
TEST(Engine, PushRegionsHoldTheBytesInFlightNotEveryTensor) {
  const int W = 2, kTensors = 8;
  const uint64_t n = 16384;  // 64 KiB of floats
  for (uint64_t window : {uint64_t(64) << 10, uint64_t(64) << 20}) {
    SCOPED_TRACE(fmt::format("credits {} bytes", window));
    WorkerOptions wo;
    wo.partitionBytes = 16 << 10;
    wo.maxBytesInFlight = window;
    Job job(W, 1, wo, /*async=*/false, /*shm=*/true);
    job.onEveryWorker([&](int r) {
      Worker& w = *job.workers[r];
      for (int t = 0; t < kTensors; ++t) w.declare(fmt::format("g{}", t), DType::kFloat32, n, soon());
      for (int round = 0; round < 2; ++round) {
        for (int t = 0; t < kTensors; ++t) {
          std::vector<float> in(n), out(n, -1.0f);
          for (uint64_t i = 0; i < n; ++i) in[i] = float((r + 1) * (t + 1) + int(i % 5) + round);
          ASSERT_TRUE(w.pushPull(fmt::format("g{}", t), DType::kFloat32, n, in.data(), out.data(),
                                 ReduceOp::kSum, 0)
                          .wait(soon())
                          .ok());
          for (uint64_t i = 0; i < n; ++i)
            ASSERT_EQ(out[i], float(3 * (t + 1) + W * (int(i % 5) + round))) << t << " " << i;
        }
      }
    });
    const uint64_t declared = kTensors * n * sizeof(float);
    const uint64_t bound = std::min(window, declared);
    for (int r = 0; r < W; ++r) {
      const uint64_t owned = job.ownedSegmentBytes(NodeId{Role::kWorker, r});
      EXPECT_GT(owned, 0u) << "worker " << r;  // the pushes went through shared memory
      EXPECT_LE(owned, bound) << "worker " << r;
    }
  }
}

TEST(Engine, AverageInPlaceAndManyOutstandingHandles) {
  const int W = 4;
  Job job(W, 3, {}, /*async=*/false, /*shm=*/true);
  job.onEveryWorker([&](int r) {
    Worker& w = *job.workers[r];
    const int kTensors = 20;
    std::vector<std::vector<float>> bufs(kTensors);
    for (int t = 0; t < kTensors; ++t) {
      w.declare(fmt::format("p{}", t), DType::kFloat32, 100 + t * 50, soon());
      bufs[t].assign(100 + t * 50, float(r + t));
    }
    std::vector<Handle> hs;
    for (int t = 0; t < kTensors; ++t)
      hs.push_back(w.pushPull(fmt::format("p{}", t), DType::kFloat32, bufs[t].size(), bufs[t].data(),
                              bufs[t].data(), ReduceOp::kAverage, -t));
    for (auto& h : hs) ASSERT_TRUE(h.wait(soon()).ok());
    for (int t = 0; t < kTensors; ++t) {
      float expect = float(0 + 1 + 2 + 3 + 4 * t) * (1.0f / 4);
      for (float v : bufs[t]) ASSERT_EQ(v, expect);
    }
  });
}

// The in-process transport of one worker, watched: it records the server
// and chunk key of every push the worker sends, in order, and holds the
// first push until open() so that the test can queue every push_pull of a
// step before the dispatcher sends anything after it.
class WatchedTransport final : public test::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  void send(const NodeId& peer, transport::Message msg) override {
    std::vector<transport::Message> one;
    one.push_back(std::move(msg));
    sendAll(peer, std::move(one));
  }
  void sendAll(const NodeId& peer, std::vector<transport::Message> msgs) override {
    for (const transport::Message& m : msgs) {
      if (m.parts.size() != 2) continue;
      const wire::DataHeader h = wire::decodeHeader(m.parts[0], m.parts[1].size());
      if (h.op != wire::Op::kPush) continue;
      std::unique_lock<std::mutex> lk(mu_);
      // Only the first push waits; 10 s bound it should the test fail first.
      cv_.wait_for(lk, std::chrono::seconds(10), [&] { return open_ || !pushes_.empty(); });
      pushes_.push_back({peer.rank, h.key});
    }
    inner().sendAll(peer, std::move(msgs));
  }

  void open() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // (server rank, chunk key) of every push so far, in the order sent.
  std::vector<std::pair<int, uint64_t>> pushes() {
    std::lock_guard<std::mutex> lk(mu_);
    return pushes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::vector<std::pair<int, uint64_t>> pushes_;
};

// WorkerOptions::staggerChunks: with every push_pull of a step queued at
// once, each worker sends the tensors by priority (FIFO among equals), as
// without it, and each tensor's chunks in the staggered order of the
// reference (tests/core/send_order_reference.h), so that the workers' first
// pushes of a tensor go to different servers; off, in index order, all to
// one server first. The sums are exact either way.
TEST(Engine, StaggeredChunkOrderKeepsPrioritiesAcrossTensors) {
  struct Tensor {
    std::string name;
    uint64_t n;
    int priority;
  };
  // Queued in this order; 256 floats a chunk. "gate" is sent first and held
  // until the rest are queued.
  const std::vector<Tensor> tensors = {
      {"gate", 10, 10}, {"a", 7 * 256, 0}, {"b", 5 * 256, 5}, {"c", 4 * 256 - 3, 0}, {"d", 100, 5}};
  const std::vector<std::string> sendOrderByPriority = {"gate", "b", "d", "a", "c"};
  for (auto [W, S] : {std::pair{3, 3}, std::pair{4, 3}, std::pair{2, 4}}) {
    for (bool stagger : {false, true}) {
      SCOPED_TRACE(fmt::format("{} workers, {} servers, stagger {}", W, S, stagger));
      WorkerOptions wo;
      wo.partitionBytes = 1024;
      wo.inlineBytes = 0;  // every chunk through the dispatcher
      wo.staggerChunks = stagger;
      std::vector<WatchedTransport*> watched(W);
      Job job(
          W, S, wo, /*async=*/false, /*shm=*/false, server::ServerEngineOptions{}.inlineBytes,
          /*serverCompact=*/true,
          [&](int w,
              std::unique_ptr<transport::Transport> t) -> std::unique_ptr<transport::Transport> {
            auto x = std::make_unique<WatchedTransport>(std::move(t));
            watched[w] = x.get();
            return x;
          });
      std::vector<std::map<uint64_t, std::string>> nameOfKey(W);
      job.onEveryWorker([&](int r) {
        Worker& w = *job.workers[r];
        for (const Tensor& t : tensors)
          nameOfKey[r][w.declare(t.name, DType::kFloat32, t.n, soon())] = t.name;
        std::vector<std::vector<float>> bufs(tensors.size());
        std::vector<Handle> hs;
        for (size_t t = 0; t < tensors.size(); ++t) {
          bufs[t].resize(tensors[t].n);
          for (uint64_t i = 0; i < tensors[t].n; ++i)
            bufs[t][i] = float((r + 1) * int(i % 13) + int(t));
          hs.push_back(w.pushPull(tensors[t].name, DType::kFloat32, tensors[t].n, bufs[t].data(),
                                  bufs[t].data(), ReduceOp::kSum, tensors[t].priority));
        }
        watched[r]->open();
        for (auto& h : hs) ASSERT_TRUE(h.wait(soon()).ok());
        for (size_t t = 0; t < tensors.size(); ++t)
          for (uint64_t i = 0; i < tensors[t].n; ++i)
            ASSERT_EQ(bufs[t][i], float(W * (W + 1) / 2 * int(i % 13) + W * int(t)))
                << tensors[t].name << " element " << i;
      });
      std::vector<int> firstServerOfB;
      for (int r = 0; r < W; ++r) {
        SCOPED_TRACE(fmt::format("worker {}", r));
        const auto pushes = watched[r]->pushes();
        // The tensors in priority order, each one's pushes together.
        std::vector<std::string> order;
        std::map<std::string, std::vector<std::pair<int, uint64_t>>> byTensor;
        for (auto [server, key] : pushes) {
          const std::string& name = nameOfKey[r].at(tensorKeyOf(key));
          if (order.empty() || order.back() != name) order.push_back(name);
          byTensor[name].push_back({server, chunkIndexOf(key)});
        }
        EXPECT_EQ(order, sendOrderByPriority);
        for (const Tensor& t : tensors) {
          const auto& sent = byTensor[t.name];
          const size_t chunks = (t.n + 255) / 256;
          ASSERT_EQ(sent.size(), chunks) << t.name;
          std::vector<int> serverOf(chunks, -1);
          for (auto [server, index] : sent) serverOf.at(index) = server;
          std::vector<size_t> want(chunks);
          for (size_t i = 0; i < chunks; ++i) want[i] = i;
          if (stagger) want = test::staggeredReference(serverOf, r);
          std::vector<size_t> got;
          for (auto [server, index] : sent) got.push_back(index);
          EXPECT_EQ(got, want) << t.name;
        }
        firstServerOfB.push_back(byTensor["b"].front().first);
      }
      // b's 5 chunks start a round on every server: staggered, the first
      // min(W, S) workers start at different servers; plain, all at one.
      std::set<int> distinct(firstServerOfB.begin(), firstServerOfB.end());
      EXPECT_EQ(distinct.size(), stagger ? size_t(std::min(W, S)) : 1u);
      EXPECT_EQ(job.serverStats().errors, 0u);
    }
  }
}

// A credit window smaller than a step's tensors, filled on each worker by
// chunks that the other workers have not pushed: worker 0 pushes its
// tensors in one order, worker 1 in the reverse (equal priorities go first
// come, first served), so with room for one chunk each waits for the
// other's push of the chunk it holds. The dispatcher sends past the window
// when no answer came for a while (WorkerOptions::creditStall), so the step
// completes, with every sum exact, instead of failing at the deadline.
TEST(Engine, CreditWindowsHeldByDifferentChunksStillComplete) {
  const int W = 2;
  WorkerOptions wo;
  wo.partitionBytes = 4096;
  wo.maxBytesInFlight = 4096;  // one chunk
  wo.inlineBytes = 0;          // every chunk through the dispatcher's credits
  Job job(W, 2, wo, /*async=*/false, /*shm=*/false);
  const int kTensors = 6;
  const uint64_t n = 3000;  // 3 chunks each
  job.onEveryWorker([&](int r) {
    Worker& w = *job.workers[r];
    for (int t = 0; t < kTensors; ++t) w.declare(fmt::format("c{}", t), DType::kFloat32, n, soon());
    std::vector<std::vector<float>> bufs(kTensors);
    for (int it = 0; it < 2; ++it) {
      std::vector<Handle> hs(kTensors);
      for (int k = 0; k < kTensors; ++k) {
        const int t = r == 0 ? k : kTensors - 1 - k;
        bufs[t].resize(n);
        for (uint64_t i = 0; i < n; ++i) bufs[t][i] = float(r * 1000 + t * 10 + it + int(i % 7));
        hs[t] = w.pushPull(fmt::format("c{}", t), DType::kFloat32, n, bufs[t].data(),
                           bufs[t].data(), ReduceOp::kSum, 0);
      }
      for (auto& h : hs) ASSERT_TRUE(h.wait(soon()).ok());
      for (int t = 0; t < kTensors; ++t)
        for (uint64_t i = 0; i < n; ++i)
          ASSERT_EQ(bufs[t][i], float(0 * 1000 + 1 * 1000 + 2 * (t * 10 + it + int(i % 7))))
              << "tensor " << t << " element " << i;
    }
  });
}

// The latency paths (WorkerOptions::inlineBytes and busyPoll,
// ServerEngineOptions::inlineBytes): tensors of one small chunk sent by the
// calling thread and summed on the servers' transport threads, side by side
// with multi-chunk tensors that go through the dispatcher and the engine
// threads, all outstanding at once in priority order, with and without shared
// memory and busy polling, sum exactly as with every hand-off (inline off).
TEST(Engine, InlineAndHandedOffPathsSumExactly) {
  struct Case {
    uint64_t workerInline, serverInline;
    int busyPollUs;
    bool shm;
  };
  const std::vector<Case> cases = {{0, 0, 0, false},
                                   {64 << 10, 64 << 10, 0, false},
                                   {64 << 10, 64 << 10, 0, true},
                                   {uint64_t(1) << 30, uint64_t(1) << 30, 300, true}};
  // 16384 floats are 64 KiB, the default bound; 100000 floats are two chunks.
  const std::vector<uint64_t> sizes = {1, 1000, 16384, 16385, 100000};
  const int W = 3, kRounds = 4;
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("worker inline {}, server inline {}, busy poll {} us, shm {}",
                             c.workerInline, c.serverInline, c.busyPollUs, c.shm));
    WorkerOptions wo;
    wo.partitionBytes = 256 << 10;
    wo.inlineBytes = c.workerInline;
    wo.busyPoll = std::chrono::microseconds(c.busyPollUs);
    Job job(W, 2, wo, /*async=*/false, c.shm, c.serverInline);
    job.onEveryWorker([&](int r) {
      Worker& w = *job.workers[r];
      for (uint64_t n : sizes) w.declare(fmt::format("t{}", n), DType::kFloat32, n, soon());
      std::vector<std::vector<float>> in(sizes.size()), out(sizes.size());
      for (int round = 0; round < kRounds; ++round) {
        std::vector<Handle> hs;
        for (size_t t = 0; t < sizes.size(); ++t) {
          in[t].resize(sizes[t]);
          out[t].assign(sizes[t], -1.0f);
          for (uint64_t i = 0; i < sizes[t]; ++i) in[t][i] = float((r + 1) * (i % 7 + 1) + round);
          hs.push_back(w.pushPull(fmt::format("t{}", sizes[t]), DType::kFloat32, sizes[t],
                                  in[t].data(), out[t].data(), ReduceOp::kSum, int(t % 3)));
        }
        for (auto& h : hs) ASSERT_TRUE(h.wait(soon()).ok());
        for (size_t t = 0; t < sizes.size(); ++t) {
          for (uint64_t i = 0; i < sizes[t]; ++i) {
            // sum over ranks of (rank + 1) * (i % 7 + 1) + round
            const float want = float(W * (W + 1) / 2 * (i % 7 + 1) + W * round);
            ASSERT_EQ(out[t][i], want)
                << "tensor of " << sizes[t] << " elements, element " << i << ", round " << round;
          }
        }
      }
    });
    auto st = job.serverStats();
    EXPECT_EQ(st.errors, 0u);
    EXPECT_EQ(st.roundsCompleted, uint64_t(kRounds) * (sizes.size() + 1));  // 100000: 2 chunks
    // Every push and pull of a key within the bound found its shard idle or
    // waited in its queue; none of a larger key was processed inline.
    const uint64_t messages = st.pushes + st.pulls;
    if (c.serverInline == 0) {
      EXPECT_EQ(st.inlined, 0u);
    } else if (c.serverInline >= (1u << 30)) {
      EXPECT_GT(st.inlined, 0u);
      EXPECT_LE(st.inlined, messages);
    } else {
      EXPECT_GT(st.inlined, 0u);
      // 16385- and 100000-element keys (3 keys, 2 messages per worker and
      // round each) are always handed off.
      EXPECT_LE(st.inlined, messages - uint64_t(3 * 2 * W * kRounds));
    }
  }
}

// Worker::release: a key's server state goes once every worker that pushes
// it has released it, not before; a released tensor refuses new rounds;
// a round in flight refuses the release.
TEST(Engine, ReleasedTensorsAreFreedOnceEveryWorkerReleasedThem) {
  WorkerOptions wo;
  wo.partitionBytes = 64;  // 40 floats: 3 chunks
  Job job(2, 2, wo);
  const uint64_t n = 40;
  job.onEveryWorker([&](int r) {
    job.workers[r]->declare("t", DType::kFloat32, n, soon());
    job.workers[r]->declare("v", DType::kFloat32, n, soon());
    for (int round = 0; round < 2; ++round) {
      std::vector<float> in(n), out(n);
      for (uint64_t i = 0; i < n; ++i) in[i] = float((r + 1) * i + round);
      ASSERT_TRUE(job.workers[r]->pushPull("t", DType::kFloat32, n, in.data(), out.data(),
                                           ReduceOp::kSum, 0).wait(soon()).ok());
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], float(3 * i + 2 * round)) << i;
    }
  });
  const size_t chunks = job.workers[0]->chunks("t").size();
  ASSERT_EQ(chunks, 3u);
  server::ServerStats s = job.waitServers([&](const auto& x) { return x.keys == chunks; });
  EXPECT_EQ(s.keys, chunks);
  job.workers[0]->release("t");
  job.workers[0]->release("t");  // twice: harmless, still one of two workers
  std::vector<float> in(n, 1.0f), out(n);
  try {
    job.workers[0]->pushPull("t", DType::kFloat32, n, in.data(), out.data(), ReduceOp::kSum, 0);
    ADD_FAILURE() << "a released tensor started a round";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'t' was released"), std::string::npos) << e.what();
  }
  // One release of two frees nothing (given time to be wrongly acted on).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  s = job.serverStats();
  EXPECT_EQ(s.keysReleased, 0u);
  EXPECT_EQ(s.keys, chunks);
  // A round in flight (worker 1 has not pushed "v"): the release is refused.
  Handle h = job.workers[0]->pushPull("v", DType::kFloat32, n, in.data(), out.data(),
                                      ReduceOp::kSum, 0);
  try {
    job.workers[0]->release("v");
    ADD_FAILURE() << "released a tensor with a round in flight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in flight"), std::string::npos) << e.what();
  }
  std::vector<float> in1(n, 2.0f), out1(n);
  ASSERT_TRUE(job.workers[1]->pushPull("v", DType::kFloat32, n, in1.data(), out1.data(),
                                       ReduceOp::kSum, 0).wait(soon()).ok());
  ASSERT_TRUE(h.wait(soon()).ok());
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 3.0f);
  // The second worker's release frees the three chunks of "t" only.
  job.workers[1]->release("t");
  s = job.waitServers([&](const auto& x) { return x.keysReleased >= chunks; });
  EXPECT_EQ(s.keysReleased, chunks);
  EXPECT_EQ(s.keys, chunks);  // "v"'s
  EXPECT_EQ(s.errors, 0u);
}

// Declaring a released name again makes a new tensor (another shape and a
// codec here) with new keys; the old keys are freed on the servers, none is
// reused, and the new tensor sums right.
TEST(Engine, AReleasedNameDeclaredAgainIsANewTensor) {
  WorkerOptions wo;
  wo.partitionBytes = 64;
  Job job(2, 2, wo);
  const uint64_t n = 40, m = 24;
  std::vector<uint64_t> keys(2);
  job.onEveryWorker([&](int r) {
    Worker& w = *job.workers[r];
    const uint64_t first = w.declare("t", DType::kFloat32, n, soon());
    std::vector<float> in(n, float(r + 1)), out(n);
    ASSERT_TRUE(w.pushPull("t", DType::kFloat32, n, in.data(), out.data(), ReduceOp::kSum, 0)
                    .wait(soon()).ok());
    for (float v : out) ASSERT_EQ(v, 3.0f);
    w.release("t");
    TensorOptions o;
    o.codec = "fp16";
    keys[r] = w.declare("t", DType::kFloat32, m, o, soon());
    EXPECT_NE(keys[r], first);
    EXPECT_EQ(w.declare("t", DType::kFloat32, m, o, soon()), keys[r]);  // again, not released: the same
    for (int round = 0; round < 2; ++round) {
      std::vector<float> in2(m), out2(m);
      for (uint64_t i = 0; i < m; ++i) in2[i] = float((r + 1) * i + round);
      ASSERT_TRUE(w.pushPull("t", DType::kFloat32, m, in2.data(), out2.data(), ReduceOp::kSum, 0)
                      .wait(soon()).ok());
      for (uint64_t i = 0; i < m; ++i) ASSERT_EQ(out2[i], float(3 * i + 2 * round)) << i;
    }
  });
  EXPECT_EQ(keys[0], keys[1]);
  const size_t oldChunks = 3;  // 40 floats in 64-byte chunks
  server::ServerStats s = job.waitServers([&](const auto& x) { return x.keysReleased >= oldChunks; });
  EXPECT_EQ(s.keysReleased, oldChunks);
  EXPECT_EQ(s.keys, job.workers[0]->chunks("t").size());
  EXPECT_EQ(s.errors, 0u);
}

TEST(Engine, AsyncModeAppliesEachPush) {
  Job job(1, 2, {}, /*async=*/true);
  Worker& w = *job.workers[0];
  w.declare("x", DType::kFloat32, 3000, soon());
  std::vector<float> in(3000), out(3000);
  for (int it = 1; it <= 4; ++it) {
    std::fill(in.begin(), in.end(), float(it));
    ASSERT_TRUE(w.pushPull("x", DType::kFloat32, 3000, in.data(), out.data(), ReduceOp::kSum, 0).wait(soon()).ok());
    // The running sum of all pushes (exact: it(it+1) is even).
    // NOLINTNEXTLINE(bugprone-integer-division)
    float expect = float(it * (it + 1) / 2);
    for (float v : out) ASSERT_EQ(v, expect);
  }
}

TEST(Engine, MisuseThrowsWithContext) {
  Job job(2, 1);
  Worker& w = *job.workers[0];
  std::vector<float> buf(10);
  auto expectError = [](auto&& f, const std::string& needle) {
    try {
      f();
      FAIL() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expectError([&] { w.pushPull("nope", DType::kFloat32, 10, buf.data(), buf.data(), ReduceOp::kSum, 0); },
              "never declared");
  job.onEveryWorker([&](int r) { job.workers[r]->declare("a", DType::kFloat32, 10, soon()); });
  expectError([&] { w.pushPull("a", DType::kFloat32, 9, buf.data(), buf.data(), ReduceOp::kSum, 0); },
              "declared with 10 elements");
  expectError([&] { w.pushPull("a", DType::kInt32, 10, buf.data(), buf.data(), ReduceOp::kSum, 0); },
              "float32");
  expectError([&] { w.declare("a", DType::kFloat32, 11, soon()); }, "keep its shape");
  // Only worker 0 pushes: its handle waits, and a deadline says so.
  Handle h = w.pushPull("a", DType::kFloat32, 10, buf.data(), buf.data(), ReduceOp::kSum, 0);
  expectError([&] { w.pushPull("a", DType::kFloat32, 10, buf.data(), buf.data(), ReduceOp::kSum, 0); },
              "already has a push_pull in flight");
  Status s = h.wait(Deadline::after(Millis(200)));
  EXPECT_EQ(s.code(), ErrorCode::kTimeout);
  EXPECT_NE(s.message().find("'a'"), std::string::npos);
  // Worker 1 catches up; both complete.
  std::vector<float> other(10, 1.0f);
  Handle h1 = job.workers[1]->pushPull("a", DType::kFloat32, 10, other.data(), other.data(), ReduceOp::kSum, 0);
  EXPECT_TRUE(h.wait(soon()).ok());
  EXPECT_TRUE(h1.wait(soon()).ok());
}

TEST(Engine, DeclarationMismatchFailsEveryWorker) {
  Job job(2, 1);
  std::vector<std::string> errors(2);
  job.onEveryWorker([&](int r) {
    try {
      job.workers[r]->declare("w", DType::kFloat32, 100 + r, soon());
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (auto& e : errors) {
    EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  }
}

// Compressed tensors (docs/codecs.md). With one worker the server's sum is
// the decoded push, and for the deterministic codecs its answer decodes to
// decode(encode(x)): fp16 and bf16 round once and top-k and DGC come back
// losslessly (exactly equal), and the sign codecs are idempotent up to the
// rounding of a mean (the signs survive a second encode exactly). The reference is the codec library used
// directly, on the whole chunk.
TEST(Engine, CompressedRoundTripThroughTheServerPerCodec) {
  WorkerOptions wo;
  wo.partitionBytes = 256;  // every codec's tensor spans chunks
  Job job(1, 2, wo);
  Worker& w = *job.workers[0];
  compressor::Registry reg;
  compressor::registerCpuCodecs(reg);
  const uint64_t n = 5000;
  std::vector<float> x(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (auto& v : x) v = d(rng);
  for (std::string spec : {"fp16", "bf16", "onebit", "signsgd", "efsignsgd", "topk:ratio=0.01",
                           "dgc:ratio=0.01"}) {
    SCOPED_TRACE(spec);
    w.declare(spec, DType::kFloat32, n, TensorOptions{.codec = spec, .errorFeedback = false},
              soon());
    std::vector<float> out(n, -1.0f);
    ASSERT_TRUE(w.pushPull(spec, DType::kFloat32, n, x.data(), out.data(), ReduceOp::kSum, 0)
                    .wait(soon())
                    .ok());
    auto codec = reg.create(spec);
    std::vector<float> expect(n);
    // Per chunk, as the partitioner cuts them: by the payload's size (fp16 40
    // chunks, the signs 3, top-k and DGC 2).
    auto chunks = ServerPlacement(2).place(0, n, 4, wo.partitionBytes, codec->payloadBytes(n));
    ASSERT_GE(chunks.size(), 2u);
    ASSERT_EQ(w.chunks(spec).size(), chunks.size());
    for (const Chunk& c : chunks) {
      std::vector<std::byte> p(codec->payloadBytes(c.numElements));
      codec->encode(x.data() + c.offset, c.numElements, p, {});
      codec->decode(p, expect.data() + c.offset, c.numElements);
    }
    const bool signCodec = codec->id() == compressor::CodecId::kOneBit ||
                           codec->id() == compressor::CodecId::kSignSgd ||
                           codec->id() == compressor::CodecId::kEfSignSgd;
    if (!signCodec) {
      ASSERT_EQ(out, expect);
      continue;
    }
    // The server's re-encode averages values that are all equal: the mean
    // comes back within a few float roundings of them, and every sign exactly.
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::signbit(out[i]), std::signbit(expect[i])) << i;
      ASSERT_NEAR(out[i], expect[i], 1e-5 * std::fabs(expect[i])) << i;
    }
  }
}

// Top-k and DGC through real servers with the compact wire form on and off,
// on the workers and on the servers in every combination: every round's
// result is the plain sum of what each worker's codec selected (integer
// values, so the servers' order of addition cannot show), bit for bit the
// same whatever the setting; the workers count what they pushed, which is
// the payloads' plain size with compaction off and their compact size
// (counted here from the same payloads) with it on; and less comes back.
TEST(Engine, CompactSparsePayloadsSumExactlyAsPlainOnesAndCountTheirBytes) {
  const int W = 3;
  const uint64_t n = 100000;
  compressor::Registry reg;
  compressor::registerCpuCodecs(reg);
  const std::vector<std::string> specs = {"topk:ratio=0.05", "dgc:ratio=0.05",
                                          "topk:ratio=0.0005"};
  auto input = [&](int r, int round, uint64_t i) {
    // Distinct magnitudes per worker and round; integers sum exactly.
    return float(int64_t((i * 7919 + uint64_t(r) * 104729 + uint64_t(round) * 1299709) % 200003) -
                 100001);
  };
  // Cut by the payloads' size: top-k and DGC at 5% in 5 chunks, top-k at
  // 0.05% in one.
  const uint64_t partition = 8192;
  std::map<std::string, std::vector<Chunk>> chunksOf;
  for (const auto& spec : specs)
    chunksOf[spec] =
        ServerPlacement(2).place(0, n, 4, partition, reg.create(spec)->payloadBytes(n));
  ASSERT_EQ(chunksOf.at(specs[0]).size(), 5u);
  // The reference: per round and codec, the plain sum, and each worker's
  // payload bytes plain and compact.
  std::map<std::pair<int, std::string>, std::vector<float>> sums;
  std::map<std::string, std::vector<uint64_t>> plainBytes, compactBytes;  // per worker
  for (const auto& spec : specs) {
    auto codec = reg.create(spec);
    const auto& chunks = chunksOf.at(spec);
    plainBytes[spec].assign(W, 0);
    compactBytes[spec].assign(W, 0);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> sum(n, 0.0f);
      for (int r = 0; r < W; ++r) {
        std::vector<float> x(n);
        for (uint64_t i = 0; i < n; ++i) x[i] = input(r, round, i);
        for (const Chunk& c : chunks) {
          std::vector<std::byte> p(codec->payloadBytes(c.numElements));
          codec->encode(x.data() + c.offset, c.numElements, p, {});
          std::vector<float> part(c.numElements);
          codec->decode(p, part.data(), c.numElements);
          for (uint64_t i = 0; i < c.numElements; ++i) sum[c.offset + i] += part[i];
          plainBytes[spec][r] += p.size();
          const size_t cb = compressor::compactBytes(p);
          ASSERT_GT(cb, 0u);
          compactBytes[spec][r] += std::min(cb, p.size());
        }
      }
      sums[{round, spec}] = sum;
    }
  }
  std::vector<uint64_t> pulledPlain;  // with the servers' compaction off
  for (bool workerCompact : {false, true}) {
    for (bool serverCompact : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "workers compact " << workerCompact << ", servers "
                                        << serverCompact);
      WorkerOptions wo;
      wo.partitionBytes = partition;
      wo.compactSparse = workerCompact;
      Job job(W, 2, wo, false, false, server::ServerEngineOptions{}.inlineBytes, serverCompact);
      std::vector<uint64_t> pulled(W);
      job.onEveryWorker([&](int r) {
        Worker& w = *job.workers[r];
        for (const auto& spec : specs)
          w.declare(spec, DType::kFloat32, n, TensorOptions{.codec = spec, .errorFeedback = false},
                    soon());
        for (const auto& spec : specs) {
          const uint64_t before = w.pushedBytes();
          for (int round = 0; round < 3; ++round) {
            std::vector<float> x(n), out(n, std::nanf(""));
            for (uint64_t i = 0; i < n; ++i) x[i] = input(r, round, i);
            Handle h = w.pushPull(spec, DType::kFloat32, n, x.data(), out.data(), ReduceOp::kSum, 0);
            Status s = h.wait(soon());
            ASSERT_TRUE(s.ok()) << spec << ": " << s.message();
            ASSERT_EQ(out, sums.at({round, spec})) << spec << " round " << round;
            EXPECT_GT(h.pushedBytes(), 0u);
          }
          EXPECT_EQ(w.pushedBytes() - before,
                    (workerCompact ? compactBytes : plainBytes).at(spec)[r])
              << spec << " worker " << r;
        }
        pulled[r] = w.pulledBytes();
      });
      if (!serverCompact) {
        pulledPlain = pulled;
      } else {
        for (int r = 0; r < W; ++r) EXPECT_LT(pulled[r], pulledPlain[r]) << "worker " << r;
      }
    }
  }
  // About 5 bytes a kept element against 8 at 5%.
  for (int r = 0; r < W; ++r)
    EXPECT_LT(double(compactBytes["topk:ratio=0.05"][r]),
              0.66 * double(plainBytes["topk:ratio=0.05"][r]));
}

// Stochastic codecs and error feedback through two workers and two servers:
// every result is finite, and with error feedback the running sum of top-k
// results tracks the running sum of the inputs (what codec_check.cc checks
// exactly in the multi-process test).
TEST(Engine, CompressedStochasticCodecsAndErrorFeedback) {
  Job job(2, 2);
  const uint64_t n = 3000;
  const std::vector<std::string> specs = {"qsgd:levels=7", "terngrad", "natural",
                                          "randomk:ratio=0.1", "topk:ratio=0.1"};
  job.onEveryWorker([&](int r) {
    Worker& w = *job.workers[r];
    for (const auto& spec : specs)
      w.declare(spec, DType::kFloat32, n, TensorOptions{.codec = spec}, soon());
    std::vector<double> pulled(n, 0.0), truth(n, 0.0);
    for (int round = 0; round < 20; ++round) {
      for (const auto& spec : specs) {
        std::vector<float> in(n), out(n, std::nanf(""));
        for (uint64_t i = 0; i < n; ++i) in[i] = std::sin(0.01f * float(i)) + 0.1f * float(r);
        Status s = w.pushPull(spec, DType::kFloat32, n, in.data(), out.data(), ReduceOp::kSum, 0)
                       .wait(soon());
        ASSERT_TRUE(s.ok()) << spec << ": " << s.message();
        for (uint64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(out[i])) << spec << " " << i;
        if (spec.rfind("topk", 0) == 0) {
          for (uint64_t i = 0; i < n; ++i) {
            pulled[i] += out[i];
            truth[i] += std::sin(0.01 * double(i)) * 2 + 0.1;
          }
        }
      }
    }
    double diff = 0, total = 0;
    for (uint64_t i = 0; i < n; ++i) {
      diff += std::fabs(pulled[i] - truth[i]);
      total += std::fabs(truth[i]);
    }
    // The gap is the workers' residuals: bounded, while the sum grew 20 rounds.
    EXPECT_LT(diff / total, 0.5) << "worker " << r;
  });
}

// A push-pull key's error feedback in bf16 (WorkerOptions::errorFeedbackState,
// CORTADO_EF_DTYPE=bf16) against a replay with plain loops that rounds the
// residual to bf16 after every round: one worker, so each answer is exactly
// the top-k values it pushed, which carry the rounded residuals.
TEST(Engine, PushPullErrorFeedbackInBf16MatchesARoundedReplay) {
  WorkerOptions wo;
  wo.errorFeedbackState = compressor::StateDType::kBFloat16;
  Job job(1, 1, wo);
  Worker& w = *job.workers[0];
  const uint64_t n = 80, k = 20;
  w.declare("t", DType::kFloat32, n, TensorOptions{.codec = "topk:ratio=0.25"}, soon());
  std::vector<float> e(n, 0.0f);
  for (int round = 0; round < 6; ++round) {
    std::vector<float> in(n), out(n, std::nanf(""));
    for (uint64_t i = 0; i < n; ++i)
      in[i] = 0.3f + 0.731f * float((i * 13 + uint64_t(round) * 11) % 97) / 97.0f;
    ASSERT_TRUE(w.pushPull("t", DType::kFloat32, n, in.data(), out.data(), ReduceOp::kSum, 0)
                    .wait(soon())
                    .ok());
    std::vector<float> q(n);
    for (uint64_t i = 0; i < n; ++i) q[i] = in[i] + e[i];
    const std::vector<float> expect = test::topk(q, k);
    for (uint64_t i = 0; i < n; ++i) e[i] = expect[i] != 0.0f ? 0.0f : bf16ToFloat(floatToBf16(q[i]));
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], expect[i]) << "round " << round << " i " << i;
  }
}

TEST(Engine, CompressedAsyncModeAppliesEachPushDensely) {
  Job job(1, 2, {}, /*async=*/true);
  Worker& w = *job.workers[0];
  w.declare("x", DType::kFloat32, 3000, TensorOptions{.codec = "fp16", .errorFeedback = false},
            soon());
  std::vector<float> in(3000), out(3000);
  for (int it = 1; it <= 4; ++it) {
    std::fill(in.begin(), in.end(), float(it));
    Status s = w.pushPull("x", DType::kFloat32, 3000, in.data(), out.data(), ReduceOp::kSum, 0)
                   .wait(soon());
    ASSERT_TRUE(s.ok()) << s.message();
    // Small integers survive fp16; the server keeps the running sum in fp32.
    // NOLINTNEXTLINE(bugprone-integer-division): exact, it(it+1) is even
    float expect = float(it * (it + 1) / 2);
    for (float v : out) ASSERT_EQ(v, expect);
  }
}

TEST(Engine, CompressionMisuseThrowsWithContext) {
  Job job(1, 1);
  Worker& w = *job.workers[0];
  auto message = [&](auto f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error";
    return std::string();
  };
  std::string e = message([&] {
    w.declare("a", DType::kFloat32, 10, TensorOptions{.codec = "zstd"}, soon());
  });
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("topk"), std::string::npos) << e;  // lists what is valid
  e = message([&] {
    w.declare("b", DType::kFloat32, 10, TensorOptions{.codec = "topk:ratio=2"}, soon());
  });
  EXPECT_NE(e.find("ratio"), std::string::npos) << e;
  e = message([&] {
    w.declare("c", DType::kFloat16, 10, TensorOptions{.codec = "fp16"}, soon());
  });
  EXPECT_NE(e.find("float32"), std::string::npos) << e;
  e = message([&] {
    w.declare("d", DType::kFloat32, 10, TensorOptions{.codec = "powersgd"}, soon());
  });
  EXPECT_NE(e.find("powersgd"), std::string::npos) << e;
  w.declare("e", DType::kFloat32, 10, TensorOptions{.codec = "topk"}, soon());
  // The canonical form is the same declaration; another codec is not.
  w.declare("e", DType::kFloat32, 10, TensorOptions{.codec = "topk:ratio=0.01"}, soon());
  e = message([&] { w.declare("e", DType::kFloat32, 10, soon()); });
  EXPECT_NE(e.find("'e'"), std::string::npos) << e;
  EXPECT_NE(e.find("topk:ratio=0.01"), std::string::npos) << e;
}

TEST(Engine, CodecMismatchFailsEveryWorker) {
  Job job(2, 1);
  std::vector<std::string> errors(2);
  job.onEveryWorker([&](int r) {
    try {
      job.workers[r]->declare("w", DType::kFloat32, 100,
                              TensorOptions{.codec = r == 0 ? "topk:ratio=0.01" : "fp16"}, soon());
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (auto& e : errors) {
    EXPECT_NE(e.find("tensor 'w' (codec differs)"), std::string::npos) << e;
    EXPECT_NE(e.find("'fp16'"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace cortado
