// A server's push budget (server/server_engine.h, "Push budget"): the server
// acknowledges each budgeted push once summed (not the one that completes
// its round) and counts the budgeted bytes it holds unsummed; the workers
// keep each server's share. Sums are checked against plain loops here.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <thread>

#include "core/transport/inproc/factory.h"
#include "core/wire/data_message.h"
#include "engine_job.h"
#include "tests/common/forwarding_transport.h"
#include "raw_worker.h"
#include "server/server_engine.h"

namespace cortado {
namespace {

using test::RawWorker;
using transport::Message;
using wire::DataHeader;
using wire::Op;

Buffer floats(const std::vector<float>& v) { return Buffer::copyOf(v.data(), v.size() * 4); }

// Round 0 of `key`: each test here runs one round per key.
DataHeader rawHeader(Op op, uint64_t key, uint64_t n, uint32_t req, uint8_t flags) {
  return test::rawHeader(op, key, 0, n, req, flags);
}

// One server with three hand-driven workers.
TEST(ServerBudget, AcknowledgesEachSummedPushButNotTheOneThatCompletesItsRound) {
  constexpr int kWorkers = 3;
  constexpr uint64_t n = 100000;  // 400 KB a push
  auto hub = transport::inproc::createHub();
  auto st = transport::inproc::create(hub, NodeId{Role::kServer, 0});
  server::ServerEngineOptions o;
  o.numWorkers = kWorkers;
  o.engineThreads = 1;
  o.inlineBytes = 0;
  o.pushBudget = 1 << 20;
  server::ServerEngine engine(o, *st);
  st->setCallbacks([&](Message&& m) { engine.handle(std::move(m)); },
                   [](const NodeId&, const Status&) {});
  const std::string addr = st->listen("inproc://server-0");
  std::vector<std::unique_ptr<RawWorker>> w;
  for (int r = 0; r < kWorkers; ++r) {
    w.push_back(std::make_unique<RawWorker>(hub, r, addr));
    st->connect(w.back()->id_, w.back()->address);
  }
  std::vector<std::vector<float>> x(kWorkers, std::vector<float>(n));
  std::vector<float> want(n, 0.0f);
  for (int r = 0; r < kWorkers; ++r)
    for (uint64_t i = 0; i < n; ++i) {
      x[r][i] = float((i * 7 + r * 13) % 101) - 50.0f;
      want[i] += x[r][i];
    }

  // Workers 0 and 1: acknowledged, and no longer counted once summed.
  for (int r = 0; r < 2; ++r) {
    w[r]->send(rawHeader(Op::kPush, 5, n, 10 + r, wire::kFlagAck), floats(x[r]));
    auto [h, body] = w[r]->next();
    EXPECT_EQ(h.op, Op::kPushAck);
    EXPECT_EQ(h.requestId, uint32_t(10 + r));
    EXPECT_EQ(h.key, 5u);
    EXPECT_EQ(body.size(), 0u);
    EXPECT_EQ(engine.stats().unsummedBytes, 0u);
  }
  EXPECT_EQ(engine.stats().unsummedPeak, n * 4);
  // A refused push (wrong size) is settled too: its sender gets the error.
  w[0]->send(rawHeader(Op::kPush, 5, n / 2, 20, wire::kFlagAck),
             floats(std::vector<float>(n / 2, 1.0f)));
  EXPECT_NE(w[0]->nextError().find("elements"), std::string::npos);
  EXPECT_EQ(engine.stats().unsummedBytes, 0u);

  // Worker 2 completes the round: its pull's answer is the next message,
  // with no acknowledgement before it.
  w[2]->send(rawHeader(Op::kPush, 5, n, 12, wire::kFlagAck), floats(x[2]));
  w[2]->send(rawHeader(Op::kPull, 5, n, 12, wire::kFlagNone), Buffer());
  for (int r : {2, 0, 1}) {
    if (r != 2) w[r]->send(rawHeader(Op::kPull, 5, n, 10 + r, wire::kFlagNone), Buffer());
    auto [h, body] = w[r]->next();
    ASSERT_EQ(h.op, Op::kPullResponse) << "worker " << r;
    ASSERT_EQ(body.size(), n * 4);
    const float* got = reinterpret_cast<const float*>(body.data());
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "worker " << r << " i " << i;
  }
  // A push without kFlagAck is neither counted nor acknowledged.
  w[0]->send(rawHeader(Op::kPush, 6, n, 30, wire::kFlagNone), floats(x[0]));
  w[0]->send(rawHeader(Op::kPull, 6, n, 31, wire::kFlagNone), Buffer());
  w[1]->send(rawHeader(Op::kPush, 6, n, 32, wire::kFlagNone), floats(x[1]));
  w[2]->send(rawHeader(Op::kPush, 6, n, 33, wire::kFlagNone), floats(x[2]));
  auto [h, body] = w[0]->next();
  EXPECT_EQ(h.op, Op::kPullResponse);
  EXPECT_EQ(h.requestId, 31u);
  EXPECT_EQ(engine.stats().unsummedPeak, n * 4);
  EXPECT_EQ(engine.stats().unsummedBytes, 0u);
  engine.stop();
  w.clear();
  st->close();
}

// A worker's transport that holds back every acknowledgement a moment (so
// that a worker that did not keep its share would send past it meanwhile)
// and records, per server, the budgeted push bytes (kFlagAck) sent and not
// yet acknowledged or answered, and their highest value.
class WatchBudget : public test::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  void setCallbacks(RecvCallback onRecv, ErrorCallback onError) override {
    inner().setCallbacks(
        [this, onRecv](Message&& m) {
          DataHeader h = wire::decodeHeader(m.parts[0], m.parts[1].size());
          if (h.op == Op::kPushAck) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          {
            // Before the worker sees it: only then may it send more.
            std::lock_guard<std::mutex> lk(mu_);
            auto it = sent_.find({m.from, h.requestId});
            if (it != sent_.end()) {
              outstanding_[m.from] -= it->second;
              total_ -= it->second;
              sent_.erase(it);
            }
            acks_ += h.op == Op::kPushAck;
          }
          onRecv(std::move(m));
        },
        std::move(onError));
  }
  void send(const NodeId& peer, Message msg) override {
    note(peer, msg);
    inner().send(peer, std::move(msg));
  }
  void sendAll(const NodeId& peer, std::vector<Message> msgs) override {
    for (const auto& m : msgs) note(peer, m);
    inner().sendAll(peer, std::move(msgs));
  }

