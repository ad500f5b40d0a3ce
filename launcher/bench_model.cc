#include "launcher/bench_model.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include "compressor/error_feedback.h"
#include "compressor/registry.h"
#include "core/backends.h"
#include "core/collective/mpi/factory.h"
#include "core/common/env.h"
#include "core/common/logging.h"
#include "core/executor.h"
#include "scheduler/planner/decision.h"
#include "scheduler/planner/option_tree.h"
#include "scheduler/planner/report.h"

namespace cortado::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using planner::AlphaBeta;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A world-wide helper over the MPI groups.
struct World {
  collective::Collectives& c;
  Deadline deadline() const { return Deadline::after(Millis(600000)); }
  void barrier() {
    int32_t x = 0, y = 0;
    c.allreduce(&x, &y, 1, DType::kInt32, deadline());
  }
  // Element-wise mean over the world.
  std::vector<double> mean(std::vector<double> v) {
    std::vector<double> out(v.size());
    c.allreduce(v.data(), out.data(), v.size(), DType::kFloat64, deadline());
    for (double& x : out) x /= c.size();
    return out;
  }
  // Element-wise maximum over the world.
  std::vector<double> max(const std::vector<double>& v) {
    std::vector<double> all(v.size() * c.size());
    c.allgather(v.data(), v.size(), all.data(), DType::kFloat64, deadline());
    std::vector<double> out(v);
    for (int r = 0; r < c.size(); ++r)
      for (size_t i = 0; i < v.size(); ++i) out[i] = std::max(out[i], all[r * v.size() + i]);
    return out;
  }
  std::string broadcast(std::string s) {
    int64_t n = int64_t(s.size());
    c.broadcast(&n, 1, DType::kInt64, 0, deadline());
    s.resize(size_t(n));
    c.broadcast(s.data(), s.size(), DType::kUInt8, 0, deadline());
    return s;
  }
};

