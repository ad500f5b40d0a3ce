// The server engine with compressed pushes, driven message by message: raw
// worker endpoints on the in-process transport send hand-built PUSH and PULL
// messages, valid and malformed, and read the server's answers. References
// are computed here by plain loops, not by the server's code path.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "compressor/compact.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "compressor/registry.h"
#include "core/common/half.h"
#include "core/transport/inproc/factory.h"
#include "core/wire/data_message.h"
#include "raw_worker.h"
#include "server/server_engine.h"

namespace cortado {
namespace {

using test::RawWorker;
using transport::Message;
using wire::DataHeader;
using wire::Op;

class ServerCodec : public ::testing::Test {
 protected:
  static constexpr int kWorkers = 2;
  void SetUp() override {
    compressor::registerCpuCodecs(registry_);
    hub_ = transport::inproc::createHub();
    st_ = transport::inproc::create(hub_, NodeId{Role::kServer, 0});
    server::ServerEngineOptions o;
    o.numWorkers = kWorkers;
    o.engineThreads = 2;
    configure(o);
    engine_ = std::make_unique<server::ServerEngine>(o, *st_);
    st_->setCallbacks([this](Message&& m) { engine_->handle(std::move(m)); },
                      [](const NodeId&, const Status&) {});
    std::string addr = st_->listen("inproc://server-0");
    for (int r = 0; r < kWorkers; ++r) {
      workers_.push_back(std::make_unique<RawWorker>(hub_, r, addr));
      st_->connect(workers_.back()->id_, workers_.back()->address);
    }
  }
  // Options of the engine under test beyond the workers and threads.
  virtual void configure(server::ServerEngineOptions&) {}
  void TearDown() override {
    engine_->stop();
    workers_.clear();
    st_->close();
  }

  // A compressed push body: preamble + the codec's payload of x.
  Buffer pushBody(const std::string& spec, const std::string& name, const std::vector<float>& x,
                  uint64_t seed = 0) {
    auto codec = registry_.create(spec);
    size_t pre = wire::compressedPreambleBytes(codec->spec(), name);
    Buffer b = Buffer::allocate(pre + codec->payloadBytes(x.size()));
    wire::writeCompressedPreamble(b.data(), codec->spec(), name);
    compressor::EncodeContext ctx;
    ctx.seed = seed;
    codec->encode(x.data(), x.size(),
                  {reinterpret_cast<std::byte*>(b.data() + pre), b.size() - pre}, ctx);
    return b;
  }
  static DataHeader header(Op op, uint64_t key, uint64_t round, uint64_t n, uint32_t req) {
    return test::rawHeader(op, key, round, n, req,
                           op == Op::kPush ? wire::kFlagCompressed : wire::kFlagNone);
  }
  // Pulls round `round` of key on worker r and decodes the answer (with the
  // codec's own decoder for its payloads, top-k for sparse sums, expanded
  // first where the server sent them compact). `compact`: whether it did.
  std::vector<float> pull(int r, uint64_t key, uint64_t round, uint64_t n,
                          bool* compact = nullptr) {
    workers_[r]->send(header(Op::kPull, key, round, n, 77), Buffer());
    auto [h, body] = workers_[r]->next();
    if (compact) *compact = false;
    if (h.op == Op::kError) {
      ADD_FAILURE() << std::string(reinterpret_cast<const char*>(body.data()), body.size());
      return {};
    }
    EXPECT_EQ(h.op, Op::kPullResponse);
    std::vector<float> out(n);
    if (!(h.flags & wire::kFlagCompressed)) {
      std::memcpy(out.data(), body.data(), n * 4);
      return out;
    }
    std::span<const std::byte> p(reinterpret_cast<const std::byte*>(body.data()), body.size());
    auto ph = compressor::parseHeader(p);
    std::vector<std::byte> plain;
    if (compressor::isCompact(ph)) {
      if (compact) *compact = true;
      plain.resize(compressor::expandedBytes(ph));
      compressor::expandSparsePayload(p, plain);
      p = plain;
    }
    registry_.create(compressor::codecIdName(ph.codec))->decode(p, out.data(), n);
    return out;
  }