  struct Seen {
    std::map<NodeId, uint64_t> peak;
    uint64_t budgetedPushes = 0, acks = 0;
    uint64_t totalPeak = 0;  // all servers together
  };
  Seen seen() {
    std::lock_guard<std::mutex> lk(mu_);
    return Seen{peak_, budgeted_, acks_, totalPeak_};
  }

 private:
  void note(const NodeId& peer, const Message& m) {
    DataHeader h = wire::decodeHeader(m.parts[0], m.parts[1].size());
    if (h.op != Op::kPush || !(h.flags & wire::kFlagAck)) return;
    std::lock_guard<std::mutex> lk(mu_);
    sent_[{peer, h.requestId}] = m.parts[1].size();
    uint64_t& now = outstanding_[peer];
    now += m.parts[1].size();
    peak_[peer] = std::max(peak_[peer], now);
    total_ += m.parts[1].size();
    totalPeak_ = std::max(totalPeak_, total_);
    ++budgeted_;
  }

  std::mutex mu_;
  std::map<std::pair<NodeId, uint32_t>, uint64_t> sent_;
  std::map<NodeId, uint64_t> outstanding_, peak_;
  uint64_t budgeted_ = 0, acks_ = 0;
  uint64_t total_ = 0, totalPeak_ = 0;
};

// Wraps worker w's transport in a WatchBudget, kept in watch[w] (which
// must hold a slot for every worker and outlive the job).
test::Job::WrapTransport watching(std::vector<WatchBudget*>& watch) {
  return [&watch](int w, std::unique_ptr<transport::Transport> t) {
    auto x = std::make_unique<WatchBudget>(std::move(t));
    watch[w] = x.get();
    return std::unique_ptr<transport::Transport>(std::move(x));
  };
}

// Eight workers push tensors of 16 chunks each to two servers whose budget
// is two chunks per worker: every result exact, no worker ever more than its
// share ahead of a server's sums, no server ever holding more than its
// budget unsummed, and the chunks of at most 64 KiB not counted.
TEST(ServerBudget, ManyWorkersKeepEachServersBudgetAndSumExactly) {
  constexpr int W = 8, S = 2;
  constexpr uint64_t kChunk = 256 << 10;
  constexpr uint64_t kBudget = W * 2 * kChunk;  // 4 MiB: a share of two chunks
  WorkerOptions wo;
  wo.partitionBytes = kChunk;
  wo.maxBytesInFlight = 64ull << 20;
  std::vector<WatchBudget*> watch(W, nullptr);
  test::Job job(W, S, wo, false, false, /*serverInlineBytes=*/0, true, watching(watch), kBudget);
  // Two tensors of 16 chunks (8 per server) and one of 64 KiB (not budgeted).
  const std::vector<uint64_t> sizes = {16 * kChunk / 4, 16 * kChunk / 4, (64 << 10) / 4};
  job.onEveryWorker([&](int r) {
    for (size_t t = 0; t < sizes.size(); ++t)
      job.workers[r]->declare(fmt::format("t{}", t), DType::kFloat32, sizes[t], {},
                              Deadline::after(Millis(20000)));
  });
  constexpr int kRounds = 3;
  job.onEveryWorker([&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::vector<float>> in(sizes.size()), out(sizes.size());
      std::vector<Handle> handles;
      for (size_t t = 0; t < sizes.size(); ++t) {
        in[t].resize(sizes[t]);
        out[t].assign(sizes[t], -1.0f);
        for (uint64_t i = 0; i < sizes[t]; ++i)
          in[t][i] = float(int64_t((i * 31 + r * 7 + t * 3 + round) % 257) - 128);
        handles.push_back(job.workers[r]->pushPull(fmt::format("t{}", t), DType::kFloat32,
                                                   sizes[t], in[t].data(), out[t].data(),
                                                   ReduceOp::kSum, 0));
      }
      for (auto& h : handles) h.wait(Deadline::after(Millis(30000)));
      for (size_t t = 0; t < sizes.size(); ++t)
        for (uint64_t i = 0; i < sizes[t]; ++i) {
          float want = 0.0f;
          for (int q = 0; q < W; ++q)
            want += float(int64_t((i * 31 + q * 7 + t * 3 + round) % 257) - 128);
          ASSERT_EQ(out[t][i], want) << "worker " << r << " tensor " << t << " element " << i;
        }
    }
  });
  uint64_t budgeted = 0, acks = 0;
  for (int w = 0; w < W; ++w) {
    auto seen = watch[w]->seen();
    budgeted += seen.budgetedPushes;
    acks += seen.acks;
    for (const auto& [server, peak] : seen.peak)
      EXPECT_LE(peak, kBudget / W) << "worker " << w << " ran ahead of " << server.toString();
  }
  // Every chunk of the two large tensors, and no other, was budgeted; all
  // but the last push of each round of a chunk were acknowledged.
  EXPECT_EQ(budgeted, uint64_t(W) * kRounds * 32);
  EXPECT_EQ(acks, uint64_t(W - 1) * kRounds * 32);
  for (int s = 0; s < S; ++s) {
    auto st = job.serverStats(s);
    EXPECT_LE(st.unsummedPeak, kBudget) << "server " << s;
    EXPECT_GE(st.unsummedPeak, kChunk) << "server " << s;
    EXPECT_EQ(st.unsummedBytes, 0u) << "server " << s;
  }
}