// Integer-valued gradients: worker r's element i of tensor j in iteration it
// is (r + 1) * (1 + it % 3) * pattern_j[i], pattern a hash of (i, j) in
// [-levels, levels]; every fp32 and fp16 sum of them is exact.
//
// As many levels as keep the largest sum, n(n+1)/2 * 3 * levels for n
// workers, within fp16's exact integers (2048), up to 64 (2 at least, so
// beyond 25 workers an fp16 sum can leave them): with
// few distinct magnitudes a top-k threshold ties with a large share of the
// tensor (with [-2, 2], 40% of it had the largest magnitude, 1% is sent), and
// DGC's selection then sorted that share: its encode took 2-3x what it takes
// on smooth gradients, and got faster iteration by iteration as the
// error-feedback residuals broke the ties (1180 ms to 812 ms over 14
// iterations of bert-base, docs/benchmarks.md). With 64 levels (4 workers)
// the largest magnitude is 1.6% of a tensor, as the candidates of smooth data.
int patternLevels(int workers) {
  const double sumFactor = double(workers) * (workers + 1) / 2.0;
  return std::clamp(int(2048.0 / (3.0 * sumFactor)), 2, 64);
}
float pattern(size_t j, uint64_t i, int levels) {
  uint64_t h = i * 0x9E3779B97F4A7C15ull + (uint64_t(j) + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return float(int(h % uint64_t(2 * levels + 1)) - levels);
}
float factor(int rank, int it) { return float((rank + 1) * (1 + it % 3)); }

// Median of `reps` timings of f().
template <typename F>
double medianSeconds(int reps, F f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto s = Clock::now();
    f();
    t.push_back(secondsSince(s));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One probe: `bytes` (what the cost formula takes) and the time it took.
struct Sample {
  double bytes = 0, us = 0;
};

// Least squares of t = A a + B b over rows (A, B, t), each row's error taken
// relative to its t, so that the small sizes' latency and the large sizes'
// rate both count (an absolute fit lets the largest size decide alone).
// Returns (a, b) with a >= 0 and b > 0.
std::pair<double, double> fitRelative(const std::vector<std::array<double, 3>>& rows) {
  double saa = 0, sab = 0, sbb = 0, sat = 0, sbt = 0;
  for (const auto& [A, B, t] : rows) {
    if (!(t > 0)) continue;
    const double w = 1.0 / (t * t);
    saa += w * A * A, sab += w * A * B, sbb += w * B * B, sat += w * A * t, sbt += w * B * t;
  }
  const double det = saa * sbb - sab * sab;
  double a = det > 0 ? (sat * sbb - sbt * sab) / det : 0;
  double b = det > 0 ? (saa * sbt - sab * sat) / det : 0;
  if (!(a >= 0)) a = 0, b = sbb > 0 ? sbt / sbb : 0;
  if (!(b > 0)) b = 1e-9, a = saa > 0 ? std::max(0.0, (sat - sab * b) / saa) : 0;
  return {a, b};
}

// The planner's formula for `op` over p ranks (planner::commTimeUs) fitted to
// the samples: alpha and rate of the link for that operation.
AlphaBeta fitOp(plan::CommOp op, int p, const std::vector<Sample>& samples) {
  planner::LinkCost unitA, unitB;
  unitA.base = {1.0, 1e30};        // 1 us per alpha, bytes free
  unitB.base = {0.0, 8.0 / 1e3};   // 1 us per byte
  std::vector<std::array<double, 3>> rows;
  for (const Sample& s : samples)
    rows.push_back({planner::commTimeUs(unitA, op, p, s.bytes), planner::commTimeUs(unitB, op, p, s.bytes), s.us});
  const auto [a, b] = fitRelative(rows);
  return AlphaBeta{a, 8.0 / (b * 1000.0)};
}

// Probe sizes: from lo to hi bytes in steps of 4, both ends included.
std::vector<uint64_t> probeSizes(uint64_t lo, uint64_t hi) {
  std::vector<uint64_t> v;
  for (uint64_t s = lo; s < hi; s *= 4) v.push_back(s);
  v.push_back(hi);
  return v;
}

// Bytes; larger tensors extrapolate the curve's last slope. BERT's word
// embedding (94 MB) extrapolated from 16 MiB along a slope taken between two
// noisy points had the push/pull prediction of `none` 31% high.
constexpr uint64_t kMaxLinkProbe = 64u << 20;
constexpr uint64_t kMaxCodecProbe = 4u << 20;   // elements

// Times op(bytes) at each size: one untimed call, then the mean of 9 (5 from
// 64 KiB, 3 from 1 MiB) calls back to back after a barrier, as the replay
// runs its tensors (with pauses between calls, the shaped links' token
// buckets refill and large steps ran 25-35% faster than in the replay;
// the mean, not the median: a
// replay's iteration is a sum of many steps, and on this shared machine a
// step now and then waits a scheduler time slice for a descheduled member,
// which the sum pays and a median hides), each the slowest rank's time: a step
// ends for everybody when its last member is done, and in the replay as here
// the members arrive at it a little apart (8 processes share 2 cores on the
// emulated hosts). A rooted step that the root leaves first (broadcast) is
// probed with a barrier after each call (measureGroup says why).
template <typename Op>
std::vector<Sample> probe(World& world, const std::vector<uint64_t>& sizes, Op op) {
  std::vector<double> all;
  std::vector<int> reps;
  for (uint64_t bytes : sizes) {
    const int r = bytes < (64u << 10) ? 9 : bytes < (1u << 20) ? 5 : 3;
    world.barrier();
    op(bytes);
    world.barrier();
    for (int i = 0; i < r; ++i) {
      const auto t = Clock::now();
      op(bytes);
      all.push_back(secondsSince(t) * 1e6);
    }
    reps.push_back(r);
  }
  all = world.max(all);
  std::vector<Sample> out;
  size_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    double sum = 0;
    for (int k = 0; k < reps[i]; ++k) sum += all[at + k];
    at += reps[i];
    out.push_back({double(sizes[i]), sum / reps[i]});
  }
  return out;
}

struct Measured {
  AlphaBeta pushPull;
  planner::MeasuredCurve pushPullCurve;  // one push (or pull), by a machine's bytes times the spread
  // Per operation, on the intra-machine and the inter-machine groups; the
  // compressed steps' own ways (sizes first, then the bytes) separately.
  std::map<plan::CommOp, AlphaBeta> intra, inter, intraCompressed, interCompressed;
  std::map<plan::CommOp, planner::MeasuredCurve> intraCurves, interCurves, intraCurvesCompressed,
      interCurvesCompressed;
  bool hasIntra = false, hasInter = false;
  double encodeAlpha = 0, encodeBeta = 0, decodeAlpha = 0, decodeBeta = 0;  // s, s per input byte
  planner::MeasuredCurve encodeCurve, decodeCurve;  // us per call, by elements (what the planner uses)
  double sumGbps = 40;
  // With fusion: the workers' agreement on a batch (one flat allgather of an
  // int64, agreeOnBatch), back to back, mean of the slowest worker's.
  double agreeUs = 0;
  std::vector<std::string> probes;  // what was measured, for the log
};

// The replay's batch agreement (fusion on): each worker offers how many
// gradients it has ready, and the batch is the largest count (every worker
// then waits for those on its own clock). A collective, so every worker runs
// Executor::runBatch with the same items.
size_t agreeOnBatch(collective::Collectives& world, size_t readyCount, Deadline d) {
  const int64_t mine = int64_t(readyCount);
  std::vector<int64_t> all(size_t(world.size()));
  world.allgather(&mine, 1, all.data(), DType::kInt64, d);
  return size_t(*std::max_element(all.begin(), all.end()));
}

// Every operation the executor may run on group g, at sizes from lo to hi
// bytes (the model's own tensor sizes, capped at kMaxLinkProbe), each fitted
// to the planner's formula for it. Compressed steps are probed the way the
// executor moves payloads (executor.cc, allgatherBlob and friends): the sizes
// first, then the bytes.
void measureGroup(World& world, collective::Collectives& g, uint64_t lo, uint64_t hi, uint64_t payloadHi,
                  Deadline d, std::map<plan::CommOp, AlphaBeta>& ops,
                  std::map<plan::CommOp, AlphaBeta>& compressedOps,
                  std::map<plan::CommOp, planner::MeasuredCurve>& curves,
                  std::map<plan::CommOp, planner::MeasuredCurve>& compressedCurves,
                  std::vector<std::string>& log, const char* scope) {
  using plan::CommOp;
  const int p = g.size();
  const uint64_t grain = 4u * uint64_t(p);  // bytes of p float32 elements: sizes are multiples
  lo = std::max<uint64_t>(grain, lo / grain * grain);
  hi = std::max(lo, std::min(hi, kMaxLinkProbe) / grain * grain);
  const auto sizes = probeSizes(lo, hi);
  std::vector<float> buf(hi / 4, 1.0f), out(hi / 4 * p);
  auto note = [&](CommOp op, bool compressed, const std::vector<Sample>& s, const AlphaBeta& ab) {
    std::string pts;
    for (const Sample& x : s) pts += fmt::format(" {:.0f}B:{:.0f}us", x.bytes, x.us);
    log.push_back(fmt::format("{} {}{}: {:.0f} us + {:.3f} Gbit/s from{}", scope, plan::toString(op),
                              compressed ? "*" : "", ab.alphaUs, ab.gbps, pts));
  };
  // Compressed steps move payloads: their sizes, in bytes.
  const auto payloadSizes = probeSizes(64, std::max<uint64_t>(64, std::min(payloadHi, kMaxLinkProbe)));
  auto fitted = [&](CommOp op, bool compressed, auto f) {
    const auto s = compressed ? probe(world, payloadSizes, [&](uint64_t bytes) { f(bytes); })
                              : probe(world, sizes, [&](uint64_t bytes) {
                                  f(bytes / 4);  // float32 elements, a multiple of p
                                });
    AlphaBeta ab = fitOp(op, p, s);
    (compressed ? compressedOps : ops)[op] = ab;
    planner::MeasuredCurve& c = (compressed ? compressedCurves : curves)[op];
    c.p = p;
    for (const Sample& x : s) c.add(x.bytes, x.us);
    note(op, compressed, s, ab);
  };
  using DT = DType;
  fitted(CommOp::kAllreduce, false, [&](uint64_t n) { g.allreduce(buf.data(), out.data(), n, DT::kFloat32, d); });
  fitted(CommOp::kReduceScatter, false,
         [&](uint64_t n) { g.reduceScatter(buf.data(), out.data(), n / p, DT::kFloat32, d); });
  fitted(CommOp::kAllgather, false, [&](uint64_t n) { g.allgather(buf.data(), n, out.data(), DT::kFloat32, d); });
  fitted(CommOp::kAlltoall, false,
         [&](uint64_t n) { g.alltoall(buf.data(), out.data(), n / p, DT::kFloat32, d); });
  fitted(CommOp::kReduce, false, [&](uint64_t n) { g.reduce(buf.data(), out.data(), n, DT::kFloat32, 0, d); });
  fitted(CommOp::kGather, false, [&](uint64_t n) { g.gather(buf.data(), n, out.data(), DT::kFloat32, 0, d); });
  // Compressed: `n` is bytes here.
  auto* bytesIn = reinterpret_cast<std::byte*>(buf.data());
  auto* bytesOut = reinterpret_cast<std::byte*>(out.data());
  std::vector<int64_t> sizes64(p), sizes64b(p);
  fitted(CommOp::kAllgather, true, [&](uint64_t n) {
    int64_t my = int64_t(n);
    g.allgather(&my, 1, sizes64.data(), DT::kInt64, d);
    std::vector<size_t> counts(sizes64.begin(), sizes64.end());
    g.allgatherv(bytesIn, n, bytesOut, counts, DT::kUInt8, d);
  });
  fitted(CommOp::kAlltoall, true, [&](uint64_t n) {
    const uint64_t each = std::max<uint64_t>(1, n / p);
    std::fill(sizes64.begin(), sizes64.end(), int64_t(each));
    g.alltoall(sizes64.data(), sizes64b.data(), 1, DT::kInt64, d);
    std::vector<size_t> sc(p, each), rc(sizes64b.begin(), sizes64b.end());
    g.alltoallv(bytesIn, sc, bytesOut, rc, DT::kUInt8, d);
  });
  fitted(CommOp::kGather, true, [&](uint64_t n) {
    int64_t my = int64_t(n);
    g.gather(&my, 1, sizes64.data(), DT::kInt64, 0, d);
    std::vector<size_t> counts(p, n);
    g.gatherv(bytesIn, n, bytesOut, counts, DT::kUInt8, 0, d);
  });
  // Broadcast: each call followed by a barrier, and the pair timed, as the
  // slowest member's time. Timed alone and back to back, the root returns as
  // soon as its sends are out and runs ahead, and a receiver finds its data
  // waiting, so it looked nearly free. Until 2026-11-25 it was timed after the
  // step before it in the plans (a reduce, a gather*) less that step, which
  // measured nothing either: back to back, the root's broadcast went out while
  // the next call's gather came in (a link carries both directions at once),
  // and broadcast* came out at about 1 ms from 64 B to 295 KB where the
  // replay took 27-37 ms to broadcast a gather's 1.2 MB. The barrier stays in
  // the time: in the replay the next tensor's step waits for every member as
  // it does, and without it (less a barrier's time, or a barrier before each
  // call) small broadcasts measured 1-50 us against 0.9 ms in the replay
  // (docs/benchmarks.md, 2026-11-25).
  auto fenced = [&](bool compressed, const std::vector<uint64_t>& at, auto bcast) {
    const auto s = probe(world, at, [&](uint64_t n) {
      bcast(n);
      world.barrier();
    });
    AlphaBeta ab = fitOp(CommOp::kBroadcast, p, s);
    (compressed ? compressedOps : ops)[CommOp::kBroadcast] = ab;
    planner::MeasuredCurve& c = (compressed ? compressedCurves : curves)[CommOp::kBroadcast];
    c.p = p;
    for (const Sample& x : s) c.add(x.bytes, x.us);
    note(CommOp::kBroadcast, compressed, s, ab);
  };
  fenced(false, sizes,
         [&](uint64_t bytes) { g.broadcast(buf.data(), bytes / 4, DT::kFloat32, 0, d); });
  // A compressed broadcast closes a gather*: the root sends every member's
  // payloads (the planner charges p payloads), so up to p times the largest.
  const auto gatheredSizes = probeSizes(
      64, std::max<uint64_t>(64, std::min(uint64_t(p) * payloadHi, kMaxLinkProbe)));
  std::vector<std::byte> gathered(gatheredSizes.back());
  fenced(true, gatheredSizes, [&](uint64_t n) {
    int64_t size = int64_t(n);
    g.broadcast(&size, 1, DT::kInt64, 0, d);
    g.broadcast(gathered.data(), n, DT::kUInt8, 0, d);
  });
}

// Push and pull of one key by every worker, at the model's sizes; a machine
// sends localSize times what one worker does. Push and pull are charged
// a + frac * bytes * b each.
// `tag` names this probe's keys apart from an earlier probe's (each round's
// probe declares its own, and releases them when done).
AlphaBeta measurePushPull(World& world, Worker& w, const collective::Topology& topo,
                          uint64_t lo, uint64_t hi, uint64_t chunkBytes, Deadline d,
                          planner::MeasuredCurve& curve, std::vector<std::string>& log, int tag) {
  lo = std::max<uint64_t>(4, lo / 4 * 4);
  hi = std::max(lo, std::min(hi, kMaxLinkProbe) / 4 * 4);
  std::vector<float> buf(hi / 4, 1.0f), out(hi / 4);
  std::map<uint64_t, std::string> keys;
  auto s = probe(world, probeSizes(lo, hi), [&](uint64_t bytes) {
    const uint64_t n = bytes / 4;
    auto [it, added] = keys.emplace(n, fmt::format("bench.model.probe{}.{}", tag, n));
    if (added) w.declare(it->second, DType::kFloat32, n, TensorOptions{}, d);
    w.pushPull(it->second, DType::kFloat32, n, buf.data(), out.data(), ReduceOp::kSum, 0).wait(d).check();
  });
  for (const auto& [n, key] : keys) w.release(key);
  const int m = std::max(2, topo.numMachines);
  const double frac = double(m - 1) / m;
  const double L = topo.localSize;
  std::vector<std::array<double, 3>> rows;
  std::string pts;
  for (const Sample& x : s) {
    // The probe key's chunks reach only that many servers, as the model's
    // tensors' do (planner::Cluster::oneTensorAtATime): the same spread here.
    const double chunks = std::ceil(x.bytes / double(chunkBytes)) * L;
    const double spread = m * std::ceil(chunks / m) / chunks;
    rows.push_back({2.0, 2.0 * frac * x.bytes * L * spread, x.us});
    pts += fmt::format(" {:.0f}B:{:.0f}us", x.bytes, x.us);
  }
  const auto [a, b] = fitRelative(rows);
  AlphaBeta ab{a, 8.0 / (b * 1000.0)};
  log.push_back(fmt::format("push+pull: {:.0f} us + {:.3f} Gbit/s each from{}", ab.alphaUs, ab.gbps, pts));
  // And as curves: commTimeUs takes a machine's bytes times the spread for
  // push and for pull; each is half of the measured exchange.
  curve.p = topo.numMachines;
  for (size_t i = 0; i < s.size(); ++i) curve.add(rows[i][1] / (2.0 * frac), s[i].us / 2);
  return ab;
}

// The executor's encode (with error feedback, as it runs it) and decode-and-
// add, at the model's tensor sizes (lo to hi elements, capped at
// kMaxCodecProbe), on data that is not in the caches (the replay fills every
// gradient before an iteration, so each encode reads memory), every worker at
// once (they share this machine's cores as in the replay). Per size: each
// worker's median call, then the slowest worker's. The planner uses these
// points as curves (linear between sizes); the alpha-beta line through them
// is only logged. Median, not mean as for the links: a call that waited for a
// descheduled worker is charged, in the replay, to the collective that waits
// for that worker's encode, whose probes already carry those waits; charging
// the encode too counted them twice (bert-base/DGC encode predicted 1.6-1.7x
// its traced time, docs/benchmarks.md). Nor one line through every size: the
// relative fit let such mid-size points set the per-element cost of the
// large tensors.
}  // namespace

