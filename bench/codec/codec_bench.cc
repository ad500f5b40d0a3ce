// Codec throughput next to the machine's single-thread memcpy bandwidth, and
// top-k / DGC next to torch.topk on the same tensor, all in one run.
//
//   cortado_codec_bench [benchmark flags]
//   cortado_codec_bench --export_costs=costs.json [--cost_max_elements=N]
//                       [--cost_reps=R] [--threads=T]
//
// GB/s is input bytes (fp32) per second. Codec runs use --threads threads
// (default: every core) through a ThreadPool; memcpy uses one.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compressor/cpu/kernels.h"
#include "compressor/error_feedback.h"
#include "compressor/payload.h"
#include "compressor/registry.h"
#include "compressor/sparse_sum.h"
#include "core/common/thread_pool.h"
#include "cost_export.h"
#include "torch_ref.h"

namespace cortado::bench {
namespace {

using compressor::EncodeContext;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<float> normalTensor(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Best of several single-thread memcpy runs: the bandwidth yardstick.
double memcpyGBs(const std::vector<float>& src) {
  std::vector<float> dst(src.size());
  std::memcpy(dst.data(), src.data(), src.size() * 4);  // fault the pages in
  double best = 1e9;
  for (int r = 0; r < 15; ++r) {
    auto t = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size() * 4);
    benchmark::DoNotOptimize(dst.data());
    best = std::min(best, secondsSince(t));
  }
  return src.size() * 4 / best / 1e9;
}

struct Context {
  compressor::Registry registry;
  std::unique_ptr<ThreadPool> pool;
  size_t threads = 1;
  std::vector<float> x64;  // 64 MiB
  std::vector<float> x25;  // 25M floats
  // 25M floats, 4% and 1% non-zero: what the alltoall path re-encodes, the
  // sum of 4 workers' 1% sparse chunks (1%: the workers chose the same
  // indices, so the k-th magnitude is zero).
  std::vector<float> x25sparse4, x25sparse1;
  double memcpy = 0;
};

// Registers a manually timed benchmark that reports GB/s of `bytes` input and
// how that compares with memcpy.
template <typename Fn>
void addThroughput(Context& c, const std::string& name, double bytes, Fn fn) {
  benchmark::RegisterBenchmark(name.c_str(), [&c, bytes, fn](benchmark::State& st) {
    double total = 0;
    for (auto _ : st) {
      auto t = Clock::now();
      fn();
      double dt = secondsSince(t);
      st.SetIterationTime(dt);
      total += dt;
    }
    double gbs = bytes / (total / st.iterations()) / 1e9;
    st.counters["GB/s"] = gbs;
    st.counters["memcpy_GB/s"] = c.memcpy;
    st.counters["pct_memcpy"] = 100.0 * gbs / c.memcpy;
  })->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
}

void registerAll(Context& c) {
  const double bytes64 = c.x64.size() * 4.0;
  addThroughput(c, "memcpy/64MiB/threads:1", bytes64, [&c, dst = std::make_shared<std::vector<float>>(c.x64.size())] {
    std::memcpy(dst->data(), c.x64.data(), c.x64.size() * 4);
    benchmark::DoNotOptimize(dst->data());
  });
  for (std::string spec : {"fp16", "bf16", "onebit", "signsgd", "efsignsgd", "qsgd:levels=7",
                           "terngrad", "randomk:ratio=0.01"}) {
    auto codec = c.registry.create(spec);
    for (size_t threads : {size_t{1}, c.threads}) {
      auto out = std::make_shared<std::vector<std::byte>>(codec->payloadBytes(c.x64.size()));
      EncodeContext ctx;
      ctx.pool = threads > 1 ? c.pool.get() : nullptr;
      ctx.seed = 1;
      addThroughput(c, "encode/" + spec + "/64MiB/threads:" + std::to_string(threads), bytes64,
                    [&c, codec, out, ctx] { codec->encode(c.x64.data(), c.x64.size(), *out, ctx); });
      if (threads == 1 && c.threads == 1) break;
    }
  }
  // The worker's full error-feedback step (the update in the codec's pass, then
  // the sent part taken off the residual).
  {
    auto ef = std::make_shared<compressor::ErrorFeedback>(c.registry.create("efsignsgd"));
    auto out = std::make_shared<std::vector<std::byte>>(ef->payloadBytes(c.x64.size()));
    EncodeContext ctx;
    ctx.pool = c.pool.get();
    addThroughput(c, "ef_encode/efsignsgd/64MiB/threads:" + std::to_string(c.threads), bytes64,
                  [&c, ef, out, ctx] { ef->encode(0, c.x64.data(), c.x64.size(), *out, ctx); });
  }
  // Error feedback's update folded into the encode (Codec::encodeUpdated)
  // against its own pass followed by the encode, the same work otherwise;
  // DGC with its momentum. Neither takes what was sent off the residual
  // (the same on both sides).
  for (std::string spec : {"efsignsgd", "dgc:ratio=0.01"}) {
    auto codec = c.registry.create(spec);
    const size_t n = c.x64.size();
    struct State {
      std::vector<float> e, u;
      std::vector<std::byte> out;
    };
    auto st = std::make_shared<State>(
        State{std::vector<float>(n, 0.0f), std::vector<float>(codec->sparse() ? n : 0, 0.0f),
              std::vector<std::byte>(codec->payloadBytes(n))});
    const float m = codec->momentumCorrection();
    auto update = [&c, st, m] {
      return compressor::FeedbackUpdate{st->e.data(), st->u.empty() ? nullptr : st->u.data(),
                                        c.x64.data(), m};
    };
    const std::string name = "ef_update_encode/" + spec + "/64MiB/threads:1/";
    addThroughput(c, name + "fused", bytes64,
                  [codec, st, update, n] { codec->encodeUpdated(update(), n, st->out, {}); });
    addThroughput(c, name + "update-then-encode", bytes64, [codec, st, update, n] {
      compressor::cpu::applyUpdate(update(), 0, n);
      codec->encode(st->e.data(), n, st->out, {});
    });
  }
  // The server's side: decompress-add a push into the fp32 sum.
  for (std::string spec : {"fp16", "onebit", "efsignsgd", "topk:ratio=0.01"}) {
    auto codec = c.registry.create(spec);
    auto payload = std::make_shared<std::vector<std::byte>>(codec->payloadBytes(c.x64.size()));
    EncodeContext ctx;
    ctx.pool = c.pool.get();
    codec->encode(c.x64.data(), c.x64.size(), *payload, ctx);
    auto sum = std::make_shared<std::vector<float>>(c.x64.size(), 0.0f);
    addThroughput(c, "decompress_add/" + spec + "/64MiB/threads:" + std::to_string(c.threads),
                  bytes64, [codec, payload, sum, ctx] {
                    codec->decompressAdd(*payload, sum->data(), sum->size(), 1.0f, ctx);
                  });
  }

  // A server's round of a DGC key as the plan executor pushes it: 4 workers'
  // payloads of one 4 MiB chunk summed and answered as their lossless sparse
  // sum. "scan": zero the sum, add, then find the nonzeros among all n (the
  // server before 2026-11-22, fifth session); "indexed": from the indices the
  // payloads carried (compressor/sparse_sum.h), clearing only those.
  {
    const size_t n = size_t{1} << 20;
    auto codec = c.registry.create("dgc:ratio=0.01");
    auto payloads = std::make_shared<std::vector<std::vector<std::byte>>>();
    for (int w = 0; w < 4; ++w) {
      std::vector<float> x(c.x64.begin() + w * n, c.x64.begin() + (w + 1) * n);
      payloads->emplace_back(codec->payloadBytes(n));
      codec->encode(x.data(), n, payloads->back(), {});
    }
    auto sum = std::make_shared<std::vector<float>>(n, 0.0f);
    auto out = std::make_shared<std::vector<std::byte>>(n * 4 + compressor::kHeaderBytes);
    auto touched = std::make_shared<compressor::IndexUnion>();
    addThroughput(c, "server_round/dgc:ratio=0.01/4x4MiB/scan", n * 4.0, [=] {
      std::fill(sum->begin(), sum->end(), 0.0f);
      for (auto& p : *payloads) codec->decompressAdd(p, sum->data(), n);
      const size_t k = compressor::countNonzeros(sum->data(), n);
      compressor::encodeSparseSum(sum->data(), n, k, {out->data(), compressor::sparseSumBytes(k)});
    });
    addThroughput(c, "server_round/dgc:ratio=0.01/4x4MiB/indexed", n * 4.0, [=] {
      touched->reset(n);
      for (auto& p : *payloads) {
        codec->decompressAdd(p, sum->data(), n);
        touched->add(p);
      }
      std::span<const uint32_t> at = touched->merged();
      const size_t k = compressor::countNonzeros(sum->data(), at);
      compressor::encodeSparseSum(sum->data(), n, at, k, {out->data(), compressor::sparseSumBytes(k)});
      for (uint32_t i : at) (*sum)[i] = 0.0f;
    });
  }

  // top-k and DGC against torch.topk(|x|, k) on the same 25M floats: normal
  // values, and a sparse sum's (4% and 1% non-zero).
  const size_t n = c.x25.size();
  for (auto [ratio, sparse] : {std::pair{0.01, 0}, std::pair{0.001, 0}, std::pair{0.01, 4}, std::pair{0.01, 1}}) {
    const std::vector<float>* x = sparse == 4   ? &c.x25sparse4  // live in c, past this loop
                                  : sparse == 1 ? &c.x25sparse1
                                                : &c.x25;
    const std::string what = sparse ? "/25M-sparse" + std::to_string(sparse) + "%" : "/25M";
    size_t k = static_cast<size_t>(n * ratio);
    double torchSec = 0;
    if (torchAvailable()) {
      torchSec = 1e9;
      for (int r = 0; r < 3; ++r) torchSec = std::min(torchSec, torchTopkOnce(x->data(), n, k));
      std::string tname = "torch.topk/ratio:" + std::to_string(ratio).substr(0, 5) + what + "/threads:" +
                          std::to_string(torchThreads());
      benchmark::RegisterBenchmark(tname.c_str(), [x, n, k](benchmark::State& st) {
        for (auto _ : st) st.SetIterationTime(torchTopkOnce(x->data(), n, k));
        st.counters["GB/s"] = benchmark::Counter(4.0 * n * st.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
      })->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
    }
    for (std::string name : {"topk", "dgc"}) {
      auto codec = c.registry.create(name + ":ratio=" + std::to_string(ratio));
      auto out = std::make_shared<std::vector<std::byte>>(codec->payloadBytes(n));
      EncodeContext ctx;
      ctx.pool = c.pool.get();
      std::string bname = "encode/" + codec->spec() + what + "/threads:" + std::to_string(c.threads);
      benchmark::RegisterBenchmark(bname.c_str(), [x, codec, out, ctx, n, torchSec](benchmark::State& st) {
        double total = 0;
        for (auto _ : st) {
          auto t = Clock::now();
          codec->encode(x->data(), n, *out, ctx);
          double dt = secondsSince(t);
          st.SetIterationTime(dt);
          total += dt;
        }
        double per = total / st.iterations();
        st.counters["GB/s"] = 4.0 * n / per / 1e9;
        if (torchSec > 0) {
          st.counters["torch_ms"] = torchSec * 1e3;
          st.counters["x_vs_torch"] = torchSec / per;
        }
      })->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
    }
  }
}

}  // namespace
}  // namespace cortado::bench

int main(int argc, char** argv) {
  using namespace cortado::bench;
  const size_t threads = takeThreadsFlag(argc, argv);
  std::string v;
  auto pool = threads > 1 ? std::make_unique<cortado::ThreadPool>(threads - 1) : nullptr;
  if (takeFlag(argc, argv, "--export_costs", &v)) {
    CostExportOptions o;
    o.path = v;
    o.pool = pool.get();
    takeCostFlags(argc, argv, o,
                  {"fp16", "bf16", "onebit", "signsgd", "efsignsgd", "topk:ratio=0.01", "topk:ratio=0.001",
                   "dgc:ratio=0.001", "randomk:ratio=0.01", "qsgd:levels=7", "terngrad", "natural"});
    return runCostExport(o);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Context c;
  cortado::compressor::registerCpuCodecs(c.registry);
  c.pool = std::move(pool);
  c.threads = threads;
  c.x64 = normalTensor(16u << 20, 1);
  c.x25 = normalTensor(25'000'000, 2);
  c.x25sparse4.assign(c.x25.size(), 0.0f);
  c.x25sparse1.assign(c.x25.size(), 0.0f);
  for (size_t i = 0; i < c.x25.size(); i += 25) c.x25sparse4[i + (i / 25) * 7 % 25] = c.x25[i];
  for (size_t i = 0; i < c.x25.size(); i += 100) c.x25sparse1[i + (i / 100) * 37 % 100] = c.x25[i];
  c.memcpy = memcpyGBs(c.x64);
  std::cerr << "single-thread memcpy of 64 MiB: " << c.memcpy << " GB/s; codec threads: " << threads
            << "; torch.topk comparison: " << (torchAvailable() ? "on" : "off (no libtorch)") << "\n";
  registerAll(c);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