// The push window (WorkerOptions::pushWindow): 4 workers push 3 rounds of
// two 16-chunk tensors to 4 servers with a budget share far above the
// window, each push acknowledged late. Returns each worker's highest bytes
// of pushes unacknowledged by all servers together; every sum is checked
// against a plain loop.
std::vector<uint64_t> windowPeaks(uint64_t window, uint64_t chunk) {
  constexpr int W = 4, S = 4, kRounds = 3;
  WorkerOptions wo;
  wo.partitionBytes = chunk;
  wo.maxBytesInFlight = 64ull << 20;
  wo.pushWindow = window;
  std::vector<WatchBudget*> watch(W, nullptr);
  test::Job job(W, S, wo, false, false, /*serverInlineBytes=*/0, true, watching(watch),
                /*pushBudget=*/64ull << 20);
  const uint64_t n = 16 * chunk / 4;
  job.onEveryWorker([&](int r) {
    for (int t = 0; t < 2; ++t)
      job.workers[r]->declare(fmt::format("t{}", t), DType::kFloat32, n, {},
                              Deadline::after(Millis(20000)));
  });
  job.onEveryWorker([&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::vector<float>> in(2, std::vector<float>(n)), out(2, std::vector<float>(n));
      std::vector<Handle> handles;
      for (int t = 0; t < 2; ++t) {
        for (uint64_t i = 0; i < n; ++i)
          in[t][i] = float(int64_t((i * 13 + r * 5 + t * 11 + round) % 199) - 99);
        handles.push_back(job.workers[r]->pushPull(fmt::format("t{}", t), DType::kFloat32, n,
                                                   in[t].data(), out[t].data(), ReduceOp::kSum,
                                                   0));
      }
      for (auto& h : handles) h.wait(Deadline::after(Millis(30000)));
      for (int t = 0; t < 2; ++t)
        for (uint64_t i = 0; i < n; ++i) {
          float want = 0.0f;
          for (int q = 0; q < W; ++q) want += float(int64_t((i * 13 + q * 5 + t * 11 + round) % 199) - 99);
          ASSERT_EQ(out[t][i], want) << "worker " << r << " tensor " << t << " element " << i;
        }
    }
  });
  std::vector<uint64_t> peaks;
  for (int w = 0; w < W; ++w) peaks.push_back(watch[w]->seen().totalPeak);
  return peaks;
}

TEST(PushWindow, KeepsAWorkersUnsummedPushesToAllServersWithinTheWindow) {
  constexpr uint64_t kChunk = 128 << 10;
  for (uint64_t peak : windowPeaks(3 * kChunk, kChunk)) {
    EXPECT_LE(peak, 3 * kChunk);
    EXPECT_GE(peak, 2 * kChunk);  // the window was used, not one push at a time
  }
  // Without a window the same job runs further ahead: the bound above is the window's.
  uint64_t most = 0;
  for (uint64_t peak : windowPeaks(0, kChunk)) most = std::max(most, peak);
  EXPECT_GT(most, 3 * kChunk);
}

TEST(PushWindow, AChunkLargerThanTheWindowGoesAlone) {
  constexpr uint64_t kChunk = 128 << 10;
  for (uint64_t peak : windowPeaks(kChunk / 2, kChunk)) EXPECT_EQ(peak, kChunk);
}

}  // namespace
}  // namespace cortado