void smoothCodecProbes(const std::vector<uint64_t>& elements, std::vector<double>& encode,
                       std::vector<double>& decode) {
  CORTADO_ENFORCE(elements.size() == encode.size() && elements.size() == decode.size(),
                  ErrorCode::kInvalidArgument,
                  "codec probe smoothing: {} sizes but {} encode and {} decode times",
                  elements.size(), encode.size(), decode.size());
  // An encode size measured more than 3x both its neighbours (4x smaller
  // and 4x larger) is taken at the larger neighbour: sizes 4x apart cost at
  // most about 4x more, and one run had 65536 elements of DGC at 2637 us
  // between 197 and 551 us (129-141 us in the runs before and after). Only
  // spikes: top-k and DGC select exactly below 65536 elements and from a
  // sample above, so 16384 elements genuinely cost more than 65536.
  const std::vector<double> raw = encode;
  for (size_t i = 1; i + 1 < raw.size(); ++i) {
    const double near = std::max(raw[i - 1], raw[i + 1]);
    if (raw[i] > 3 * near) encode[i] = near;
  }
  // Then, from the smallest size up, a size measured more than 3x the size
  // below it scaled by their elements is taken at that scaled time: a codec
  // step reads every element from memory (the probe evicts the caches), so
  // its cost per element does not grow 3x from one size to the next, and a
  // stall there is not caught above when a neighbour stalled too, or at the
  // largest size, which has one neighbour. Runs of 2026-11-25 (DGC): the
  // decode of 2359296 elements at 2251 us with 1048576 at 101 (196-261 us in
  // three other runs; the compress-everything strategies were predicted
  // 56-70% over), and the encode of 262144 at 2914 us between 160 and 3247
  // (433-618 us in four other runs).
  for (std::vector<double>* v : {&encode, &decode})
    for (size_t i = 1; i < elements.size(); ++i) {
      const double ratio = double(elements[i]) / double(std::max<uint64_t>(1, elements[i - 1]));
      const double scaled = (*v)[i - 1] * ratio;
      if ((*v)[i] > 3 * scaled) (*v)[i] = scaled;
    }
  // A decode-and-add costs no less for more elements (it scatters or
  // streams in proportion), so a size measured dearer than a larger one is
  // capped at it: one run had 1048576 elements of DGC at 2373 us between 497
  // us below and 406 us above (a worker's medians there all slow), and the
  // compress-everything strategies were predicted 28-33% above the replay
  // (flat allgather: 4 decodes per tensor).
  for (size_t i = decode.size(); i-- > 1;) decode[i - 1] = std::min(decode[i - 1], decode[i]);
}

namespace {

void measureCodec(World& world, const std::string& spec, uint64_t lo, uint64_t hi, Measured& m) {
  compressor::Registry reg;
  compressor::registerCpuCodecs(reg);
  compressor::CodecPtr codec = reg.create(reg.canonical(spec));
  hi = std::max<uint64_t>(1, std::min(hi, kMaxCodecProbe));
  lo = std::max<uint64_t>(1, std::min(lo, hi));
  const auto sizes = probeSizes(lo, hi);
  std::vector<float> x(hi), sum(hi);
  const int levels = patternLevels(world.c.size());
  // The replay's own gradients: a codec's cost depends on the values (DGC's
  // threshold search on the replay's few distinct magnitudes took 2-3x what
  // it took on smooth data).
  for (uint64_t i = 0; i < hi; ++i) x[i] = factor(world.c.rank(), 0) * pattern(0, i, levels);
  std::vector<char> flush(64u << 20);
  auto evict = [&] {
    for (size_t i = 0; i < flush.size(); i += 64) flush[i] = char(flush[i] + 1);
  };
  uint64_t key = 0;
  // Passes over every size, not the repetitions of one size back to back: a
  // worker descheduled for a few ms (8 processes on 2 cores) then costs one
  // call of several sizes, which each size's median drops, instead of every
  // call of one size (one such run had 65536 elements at 3864 us and 262144
  // at 424 us, and the curve, kept non-decreasing, carried the spike up).
  const int reps = 7;
  std::vector<std::unique_ptr<compressor::ErrorFeedback>> efs;  // a residual per size, as per tensor
  std::vector<std::vector<std::byte>> payloads(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    efs.push_back(std::make_unique<compressor::ErrorFeedback>(codec));
    payloads[i].resize(efs[i]->payloadBytes(sizes[i]));
  }
  std::vector<double> enc(sizes.size() * reps), dec(sizes.size() * reps);
  for (int r = -1; r < reps; ++r) {  // pass -1: untimed first touches
    for (size_t i = 0; i < sizes.size(); ++i) {
      const uint64_t n = sizes[i];
      auto encodeOnce = [&] {
        compressor::EncodeContext ctx;
        ctx.seed = ++key;
        efs[i]->encode(n, x.data(), n, payloads[i], ctx);
      };
      auto decodeOnce = [&] { codec->decompressAdd(payloads[i], sum.data(), n); };
      if (r < 0) {
        encodeOnce();
        decodeOnce();
        continue;
      }
      evict();
      world.barrier();
      enc[i * reps + size_t(r)] = medianSeconds(1, encodeOnce);
      evict();
      world.barrier();
      dec[i * reps + size_t(r)] = medianSeconds(1, decodeOnce);
    }
  }
  auto medians = [&](const std::vector<double>& v) {
    std::vector<double> out;
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<double> r(v.begin() + long(i * reps), v.begin() + long((i + 1) * reps));
      std::sort(r.begin(), r.end());
      out.push_back(r[r.size() / 2]);
    }
    return out;
  };
  // The slowest worker's: the step after an encode waits for it. (Per pass
  // the slowest worker's call, then the median over the passes, was tried:
  // 4 workers on 2 cores, one of them always waits for a core, and the
  // predictions came out 65% above the replay.)
  std::vector<double> encMed = world.max(medians(enc));
  std::vector<double> decMed = world.max(medians(dec));
  smoothCodecProbes(sizes, encMed, decMed);
  std::vector<std::array<double, 3>> er, dr;
  m.encodeCurve = m.decodeCurve = planner::MeasuredCurve{};
  for (size_t i = 0; i < sizes.size(); ++i) {
    er.push_back({1.0, 4.0 * sizes[i], encMed[i]});
    dr.push_back({1.0, 4.0 * sizes[i], decMed[i]});
    m.encodeCurve.add(double(sizes[i]), encMed[i] * 1e6);
    m.decodeCurve.add(double(sizes[i]), decMed[i] * 1e6);
  }
  std::tie(m.encodeAlpha, m.encodeBeta) = fitRelative(er);
  std::tie(m.decodeAlpha, m.decodeBeta) = fitRelative(dr);
  std::string pts;
  for (size_t i = 0; i < sizes.size(); ++i)
    pts += fmt::format(" {}:{:.0f}/{:.0f}us", sizes[i], er[i][2] * 1e6, dr[i][2] * 1e6);
  m.probes.push_back(fmt::format("codec {} encode/decode per elements:{}", spec, pts));
  const uint64_t ns = hi;
  const double s = medianSeconds(3, [&] {
    for (uint64_t i = 0; i < ns; ++i) sum[i] += x[i];
  });
  m.sumGbps = 8.0 * 4.0 * ns / s / 1e9;
}