  compressor::Registry registry_;
  std::shared_ptr<transport::inproc::Hub> hub_;
  std::unique_ptr<transport::Transport> st_;
  std::unique_ptr<server::ServerEngine> engine_;
  std::vector<std::unique_ptr<RawWorker>> workers_;
};

// The server's lossy re-encode of `p` (the sum plus its residual) for `key`
// in round `round`, replayed: decode(encode(p)) with the server's seed.
template <typename CodecPtr>
std::vector<float> reencoded(const CodecPtr& codec, uint64_t key, uint64_t round,
                             const std::vector<float>& p) {
  const size_t n = p.size();
  std::vector<float> out(n);
  std::vector<std::byte> payload(codec->payloadBytes(n));
  compressor::EncodeContext ctx;
  ctx.seed = compressor::format::hash2(compressor::format::hash2(key, round), 0);
  codec->encode(p.data(), n, payload, ctx);
  codec->decode(payload, out.data(), n);
  return out;
}

std::vector<float> ramp(size_t n, float scale, size_t hot) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = scale * 0.001f * float(i % 7);
  x[hot] = 100 * scale;  // the element top-k must pick
  return x;
}

TEST_F(ServerCodec, TopKPushesSumLosslesslyIntoTheAnswer) {
  const size_t n = 1000;
  auto x0 = ramp(n, 1.0f, 10), x1 = ramp(n, -2.0f, 20);
  workers_[0]->send(header(Op::kPush, 5, 0, n, 1), pushBody("topk:ratio=0.002", "w", x0));
  workers_[1]->send(header(Op::kPush, 5, 0, n, 2), pushBody("topk:ratio=0.002", "w", x1));
  // Reference: each worker sends its 2 largest magnitudes; the answer is their
  // exact sum, not a re-selected top-2 of it.
  auto top2 = [](const std::vector<float>& x) {
    std::vector<size_t> idx(x.size());
    for (size_t i = 0; i < x.size(); ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    return std::vector<size_t>{idx[0], idx[1]};
  };
  std::vector<float> expect(n, 0.0f);
  for (auto* x : {&x0, &x1})
    for (size_t i : top2(*x)) expect[i] += (*x)[i];
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(pull(r, 5, 0, n), expect);
}

TEST_F(ServerCodec, Fp16AnswersTheRoundedSum) {
  const size_t n = 333;
  std::vector<float> x0(n), x1(n);
  for (size_t i = 0; i < n; ++i) {
    x0[i] = 0.1f * float(i) + 0.37f;
    x1[i] = -0.05f * float(i) + 1.91f;
  }
  workers_[0]->send(header(Op::kPush, 9, 0, n, 1), pushBody("fp16", "h", x0));
  workers_[1]->send(header(Op::kPush, 9, 0, n, 2), pushBody("fp16", "h", x1));
  std::vector<float> expect(n);
  for (size_t i = 0; i < n; ++i)
    expect[i] = halfToFloat(floatToHalf(halfToFloat(floatToHalf(x0[i])) +
                                        halfToFloat(floatToHalf(x1[i]))));
  EXPECT_EQ(pull(1, 9, 0, n), expect);
}

TEST_F(ServerCodec, MalformedPushesAreRefusedNamingTensorAndSender) {
  const size_t n = 1000;
  auto x = ramp(n, 1.0f, 3);
  Buffer good = pushBody("topk:ratio=0.01", "layer1.weight", x);
  const size_t pre = wire::compressedPreambleBytes("topk:ratio=0.01", "layer1.weight");
  uint32_t req = 100;
  auto refused = [&](Buffer body, const std::string& why) {
    workers_[1]->send(header(Op::kPush, 7, 0, n, ++req), std::move(body));
    std::string e = workers_[1]->nextError();
    EXPECT_TRUE(e.find("worker 1") != std::string::npos) << why << ": " << e;
    return e;
  };
  // Worker 0 pushes a good payload first: the key knows its tensor's name.
  workers_[0]->send(header(Op::kPush, 7, 0, n, 1), Buffer::copyOf(good.data(), good.size()));
  // Sync pushes get no acknowledgement: wait (with a deadline) until it counted.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (engine_->stats().pushes < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engine_->stats().pushes, 1u);

  // A preamble cut short and one whose lengths run past the body.
  std::string e = refused(Buffer::copyOf(good.data(), 3), "short preamble");
  EXPECT_NE(e.find("4-byte preamble"), std::string::npos) << e;
  {
    Buffer b = Buffer::copyOf(good.data(), good.size());
    uint16_t big = 60000;
    std::memcpy(b.data() + 2, &big, 2);
    e = refused(std::move(b), "name past the end");
    EXPECT_NE(e.find("tensor 'layer1.weight'"), std::string::npos) << e;
  }
  // A bad payload header (magic).
  {
    Buffer b = Buffer::copyOf(good.data(), good.size());
    b.data()[pre] ^= 0xff;
    e = refused(std::move(b), "bad magic");
    EXPECT_NE(e.find("tensor 'layer1.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("magic"), std::string::npos) << e;
  }
  // A truncated body.
  e = refused(Buffer::copyOf(good.data(), good.size() - 5), "truncated");
  EXPECT_NE(e.find("tensor 'layer1.weight'"), std::string::npos) << e;
  // An index out of range.
  {
    Buffer b = Buffer::copyOf(good.data(), good.size());
    uint32_t bad = 5000;
    std::memcpy(b.data() + pre + compressor::kHeaderBytes, &bad, 4);
    e = refused(std::move(b), "index out of range");
    EXPECT_NE(e.find("tensor 'layer1.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  }
  // Another codec than the key's, and a spec no server knows.
  e = refused(pushBody("fp16", "layer1.weight", x), "other codec");
  EXPECT_NE(e.find("codec 'topk:ratio=0.01'"), std::string::npos) << e;
  // An uncompressed push to a compressed key.
  {
    DataHeader h = header(Op::kPush, 7, 0, n, ++req);
    h.flags = wire::kFlagNone;
    Buffer dense = Buffer::copyOf(x.data(), n * 4);
    workers_[1]->send(h, std::move(dense));
    e = workers_[1]->nextError();
    EXPECT_NE(e.find("uncompressed"), std::string::npos) << e;
  }
  EXPECT_GE(engine_->stats().errors, 7u);

  // The server is unharmed and the sum is only the good pushes: worker 1's
  // valid push completes the round.
  workers_[1]->send(header(Op::kPush, 7, 0, n, 2), Buffer::copyOf(good.data(), good.size()));
  std::vector<float> expect(n, 0.0f);
  {
    std::vector<float> once(n);
    registry_.create("topk:ratio=0.01")
        ->decode({reinterpret_cast<const std::byte*>(good.data() + pre), good.size() - pre},
                 once.data(), n);
    for (size_t i = 0; i < n; ++i) expect[i] = 2 * once[i];
  }
  EXPECT_EQ(pull(0, 7, 0, n), expect);
}

TEST_F(ServerCodec, UnknownCodecOnAFirstPushIsRefused) {
  const size_t n = 16;
  std::string spec = "zstd:level=3";
  Buffer b = Buffer::allocate(wire::compressedPreambleBytes(spec, "t") + 64);
  std::memset(b.data(), 0, b.size());
  wire::writeCompressedPreamble(b.data(), spec, "t");
  workers_[0]->send(header(Op::kPush, 3, 0, n, 1), std::move(b));
  std::string e = workers_[0]->nextError();
  EXPECT_NE(e.find("tensor 't'"), std::string::npos) << e;
  EXPECT_NE(e.find("worker 0"), std::string::npos) << e;
  EXPECT_NE(e.find("zstd"), std::string::npos) << e;
  EXPECT_NE(e.find("topk"), std::string::npos) << e;  // lists what is valid
}


// The plan executor's forms (core/executor/executor.h): one pusher per round for a key
// declared with contributors, several payloads in one push, a dense answer.
TEST_F(ServerCodec, ContributorsAndSeveralPayloadsPerPushWithADenseAnswer) {
  const size_t n = 50;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = 0.1f * float(i) + 0.37f;
    b[i] = -0.3f * float(i) + 2.11f;
  }
  // Two payloads back to back: the preamble once, then both.
  Buffer pa = pushBody("fp16", "t/shard0", a), pb = pushBody("fp16", "t/shard0", b);
  const size_t pre = wire::compressedPreambleBytes("fp16", "t/shard0");
  Buffer body = Buffer::allocate(pa.size() + pb.size() - pre);
  std::memcpy(body.data(), pa.data(), pa.size());
  std::memcpy(body.data() + pa.size(), pb.data() + pre, pb.size() - pre);
  DataHeader h = header(Op::kPush, 11, 0, n, 1);
  h.contributors = 1;  // worker 0 alone completes the round
  h.flags |= wire::kFlagDenseAnswer;
  workers_[0]->send(h, body);
  std::vector<float> expect(n);
  for (size_t i = 0; i < n; ++i)
    expect[i] = halfToFloat(floatToHalf(a[i])) + halfToFloat(floatToHalf(b[i]));  // not re-rounded
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(pull(r, 11, 0, n), expect);
}

// A top-k key takes payloads that list any number of elements (GraVAC's
// messages through the plan executor: each piece carries the pairs the
// message has there), each sized by its own header, several in one push;
// the sum is exact. A run whose last payload is cut short is refused.
TEST_F(ServerCodec, TopkKeysTakePayloadsOfAnyCount) {
  const size_t n = 40;
  // A top-k payload of n elements listing `pairs` (index, value).
  auto payload = [&](const std::vector<std::pair<uint32_t, float>>& pairs) {
    std::vector<std::byte> out(compressor::kHeaderBytes + 8 * pairs.size());
    compressor::PayloadHeader ph;
    ph.codec = compressor::CodecId::kTopK;
    ph.numel = n;
    ph.bodyBytes = 8 * pairs.size();
    ph.count = pairs.size();
    compressor::writeHeader(ph, out);
    for (size_t j = 0; j < pairs.size(); ++j) {
      compressor::storeLe<uint32_t>(out.data() + compressor::kHeaderBytes + 4 * j, pairs[j].first);
      compressor::storeLe<float>(out.data() + compressor::kHeaderBytes + 4 * (pairs.size() + j),
                                 pairs[j].second);
    }
    return out;
  };
  const std::string spec = registry_.create("topk:ratio=0.1")->spec();  // k = 4
  auto body = [&](const std::vector<std::vector<std::byte>>& payloads, size_t cut = 0) {
    const size_t pre = wire::compressedPreambleBytes(spec, "g");
    size_t total = pre;
    for (const auto& q : payloads) total += q.size();
    Buffer b = Buffer::allocate(total - cut);
    wire::writeCompressedPreamble(b.data(), spec, "g");
    size_t at = pre;
    for (const auto& q : payloads) {
      const size_t m = std::min(q.size(), b.size() - at);
      std::memcpy(b.data() + at, q.data(), m);
      at += m;
    }
    return b;
  };
  const auto a = payload({{0, 1.5f}, {3, -2.0f}, {7, 0.25f}, {9, 4.0f}, {20, 1.0f}, {39, -3.0f}});
  const auto b = payload({});
  const auto c = payload({{3, 2.0f}, {21, 0.5f}});
  workers_[0]->send(header(Op::kPush, 16, 0, n, 1), body({a, b}));  // 6 pairs and none
  workers_[1]->send(header(Op::kPush, 16, 0, n, 1), body({c}));     // 2 pairs
  std::vector<float> expect(n, 0.0f);
  expect[0] = 1.5f, expect[3] = -2.0f + 2.0f, expect[7] = 0.25f, expect[9] = 4.0f;
  expect[20] = 1.0f, expect[21] = 0.5f, expect[39] = -3.0f;
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(pull(r, 16, 0, n), expect);
  // The second payload four bytes short of what its header declares.
  workers_[0]->send(header(Op::kPush, 17, 0, n, 1), body({a, c}, 4));
  const std::string e = workers_[0]->nextError();
  EXPECT_NE(e.find("payload #1"), std::string::npos) << e;
  EXPECT_NE(e.find("declares a 16-byte body"), std::string::npos) << e;
}

TEST_F(ServerCodec, RawKeyAnsweredInTheCodecFormAPullAsksFor) {
  const size_t n = 40;
  std::vector<float> x0(n), x1(n);
  for (size_t i = 0; i < n; ++i) {
    x0[i] = 0.013f * float(i * i) - 1.0f;
    x1[i] = 0.7f;
  }
  for (int r = 0; r < kWorkers; ++r) {
    DataHeader h = header(Op::kPush, 12, 0, n, 1);
    h.flags = wire::kFlagNone;  // raw
    const auto& x = r == 0 ? x0 : x1;
    workers_[r]->send(h, Buffer::copyOf(x.data(), n * 4));
  }
  Buffer pre = Buffer::allocate(wire::compressedPreambleBytes("fp16", "raw"));
  wire::writeCompressedPreamble(pre.data(), "fp16", "raw");
  DataHeader p = header(Op::kPull, 12, 0, n, 5);
  p.flags = wire::kFlagCompressed;
  workers_[0]->send(p, pre);
  auto [ah, abody] = workers_[0]->next();
  ASSERT_EQ(ah.op, Op::kPullResponse);
  ASSERT_TRUE(ah.flags & wire::kFlagCompressed);
  std::vector<float> got(n);
  registry_.create("fp16")->decode(
      {reinterpret_cast<const std::byte*>(abody.data()), abody.size()}, got.data(), n);
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(got[i], halfToFloat(floatToHalf(x0[i] + x1[i]))) << i;
  // A plain pull of the same round still gets the raw sum.
  auto raw = pull(1, 12, 0, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(raw[i], x0[i] + x1[i]) << i;
}

TEST_F(ServerCodec, ContributorCountsThatDisagreeOrExceedTheJobAreRefused) {
  const size_t n = 10;
  std::vector<float> x(n, 1.0f);
  DataHeader h = header(Op::kPush, 13, 0, n, 1);
  h.contributors = 3;  // the job has 2 workers
  workers_[0]->send(h, pushBody("fp16", "c", x));
  EXPECT_NE(workers_[0]->nextError().find("says 3 workers push"), std::string::npos);
  h = header(Op::kPush, 14, 0, n, 1);
  h.contributors = 2;
  const uint64_t before = engine_->stats().pushes;
  workers_[0]->send(h, pushBody("fp16", "c", x));
  // Worker 0's count must be the key's before worker 1's arrives (the two
  // come on different connections): sync pushes get no acknowledgement, so
  // wait (with a deadline) until the server counted it.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (engine_->stats().pushes < before + 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engine_->stats().pushes, before + 1);
  h.contributors = 1;
  workers_[1]->send(h, pushBody("fp16", "c", x));
  std::string e = workers_[1]->nextError();
  EXPECT_NE(e.find("contributors"), std::string::npos) << e;
  // Payload bytes that are not whole payloads.
  Buffer body = pushBody("fp16", "c", x);
  Buffer cut = Buffer::allocate(body.size() + 3);
  std::memcpy(cut.data(), body.data(), body.size());
  std::memset(cut.data() + body.size(), 0, 3);
  workers_[0]->send(header(Op::kPush, 15, 0, n, 1), cut);
  e = workers_[0]->nextError();
  EXPECT_NE(e.find("not a whole number"), std::string::npos) << e;
}

// Server-side error feedback (kFlagErrorFeedback). The running sum of what the
// server sent must equal the running sum of what it received minus the key's
// current residual e_t = p_t - decode(encode(p_t)), p_t = sum_t + e_{t-1}.
// For fp16, |e_t| is at most half an fp16 ulp of |p_t|; with |p_t| < 2 here
// that is 2^-11 per element, whatever the number of rounds (the fp32 updates
// of the residual are exact with these values). Without the flag the same
// rounds lose the rounding every round: each round's sum is
// 1 + 2^-12 + j 2^-14 (j = 0..3: below half an ulp of 1, so fp16 rounds it
// down to 1.0 and drops at least 2^-12), and the error grows linearly, past
// 100 times the bound after 200 rounds.
TEST_F(ServerCodec, Fp16ResidualIsCarriedAcrossRoundsOnlyWithErrorFeedback) {
  const size_t n = 48, rounds = 200;
  const double bound = std::ldexp(1.0, -11);
  for (bool ef : {true, false}) {
    const uint64_t key = ef ? 30 : 31;
    std::vector<double> sent(n, 0.0), received(n, 0.0);
    double worst = 0;
    for (uint64_t t = 0; t < rounds; ++t) {
      std::vector<float> a(n, 1.0f), b(n);
      for (size_t i = 0; i < n; ++i) b[i] = std::ldexp(1.0f, -12) + float((i + t) % 4) * std::ldexp(1.0f, -14);
      for (int r = 0; r < kWorkers; ++r) {
        DataHeader h = header(Op::kPush, key, t, n, 1);
        if (ef) h.flags |= wire::kFlagErrorFeedback;
        workers_[r]->send(h, pushBody("fp16", "efh", r == 0 ? a : b));
      }
      auto got = pull(0, key, t, n);
      ASSERT_EQ(got.size(), n);
      for (size_t i = 0; i < n; ++i) {
        // a and b are fp16 values: the server's decoded sum is exact.
        received[i] += double(a[i]) + double(b[i]);
        sent[i] += got[i];
        worst = std::max(worst, std::abs(sent[i] - received[i]));
        if (ef) {
          ASSERT_LE(std::abs(sent[i] - received[i]), bound) << "round " << t << " element " << i;
        }
      }
    }
    if (!ef) {
      EXPECT_GT(worst, 100 * bound) << "without error feedback the rounding must pile up";
    } else {
      EXPECT_GT(worst, 0.0);  // the residual is really there
    }
  }
}

// The same for the biased and the stochastic codecs: each answer must be the
// codec's encoding of this round's sum plus the residual that a plain-loop
// replay here carries (seed: hash2(hash2(key, round), 0), as for any server
// encode), so the running sums differ by exactly the replayed residual.
TEST_F(ServerCodec, SignAndTernaryAnswersCarryTheResidual) {
  const size_t n = 37, rounds = 60;
  uint64_t key = 40;
  for (const char* spec : {"onebit", "efsignsgd", "terngrad", "qsgd:levels=7"}) {
    auto codec = registry_.create(spec);
    std::vector<float> e(n, 0.0f);
    std::vector<double> sent(n, 0.0), received(n, 0.0);
    double worstResidual = 0;
    for (uint64_t t = 0; t < rounds; ++t) {
      std::vector<float> a(n), b(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = std::sin(0.3 * double(i) + 0.1 * double(t));
        b[i] = 0.25f + 0.5f * std::cos(0.7 * double(i * t));
      }
      // What the server decodes: each push's payload, in fp32.
      std::vector<float> sum(n, 0.0f);
      for (int r = 0; r < kWorkers; ++r) {
        Buffer body = pushBody(codec->spec(), "efq", r == 0 ? a : b, 1000 + t * 2 + r);
        const size_t pre = wire::compressedPreambleBytes(codec->spec(), "efq");
        codec->decompressAdd({reinterpret_cast<const std::byte*>(body.data() + pre), body.size() - pre},
                             sum.data(), n);
        DataHeader h = header(Op::kPush, key, t, n, 1);
        h.flags |= wire::kFlagErrorFeedback;
        workers_[r]->send(h, body);
      }
      auto got = pull(1, key, t, n);
      ASSERT_EQ(got.size(), n);
      // Replay: p = sum + e; the answer must be decode(encode(p)).
      std::vector<float> p(n);
      for (size_t i = 0; i < n; ++i) p[i] = sum[i] + e[i];
      const std::vector<float> want = reencoded(codec, key, t, p);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], want[i]) << spec << " round " << t << " element " << i;
        e[i] = p[i] - want[i];
        received[i] += sum[i];
        sent[i] += got[i];
        worstResidual = std::max(worstResidual, double(std::abs(e[i])));
        // Sent + residual = received, up to fp32 rounding of the residual updates.
        ASSERT_NEAR(sent[i] + e[i], received[i], 1e-4 * double(t + 1))
            << spec << " round " << t << " element " << i;
      }
    }
    EXPECT_GT(worstResidual, 0.0) << spec;
    ++key;
  }
}

// A raw key whose pulls ask for the codec's form (the plan executor's raw push,
// compressed pull) keeps the residual as well, with the flag on the pull.
TEST_F(ServerCodec, RawKeyPulledCompressedKeepsTheResidual) {
  const size_t n = 24, rounds = 100;
  // Half an fp16 ulp below 2, as above, plus the fp32 rounding of
  // p = 1.0003 + e in each round (at most 2^-24 per round).
  const double bound = std::ldexp(1.0, -11) + rounds * std::ldexp(1.0, -24);
  std::vector<double> sent(n, 0.0), received(n, 0.0);
  double worst = 0;
  Buffer pre = Buffer::allocate(wire::compressedPreambleBytes("fp16", "rawef"));
  wire::writeCompressedPreamble(pre.data(), "fp16", "rawef");
  for (uint64_t t = 0; t < rounds; ++t) {
    for (int r = 0; r < kWorkers; ++r) {
      std::vector<float> x(n, r == 0 ? 1.0f : 0.0003f);  // 1.0003 is not an fp16 value
      DataHeader h = header(Op::kPush, 50, t, n, 1);
      h.flags = wire::kFlagNone;
      workers_[r]->send(h, Buffer::copyOf(x.data(), n * 4));
    }
    DataHeader p = header(Op::kPull, 50, t, n, 5);
    p.flags = wire::kFlagCompressed | wire::kFlagErrorFeedback;
    workers_[0]->send(p, pre);
    auto [ah, abody] = workers_[0]->next();
    ASSERT_EQ(ah.op, Op::kPullResponse);
    std::vector<float> got(n);
    registry_.create("fp16")->decode(
        {reinterpret_cast<const std::byte*>(abody.data()), abody.size()}, got.data(), n);
    for (size_t i = 0; i < n; ++i) {
      received[i] += double(1.0f + 0.0003f);
      sent[i] += got[i];
      worst = std::max(worst, std::abs(sent[i] - received[i]));
      ASSERT_LE(std::abs(sent[i] - received[i]), bound) << "round " << t;
    }
  }
  EXPECT_GT(worst, 0.0);
}

// kFlagFlushResidual (the plan executor's last round of a shard key before a
// plan switch): a key holding a residual answers that round with the dense
// fp32 sum plus the residual and clears it, so that what the key sent over all
// its rounds equals what it received, to fp32 rounding. Rounds after a flush
// start from a zero residual (the same key can go on); a key without a
// residual (top-k's lossless answer) answers as always. Compressed pushes and
// a raw key pulled in a codec's form both, a flag on one push suffices.
TEST_F(ServerCodec, FlushedRoundAnswersDenseWithTheResidual) {
  const size_t n = 29, rounds = 12, flushAt = 7;
  Buffer pre = Buffer::allocate(wire::compressedPreambleBytes("onebit", "flush"));
  wire::writeCompressedPreamble(pre.data(), "onebit", "flush");
  for (bool rawKey : {false, true}) {
    const uint64_t key = rawKey ? 61 : 60;
    auto codec = registry_.create("onebit");
    std::vector<double> sent(n, 0.0), received(n, 0.0);
    std::vector<float> e(n, 0.0f);  // the plain-loop replay of the residual
    for (uint64_t t = 0; t < rounds; ++t) {
      const bool flush = t == flushAt;
      std::vector<float> sum(n, 0.0f);
      for (int r = 0; r < kWorkers; ++r) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = float(std::sin(0.5 * double(i) + 0.3 * double(t) + r));
        DataHeader h = header(Op::kPush, key, t, n, 1);
        Buffer body;
        if (rawKey) {
          h.flags = wire::kFlagNone;
          body = Buffer::copyOf(x.data(), n * 4);
          for (size_t i = 0; i < n; ++i) sum[i] += x[i];
        } else {
          h.flags |= wire::kFlagErrorFeedback;
          body = pushBody("onebit", "flush", x, 500 + t * 2 + r);
          const size_t p = wire::compressedPreambleBytes("onebit", "flush");
          codec->decompressAdd({reinterpret_cast<const std::byte*>(body.data() + p), body.size() - p},
                               sum.data(), n);
        }
        if (flush && r == 1) h.flags |= wire::kFlagFlushResidual;  // one push says so
        workers_[r]->send(h, body);
      }
      // Replay: p = sum + e; a flushed round answers p itself (e := 0), any
      // other decode(encode(p)) with e := p - answer.
      std::vector<float> p(n);
      for (size_t i = 0; i < n; ++i) p[i] = sum[i] + e[i];
      const std::vector<float> want = flush ? p : reencoded(codec, key, t, p);
      for (size_t i = 0; i < n; ++i) {
        e[i] = p[i] - want[i];
        received[i] += sum[i];
      }
      for (int r = 0; r < kWorkers; ++r) {
        std::vector<float> got(n);
        if (rawKey) {
          DataHeader p = header(Op::kPull, key, t, n, 5);
          p.flags = wire::kFlagCompressed | wire::kFlagErrorFeedback;
          workers_[r]->send(p, pre);
          auto [ah, abody] = workers_[r]->next();
          ASSERT_EQ(ah.op, Op::kPullResponse) << std::string(reinterpret_cast<const char*>(abody.data()), abody.size());
          ASSERT_EQ(bool(ah.flags & wire::kFlagCompressed), !flush) << "round " << t;
          if (flush) {
            ASSERT_EQ(abody.size(), n * 4);
            std::memcpy(got.data(), abody.data(), n * 4);
          } else {
            codec->decode({reinterpret_cast<const std::byte*>(abody.data()), abody.size()}, got.data(), n);
          }
        } else {
          got = pull(r, key, t, n);
        }
        ASSERT_EQ(got.size(), n);
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(got[i], want[i]) << (rawKey ? "raw" : "compressed") << " key, round " << t
                                     << " element " << i << " worker " << r;
        if (r == 0)
          for (size_t i = 0; i < n; ++i) sent[i] += got[i];
      }
      double worst = 0;
      for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(sent[i] - received[i]));
      if (flush) {
        EXPECT_LT(worst, 1e-4) << "after the flush nothing is owed";
      } else if (t + 1 == flushAt) {
        EXPECT_GT(worst, 0.1) << "the residual is really there";
      }
    }
  }
  // Top-k answers losslessly and holds no residual: a flushed round is its
  // usual sparse answer.
  std::vector<float> a = ramp(40, 1.0f, 3), b = ramp(40, 2.0f, 9);
  for (int r = 0; r < kWorkers; ++r) {
    DataHeader h = header(Op::kPush, 62, 0, 40, 1);
    h.flags |= wire::kFlagErrorFeedback | wire::kFlagFlushResidual;
    workers_[r]->send(h, pushBody("topk:ratio=0.05", "flushtopk", r == 0 ? a : b));
  }
  workers_[0]->send(header(Op::kPull, 62, 0, 40, 9), Buffer());
  auto [th, tbody] = workers_[0]->next();
  ASSERT_EQ(th.op, Op::kPullResponse);
  EXPECT_TRUE(th.flags & wire::kFlagCompressed) << "top-k's answer stays its sparse sum";
}

// A top-k or DGC key builds its answer from the indices the round's payloads
// carried and clears only those for the next round (an eighth of the key or
// fewer; more, and it scans and clears everything). Round after round, with
// the workers' indices moving, overlapping or not, answered sparse or dense,
// every answer must be the exact sum of that round's payloads: a value left
// over from an earlier round would show.
TEST_F(ServerCodec, SparseKeysAnswerEachRoundsExactSumAcrossRounds) {
  const size_t n = 4000;
  struct Case {
    uint64_t key;
    std::string spec;
    bool dense;
  };
  // ratio 0.07: 280 indices a worker; the union is within n/8 = 500 when both
  // workers pick the same ones (even rounds below), beyond it otherwise.
  for (const Case& c : {Case{70, "topk:ratio=0.01", false}, Case{71, "dgc:ratio=0.07", false},
                        Case{72, "topk:ratio=0.07", true}}) {
    auto codec = registry_.create(c.spec);
    const size_t pre = wire::compressedPreambleBytes(codec->spec(), "sparse");
    for (uint64_t t = 0; t < 6; ++t) {
      SCOPED_TRACE(::testing::Message() << c.spec << (c.dense ? " dense" : "") << " round " << t);
      std::vector<float> want(n, 0.0f);
      for (int r = 0; r < kWorkers; ++r) {
        std::vector<float> x(n);
        const int who = t % 2 == 0 ? 0 : r;  // even rounds: the same hot elements
        for (size_t i = 0; i < n; ++i)
          x[i] = float(std::sin(0.37 * double(i) * double(1 + who) + double(t))) * float(r + 1);
        Buffer body = pushBody(c.spec, "sparse", x);
        codec->decompressAdd({reinterpret_cast<const std::byte*>(body.data() + pre), body.size() - pre},
                             want.data(), n);
        DataHeader h = header(Op::kPush, c.key, t, n, 1);
        if (c.dense) h.flags |= wire::kFlagDenseAnswer;
        workers_[r]->send(h, body);
      }
      for (int r = 0; r < kWorkers; ++r) ASSERT_EQ(pull(r, c.key, t, n), want);
    }
  }
}

// Compact pushes (compressor/compact.h) sum exactly as their plain forms do,
// mixed with plain ones in a round and in one push; a malformed compact push
// is refused naming what is wrong and leaves the sum alone; and the server
// answers a sparse sum compact where that is smaller, which expands to the
// same sum.
TEST_F(ServerCodec, CompactPushesSumAsTheirPlainFormsAndSparseAnswersComeCompact) {
  const size_t n = 20000;
  for (const std::string spec : {"topk:ratio=0.05", "dgc:ratio=0.05"}) {
    SCOPED_TRACE(spec);
    const uint64_t key = spec[0] == 't' ? 120 : 121;
    auto codec = registry_.create(spec);
    const size_t pre = wire::compressedPreambleBytes(codec->spec(), "c");
    // The push body with its payload(s) compacted.
    auto compactBody = [&](const Buffer& plain) {
      std::span<const std::byte> run(reinterpret_cast<const std::byte*>(plain.data() + pre),
                                     plain.size() - pre);
      const size_t bytes = compressor::compactedRunBytes(run);
      EXPECT_LT(bytes, run.size());
      Buffer b = Buffer::allocate(pre + bytes);
      std::memcpy(b.data(), plain.data(), pre);
      compressor::compactRun(run, {reinterpret_cast<std::byte*>(b.data() + pre), bytes});
      return b;
    };
    for (uint64_t t = 0; t < 3; ++t) {
      SCOPED_TRACE(::testing::Message() << "round " << t);
      std::vector<float> want(n, 0.0f);
      for (int r = 0; r < kWorkers; ++r) {
        auto tensor = [&](int seed) {
          std::vector<float> x(n);
          for (size_t i = 0; i < n; ++i)
            x[i] = float(std::sin(0.013 * double(i) * double(seed + 1) + double(t)));
          return x;
        };
        Buffer plain = pushBody(spec, "c", tensor(r));
        codec->decompressAdd({reinterpret_cast<const std::byte*>(plain.data() + pre),
                              plain.size() - pre},
                             want.data(), n);
        if (r == 1 && t == 2) {
          // Two payloads in one push (the plan executor's form), the first
          // compact, the second plain, then a malformed compact push.
          Buffer second = pushBody(spec, "c", tensor(7));
          codec->decompressAdd({reinterpret_cast<const std::byte*>(second.data() + pre),
                                second.size() - pre},
                               want.data(), n);
          Buffer first = compactBody(plain);
          Buffer two = Buffer::allocate(first.size() + second.size() - pre);
          std::memcpy(two.data(), first.data(), first.size());
          std::memcpy(two.data() + first.size(), second.data() + pre, second.size() - pre);
          Buffer bad = Buffer::copyOf(first.data(), first.size());
          bad.data()[bad.size() - 1] |= 0x80;  // the last gap now runs past the end
          workers_[r]->send(header(Op::kPush, key, t, n, 5), std::move(bad));
          const std::string e = workers_[r]->nextError();
          EXPECT_NE(e.find("tensor 'c'"), std::string::npos) << e;
          EXPECT_NE(e.find("worker 1"), std::string::npos) << e;
          EXPECT_NE(e.find("compact"), std::string::npos) << e;
          EXPECT_NE(e.find("truncated"), std::string::npos) << e;
          workers_[r]->send(header(Op::kPush, key, t, n, 1), std::move(two));
          continue;
        }
        // Round 0: worker 0 plain, worker 1 compact; later rounds compact.
        workers_[r]->send(header(Op::kPush, key, t, n, 1),
                          t == 0 && r == 0 ? std::move(plain) : compactBody(plain));
      }
      for (int r = 0; r < kWorkers; ++r) {
        bool compact = false;
        ASSERT_EQ(pull(r, key, t, n, &compact), want);
        EXPECT_TRUE(compact);  // 2-3 workers' 5% of 20000: far below the dense sum
      }
    }
  }
}

// A push of several payloads whose second lists an index out of range is
// refused before any of it is added (it comes after a good push of the
// round, so nothing would zero what it left): every round's answer is the
// good pushes' exact sum.
TEST_F(ServerCodec, SparseKeyRefusesABadIndexInAnyPayloadBeforeAddingAny) {
  const size_t n = 3000;
  const std::string spec = "dgc:ratio=0.01";
  auto codec = registry_.create(spec);
  const size_t pre = wire::compressedPreambleBytes(codec->spec(), "bad");
  auto tensor = [&](int r, uint64_t t) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = float(std::cos(0.11 * double(i) * double(r + 2) + double(t)));
    return x;
  };
  for (uint64_t t = 0; t < 3; ++t) {
    std::vector<float> want(n, 0.0f);
    for (int r = 0; r < kWorkers; ++r) {
      if (r == 1 && t > 0) {
        // The first payload picks worker 0's elements: were it added, the
        // answer (read at the listed indices) would show it.
        Buffer pa = pushBody(spec, "bad", tensor(0, t)), pb = pushBody(spec, "bad", tensor(6, t));
        Buffer two = Buffer::allocate(pa.size() + pb.size() - pre);
        std::memcpy(two.data(), pa.data(), pa.size());
        std::memcpy(two.data() + pa.size(), pb.data() + pre, pb.size() - pre);
        // The second payload's first index: n, one past the end.
        const uint32_t past = uint32_t(n);
        std::memcpy(two.data() + pa.size() + compressor::kHeaderBytes, &past, 4);
        workers_[r]->send(header(Op::kPush, 80, t, n, 1), two);
        const std::string e = workers_[r]->nextError();
        EXPECT_NE(e.find("out of range"), std::string::npos) << e;
      }
      Buffer body = pushBody(spec, "bad", tensor(r, t));
      codec->decompressAdd({reinterpret_cast<const std::byte*>(body.data() + pre), body.size() - pre},
                           want.data(), n);
      workers_[r]->send(header(Op::kPush, 80, t, n, 2), body);
    }
    for (int r = 0; r < kWorkers; ++r) ASSERT_EQ(pull(r, 80, t, n), want) << "round " << t;
  }
}

// The same for the dense codecs, whose body checks (a code beyond the
// levels, ternary code 3, natural's negative zero, sign padding bits) come
// after a header that parses: a push of two payloads whose second fails
// them is refused whole, and every round answers the good pushes' exact sum
// (dense answers, so the sum itself is compared).
TEST_F(ServerCodec, DenseKeyRefusesABadBodyInAnyPayloadBeforeAddingAny) {
  const size_t n = 3001;  // not a multiple of 8: the sign codecs have padding bits
  struct Case {
    uint64_t key;
    std::string spec;
    size_t at;           // byte of the payload set to `value`; 0: `value` or'ed into the last
    std::byte value;
    std::string error;   // what the refusal says
  };
  const size_t body = compressor::kHeaderBytes;
  const std::vector<Case> cases = {
      {90, "qsgd:levels=5", body + 4, std::byte{0x07}, "above the 5 levels"},
      {91, "terngrad", body + 4, std::byte{0x0c}, "invalid code 3"},
      {92, "natural", body + 2, std::byte{0x80}, "negative zero"},
      {93, "efsignsgd", 0, std::byte{0x80}, "padding bits"},  // 0: the last byte
  };
  for (const Case& c : cases) {
    auto codec = registry_.create(c.spec);
    const size_t pre = wire::compressedPreambleBytes(codec->spec(), "bad");
    auto tensor = [&](int r, uint64_t t) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i)
        x[i] = float(std::sin(0.07 * double(i) * double(r + 2) + double(t))) * float(r + 1);
      return x;
    };
    for (uint64_t t = 0; t < 3; ++t) {
      SCOPED_TRACE(::testing::Message() << c.spec << " round " << t);
      std::vector<float> want(n, 0.0f);
      for (int r = 0; r < kWorkers; ++r) {
        if (r == 1 && t > 0) {
          Buffer pa = pushBody(c.spec, "bad", tensor(5, t)), pb = pushBody(c.spec, "bad", tensor(6, t));
          Buffer two = Buffer::allocate(pa.size() + pb.size() - pre);
          std::memcpy(two.data(), pa.data(), pa.size());
          std::memcpy(two.data() + pa.size(), pb.data() + pre, pb.size() - pre);
          uint8_t* second = two.data() + pa.size();
          if (c.at)
            second[c.at] = static_cast<uint8_t>(c.value);
          else
            second[pb.size() - pre - 1] |= static_cast<uint8_t>(c.value);
          DataHeader h = header(Op::kPush, c.key, t, n, 1);
          h.flags |= wire::kFlagDenseAnswer;
          workers_[r]->send(h, two);
          const std::string e = workers_[r]->nextError();
          EXPECT_NE(e.find(c.error), std::string::npos) << e;
        }
        Buffer good = pushBody(c.spec, "bad", tensor(r, t));
        codec->decompressAdd({reinterpret_cast<const std::byte*>(good.data() + pre), good.size() - pre},
                             want.data(), n);
        DataHeader h = header(Op::kPush, c.key, t, n, 2);
        h.flags |= wire::kFlagDenseAnswer;
        workers_[r]->send(h, good);
      }
      for (int r = 0; r < kWorkers; ++r) ASSERT_EQ(pull(r, c.key, t, n), want);
    }
  }
}

