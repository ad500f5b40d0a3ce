// Sparse (Zen) tensors through the real worker and server engines: a job
// in one process (engine_job.h) sums sparse tensors given as pairs or as
// dense buffers, checked against a dense reference; bad input is refused
// by the worker, and malformed pushes sent by hand (raw_worker.h) are
// refused by the server naming the tensor and the sender, leaving the sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "compressor/zen/zen_hash.h"
#include "compressor/zen/zen_payload.h"
#include "engine_job.h"
#include "raw_worker.h"

namespace cortado {
namespace {

using test::Job;
using transport::Message;
using wire::Op;
namespace zen = compressor::zen;

const Deadline soon() { return Deadline::after(Millis(20000)); }

struct Input {
  std::vector<uint32_t> index;
  std::vector<float> value;
};

// Worker r's pairs in round it: skewed towards the low indices (most in
// the first tenth), index 0 and the last one always, and a few repeated
// indices (their values add up). Small integers: sums are exact.
Input inputOf(uint64_t n, int r, int it, double density) {
  std::mt19937_64 rng(1000 * r + it);
  std::uniform_real_distribution<double> u(0, 1);
  Input in;
  const auto m = uint64_t(double(n) * density);
  for (uint64_t k = 0; k < m; ++k) {
    const double x = u(rng);
    in.index.push_back(uint32_t(uint64_t(std::pow(x, 4.0) * double(n)) % n));  // skewed
    in.value.push_back(float(int(rng() % 9) - 4));
  }
  in.index.push_back(0);
  in.value.push_back(float(r + 1));
  in.index.push_back(uint32_t(n - 1));
  in.value.push_back(2.0f);
  for (int k = 0; k < 3 && !in.index.empty(); ++k) {  // repeats
    in.index.push_back(in.index[k]);
    in.value.push_back(1.0f);
  }
  return in;
}

struct EngineCase {
  int workers, servers;
  bool compact;  // WorkerOptions::compactSparse: delta-coded pushes where smaller
};

class ZenEngine : public ::testing::TestWithParam<EngineCase> {};

// Pairs, dense buffers and the average, over several rounds, beside a
// dense tensor; every worker's output equals the dense reference, with
// delta-coded pushes and without.
TEST_P(ZenEngine, SparseSumsMatchTheDenseReference) {
  const auto [W, S, compact] = GetParam();
  WorkerOptions wo;
  wo.compactSparse = compact;
  Job job(W, S, wo);
  const uint64_t n = 60000;
  std::vector<std::vector<float>> ref(4, std::vector<float>(n, 0.0f));
  for (int it = 0; it < 4; ++it)
    for (int r = 0; r < W; ++r) {
      Input in = inputOf(n, r, it, it == 3 ? 0.3 : 0.01);
      for (size_t i = 0; i < in.index.size(); ++i) ref[it][in.index[i]] += in.value[i];
    }
  job.onEveryWorker([&](int r) {
    Worker& w = *job.workers[r];
    TensorOptions sparse;
    sparse.sparse = true;
    w.declare("dense.before", DType::kFloat32, 1000, soon());
    const uint64_t key = w.declare("emb", DType::kFloat32, n, sparse, soon());
    EXPECT_EQ(w.declare("emb", DType::kFloat32, n, sparse, soon()), key);
    EXPECT_EQ(w.chunks("emb").size(), size_t(S));  // one key per server
    std::vector<float> out(n, 7.0f), d(1000, float(r)), dout(1000);
    for (int it = 0; it < 4; ++it) {
      Input in = inputOf(n, r, it, it == 3 ? 0.3 : 0.01);
      Handle h;
      if (it == 1 || it == 3) {
        // A dense buffer, scanned for its non-zeros (in place: input = output).
        std::fill(out.begin(), out.end(), 0.0f);
        for (size_t i = 0; i < in.index.size(); ++i) out[in.index[i]] += in.value[i];
        h = w.pushPull("emb", DType::kFloat32, n, out.data(), out.data(),
                       it == 3 ? ReduceOp::kAverage : ReduceOp::kSum, 0);
      } else {
        SparseInput si;
        si.indices = in.index.data();
        si.values = in.value.data();
        si.count = in.index.size();
        h = w.pushPullSparse("emb", si, out.data(), ReduceOp::kSum, 0);
        in = Input{};  // consumed by the call
      }
      Handle hd = w.pushPull("dense.before", DType::kFloat32, 1000, d.data(), dout.data(),
                             ReduceOp::kSum, 1);
      ASSERT_TRUE(h.wait(soon()).ok()) << h.wait(soon()).message();
      ASSERT_TRUE(hd.wait(soon()).ok());
      if (it == 3) {
        for (uint64_t i = 0; i < n; ++i)
          ASSERT_FLOAT_EQ(out[i], ref[it][i] / float(W)) << "index " << i << " rank " << r;
      } else {
        ASSERT_EQ(out, ref[it]) << "round " << it << " rank " << r;
      }
      ASSERT_EQ(dout[0], float(W * (W - 1) / 2));
    }
  });
  auto st = job.serverStats();
  EXPECT_EQ(st.errors, 0u);
}

INSTANTIATE_TEST_SUITE_P(Zen, ZenEngine,
                         ::testing::Values(EngineCase{2, 2, true}, EngineCase{3, 4, true},
                                           EngineCase{4, 3, true}, EngineCase{3, 4, false}),
                         [](const auto& info) {
                           return fmt::format("{}workers_{}servers_{}", info.param.workers,
                                              info.param.servers,
                                              info.param.compact ? "delta" : "coo");
                         });

void expectInvalid(const std::function<void()>& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (const auto& wd : words)
      EXPECT_NE(std::string(e.what()).find(wd), std::string::npos) << e.what();
  }
}

TEST(ZenEngineErrors, BadInputIsRefusedNamingTheTensor) {
  Job job(1, 2);
  Worker& w = *job.workers[0];
  TensorOptions sparse;
  sparse.sparse = true;
  TensorOptions both = sparse;
  both.codec = "topk:ratio=0.1";
  expectInvalid([&] { w.declare("x", DType::kFloat32, 10, both, soon()); }, {"'x'", "codec"});
  expectInvalid([&] { w.declare("y", DType::kFloat64, 10, sparse, soon()); }, {"'y'", "float32"});
  w.declare("emb", DType::kFloat32, 100, sparse, soon());
  w.declare("plain", DType::kFloat32, 100, soon());
  std::vector<uint32_t> idx{3, 100};
  std::vector<float> val{1, 1}, out(100);
  SparseInput si;
  si.indices = idx.data();
  si.values = val.data();
  si.count = 2;
  expectInvalid([&] { w.pushPullSparse("emb", si, out.data(), ReduceOp::kSum, 0); },
                {"'emb'", "index #1 is 100"});
  expectInvalid([&] { w.pushPullSparse("plain", si, out.data(), ReduceOp::kSum, 0); },
                {"'plain'", "not declared sparse"});
  Exchange ex;
  ex.rawInput = out.data();
  ex.rawOutput = out.data();
  expectInvalid([&] { w.exchange("emb", std::move(ex), 0); }, {"'emb'", "sparse"});
  SparseInput pairsAndDense = si;
  pairsAndDense.dense = out.data();
  expectInvalid([&] { w.pushPullSparse("emb", pairsAndDense, out.data(), ReduceOp::kSum, 0); },
                {"'emb'", "both"});
  // The worker still works after the refusals.
  si.count = 1;
  ASSERT_TRUE(w.pushPullSparse("emb", si, out.data(), ReduceOp::kSum, 0).wait(soon()).ok());
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_EQ(out[4], 0.0f);
  // A round without non-zeros (no pairs, no pointers): all zeros back.
  ASSERT_TRUE(
      w.pushPullSparse("emb", SparseInput{}, out.data(), ReduceOp::kSum, 0).wait(soon()).ok());
  EXPECT_EQ(std::count(out.begin(), out.end(), 0.0f), 100);
}

// The server alone, driven by hand-built messages from two raw workers.
class ServerSparse : public ::testing::Test {
 protected:
  void SetUp() override {
    hub_ = transport::inproc::createHub();
    st_ = transport::inproc::create(hub_, NodeId{Role::kServer, 0});
    server::ServerEngineOptions o;
    o.numWorkers = 2;
    o.engineThreads = 2;
    o.self = NodeId{Role::kServer, 0};
    engine_ = std::make_unique<server::ServerEngine>(o, *st_);
    st_->setCallbacks([this](Message&& m) { engine_->handle(std::move(m)); },
                      [](const NodeId&, const Status&) {});
    const std::string addr = st_->listen("inproc://server-0");
    for (int r = 0; r < 2; ++r) {
      workers_.push_back(std::make_unique<test::RawWorker>(hub_, r, addr));
      st_->connect(workers_.back()->id_, workers_.back()->address);
    }
  }
  void TearDown() override {
    engine_->stop();
    workers_.clear();
    st_->close();
  }