planner::ModelProfile scaled(planner::ModelProfile p, double k) {
  p.forwardUs *= k;
  for (auto& t : p.tensors) t.backwardUs *= k;
  return p;
}

struct Prediction {
  std::string strategy;
  plan::Plan plan;
  double predictedUs = 0;  // forward + backward and synchronization, one tensor at a time
  double overlappedUs = 0;  // forward + the simulator's overlapped timeline (the planner's model)
  std::string options;     // the one option everybody runs, or a summary
};

// The replay's timeline: the executor runs one batch at a time
// (Executor::runBatch is synchronous, on one thread). Tensor j is ready at the
// profile's backward times (a wall-clock schedule that codec work does not
// delay). Without fusion (Cluster::fusionBytes 0) each tensor is a batch of
// its own: its synchronization starts when it is ready and tensor j-1's has
// ended. With fusion, each time the executor is free every tensor ready by
// then is the batch (none: the next one, when it is ready); the workers agree
// on it (Cluster::batchAgreeUs); its lone tensors run first, then per
// fusible option its tensors packed in order within the threshold, each
// group as one execution of its summed size. An execution takes
// what it takes alone (Simulator::runAlone: its operations chained on free
// lanes). The planner's simulator models the same rule when oneTensorAtATime
// is set, and the same ready times with Cluster::gpuCodecPausesCompute off
// (predict() sets it: the replay's buffers are host memory; until
// 2026-11-26 the planner searched with "gpu" codec work delaying the
// gradients, which the replay's are not). Returns the end of the last
// synchronization after the forward pass (us); `trace` gets the events on
// that timeline.
double serialized(planner::Simulator& sim, const std::vector<int>& choice,
                  std::vector<planner::TraceEvent>* trace) {
  const auto& ts = sim.profile().tensors;
  const int N = sim.tensors();
  const uint64_t threshold = sim.cluster().fusionBytes;
  std::vector<double> ready(N);
  double readyUs = 0;
  for (int j = 0; j < N; ++j) {
    const double bw = ts[j].backwardUs;
    readyUs += bw;
    ready[j] = readyUs;
    if (trace && bw > 0) trace->push_back({"backward " + ts[j].name, -1, j, readyUs - bw, bw});
  }
  std::vector<planner::TraceEvent> ev;
  double free = 0;
  for (int j = 0; j < N;) {
    const double formed = std::max(free, ready[j]);
    int end = j + 1;
    if (threshold > 0)
      while (end < N && ready[end] <= formed) ++end;
    double t = formed + (threshold > 0 ? sim.cluster().batchAgreeUs : 0.0);
    auto execute = [&](int last, int64_t elements, int option, int count, int first) {
      const std::string label =
          count > 1 ? fmt::format("fused{}:{}..{}", count, ts[first].name, ts[last].name) : std::string();
      ev.clear();
      const double d = sim.runAlone(last, elements, option, trace ? &ev : nullptr,
                                    label.empty() ? nullptr : &label);
      for (planner::TraceEvent& e : ev) {
        e.start += t;
        trace->push_back(std::move(e));
      }
      t += d;
    };
    // Executor::runBatch: the lone executions in order, then per fusible
    // option (in the order of its first tensor) its tensors packed in order
    // within the threshold.
    std::vector<std::vector<int>> byOption;
    for (int i = j; i < end; ++i) {
      if (threshold == 0 || !sim.options()[choice[i]].fusible()) {
        execute(i, ts[i].elements, choice[i], 1, i);
        continue;
      }
      auto it = std::find_if(byOption.begin(), byOption.end(), [&](const std::vector<int>& g) {
        return choice[g.front()] == choice[i] && ts[g.front()].dtypeBytes == ts[i].dtypeBytes;
      });
      if (it == byOption.end()) byOption.push_back({i});
      else it->push_back(i);
    }
    for (const std::vector<int>& members : byOption) {
      int first = -1, count = 0, last = -1;
      int64_t elements = 0;
      for (int i : members) {
        if (count > 0 && double(elements + ts[i].elements) * ts[i].dtypeBytes > double(threshold)) {
          execute(last, elements, choice[last], count, first);
          count = 0, elements = 0;
        }
        if (count == 0) first = i;
        last = i, elements += ts[i].elements, ++count;
      }
      if (count > 0) execute(last, elements, choice[last], count, first);
    }
    free = t;
    j = end;
  }
  return free;
}

// --predicted-trace FILE: the plan strategy's timeline goes to FILE, every
// other strategy's beside it with the strategy's name before the extension
// (predicted.json -> predicted-none.json).
std::string predictedTracePath(const std::string& file, const std::string& strategy) {
  if (strategy == "plan") return file;
  const size_t slash = file.find_last_of('/');
  const size_t dot = file.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return file + "-" + strategy;
  return file.substr(0, dot) + "-" + strategy + file.substr(dot);
}

// The prediction for a plan handed out during the run (replan), by the same
// cost models as the other strategies (`base`: the simulator predict() made):
// forward + the serialized timeline, and the overlapped one. Nothing when the
// plan names a tensor the profile lacks or compresses with another codec
// than --codec (no measured costs for it).
std::optional<std::pair<double, double>> predictPlan(const planner::Simulator& base,
                                                     const plan::Plan& p, const std::string& tracePath) {
  std::vector<plan::TensorOption> options = base.options();
  std::vector<int> choice;
  for (const auto& t : base.profile().tensors) {
    auto it = p.tensors.find(t.name);
    if (it == p.tensors.end()) return std::nullopt;
    if (it->second.compressed() && it->second.codec != base.codec().spec) return std::nullopt;
    auto at = std::find(options.begin(), options.end(), it->second);
    if (at == options.end()) at = options.insert(options.end(), it->second);
    choice.push_back(int(at - options.begin()));
  }
  planner::Simulator sim(base.cluster(), base.codec(), base.profile(), options);
  if (!tracePath.empty()) {
    std::vector<planner::TraceEvent> ev;
    serialized(sim, choice, &ev);
    std::ofstream f(tracePath);
    f << planner::chromeTrace(sim, ev) << "\n";
  }
  return std::make_pair(base.profile().forwardUs + serialized(sim, choice, nullptr),
                        base.profile().forwardUs + sim.simulate(choice));
}