// The stall check (ServerEngineOptions::stallAfter): a round that one worker
// pushed and the other has not is reported once, naming the key, the round
// and who pushed; it still completes, with the exact sum, when the late push
// comes; rounds that complete in time are never reported.
class ServerStall : public ServerCodec {
 protected:
  void configure(server::ServerEngineOptions& o) override {
    o.stallAfter = std::chrono::milliseconds(150);
    o.onStall = [this](const StallReport& r) {
      std::lock_guard<std::mutex> lk(mu_);
      reports_.push_back(r);
      cv_.notify_all();
    };
  }
  // The reports so far, once there are at least `n` or `wait` has passed.
  std::vector<StallReport> reports(size_t n, std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, wait, [&] { return reports_.size() >= n; });
    return reports_;
  }
  static DataHeader rawPush(uint64_t key, uint64_t round, uint64_t n) {
    DataHeader h = header(Op::kPush, key, round, n, 3);
    h.flags = wire::kFlagNone;
    return h;
  }
  static Buffer floats(const std::vector<float>& x) {
    return Buffer::copyOf(x.data(), 4 * x.size());
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StallReport> reports_;
};

TEST_F(ServerStall, ARoundMissingAWorkersPushIsReportedOnceAndStillCompletes) {
  const size_t n = 64;
  std::vector<float> x0(n), x1(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    x0[i] = float(i);
    x1[i] = 1000.0f - 3.0f * float(i);
    want[i] = x0[i] + x1[i];
  }
  const auto start = std::chrono::steady_clock::now();
  workers_[1]->send(rawPush(9, 0, n), floats(x1));  // worker 0 is late
  auto got = reports(1, std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 1u);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(150));
  EXPECT_EQ(got[0].key, 9u);
  EXPECT_EQ(got[0].round, 0u);
  EXPECT_EQ(got[0].pushed, std::vector<int>{1});
  EXPECT_EQ(got[0].expected, kWorkers);
  EXPECT_GE(got[0].waitedMs, 150u);
  EXPECT_EQ(got[0].tensor, "");  // uncompressed pushes carry no name
  // Once per round: still one report after several more checks.
  EXPECT_EQ(reports(2, std::chrono::milliseconds(600)).size(), 1u);
  // The late push completes the round with the exact sum.
  workers_[0]->send(rawPush(9, 0, n), floats(x0));
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(pull(r, 9, 0, n), want);
  // Rounds whose pushes come together are not reported.
  for (uint64_t round = 1; round <= 3; ++round) {
    workers_[0]->send(rawPush(9, round, n), floats(x0));
    workers_[1]->send(rawPush(9, round, n), floats(x1));
    for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(pull(r, 9, round, n), want);
  }
  EXPECT_EQ(reports(2, std::chrono::milliseconds(500)).size(), 1u);
}

