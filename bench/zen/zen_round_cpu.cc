// The CPU work of one Zen round, step by step, in one process and on one
// thread (no network, no engine): what `cortado bench sparse` spends in the
// library per worker and per server, beside the allgather peer's zeroing
// and scatter-add of every pair. Each step is timed with the thread's CPU
// clock and reported as the median over the rounds, per worker or per
// server (the mean over them). The pairs are drawn as `cortado bench
// sparse` draws them (index i with probability ~ c / (i + 1), ascending;
// small integer values), and every round's output is checked against the
// plain sum. The pushes are delta-coded where smaller, as the worker engine
// sends them by default (--pushes coo: COO, as with CORTADO_COMPACT_SPARSE=0);
// --shuffled gives each worker its pairs out of order, so that they go
// through the hash table (and, for delta-coded pushes, its ascending
// read-out) instead of the direct path.
//
//   zen_round_cpu [--elements N] [--density PERCENT] [--workers W] [--rounds R]
//                 [--pushes delta|coo] [--shuffled 0|1]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compressor/zen/zen_hash.h"
#include "compressor/zen/zen_payload.h"
#include "compressor/zen/zen_sum.h"
#include "launcher/sparse_pairs.h"

namespace zen = cortado::compressor::zen;
using cortado::launcher::Pairs;
using cortado::launcher::skewedPairs;

namespace {

double cpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 16777216;
  double density = 1.0;
  int W = 4, rounds = 5;
  bool compact = true, shuffled = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--elements")
      n = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--density")
      density = std::atof(argv[i + 1]);
    else if (a == "--workers")
      W = std::atoi(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else if (a == "--pushes" &&
             (std::string(argv[i + 1]) == "delta" || std::string(argv[i + 1]) == "coo"))
      compact = std::string(argv[i + 1]) == "delta";
    else if (a == "--shuffled")
      shuffled = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const auto S = uint32_t(W);  // one server per worker, as in the benchmark
  std::vector<Pairs> in;
  for (int r = 0; r < W; ++r) in.push_back(skewedPairs(n, density / 100, r, 2));
  if (shuffled) {
    std::mt19937_64 rng(7);
    for (Pairs& p : in) {
      for (size_t i = p.index.size(); i > 1; --i) {
        const size_t j = rng() % i;
        std::swap(p.index[i - 1], p.index[j]);
        std::swap(p.value[i - 1], p.value[j]);
      }
    }
  }
  std::vector<float> ref(n, 0.0f);
  for (const Pairs& p : in)
    for (size_t i = 0; i < p.index.size(); ++i) ref[p.index[i]] += p.value[i];
  const zen::Ownership own(n, S, 0x1234);
  const zen::IndexLists lists(own);
  std::vector<zen::ServerSum> servers;
  for (uint32_t p = 0; p < S; ++p) servers.emplace_back(own, p);
  std::vector<float> out(n, 1.0f);
  enum Step { kPlace, kEncode, kAdd, kAnswer, kCheck, kAssemble, kGatherAdd, kSteps };
  const char* names[kSteps] = {"worker: placement (level 1 and 2)",
                               compact ? "worker: delta-coded (or COO) encoding of the pushes"
                                       : "worker: COO encoding of the pushes",
                               "server: checks and adds of the pushes",
                               "server: sum and answer",
                               "worker: checking the answers",
                               "worker: zeroing and writing the output (one pass)",
                               "allgather peer: zeroing and scatter-add of all pairs"};
  std::vector<std::vector<double>> ms(kSteps);
  int wrong = 0;
  double pushBytes = 0, answerBytes = 0;  // the last round's, per worker and per server
  for (int round = 0; round < rounds; ++round) {
    double t[kSteps] = {};
    // Workers: place and encode.
    std::vector<std::vector<std::vector<std::byte>>> pushes(W);  // [worker][server]
    pushBytes = answerBytes = 0;
    for (int r = 0; r < W; ++r) {
      double c0 = cpuMs();
      zen::PlacementOptions po;
      po.ascendingLists = compact;
      zen::HierarchicalHash hh(own, po);
      zen::Partitioned parts;
      hh.place(in[r].index, in[r].value, parts);
      double c1 = cpuMs();
      for (uint32_t p = 0; p < S; ++p) {
        const zen::PushForm form = zen::choosePushForm(parts.indices[p], compact);
        std::vector<std::byte> push(zen::pushBytes(parts.indices[p], form));
        zen::writePush(own, p, parts.indices[p], parts.values[p], form, push);
        pushBytes += double(push.size()) / W;
        pushes[r].push_back(std::move(push));
      }
      double c2 = cpuMs();
      t[kPlace] += c1 - c0;
      t[kEncode] += c2 - c1;
    }
    // Servers: add every worker's push, then answer.
    std::vector<std::vector<std::byte>> answers(S);
    for (uint32_t p = 0; p < S; ++p) {
      double c0 = cpuMs();
      for (int r = 0; r < W; ++r) servers[p].add(pushes[r][p]);
      double c1 = cpuMs();
      answers[p] = servers[p].answer();
      answerBytes += double(answers[p].size()) / S;
      double c2 = cpuMs();
      t[kAdd] += c1 - c0;
      t[kAnswer] += c2 - c1;
    }
    // Every worker checks and assembles the same answers: once, counted
    // per worker.
    {
      double c0 = cpuMs();
      std::vector<zen::CheckedAnswer> checked(S);
      for (uint32_t p = 0; p < S; ++p)
        zen::checkAnswer(answers[p], own, p, lists.of(p), checked[p]);
      double c1 = cpuMs();
      zen::assembleDense(checked, n, 1.0f, out.data());
      double c2 = cpuMs();
      t[kCheck] += W * (c1 - c0);
      t[kAssemble] += W * (c2 - c1);
      if (out != ref) ++wrong;
    }
    {
      double c0 = cpuMs();
      std::memset(out.data(), 0, n * sizeof(float));
      for (const Pairs& p : in)
        for (size_t i = 0; i < p.index.size(); ++i) out[p.index[i]] += p.value[i];
      t[kGatherAdd] += W * (cpuMs() - c0);
      if (out != ref) ++wrong;
    }
    for (int s = 0; s < kSteps; ++s) ms[s].push_back(t[s] / W);
  }
  uint64_t pairs = 0, nnz = 0;
  for (const Pairs& p : in) pairs += p.index.size();
  for (float x : ref) nnz += x != 0.0f;
  std::printf(
      "# zen_round_cpu: %llu elements, %d workers and servers, %.2f%% per worker "
      "(%.2f%% in the sum), %d rounds; thread CPU ms per worker or server, median\n",
      (unsigned long long)n, W, 100.0 * double(pairs) / W / double(n),
      100.0 * double(nnz) / double(n), rounds);
  std::printf("| step | CPU ms |\n|---|---|\n");
  double zenTotal = 0;
  for (int s = 0; s < kSteps; ++s) {
    const double m = median(ms[s]);
    if (s != kGatherAdd) zenTotal += m;
    std::printf("| %s | %.2f |\n", names[s], m);
  }
  std::printf("| Zen, all steps (one worker and one server) | %.2f |\n", zenTotal);
  std::printf(
      "# bytes: a worker's pushes %.0f (all servers), a server's answer %.0f; %s pushes%s\n",
      pushBytes, answerBytes, compact ? "delta-coded" : "COO",
      shuffled ? ", input out of order" : "");
  std::printf("# check: %s\n", wrong ? "WRONG" : "ok");
  return wrong ? 1 : 0;
}