// Rank 0: the cost models from the measurements, as a simulator over the
// planner's options for this job (BytePS's default among them, at
// *bytepsIndex); *costNote says what they are. Either may be null.
std::shared_ptr<planner::Simulator> buildSimulator(const ModelBenchOptions& o,
                                                   const planner::ModelProfile& profile,
                                                   const collective::Topology& topo, const Measured& m,
                                                   int cpuCores, uint64_t chunkBytes,
                                                   uint64_t fusionBytes, std::string* costNote,
                                                   int* bytepsIndex) {
  const std::string dir = planner::resolveDataDir(o.dataDir);
  planner::CodecModel codecs = planner::CodecModel::load(dir + "/costs/codecs.json");
  json fits = {{"schema", "cortado.codec_costs.v1"},
               {"date", "this run"},
               {"machine", "this job's workers"},
               {"threads", 1},
               {"entries", json::array()}};
  // Buffers are host memory: a "gpu" encode or decode runs the CPU twin, so
  // both devices get the CPU's fits.
  for (const char* dev : {"cpu", "gpu"}) {
    fits["entries"].push_back({{"codec", o.codec}, {"device", dev}, {"op", "encode"},
                               {"alpha", m.encodeAlpha}, {"beta", m.encodeBeta}});
    fits["entries"].push_back({{"codec", o.codec}, {"device", dev}, {"op", "decompress_add"},
                               {"alpha", m.decodeAlpha}, {"beta", m.decodeBeta}});
  }
  codecs.applyMeasured(fits, "cortado bench model");
  planner::Cluster cl;
  cl.machines = topo.numMachines;
  cl.gpusPerMachine = topo.localSize;
  // Every operation as measured on its own (OpenMPI's reduce ran at 0.35
  // Gbit/s where its allreduce ran at 7-18 in a traced run; a compressed
  // allgather is two collectives).
  cl.inter.name = "measured inter";
  cl.inter.base = m.hasInter ? m.inter.at(plan::CommOp::kAllreduce) : m.pushPull;
  if (m.hasInter) {
    cl.inter.perOp = m.inter, cl.inter.perOpCompressed = m.interCompressed;
    cl.inter.curves = m.interCurves, cl.inter.curvesCompressed = m.interCurvesCompressed;
  }
  cl.inter.perOp[plan::CommOp::kPush] = m.pushPull;
  cl.inter.perOp[plan::CommOp::kPull] = m.pushPull;
  cl.inter.curves[plan::CommOp::kPush] = m.pushPullCurve;
  cl.inter.curves[plan::CommOp::kPull] = m.pushPullCurve;
  cl.intra.name = "measured intra";
  cl.intra.base = m.hasIntra ? m.intra.at(plan::CommOp::kAllreduce) : cl.inter.base;
  if (m.hasIntra) {
    cl.intra.perOp = m.intra, cl.intra.perOpCompressed = m.intraCompressed;
    cl.intra.curves = m.intraCurves, cl.intra.curvesCompressed = m.intraCurvesCompressed;
  }
  // No copies: the replay's buffers are host memory; a "gpu" step runs the
  // CPU twin on the executor's thread while the gradients become ready on
  // the wall clock (the planner's searches then see serialized()'s timeline).
  cl.d2h = cl.h2d = AlphaBeta{0, 1e9};
  cl.gpuCodecPausesCompute = false;
  cl.cpuCores = cpuCores;
  cl.cpuSumGbps = m.sumGbps;
  cl.parameterServer = true;
  cl.chunkBytes = double(chunkBytes);
  cl.oneTensorAtATime = true;  // Executor::runBatch: one tensor (or fused group) at a time
  // The replay's batches and fusion, as the executor runs them (serialized()).
  cl.fusionBytes = fusionBytes;
  cl.batchAgreeUs = m.agreeUs;
  planner::ResolvedCodec codec = codecs.resolve(o.codec);
  for (int d = 0; d < 2; ++d) {  // both devices run the CPU twin here
    codec.encodeCurve[d] = m.encodeCurve;
    codec.decodeCurve[d] = m.decodeCurve;
  }
  auto options = planner::plannerOptions(cl, codec.spec);
  const plan::TensorOption byteps = executor::defaultOption();
  int bytepsIdx = -1;
  for (size_t i = 0; i < options.size(); ++i)
    if (options[i] == byteps) bytepsIdx = int(i);
  if (bytepsIdx < 0) {
    options.push_back(byteps);
    bytepsIdx = int(options.size()) - 1;
  }
  if (bytepsIndex) *bytepsIndex = bytepsIdx;
  if (costNote)
    *costNote = fmt::format(
        "links (per operation; every probe point on stderr): intra allreduce {:.0f} us + {:.2f} "
        "Gbit/s{}, inter allreduce {:.0f} us + {:.2f} Gbit/s{}, push/pull {:.0f} us + {:.2f} Gbit/s; "
        "codec {} per-size medians (the planner's curves), as a line: encode {:.1f} us + {:.2f} "
        "ns/elem, decode {:.1f} us + {:.2f} ns/elem (CPU, also used for \"gpu\"); sum {:.1f} Gbit/s; {} CPU cores per machine",
        cl.intra.base.alphaUs, cl.intra.base.gbps, m.hasIntra ? "" : " (not measured)",
        cl.inter.base.alphaUs, cl.inter.base.gbps, m.hasInter ? "" : " (not measured)",
        m.pushPull.alphaUs, m.pushPull.gbps, o.codec, m.encodeAlpha * 1e6, m.encodeBeta * 4e9,
        m.decodeAlpha * 1e6, m.decodeBeta * 4e9, m.sumGbps, cpuCores);
  return std::make_shared<planner::Simulator>(cl, codec, profile, options);
}

// Rank 0: every strategy's plan and predicted iteration time under the cost
// models from the measurements (*keep: their simulator).
std::vector<Prediction> predict(const ModelBenchOptions& o, const planner::ModelProfile& profile,
                                const collective::Topology& topo, const Measured& m,
                                int cpuCores, uint64_t chunkBytes, uint64_t fusionBytes,
                                std::string* costNote,
                                std::shared_ptr<planner::Simulator>* keep) {
  int bytepsIdx = -1;
  *keep = buildSimulator(o, profile, topo, m, cpuCores, chunkBytes, fusionBytes, costNote, &bytepsIdx);
  planner::Simulator& sim = **keep;
  const auto& options = sim.options();
  planner::Planner pl(sim);
  const int T = sim.tensors();
  auto uniform = [&](int option) {
    planner::Strategy s;
    s.choice.assign(T, option);
    s.iterUs = sim.simulate(s.choice);
    return s;
  };
  std::vector<Prediction> out;
  for (const std::string& name : o.strategies) {
    planner::Strategy s;
    if (name == "none") {
      s = uniform(bytepsIdx);
    } else if (name == "gpu") {
      s = pl.compressAllGpu();
    } else if (name == "cpu") {
      s = pl.compressAllCpu();
      CORTADO_ENFORCE(!s.choice.empty(), ErrorCode::kInvalidArgument,
                      "codec '{}' has no option compressed on the CPU", o.codec);
    } else if (name == "plan" || name == "replan") {
      // replan starts from the offline plan; what the scheduler switches it
      // to is reported after the run.
      s = pl.decide();
    }
    if (name != "replan" && !o.predictedTrace.empty()) {
      std::vector<planner::TraceEvent> ev;
      serialized(sim, s.choice, &ev);
      const std::string path = predictedTracePath(o.predictedTrace, name);
      std::ofstream f(path);
      f << planner::chromeTrace(sim, ev) << "\n";
      CORTADO_ENFORCE(f.good(), ErrorCode::kInvalidArgument, "--predicted-trace: cannot write '{}'",
                      path);
    }
    Prediction p;
    p.strategy = name;
    p.plan = planner::toPlan(sim, s, 1);
    p.predictedUs = profile.forwardUs + serialized(sim, s.choice, nullptr);
    p.overlappedUs = profile.forwardUs + s.iterUs;
    std::map<std::string, int> count;
    for (int c : s.choice) ++count[options[c].describe() + (options[c].codec.empty() ? "" : " " + options[c].codec)];
    if (count.size() == 1) {
      p.options = count.begin()->first;
    } else {
      int compressed = 0;
      for (int c : s.choice) compressed += options[c].compressed();
      p.options = fmt::format("{} distinct options, {} of {} tensors compressed", count.size(),
                              compressed, T);
    }
    out.push_back(std::move(p));
  }
  return out;
}


bool losslessFor(const std::string& codec) {
  return codec.rfind("fp16", 0) == 0 || codec.rfind("bf16", 0) == 0;
}

class Progress {
 public:
  Progress(bool on, int total) : on_(on), total_(total) {}
  void update(const std::string& what, int done, double lastMs) {
    if (!on_) return;
    const int width = 30, fill = total_ ? done * width / total_ : width;
    std::fprintf(stderr, "\r%-6s [%s%s] %d/%d  last %.1f ms   ", what.c_str(),
                 std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), done,
                 total_, lastMs);
    std::fflush(stderr);
  }
  void done() {
    if (on_) std::fprintf(stderr, "\n");
  }

 private:
  bool on_;
  int total_;
};

struct Result {
  std::string strategy, options;
  double meanMs = 0, stdMs = 0, minMs = 0, predictedMs = 0;
  std::vector<double> timesMs;  // each timed iteration (every round), the slowest worker's
  std::vector<double> roundMs;  // each round's mean
  // Rank 0: each round's prediction (from that round's probe; all from the
  // first with --probe-once); predictedMs is their mean.
  std::vector<double> roundPredictedMs;
  uint64_t offlineVersion = 0;  // the version of the plan rank 0 computed for it
  uint64_t planVersion = 0;  // replan: the version reached
  int switchedAt = -1;       // replan: the iteration of the first switch
  int timedFrom = -1;        // replan: the iteration the timing starts (after the check of a switch)
  uint64_t checked = 0, wrong = 0, lossyTensors = 0;
  uint64_t batches = 0, iterationsRun = 0;  // Executor::runBatch calls, replay iterations
};

}  // namespace

std::vector<std::string> modelBenchStrategies() { return {"none", "gpu", "cpu", "plan", "replan"}; }

void validateModelBench(const ModelBenchOptions& o) {
  CORTADO_ENFORCE(!o.profile.empty(), ErrorCode::kInvalidArgument,
                  "--profile is required: a bundled profile ({}) or a profile .json",
                  fmt::join(planner::bundledModels(), ", "));
  try {
    planner::loadModel(o.profile, planner::resolveDataDir(o.dataDir));
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("--profile: {}", e.what()));
  }
  CORTADO_ENFORCE(!o.strategies.empty(), ErrorCode::kInvalidArgument,
                  "--strategies is empty: name some of none, gpu, cpu, plan");
  for (const std::string& s : o.strategies) {
    const auto all = modelBenchStrategies();
    CORTADO_ENFORCE(std::find(all.begin(), all.end(), s) != all.end(), ErrorCode::kInvalidArgument,
                    "--strategies: unknown strategy '{}' (valid: none, gpu, cpu, plan, replan)", s);
    if (s == "replan") {
      const auto w = getEnvInt({"CORTADO_PROFILE_WINDOW"});
      CORTADO_ENFORCE(w && *w > 0, ErrorCode::kInvalidArgument,
                      "--strategies: 'replan' needs online profiling: set CORTADO_PROFILE_WINDOW "
                      "(iterations per profiling window, e.g. 3) for the job, and "
                      "CORTADO_REPLAN_CODEC to the codec the scheduler may use (e.g. the same as "
                      "--codec)");
    }
  }
  CORTADO_ENFORCE(std::isfinite(o.computeScale) && o.computeScale >= 0 && o.computeScale <= 1000,
                  ErrorCode::kInvalidArgument,
                  "--compute-scale {}: must be a number in [0, 1000] (1: the profile's times; 2: "
                  "compute twice as slow as the profile's GPU; 0: no compute)",
                  o.computeScale);
  CORTADO_ENFORCE(o.iterations >= 1 && o.iterations <= 100000, ErrorCode::kInvalidArgument,
                  "--iterations {}: must be in [1, 100000]", o.iterations);
  CORTADO_ENFORCE(o.warmup >= 0 && o.warmup <= 10000, ErrorCode::kInvalidArgument,
                  "--warmup {}: must be in [0, 10000]", o.warmup);
  CORTADO_ENFORCE(o.rounds >= 1 && o.rounds <= 1000, ErrorCode::kInvalidArgument,
                  "--rounds {}: must be in [1, 1000]", o.rounds);
  try {
    const std::string dir = planner::resolveDataDir(o.dataDir);
    planner::CodecModel::load(dir + "/costs/codecs.json").resolve(o.codec);
    compressor::Registry reg;
    compressor::registerCpuCodecs(reg);
    reg.create(reg.canonical(o.codec));
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("--codec '{}': {}", o.codec, e.what()));
  }
}