  Buffer body(const std::vector<std::byte>& payload, const std::string& spec = "zen") {
    const size_t pre = wire::compressedPreambleBytes(spec, "emb");
    Buffer b = Buffer::allocate(pre + payload.size());
    wire::writeCompressedPreamble(b.data(), spec, "emb");
    std::memcpy(b.data() + pre, payload.data(), payload.size());
    return b;
  }
  wire::DataHeader header(Op op, uint64_t round) {
    wire::DataHeader h;
    h.op = op;
    h.flags = wire::kFlagSparse;
    h.key = 77;
    h.round = round;
    h.numElements = own_.numElements();
    h.requestId = 5;
    return h;
  }

  zen::Ownership own_{5000, 2, 31};  // this server is server 0 of 2
  std::shared_ptr<transport::inproc::Hub> hub_;
  std::unique_ptr<transport::Transport> st_;
  std::unique_ptr<server::ServerEngine> engine_;
  std::vector<std::unique_ptr<test::RawWorker>> workers_;
};

TEST_F(ServerSparse, MalformedPushesAreRefusedNamingTensorAndSender) {
  const auto list = zen::ownedIndices(own_, 0);
  uint32_t notMine = 0;
  while (own_.owner(notMine) == 0) ++notMine;
  auto coo = [&](std::vector<uint32_t> idx) {
    return zen::encodeCoo(own_, 0, idx, std::vector<float>(idx.size(), 1.0f));
  };
  // Worker 0's good push opens round 0.
  workers_[0]->send(header(Op::kPush, 0),
                    body(zen::encodeCoo(own_, 0, std::vector<uint32_t>{list[0], list[3]},
                                        std::vector<float>{2, 3})));
  auto& w1 = *workers_[1];
  struct Bad {
    std::vector<std::byte> payload;
    std::string words;
  };
  auto truncated = coo({list[1]});
  truncated.pop_back();
  auto delta = [&](std::vector<uint32_t> idx) {
    return zen::encodeDeltaPush(own_, 0, idx, std::vector<float>(idx.size(), 1.0f));
  };
  uint32_t notMineAbove = list[1] + 1;  // a delta-coded push ascends
  while (own_.owner(notMineAbove) == 0) ++notMineAbove;
  auto deltaCut = delta({list[1], list[2]});
  deltaCut.pop_back();
  auto deltaLong = delta({list[1]});
  deltaLong.push_back(std::byte{0});
  std::vector<Bad> bads = {{coo({list[1], 5000}), "out of range"},
                           {coo({list[1], notMine}), "does not own"},
                           {coo({list[1], list[1]}), "listed twice"},
                           {truncated, "truncated pair list"},
                           {zen::encodeCoo(own_, 1, {}, {}), "server 1 of 2"},
                           {delta({list[1], notMineAbove}), "does not own"},
                           {deltaCut, "delta-coded push"},
                           {deltaLong, "left over"}};
  for (const auto& b : bads) {
    w1.send(header(Op::kPush, 0), body(b.payload));
    const std::string e = w1.nextError();
    EXPECT_NE(e.find("'emb'"), std::string::npos) << e;
    EXPECT_NE(e.find("worker 1"), std::string::npos) << e;
    EXPECT_NE(e.find(b.words), std::string::npos) << e;
  }
  {
    w1.send(header(Op::kPush, 0), body(coo({list[1]}), "topk"));
    const std::string e = w1.nextError();
    EXPECT_NE(e.find("codec 'topk'"), std::string::npos) << e;
  }
  {
    // A dense push on the sparse key.
    wire::DataHeader h = header(Op::kPush, 0);
    h.flags = 0;
    std::vector<float> dense(own_.numElements(), 1.0f);
    w1.send(h, Buffer::copyOf(dense.data(), dense.size() * 4));
    const std::string e = w1.nextError();
    EXPECT_NE(e.find("dense"), std::string::npos) << e;
  }
  // Worker 1's good push (delta-coded, beside worker 0's COO) completes the
  // round: the refused ones added nothing.
  w1.send(header(Op::kPush, 0), body(delta({list[3], list[4]})));
  workers_[0]->send(header(Op::kPull, 0), Buffer());
  auto [h, answer] = workers_[0]->next();
  ASSERT_EQ(h.op, Op::kPullResponse);
  EXPECT_TRUE(h.flags & wire::kFlagSparse);
  std::map<uint32_t, float> got;
  zen::decodeAnswer({reinterpret_cast<const std::byte*>(answer.data()), answer.size()}, own_, 0,
                    list, [&](uint32_t i, float v) { got[i] = v; });
  EXPECT_EQ(got, (std::map<uint32_t, float>{{list[0], 2}, {list[3], 4}, {list[4], 1}}));
  EXPECT_EQ(engine_->stats().errors, bads.size() + 2);
}

}  // namespace
}  // namespace cortado