TEST_F(ServerStall, ACompressedKeysReportNamesItsTensorAndALaterRoundIsReportedAgain) {
  const size_t n = 200;
  auto x0 = ramp(n, 1.0f, 3), x1 = ramp(n, 2.0f, 5);
  workers_[0]->send(header(Op::kPush, 4, 0, n, 1),
                    pushBody("topk:ratio=0.005", "layer1.weight", x0));
  auto got = reports(1, std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tensor, "layer1.weight");
  EXPECT_EQ(got[0].pushed, std::vector<int>{0});
  workers_[1]->send(header(Op::kPush, 4, 0, n, 2),
                    pushBody("topk:ratio=0.005", "layer1.weight", x1));
  std::vector<float> expect(n, 0.0f);
  expect[3] = x0[3], expect[5] = x1[5];  // each worker's one largest magnitude
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(pull(r, 4, 0, n), expect);
  // Round 1 stalls on the other worker: a report of its own.
  workers_[1]->send(header(Op::kPush, 4, 1, n, 3),
                    pushBody("topk:ratio=0.005", "layer1.weight", x1));
  got = reports(2, std::chrono::seconds(10));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].round, 1u);
  EXPECT_EQ(got[1].pushed, std::vector<int>{1});
}

}  // namespace
}  // namespace cortado