int runModelBench(const ModelBenchOptions& o) {
  validateModelBench(o);
  CORTADO_ENFORCE(getEnv({"CORTADO_ROLE", "DMLC_ROLE"}) && getEnv({"OMPI_COMM_WORLD_SIZE"}),
                  ErrorCode::kInvalidArgument,
                  "cortado bench model runs as the workers of a job under mpirun: start it with "
                  "`cortado launch --mpi -w 4 -s 2 -- cortado bench model --profile {}` (or "
                  "--hosts ... for several machines)",
                  o.profile);
  const planner::ModelProfile profile =
      scaled(planner::loadModel(o.profile, planner::resolveDataDir(o.dataDir)), o.computeScale);

  collective::mpi::Runtime mpi;
  auto mo = collective::mpi::Options::fromEnv();
  if (!getEnv({"CORTADO_COLLECTIVE_CHECK"})) mo.checkArguments = false;
  const Deadline setup = Deadline::after(Millis(600000));
  collective::Groups groups = collective::mpi::createGroups(mpi, mo, setup);
  JobConfig base;
  base.rank = mpi.worldRank();
  JobConfig job = readJobConfig(true, base);
  CORTADO_ENFORCE(job.role == Role::kWorker, ErrorCode::kInvalidArgument,
                  "cortado bench model runs as a worker, but CORTADO_ROLE is {}", roleName(job.role));
  setupLogging(fmt::format("worker {}", job.rank), job.logLevel);
  auto worker = startWorker(job, Deadline::after(job.connectTimeout));
  executor::Executor ex(*worker, &groups);
  ex.setFusionBytes(job.fusionBytes);  // CORTADO_FUSION_BYTES
  ex.setPipeline(job.pipeline);        // CORTADO_PIPELINE
  auto tracer = std::make_shared<Tracer>(TraceOptions::fromEnv(fmt::format("worker {}", job.rank)));
  if (tracer->enabled()) ex.setTracer(tracer);
  const collective::Topology& topo = ex.topology();
  const bool lead = topo.rank == 0;
  World world{*groups.world};
  const Deadline opDeadline = Deadline::after(Millis(3600000));

  // 1. Measure, at the model's own sizes.
  Measured m;
  uint64_t minElems = UINT64_MAX, maxElems = 1;
  for (const auto& t : profile.tensors) {
    minElems = std::min(minElems, uint64_t(std::max<int64_t>(1, t.elements)));
    maxElems = std::max(maxElems, uint64_t(std::max<int64_t>(1, t.elements)));
  }
  uint64_t maxPayload = 64;
  {
    compressor::Registry reg;
    compressor::registerCpuCodecs(reg);
    maxPayload = std::max<uint64_t>(64, reg.create(reg.canonical(o.codec))->payloadBytes(std::min(maxElems, uint64_t(1) << 26)));
  }
  // Every probe, at the start and (--probe-once not given) again before
  // every later round: the rounds' predictions then come from the costs of
  // their own minutes on a machine whose speed drifts (docs/model_bench.md).
  auto measureAll = [&](Measured& into, int tag) {
    const Deadline d = Deadline::after(Millis(600000));
    if (topo.localSize > 1) {
      measureGroup(world, *groups.intra, 4 * minElems, 4 * maxElems, maxPayload, d, into.intra,
                   into.intraCompressed, into.intraCurves, into.intraCurvesCompressed, into.probes,
                   "intra");
      into.hasIntra = true;
    }
    if (topo.numMachines > 1) {
      measureGroup(world, *groups.inter, 4 * minElems, 4 * maxElems, maxPayload, d, into.inter,
                   into.interCompressed, into.interCurves, into.interCurvesCompressed, into.probes,
                   "inter");
      into.hasInter = true;
    }
    into.pushPull = measurePushPull(world, *worker, topo, 4 * minElems, 4 * maxElems,
                                    job.partitionBytes, d, into.pushPullCurve, into.probes, tag);
    measureCodec(world, o.codec, minElems, maxElems, into);
    if (job.fusionBytes > 0) {
      constexpr int kCalls = 30;
      world.barrier();
      for (int i = 0; i < 3; ++i) agreeOnBatch(*groups.world, 1, d);
      const auto a0 = Clock::now();
      for (int i = 0; i < kCalls; ++i) agreeOnBatch(*groups.world, size_t(i), d);
      into.agreeUs = world.max({secondsSince(a0) * 1e6 / kCalls})[0];
      into.probes.push_back(fmt::format(
          "batch agreement (flat allgather of an int64, mean of {}): {:.0f} us", kCalls, into.agreeUs));
    }
    if (lead)
      for (const std::string& line : into.probes)
        fmt::print(stderr, "# cortado bench model: measured{} {}\n",
                   tag > 0 ? fmt::format(" (round {})", tag + 1) : std::string(), line);
  };
  const auto probe0 = Clock::now();
  measureAll(m, 0);
  const double probeSeconds = secondsSince(probe0);
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const int cpuCores = o.cpuCores > 0 ? o.cpuCores : std::max(1, hw / std::max(1, topo.numMachines));

  // 2. Plans and predictions on rank 0, plans to everybody.
  std::vector<Prediction> preds;
  std::shared_ptr<planner::Simulator> simulator;  // rank 0: for the plans handed out during replan
  std::string costNote, err;
  if (lead) {
    try {
      preds = predict(o, profile, topo, m, cpuCores, job.partitionBytes, job.fusionBytes, &costNote,
                      &simulator);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = world.broadcast(err);
  if (!err.empty()) throw Error(ErrorCode::kInvalidArgument, "planning the strategies: " + err);
  std::vector<std::string> planJson;
  for (size_t i = 0; i < o.strategies.size(); ++i)
    planJson.push_back(world.broadcast(lead ? plan::toJsonString(preds[i].plan) : std::string()));
  if (lead && !o.planOut.empty()) {
    for (const auto& p : preds) {
      if (p.strategy != "plan") continue;
      std::ofstream f(o.planOut);
      f << plan::toJsonString(p.plan) << "\n";
      CORTADO_ENFORCE(f.good(), ErrorCode::kInvalidArgument, "--plan-out: cannot write '{}'", o.planOut);
    }
  }

  // 3. Replay.
  const size_t T = profile.tensors.size();
  uint64_t totalElements = 0;
  for (const auto& t : profile.tensors) totalElements += uint64_t(t.elements);
  if (lead && !o.json) {
    fmt::print("# cortado bench model: {} ({} tensors, {:.1f} M elements), codec {}, {} workers on "
               "{} machines x {}, {} servers, compute scale {} (forward {:.1f} ms, backward {:.1f} "
               "ms), {} iterations after {} warm-up, tensor fusion {}{}\n# measured {}\n",
               profile.model, T, totalElements / 1e6, o.codec, topo.size, topo.numMachines,
               topo.localSize, worker->numServers(), o.computeScale, profile.forwardUs / 1e3,
               profile.backwardUs() / 1e3, o.iterations, o.warmup,
               job.fusionBytes > 0 ? fmt::format("up to {} bytes (CORTADO_FUSION_BYTES; batch "
                                                 "agreement {:.0f} us)",
                                                 job.fusionBytes, m.agreeUs)
                                   : std::string("off (CORTADO_FUSION_BYTES=0)"),
               job.pipeline ? ", encode pipeline on (CORTADO_PIPELINE=1: the predictions do not "
                              "model its overlap)"
                            : "",
               costNote);
    std::fflush(stdout);
  }
  std::vector<std::vector<float>> pat(T), buf(T);
  const int levels = patternLevels(topo.size);
  for (size_t j = 0; j < T; ++j) {
    const auto& t = profile.tensors[j];
    ex.declare(t.name, DType::kFloat32, uint64_t(t.elements));
    pat[j].resize(size_t(t.elements));
    buf[j].resize(size_t(t.elements));
    for (uint64_t i = 0; i < uint64_t(t.elements); ++i) pat[j][i] = pattern(j, i, levels);
  }
  // Gradient j is ready this long after an iteration starts (forward pass
  // and backward up to j).
  std::vector<double> readyTimes(T);
  {
    double at = profile.forwardUs;
    for (size_t j = 0; j < T; ++j) readyTimes[j] = at += profile.tensors[j].backwardUs;
  }
  std::vector<executor::BatchItem> batch;
  const bool progressOn = lead && (o.progress || isatty(2));
  const double sumFactor = double(topo.size) * (topo.size + 1) / 2.0;
  const size_t S = o.strategies.size();
  std::vector<Result> results(S);
  for (size_t si = 0; si < S; ++si) results[si].strategy = o.strategies[si];
  // replan: the plan the scheduler settled on in the first round, which the
  // later rounds run as a fixed plan.
  std::optional<plan::Plan> replanned;
  // Tensors that were lossy under the strategy before: setPlan() retires
  // their encode points and folds the residuals into the next input too.
  std::vector<bool> compressedBefore(T, false);
  // --rounds: every strategy runs once per round, in the given order in odd
  // rounds and in reverse in even ones, so that a drift of this shared
  // machine's speed over the job (iterations of one strategy measured 20-30%
  // apart minutes apart, docs/benchmarks.md) weighs on every strategy alike
  // instead of on those that ran late.
  // Rank 0: each later round's cost models from its own probe (round 0's is
  // `simulator`), which predict the same plans again at the end.
  std::vector<std::shared_ptr<planner::Simulator>> roundSims;
  for (int round = 0; round < o.rounds; ++round)
  for (size_t k = 0; k < S; ++k) {
    if (k == 0 && round > 0 && !o.probeOnce) {
      Measured mr;
      measureAll(mr, round);
      if (lead) {
        std::shared_ptr<planner::Simulator> sim;
        try {
          sim = buildSimulator(o, profile, topo, mr, cpuCores, job.partitionBytes, job.fusionBytes,
                               nullptr, nullptr);
        } catch (const Error& e) {
          // The same inputs built round 1's; should they not now, that round's stand.
          CORTADO_LOG_WARN("[bench] round {}: the cost models from its probe failed ({}); round 1's "
                           "predict it",
                           round + 1, e.what());
        }
        roundSims.push_back(sim ? sim : simulator);
      }
    }
    const size_t si = round % 2 ? S - 1 - k : k;
    Result& r = results[si];
    // replan: online profiling and the scheduler's switches in the first
    // round only.
    const bool replan = r.strategy == "replan" && round == 0;
    const plan::Plan p = r.strategy == "replan" && round > 0 ? *replanned
                                                             : plan::planFromJsonString(planJson[si]);
    ex.setPlan(p, opDeadline);
    std::vector<bool> exact(T);
    // At a switch the retired lossy encode points' error-feedback residuals
    // are folded into that iteration's input (docs/planner.md): the result
    // is the exact sum plus what the old plan had not sent yet, so a tensor
    // that was lossy before the switch is not checked in that iteration; and
    // if its new option compresses (even with fp16), the folded fractions
    // keep rounding and live on in that option's residual, so it is not
    // checked again in this strategy (`tainted`).
    std::vector<bool> folding(T, false), tainted(T, false);
    // The same holds between strategies: the first iteration after setPlan()
    // carries what the previous strategy's lossy encode points had not sent.
    for (size_t j = 0; j < T; ++j) {
      if (!compressedBefore[j]) continue;
      folding[j] = true;
      tainted[j] = p.tensors.at(profile.tensors[j].name).compressed();
    }
    auto classify = [&](const plan::Plan& cur) {
      r.lossyTensors = 0;
      for (size_t j = 0; j < T; ++j) {
        const auto& opt = cur.tensors.at(profile.tensors[j].name);
        exact[j] = !opt.compressed() || (losslessFor(opt.codec) && !tainted[j]);
        r.lossyTensors += !exact[j];
      }
    };
    classify(p);
    // replan: online profiling on, iterations numbered for beginIteration();
    // the scheduler decides on the first complete window (a plan switches at
    // warm-up + window + CORTADO_REPLAN_AHEAD; or the offline plan stays when
    // no plan is predicted CORTADO_REPLAN_MIN_GAIN faster); o.iterations are
    // measured after o.warmup more after that iteration.
    int cap = o.warmup + o.iterations, decided = -1;
    // replan: the iteration at which the plan has settled: the first verdict's
    // when the offline plan stays; after a switch, that of the scheduler's
    // measured check of the new plan (the first window that ran it
    // throughout, docs/planner.md), which may revert it.
    int settled = -1, changes = 0;
    int windowFrom = 0, windowLen = 1;
    if (replan) {
      executor::OnlineOptions ol = executor::onlineOptions(job);
      ol.warmup = uint64_t(std::max(1, o.warmup));
      ex.setOnline(ol);
      decided = int(ol.warmup + ol.window + job.replanAhead);
      cap = int(ol.warmup + 3 * ol.window + job.replanAhead) + 5;
      windowFrom = int(ol.warmup);
      windowLen = int(std::max<uint64_t>(1, ol.window));
    }
    if (round == 0) r.planVersion = r.offlineVersion = p.version;
    Progress bar(progressOn, replan ? cap + 3 * (2 * windowLen + int(job.replanAhead)) + o.warmup +
                                          o.iterations
                                    : o.warmup + o.iterations);
    std::vector<double> times;
    for (int it = 0;; ++it) {
      if (!replan && it >= o.warmup + o.iterations) break;
      if (replan) {
        // After the switch, --warmup untimed iterations again: the new plan's
        // first iterations pay its first touches (new error-feedback
        // residuals, new keys on the servers), 1-2 s each on emulated hosts.
        if (settled >= 0 && it - settled >= o.warmup + o.iterations) break;
        // Every worker switches at the same iteration, so all stop together.
        CORTADO_ENFORCE(r.switchedAt >= 0 || it < cap, ErrorCode::kTimeout,
                        "--strategies replan: no new plan by iteration {} (profiling windows of {} "
                        "iterations after {} warm-up, CORTADO_REPLAN_AHEAD {}): the scheduler "
                        "handed out none; see its log for the re-planning error",
                        it, job.profileWindow, std::max(1, o.warmup), job.replanAhead);
        ex.beginIteration(uint64_t(it), opDeadline);
        if (ex.currentPlan().version != r.planVersion) {
          if (r.switchedAt < 0) r.switchedAt = it;
          // Each of the first 3 plans handed out is checked by its first
          // window (its verdict may revert it, or a moved link re-plan);
          // later ones are taken as they come.
          if (++changes <= 3) {
            // The check is the first window that begins after the switch
            // (one that begins with it holds the new plan's first touches).
            const int checkFrom = windowFrom + ((it - windowFrom) / windowLen + 1) * windowLen;
            settled = checkFrom + windowLen + int(job.replanAhead);
            times.clear();  // iterations timed before it ran another plan
          }
          r.planVersion = ex.currentPlan().version;
          const std::vector<bool> before = exact;
          for (size_t j = 0; j < T; ++j) tainted[j] = tainted[j] || !before[j];
          classify(ex.currentPlan());
          for (size_t j = 0; j < T; ++j) folding[j] = !before[j];
        }
        if (r.switchedAt < 0 && it == decided) r.switchedAt = settled = it;  // the offline plan stays
      }
      const float f = factor(topo.rank, it);
      for (size_t j = 0; j < T; ++j)
        for (size_t i = 0; i < buf[j].size(); ++i) buf[j][i] = f * pat[j][i];
      world.barrier();
      const auto t0 = Clock::now();
      const double traceT0 = Tracer::now();
      // Each time the executor is free: every gradient ready by now is the
      // batch (none: the next one, when it is ready). With fusion the
      // workers agree on it first (the largest of their counts; each waits
      // for those on its own clock), so that all run the same items.
      auto readyAt = [&](size_t j) {
        return t0 + std::chrono::nanoseconds(int64_t(readyTimes[j] * 1e3));
      };
      for (size_t j = 0; j < T;) {
        std::this_thread::sleep_until(readyAt(j));
        size_t end = j + 1;
        if (ex.fusionBytes() > 0) {
          const auto now = Clock::now();
          while (end < T && readyAt(end) <= now) ++end;
          end = agreeOnBatch(*groups.world, end, opDeadline);
          std::this_thread::sleep_until(readyAt(end - 1));
        }
        batch.clear();
        for (size_t k = j; k < end; ++k) {
          const auto& t = profile.tensors[k];
          // The executor's iteration is the tensor's run count: the same here.
          if (tracer->enabled() && t.backwardUs > 0)
            tracer->record("backward", t.name, int64_t(ex.runs(t.name)), "gpu",
                           traceT0 + readyTimes[k] - t.backwardUs, traceT0 + readyTimes[k]);
          batch.push_back({t.name, buf[k].data(), buf[k].data(), buf[k].size()});
        }
        ex.runBatch(batch, ReduceOp::kSum, opDeadline);
        ++r.batches;
        j = end;
      }
      const double secs = secondsSince(t0);
      if (replan ? settled >= 0 && it >= settled + o.warmup : it >= o.warmup) times.push_back(secs);
      const float want = float(sumFactor * (1 + it % 3));
      for (size_t j = 0; j < T; ++j) {
        if (!exact[j] || folding[j]) continue;
        r.checked += buf[j].size();
        for (size_t i = 0; i < buf[j].size(); ++i) r.wrong += buf[j][i] != want * pat[j][i];
      }
      std::fill(folding.begin(), folding.end(), false);
      ++r.iterationsRun;
      if (lead)
        CORTADO_LOG_DEBUG("[bench] {} round {} iteration {}: {:.1f} ms (this worker), plan version {}",
                          r.strategy, round + 1, it, secs * 1e3, ex.currentPlan().version);
      bar.update(r.strategy, it + 1, secs * 1e3);
    }
    bar.done();
    if (replan) r.timedFrom = settled + o.warmup;
    for (size_t j = 0; j < T; ++j) {
      // Lossless codecs on this data (fp16 of integers) leave zero residuals.
      const auto& opt = ex.currentPlan().tensors.at(profile.tensors[j].name);
      compressedBefore[j] = opt.compressed() && !losslessFor(opt.codec);
    }
    if (replan) {
      ex.setOnline({});  // no later plan may replace the next strategy's
      replanned = ex.currentPlan();
    }
    times = world.max(times);  // an iteration ends when the last worker is done
    double roundSum = 0;
    for (double t : times) r.timesMs.push_back(t * 1e3), roundSum += t;
    r.roundMs.push_back(roundSum / double(times.size()) * 1e3);
  }
  for (size_t si = 0; si < S; ++si) {
    Result& r = results[si];
    const bool replan = r.strategy == "replan";
    const std::vector<double>& times = r.timesMs;
    double sum = 0, sq = 0;
    for (double t : times) sum += t, sq += t * t;
    const double n = double(times.size());
    r.meanMs = sum / n;
    r.stdMs = std::sqrt(std::max(0.0, sq / n - (sum / n) * (sum / n)));
    r.minMs = *std::min_element(times.begin(), times.end());
    auto wrong = world.mean({double(r.wrong), double(r.checked)});
    r.wrong = uint64_t(std::llround(wrong[0] * topo.size));
    r.checked = uint64_t(std::llround(wrong[1] * topo.size));
    if (lead) {
      r.predictedMs = preds[si].predictedUs / 1e3;
      r.options = preds[si].options;
      double overlappedMs = preds[si].overlappedUs / 1e3;
      if (replan) {
        // The scheduler chose this plan from its own fits; predicted here by
        // the costs this benchmark measured, as every other strategy (none
        // when the plan compresses with another codec than --codec).
        r.predictedMs = 0, overlappedMs = 0;
        const std::string tracePath =
            o.predictedTrace.empty() ? std::string() : predictedTracePath(o.predictedTrace, "replan");
        if (auto pr = predictPlan(*simulator, *replanned, tracePath)) {
          r.predictedMs = pr->first / 1e3;
          overlappedMs = pr->second / 1e3;
        }
        std::map<std::string, int> count;
        int compressed = 0;
        for (const auto& [name, opt] : replanned->tensors) {
          ++count[opt.describe() + (opt.codec.empty() ? "" : " " + opt.codec)];
          compressed += opt.compressed();
        }
        const std::string what = count.size() == 1
                                     ? count.begin()->first
                                     : fmt::format("{} distinct options, {} of {} tensors compressed",
                                                   count.size(), compressed, T);
        r.options = r.planVersion == r.offlineVersion
                        ? fmt::format("offline plan (version {}) kept by the scheduler (first verdict "
                                      "at iteration {}): {}",
                                      r.offlineVersion, r.switchedAt, what)
                        : fmt::format("offline plan (version {}), then version {} (first switch at "
                                      "iteration {}, timed from {}): {}",
                                      r.offlineVersion, r.planVersion, r.switchedAt, r.timedFrom, what);
      }
      // Each later round's prediction from its own probe, the same plan:
      // the strategy's is their mean, as its measured time is the mean over
      // the rounds (each has --iterations).
      r.roundPredictedMs = {r.predictedMs};
      if (r.predictedMs > 0) {
        const plan::Plan& p = replan ? *replanned : preds[si].plan;
        double predSum = r.predictedMs, overSum = overlappedMs;
        for (const auto& sim : roundSims) {
          const auto pr = predictPlan(*sim, p, std::string());
          const double ms = pr ? pr->first / 1e3 : r.predictedMs;
          r.roundPredictedMs.push_back(ms);
          predSum += ms;
          overSum += pr ? pr->second / 1e3 : overlappedMs;
        }
        r.predictedMs = predSum / double(r.roundPredictedMs.size());
        overlappedMs = overSum / double(r.roundPredictedMs.size());
      }
      const double errPct = r.predictedMs > 0 ? 100.0 * (r.predictedMs - r.meanMs) / r.meanMs : 0;
      const std::string check = r.wrong ? fmt::format("WRONG ({} of {})", r.wrong, r.checked)
                                : r.lossyTensors == T ? "lossy"
                                : fmt::format("exact ({} lossy tensors)", r.lossyTensors);
      if (o.json) {
        json jr = {{"model", profile.model}, {"codec", o.codec}, {"strategy", r.strategy},
                   {"measured_ms", r.meanMs}, {"stdev_ms", r.stdMs}, {"min_ms", r.minMs},
                   {"predicted_ms", r.predictedMs}, {"error_pct", errPct},
                   {"overlapped_ms", overlappedMs},
                   {"iterations", o.iterations}, {"rounds", o.rounds}, {"round_ms", r.roundMs},
                   {"round_predicted_ms", r.roundPredictedMs}, {"probe_s", probeSeconds},
                   {"workers", topo.size},
                   {"machines", topo.numMachines}, {"compute_scale", o.computeScale},
                   {"checked_elements", r.checked}, {"wrong_elements", r.wrong},
                   {"lossy_tensors", r.lossyTensors}, {"options", r.options},
                   {"fusion_bytes", job.fusionBytes},
                   {"pipeline", job.pipeline},
                   {"batches_per_iteration", double(r.batches) / double(std::max<uint64_t>(1, r.iterationsRun))},
                   {"iteration_ms", r.timesMs}};
        if (!(r.predictedMs > 0)) {
          jr["predicted_ms"] = nullptr;
          jr["overlapped_ms"] = nullptr;
          jr["error_pct"] = nullptr;
        }
        if (replan) {
          jr["plan_version"] = r.planVersion;
          jr["switched_at"] = r.switchedAt;
          jr["timed_from"] = r.timedFrom;
        }
        fmt::print("{}\n", jr.dump());
      } else {
        if (si == 0)
          fmt::print("| strategy | measured ms | stdev | predicted ms | error | check | options |\n"
                     "|---|---|---|---|---|---|---|\n");
        if (!(r.predictedMs > 0))
          fmt::print("| {} | {:.1f} | {:.1f} | - | - | {} | {} |\n", r.strategy, r.meanMs, r.stdMs,
                     check, r.options);
        else
          fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:+.1f}% | {} | {} |\n", r.strategy,
                     r.meanMs, r.stdMs, r.predictedMs, errPct, check, r.options);
      }
      std::fflush(stdout);
    }
  }
  int failures = 0;
  for (const Result& r : results) failures += r.wrong > 0;
  if (lead) {
    auto find = [&](const char* s) -> const Result* {
      for (const Result& r : results)
        if (r.strategy == s) return &r;
      return nullptr;
    };
    const Result *plan = find("plan"), *none = find("none"), *gpu = find("gpu"), *cpu = find("cpu"),
                 *replanned = find("replan");
    if (replanned && none) {
      if (o.json)
        fmt::print("{}\n", json({{"model", profile.model}, {"codec", o.codec}, {"summary", true},
                                 {"replan_speedup_vs_none", none->meanMs / replanned->meanMs}})
                               .dump());
      else
        fmt::print("replan (after the switch) vs none: {:.2f}x\n", none->meanMs / replanned->meanMs);
    }
    const Result* bestAll = gpu && (!cpu || gpu->meanMs <= cpu->meanMs) ? gpu : cpu;
    if (plan && (none || bestAll)) {
      const double vsNone = none ? none->meanMs / plan->meanMs : 0;
      const double vsAll = bestAll ? bestAll->meanMs / plan->meanMs : 0;
      if (o.json) {
        json js = {{"model", profile.model}, {"codec", o.codec}, {"summary", true}};
        if (none) js["plan_speedup_vs_none"] = vsNone;
        if (bestAll) {
          js["plan_speedup_vs_best_compress_all"] = vsAll;
          js["best_compress_all"] = bestAll->strategy;
        }
        fmt::print("{}\n", js.dump());
      } else {
        if (none) fmt::print("plan vs none: {:.2f}x\n", vsNone);
        if (bestAll) fmt::print("plan vs best compress-everything ({}): {:.2f}x\n", bestAll->strategy, vsAll);
      }
    }
  }
  if (tracer->enabled()) {
    const std::string path = tracer->flush();
    if (lead) fmt::print(stderr, "cortado bench model: trace written to {} (and the other workers' beside it)\n", path);
  }
  worker->shutdown(Deadline::after(job.opTimeout));
  if (failures) {
    if (lead) fmt::print(stderr, "cortado bench model: {} strategies had wrong results\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace cortado::launcher
