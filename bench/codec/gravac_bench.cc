// GraVAC's multi-level compression against compressing the original twice,
// in one run: each iteration GraVAC needs the tensor at the minimum CF and
// at the candidate CF (minimum x step). "direct" encodes the full tensor
// twice; "multi-level" encodes it once at the minimum CF and compresses
// that payload again (compressor/multi_level.h). Prints both times and
// their ratio (direct / multi-level) per codec and CF pair, and the same for
// the second encode alone (the candidate from the tensor, or from the first
// level's payload), which is all that multi-level compression replaces.
//
//   cortado_gravac_bench [--elements=N] [--reps=R] [--threads=T]
//
// Repetitions alternate the two ways, so that a load change on a shared
// machine hits both; the figure is the median of each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compressor/multi_level.h"
#include "compressor/registry.h"
#include "core/common/thread_pool.h"
#include "cost_export.h"

namespace {

using cortado::compressor::EncodeContext;
using cortado::compressor::MultiLevelCodec;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cortado;
  const size_t threads = bench::takeThreadsFlag(argc, argv);
  std::string v;
  size_t n = 25'000'000;  // about ResNet-50's gradient
  int reps = 7;
  if (bench::takeFlag(argc, argv, "--elements", &v)) n = std::stoull(v);
  if (bench::takeFlag(argc, argv, "--reps", &v)) reps = std::max(1, std::stoi(v));
  if (argc > 1) {
    std::fprintf(stderr, "unknown argument %s; flags: --elements=N --reps=R --threads=T\n",
                 argv[1]);
    return 1;
  }
  auto pool = threads > 1 ? std::make_unique<ThreadPool>(threads - 1) : nullptr;
  compressor::Registry registry;
  compressor::registerCpuCodecs(registry);

  std::vector<float> x(n);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> d;
  for (auto& e : x) e = d(rng);

  std::printf("GraVAC multi-level vs direct: %zu fp32 elements, %zu thread(s), median of %d\n", n,
              threads, reps);
  std::printf("%-8s %7s %9s %10s %15s %7s %16s %16s %7s\n", "codec", "min CF", "cand. CF",
              "direct ms", "multi-level ms", "ratio", "2nd: direct ms", "2nd: from 1st ms",
              "ratio");
  struct Case {
    const char* codec;
    double minCf, candidateCf;
  };
  const Case cases[] = {{"topk", 10, 20},    {"topk", 10, 160},    {"topk", 100, 1000},
                        {"dgc", 10, 20},     {"dgc", 10, 160},     {"dgc", 100, 1000},
                        {"randomk", 10, 20}, {"randomk", 10, 160}, {"randomk", 1.5, 12}};
  EncodeContext ctx;
  ctx.pool = pool.get();
  ctx.seed = 3;
  for (const auto& c : cases) {
    MultiLevelCodec codec(registry, c.codec, 1);
    std::vector<std::byte> first(codec.payloadBytes(n, c.minCf));
    std::vector<std::byte> second(codec.payloadBytes(n, c.candidateCf));
    std::vector<std::byte> check(second.size());
    std::vector<double> direct, multi, direct2, multi2;
    for (int r = 0; r < reps + 1; ++r) {  // the first round warms up
      auto t = Clock::now();
      codec.encode(x.data(), n, c.minCf, first, ctx);
      auto t2 = Clock::now();
      codec.encode(x.data(), n, c.candidateCf, check, ctx);
      double dt = seconds(t), dt2 = seconds(t2);
      t = Clock::now();
      codec.encode(x.data(), n, c.minCf, first, ctx);
      t2 = Clock::now();
      codec.recompress(first, n, c.candidateCf, second, ctx);
      double mt = seconds(t), mt2 = seconds(t2);
      if (r > 0) {
        direct.push_back(dt);
        multi.push_back(mt);
        direct2.push_back(dt2);
        multi2.push_back(mt2);
      }
    }
    // Top-k and DGC: both ways must produce the same candidate payload.
    const char* same = c.codec[0] == 'r' ? "" : (second == check ? "" : "  (payloads differ!)");
    double dm = median(direct), mm = median(multi), d2 = median(direct2), m2 = median(multi2);
    std::printf("%-8s %7g %9g %10.2f %15.2f %6.2fx %16.2f %16.2f %6.2fx%s\n", c.codec, c.minCf,
                c.candidateCf, dm * 1e3, mm * 1e3, dm / mm, d2 * 1e3, m2 * 1e3, d2 / m2, same);
  }
  return 0;
}
