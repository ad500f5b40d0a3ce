// The probes of `cortado bench model` (bench_model_probe.h), and why each
// is taken the way it is.
#include "launcher/bench_model_probe.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>

#include "compressor/cpu/kernels.h"
#include "compressor/error_feedback.h"
#include "compressor/registry.h"
#include "core/common/error.h"
#include "core/common/logging.h"
#include "core/common/thread_pool.h"
#include "core/common/trace.h"
#include "core/executor/executor.h"
#include "launcher/bench_model.h"
#include "launcher/bench_model_predict.h"

namespace cortado::launcher {

namespace replay {

using planner::AlphaBeta;

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

namespace {

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
  int calls = 1, strays = 0;  // the calls in `us` and those left out (meanLessStrays)
};

// A probe's samples as a curve: non-decreasing by size, each size weighted
// by its calls (MeasuredCurve::monotone; `add` alone would keep the running
// maximum, and one slow size would floor every larger one).
planner::MeasuredCurve curveOf(const std::vector<Sample>& s, int p) {
  std::vector<std::array<double, 3>> rows;
  for (const Sample& x : s) rows.push_back({x.bytes, x.us, double(x.calls)});
  return planner::MeasuredCurve::monotone(rows, p);
}

// A sample for the log: bytes, time and the strays left out.
std::string describe(const Sample& x) {
  return x.strays ? fmt::format(" {:.0f}B:{:.0f}us({} left out)", x.bytes, x.us, x.strays)
                  : fmt::format(" {:.0f}B:{:.0f}us", x.bytes, x.us);
}

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

// Element counts for the codec and exchange probes: lo to hi (at most
// `cap`, at least 1) 4x apart with both ends, and each of `also` strictly
// between them, in increasing order.
std::vector<uint64_t> elementSizes(uint64_t lo, uint64_t hi, uint64_t cap,
                                   const std::vector<uint64_t>& also) {
  hi = std::max<uint64_t>(1, std::min(hi, cap));
  lo = std::max<uint64_t>(1, std::min(lo, hi));
  std::vector<uint64_t> sizes = probeSizes(lo, hi);
  for (uint64_t a : also)
    if (a > lo && a < hi && std::find(sizes.begin(), sizes.end(), a) == sizes.end())
      sizes.push_back(a);
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

// Elements: up to the largest fused group's (bench_model.cc), 64 MiB of
// floats at most, or the largest tensor's own size where that is larger:
// BERT's word embedding (23 Mi elements) priced by the slope from 4 to 16 Mi
// had its zeroing pass at 16 ms against 34 traced (2026-12-01).
constexpr uint64_t kMaxCodecProbe = 16u << 20;

// Bytes; larger tensors extrapolate the curve's last slope. BERT's word
// embedding (94 MB) extrapolated from 16 MiB along a slope taken between two
// noisy points had the push/pull prediction of `none` 31% high.
constexpr uint64_t kMaxLinkProbe = 64u << 20;
// Elements: the compressed exchange's largest size (measureCompressedExchange).
// Its time grows with the payload's bytes from about 1 Mi elements up (DGC
// 1%: 6.4 ms at 0.5 Mi, 12.5 at 2 Mi, 26.4 at 8 Mi, 54.8 at 16 Mi on the
// emulated hosts), so the last slope carries it beyond; larger probes only
// held the servers' keys and the workers' heap (memory report) for nothing.
constexpr uint64_t kMaxExchangeProbe = 4u << 20;

// Times op(bytes) at each size: one untimed call, then the mean of 9 (5 from
// 64 KiB, 3 from 1 MiB) calls back to back after a barrier, less strays
// (meanLessStrays), as the replay
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
    const ProbeMean m = meanLessStrays(std::vector<double>(all.begin() + long(at),
                                                           all.begin() + long(at) + reps[i]));
    at += size_t(reps[i]);
    out.push_back({double(sizes[i]), m.us, m.calls, m.strays});
  }
  return out;
}

// Per size (`sizes` of them, `reps` times each in `v`, size-major) this
// worker's median, then the slowest worker's.
std::vector<double> slowestMedians(World& world, size_t sizes, int reps,
                                   const std::vector<double>& v) {
  std::vector<double> out;
  for (size_t i = 0; i < sizes; ++i) {
    std::vector<double> r(v.begin() + long(i * size_t(reps)),
                          v.begin() + long((i + 1) * size_t(reps)));
    std::sort(r.begin(), r.end());
    out.push_back(r[r.size() / 2]);
  }
  return world.max(out);
}

// A codec probe's timings (enc, dec: seconds, `reps` per size, size-major)
// into curves by elements and alpha-beta fits (s, s per input byte): per
// size each worker's median, then the slowest worker's (the step after an
// encode waits for it; per pass the slowest worker's call, then the median
// over the passes, was tried: 4 workers on 2 cores, one of them always
// waits for a core, and the predictions came out 65% above the replay),
// smoothed (smoothCodecProbes). Returns the points for the log.
std::string fitCodecProbes(World& world, const std::vector<uint64_t>& sizes, int reps,
                           const std::vector<double>& enc, const std::vector<double>& dec,
                           planner::MeasuredCurve& encCurve, planner::MeasuredCurve& decCurve,
                           double& encAlpha, double& encBeta, double& decAlpha, double& decBeta) {
  std::vector<double> encMed = slowestMedians(world, sizes.size(), reps, enc);
  std::vector<double> decMed = slowestMedians(world, sizes.size(), reps, dec);
  smoothCodecProbes(sizes, encMed, decMed);
  std::vector<std::array<double, 3>> er, dr;
  encCurve = decCurve = planner::MeasuredCurve{};
  std::string pts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    er.push_back({1.0, 4.0 * sizes[i], encMed[i]});
    dr.push_back({1.0, 4.0 * sizes[i], decMed[i]});
    encCurve.add(double(sizes[i]), encMed[i] * 1e6);
    decCurve.add(double(sizes[i]), decMed[i] * 1e6);
    pts += fmt::format(" {}:{:.0f}/{:.0f}us", sizes[i], encMed[i] * 1e6, decMed[i] * 1e6);
  }
  std::tie(encAlpha, encBeta) = fitRelative(er);
  std::tie(decAlpha, decBeta) = fitRelative(dr);
  return pts;
}

}  // namespace

std::vector<uint64_t> codecProbeSizes(uint64_t lo, uint64_t hi, const std::vector<uint64_t>& also) {
  uint64_t cap = kMaxCodecProbe;
  for (uint64_t a : also)
    if (a <= hi) cap = std::max(cap, a);
  return elementSizes(lo, hi, cap, also);
}

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
// executor moves payloads (core/executor/steps.cc, allgatherBlob and friends): the sizes
// first, then the bytes.
void measureGroup(World& world, collective::Collectives& g, collective::Collectives& raw,
                  device::Device& dev, uint64_t lo, uint64_t hi, uint64_t payloadHi, Deadline d, std::map<plan::CommOp, AlphaBeta>& ops,
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
  // Compressed steps move payloads: their sizes, in bytes (a fused group's
  // payload may exceed the largest tensor's raw bytes).
  const auto payloadSizes =
      probeSizes(64, std::max<uint64_t>(64, std::min(payloadHi, kMaxLinkProbe)));
  // The uncompressed steps' buffers in the device's memory (filled with
  // ones: sums of uninitialized floats may meet slow denormals on a CPU);
  // the payloads' in host memory, the same buffers where the device's
  // memory is the host's.
  const bool shared = dev.hostAddressable();
  const uint64_t room = shared ? std::max(hi, payloadSizes.back()) : hi;
  device::Buffer rawIn(dev, false), rawOut(dev, false);
  float* buf = rawIn.floats((room + 3) / 4);
  float* out = rawOut.floats((room + 3) / 4 * p);
  {
    auto s = dev.createStream();
    auto e = dev.createEvent();
    dev.fill(buf, 1.0f, (room + 3) / 4, *s);
    dev.fill(out, 0.0f, (room + 3) / 4 * p, *s);
    e->record(*s);
    e->synchronize(d, "the probe buffers' fill");
  }
  std::vector<float> hostIn, hostOut;
  if (!shared) {
    hostIn.assign((payloadSizes.back() + 3) / 4, 1.0f);
    hostOut.assign((payloadSizes.back() + 3) / 4 * p, 0.0f);
  }
  auto note = [&](CommOp op, bool compressed, const std::vector<Sample>& s, const AlphaBeta& ab) {
    std::string pts;
    for (const Sample& x : s) pts += describe(x);
    log.push_back(fmt::format("{} {}{}: {:.0f} us + {:.3f} Gbit/s from{}", scope, plan::toString(op),
                              compressed ? "*" : "", ab.alphaUs, ab.gbps, pts));
  };
  auto fitted = [&](CommOp op, bool compressed, auto f) {
    const auto s = compressed ? probe(world, payloadSizes, [&](uint64_t bytes) { f(bytes); })
                              : probe(world, sizes, [&](uint64_t bytes) {
                                  f(bytes / 4);  // float32 elements, a multiple of p
                                });
    AlphaBeta ab = fitOp(op, p, s);
    (compressed ? compressedOps : ops)[op] = ab;
    (compressed ? compressedCurves : curves)[op] = curveOf(s, p);
    note(op, compressed, s, ab);
  };
  using DT = DType;
  fitted(CommOp::kAllreduce, false, [&](uint64_t n) { raw.allreduce(buf, out, n, DT::kFloat32, d); });
  fitted(CommOp::kReduceScatter, false,
         [&](uint64_t n) { raw.reduceScatter(buf, out, n / p, DT::kFloat32, d); });
  fitted(CommOp::kAllgather, false, [&](uint64_t n) { raw.allgather(buf, n, out, DT::kFloat32, d); });
  fitted(CommOp::kAlltoall, false,
         [&](uint64_t n) { raw.alltoall(buf, out, n / p, DT::kFloat32, d); });
  fitted(CommOp::kReduce, false, [&](uint64_t n) { raw.reduce(buf, out, n, DT::kFloat32, 0, d); });
  fitted(CommOp::kGather, false, [&](uint64_t n) { raw.gather(buf, n, out, DT::kFloat32, 0, d); });
  // Compressed: `n` is bytes here.
  auto* bytesIn = reinterpret_cast<std::byte*>(shared ? buf : hostIn.data());
  auto* bytesOut = reinterpret_cast<std::byte*>(shared ? out : hostOut.data());
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
    (compressed ? compressedCurves : curves)[CommOp::kBroadcast] = curveOf(s, p);
    note(CommOp::kBroadcast, compressed, s, ab);
  };
  fenced(false, sizes,
         [&](uint64_t bytes) { raw.broadcast(buf, bytes / 4, DT::kFloat32, 0, d); });
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
  std::vector<Sample> each;  // one push (or pull): by a machine's bytes times the spread
  for (const Sample& x : s) {
    // The probe key's chunks reach only that many servers, as the model's
    // tensors' do (planner::Cluster::oneTensorAtATime): the same spread here.
    const double chunks = std::ceil(x.bytes / double(chunkBytes)) * L;
    const double spread = m * std::ceil(chunks / m) / chunks;
    rows.push_back({2.0, 2.0 * frac * x.bytes * L * spread, x.us});
    each.push_back({x.bytes * L * spread, x.us / 2, x.calls, x.strays});
    pts += describe(x);
  }
  const auto [a, b] = fitRelative(rows);
  AlphaBeta ab{a, 8.0 / (b * 1000.0)};
  log.push_back(fmt::format("push+pull: {:.0f} us + {:.3f} Gbit/s each from{}", ab.alphaUs, ab.gbps, pts));
  // And as a curve: commTimeUs takes a machine's bytes times the spread for
  // push and for pull; each is half of the measured exchange.
  curve = curveOf(each, topo.numMachines);
  return ab;
}

// The executor's encode (with error feedback, as it runs it) and decode-and-
// add, at the model's tensor sizes (codecProbeSizes of lo to hi elements),
// on data that is not in the caches (the replay fills every
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
void measureCodec(World& world, const std::string& spec, uint64_t lo, uint64_t hi, Measured& m,
                  const std::vector<uint64_t>& also) {
  compressor::Registry reg;
  compressor::registerCpuCodecs(reg);
  compressor::CodecPtr codec = reg.create(reg.canonical(spec));
  const std::vector<uint64_t> sizes = codecProbeSizes(lo, hi, also);
  hi = sizes.back();
  m.codecSizes = sizes;
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
    efs.push_back(std::make_unique<compressor::ErrorFeedback>(codec, -1.0f, m.efState));
    payloads[i].resize(efs[i]->payloadBytes(sizes[i]));
  }
  std::vector<double> enc(sizes.size() * reps), dec(sizes.size() * reps),
      zeros(sizes.size() * reps), first(sizes.size() * reps), further(sizes.size() * reps);
  const int contributions = world.c.size();
  // The executor's codec threads: the calling thread and a pool.
  std::unique_ptr<ThreadPool> pool;
  if (m.codecThreads > 1) pool = std::make_unique<ThreadPool>(size_t(m.codecThreads - 1));
  compressor::EncodeContext decodeCtx;
  decodeCtx.pool = pool.get();
  auto gradients = [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) x[i] = factor(world.c.rank(), 0) * pattern(0, i, levels);
  };
  for (int r = -1; r < reps; ++r) {  // pass -1: untimed first touches
    for (size_t i = 0; i < sizes.size(); ++i) {
      const uint64_t n = sizes[i];
      auto encodeOnce = [&] {
        compressor::EncodeContext ctx;
        ctx.seed = ++key;
        ctx.pool = pool.get();
        efs[i]->encode(n, x.data(), n, payloads[i], ctx);
      };
      auto decodeOnce = [&] { codec->decompressAdd(payloads[i], x.data(), n, 1.0f, decodeCtx); };
      auto zero = [&] { compressor::cpu::zeroFloats(pool.get(), x.data(), n); };
      if (r < 0) {
        encodeOnce();
        zero();
        decodeOnce();
        gradients(n);
        continue;
      }
      evict();
      world.barrier();
      enc[i * reps + size_t(r)] = medianSeconds(1, encodeOnce);
      // The decode as the executor runs it (Run::decodeOnHost), after the
      // collective that every worker leaves at once: the tensor's own region,
      // which the encode has just read, zeroed, then a payload of every worker
      // added into it in turn (a flat allgather*'s; the replay's workers'
      // gradients share one pattern, so their payloads list the same
      // indices). The zeroing pass is timed on its own (Cluster::
      // cpuFillCurve), the adds per payload, the first apart from the others
      // (it reads the region from memory: ResolvedCodec::decodeFirstCurve).
      // Then the gradients again.
      world.barrier();
      const auto z0 = Clock::now();
      zero();
      zeros[i * reps + size_t(r)] = secondsSince(z0);
      const auto d0 = Clock::now();
      decodeOnce();
      const double once = secondsSince(d0);
      for (int k = 1; k < contributions; ++k) decodeOnce();
      const double all = secondsSince(d0);
      dec[i * reps + size_t(r)] = all / contributions;
      first[i * reps + size_t(r)] = once;
      further[i * reps + size_t(r)] = contributions > 1 ? (all - once) / (contributions - 1) : once;
      gradients(n);
    }
  }
  const std::string pts = fitCodecProbes(world, sizes, reps, enc, dec, m.encodeCurve,
                                         m.decodeCurve, m.encodeAlpha, m.encodeBeta,
                                         m.decodeAlpha, m.decodeBeta);
  m.probes.push_back(fmt::format("codec {} encode/decode per elements:{}", spec, pts));
  // The first payload's add and each further one's, per size as the
  // others (each worker's median, the slowest worker's), smoothed as the
  // zeroing pass below.
  std::vector<double> firstMed = slowestMedians(world, sizes.size(), reps, first);
  std::vector<double> furtherMed = slowestMedians(world, sizes.size(), reps, further);
  smoothPassProbes(sizes, firstMed);
  smoothPassProbes(sizes, furtherMed);
  m.decodeFirstCurve = m.decodeFurtherCurve = planner::MeasuredCurve{};
  std::string fpts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    m.decodeFirstCurve.add(double(sizes[i]), firstMed[i] * 1e6);
    m.decodeFurtherCurve.add(double(sizes[i]), furtherMed[i] * 1e6);
    fpts += fmt::format(" {}:{:.0f}/{:.0f}us", sizes[i], firstMed[i] * 1e6, furtherMed[i] * 1e6);
  }
  m.probes.push_back(
      fmt::format("codec {} decode's first payload/each further one per elements:{}", spec, fpts));
  // The zeroing pass per size, every worker at once: each worker's median,
  // then the slowest worker's, smoothed as the decodes are (a pass costs no
  // less for more elements; one run had 1 Mi elements at 2206 us between 92
  // us for 256 Ki and 964 us for 2.25 Mi).
  std::vector<double> zeroMed = slowestMedians(world, sizes.size(), reps, zeros);
  std::string zpts;
  for (size_t i = 0; i < sizes.size(); ++i)
    zpts += fmt::format(" {}:{:.0f}us", sizes[i], zeroMed[i] * 1e6);
  smoothPassProbes(sizes, zeroMed);
  m.fillCurve = planner::MeasuredCurve{};
  for (size_t i = 0; i < sizes.size(); ++i) m.fillCurve.add(double(sizes[i]), zeroMed[i] * 1e6);
  m.fillGbps = 8.0 * 4.0 * double(sizes.back()) / std::max(zeroMed.back(), 1e-9) / 1e9;
  m.probes.push_back(fmt::format("decode's zeroing pass per elements (after the encode):{}", zpts));
  const uint64_t ns = hi;
  const double s = medianSeconds(3, [&] {
    for (uint64_t i = 0; i < ns; ++i) sum[i] += x[i];
  });
  m.sumGbps = 8.0 * 4.0 * ns / s / 1e9;
}

// Why the executor and not Worker::exchange: its payloads, chunks, keys and
// the servers' answers are those of the replay's plans, and its profiling
// window (Executor::setOnline without the scheduler) times the round trip
// as it times the replay's (CommTiming, what the online re-planner fits), so
// that the curves come out of the same arithmetic (OnlineReplanner::
// measuredCurves). Passes over the sizes as in measureCodec; the replay's
// gradients, so that top-k and DGC payloads have the replay's sizes.
void measureCompressedExchange(World& world, Worker& w, const collective::Groups& groups,
                               const std::string& spec, uint64_t lo, uint64_t hi, Measured& m,
                               int tag, const std::vector<uint64_t>& also) {
  using plan::CommOp;
  using plan::Scope;
  using plan::Step;
  const std::vector<uint64_t> sizes = elementSizes(lo, hi, kMaxExchangeProbe, also);
  const Deadline d = world.deadline();
  const auto t0 = Clock::now();
  executor::Executor px(w, &groups);  // host memory: the exchange is the same from pinned memory
  px.setCodecThreads(m.codecThreads);
  px.setFusionBytes(0);
  executor::OnlineOptions on;
  constexpr int kPasses = 5;
  on.window = kPasses;
  on.warmup = 1;  // the first pass: the servers' keys, first touches
  on.exchange = false;
  px.setOnline(on);
  const plan::TensorOption x = chainOption(spec, /*servers=*/true);
  plan::Plan p;
  std::vector<std::string> names;
  for (uint64_t n : sizes) {
    names.push_back(fmt::format("bench.model.exchange{}.{}", tag, n));
    px.declare(names.back(), DType::kFloat32, n);
    p.tensors[names.back()] = x;
  }
  px.setPlan(p, d);
  const int levels = patternLevels(world.c.size());
  std::vector<float> in(sizes.back()), out(sizes.back());
  for (int it = 0; it <= kPasses + 1; ++it) {
    px.beginIteration(uint64_t(it), d);  // closes the window at kPasses + 1
    if (it > kPasses) break;
    for (uint64_t i = 0; i < in.size(); ++i) in[i] = factor(world.c.rank(), it) * pattern(2, i, levels);
    // Each exchange after a barrier: its round trip then waits for the
    // other workers' encodes of the same size only (the replay's skew is
    // the simulator's own term, Measured::syncSkew), not for the refill.
    for (size_t k = 0; k < sizes.size(); ++k) {
      world.barrier();
      px.run(names[k], in.data(), out.data(), sizes[k], ReduceOp::kSum, d);
    }
  }
  CORTADO_ENFORCE(px.lastReport().has_value(), ErrorCode::kInternal,
                  "the compressed exchange probe closed no profiling window");
  // The probe's keys released: every tensor on a flat allreduce, which
  // keeps none (setPlan retires the old plan's keys; nothing runs).
  plan::TensorOption flat;
  flat.steps = {Step::comm(Scope::kFlat, CommOp::kAllreduce, false)};
  for (auto& [name, o] : p.tensors) o = flat;
  p.version += 1;
  px.setPlan(p, d);
  m.exchangeReports.clear();
  for (const std::string& r : world.allgather(plan::toJsonString(*px.lastReport())))
    m.exchangeReports.push_back(plan::profileFromJsonString(r));
  // The log: per size, the slowest worker's mean round trip, and the most
  // bytes a worker pushed (a top-k or DGC payload's size varies by call).
  std::map<uint64_t, std::pair<double, double>> bySize;  // elements -> (us, pushed bytes)
  for (const auto& r : m.exchangeReports) {
    std::map<uint64_t, std::pair<double, double>> mine;  // elements -> (calls, us)
    for (const auto& c : r.comms)
      if (c.op == CommOp::kPush && c.calls > 0) {
        mine[c.elements].first += double(c.calls);
        mine[c.elements].second += c.totalUs;
        bySize[c.elements].second = std::max(bySize[c.elements].second, double(c.bytes));
      }
    for (const auto& [n, x] : mine) bySize[n].first = std::max(bySize[n].first, x.second / x.first);
  }
  std::string pts;
  for (const auto& [n, v] : bySize) pts += fmt::format(" {}:{:.0f}B:{:.0f}us", n, v.second, v.first);
  m.probes.push_back(fmt::format("compressed exchange ({} x.push* x.pull*, through the servers; "
                                 "{:.1f} s) by elements:pushed bytes:round trip{}",
                                 spec, secondsSince(t0), pts));
}

std::vector<uint64_t> skewChainSizes(const planner::MeasuredCurve& encode,
                                     const std::vector<uint64_t>& codecSizes) {
  // Up to 1 Mi elements, beyond which the curve holds its last wait. Chains
  // of 4 Mi (encodes of about 8 ms) priced the DGC plans' large groups
  // closer (the plans -2% to -16% against -13% to -26% in alternating runs),
  // but EFSignSGD's chains ran 4-5x their encode beyond their price at every
  // size, a wait of 22 ms at 4 Mi elements, and the full run of 2026-12-01
  // (run AE) priced compress-everything with "gpu" codec steps +74% and +92%
  // there. Nor beyond the codec probe's largest size (the model's largest
  // tensor or group): the links' probes stop there too, and a chain's step
  // priced by their extrapolation charged its error as skew (a small
  // model's fp16 chains at 7.5x their encode).
  constexpr uint64_t kMaxChainProbe = 1u << 20;
  const uint64_t largest = codecSizes.empty() ? kMaxChainProbe : codecSizes.back();
  const uint64_t cap = std::max<uint64_t>(1024, std::min(kMaxChainProbe, largest));
  std::vector<uint64_t> sizes;
  for (const double target : {30.0, 120.0, 500.0, 2000.0}) {
    uint64_t n = 1024;
    while (n < cap && encode.us(double(n)) < target) n *= 2;
    n = std::min(n, cap);
    if (sizes.empty() || n > sizes.back()) sizes.push_back(n);
  }
  return sizes;
}

// Why a chain and not one encode after a barrier: in the replay the workers
// meet at each collective late by what they were late at the previous one's
// end plus their own encode's share of the shared cores, and nothing lines
// them up in between. So the probe runs what the replay runs: a batch of
// `steps` tensors of one size, each `F: E(c) ag* D(c)`, one after the other
// on the executor (Executor::runBatch, as the replay hands it a batch),
// every worker at once after one barrier. The slowest worker's time per
// step, a median over passes, is what a chain of such steps costs; the
// predictions take from it what the cost models already price for the step
// (applyChainSkew, bench_model_predict.cc) and charge the rest as the
// skew.
void measureSkewChain(World& world, Worker& w, const collective::Groups& groups,
                      const std::string& spec, bool pipeline, Measured& m, bool servers, int tag) {
  const std::vector<uint64_t> sizes = skewChainSizes(m.encodeCurve, m.codecSizes);
  const Deadline d = world.deadline();
  const auto t0 = Clock::now();
  executor::Executor px(w, &groups);
  px.setFusionBytes(0);
  px.setPipeline(pipeline);
  px.setCodecThreads(m.codecThreads);
  // Its stages, traced in memory: what of a step's excess over its price
  // is the encode's, the collective's or the decode's own time, and what is
  // the wait for the last worker.
  TraceOptions to;
  to.inMemory = true;
  to.first = 1;  // the timed passes (a tensor's runs count from 0)
  auto tracer = std::make_shared<Tracer>(to);
  px.setTracer(tracer);
  const plan::TensorOption f = chainOption(spec, servers);
  plan::Plan p;
  struct Chain {
    uint64_t elements;
    int steps;
    std::vector<std::string> names;
  };
  std::vector<Chain> chains;
  uint64_t held = 0;
  for (uint64_t n : sizes) {
    // About 40 ms of encodes per chain, 4 to 48 steps, 8 Mi elements at
    // most (the chain's gradients are held at once).
    const double enc = std::max(1.0, m.encodeCurve.us(double(n)));
    const double most = std::max(4.0, double(8u << 20) / double(n));
    const int steps = int(std::clamp(40000.0 / enc, 4.0, std::min(48.0, most)));
    Chain c{n, steps, {}};
    for (int k = 0; k < steps; ++k) {
      c.names.push_back(servers ? fmt::format("bench.model.serverchain{}.{}.{}", tag, n, k)
                                : fmt::format("bench.model.chain.{}.{}", n, k));
      px.declare(c.names.back(), DType::kFloat32, n);
      p.tensors[c.names.back()] = f;
    }
    held = std::max(held, n * uint64_t(steps));
    chains.push_back(std::move(c));
  }
  px.setPlan(p, d);
  const int levels = patternLevels(world.c.size());
  std::vector<float> buf(held);
  constexpr int kPasses = 5;
  std::vector<double> mine;  // per pass (after the untimed one) and chain: this worker's us
  std::vector<executor::BatchItem> batch;
  for (int pass = 0; pass <= kPasses; ++pass)
    for (const Chain& c : chains) {
      batch.clear();
      for (int k = 0; k < c.steps; ++k) {
        float* x = buf.data() + size_t(k) * c.elements;
        for (uint64_t i = 0; i < c.elements; ++i)
          x[i] = factor(world.c.rank(), pass) * pattern(3 + k, i, levels);
        batch.push_back({c.names[size_t(k)], x, x, c.elements});
      }
      world.barrier();
      const auto b0 = Clock::now();
      px.runBatch(batch, ReduceOp::kSum, d);
      if (pass > 0) mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - b0).count());
    }
  // F keeps no keys on the servers; H's released: every tensor on a flat
  // allreduce, which keeps none (as measureCompressedExchange does).
  if (servers) {
    plan::TensorOption flat;
    flat.steps = {plan::Step::comm(plan::Scope::kFlat, plan::CommOp::kAllreduce, false)};
    for (auto& [name, o] : p.tensors) o = flat;
    p.version += 1;
    px.setPlan(p, d);
  }
  const std::vector<double> slowest = world.max(mine);
  // This worker's stages per step of each chain over the timed passes:
  // encode, collective, decode (3 per chain).
  std::map<std::string, size_t> chainOf;
  for (size_t i = 0; i < chains.size(); ++i)
    for (const std::string& name : chains[i].names) chainOf[name] = i;
  std::vector<double> stages(3 * chains.size(), 0.0);
  for (const Tracer::Event& e : tracer->recorded()) {
    const auto it = chainOf.find(e.tensor);
    if (it == chainOf.end()) continue;
    size_t k = 0;  // the stage's place among the chain's three
    if (e.stage == "encode") {
      k = 0;
    } else if (e.stage.find(servers ? "push" : "allgather") != std::string::npos) {
      k = 1;
    } else if (e.stage == "decode") {
      k = 2;
    } else {
      continue;
    }
    stages[3 * it->second + k] += e.dur / (double(kPasses) * chains[it->second].steps);
  }
  const std::vector<double> meanStages = world.mean(stages);
  std::vector<double> negated(stages);
  for (double& x : negated) x = -x;
  const std::vector<double> leastStages = world.max(negated);  // -(the least)
  std::vector<Measured::ChainPoint>& points = servers ? m.serverChainPoints : m.chainPoints;
  points.clear();
  std::string pts;
  for (size_t i = 0; i < chains.size(); ++i) {
    std::vector<double> v;
    for (int pass = 0; pass < kPasses; ++pass) v.push_back(slowest[size_t(pass) * chains.size() + i]);
    std::sort(v.begin(), v.end());
    const double stepUs = v[v.size() / 2] / chains[i].steps;
    Measured::ChainPoint c{chains[i].elements, chains[i].steps, stepUs};
    c.encodeUs = meanStages[3 * i];
    c.collectiveUs = -leastStages[3 * i + 1];
    c.decodeUs = meanStages[3 * i + 2];
    points.push_back(c);
    pts += fmt::format(" {}x{}:{:.0f}us(E {:.0f} {} {:.0f} D {:.0f})", chains[i].steps,
                       chains[i].elements, stepUs, c.encodeUs, servers ? "x.push*+pull*" : "ag*",
                       c.collectiveUs, c.decodeUs);
  }
  m.probes.push_back(fmt::format(
      "skew chain ({0} back to back, the slowest worker's time per step, and its stages: the "
      "workers' mean encode and decode, the fastest worker's {1}; {2:.1f} s) by steps x "
      "elements:{3}",
      servers ? fmt::format("H: i.rs E({0}) x.push* x.pull* i.ag* D({0})", spec)
              : fmt::format("F: E({0}) ag* D({0})", spec),
      servers ? "push and pull" : "allgather", secondsSince(t0), pts));
}

// The CUDA encode runs on a stream and the host learns it ended from an
// event, as the executor's does before it copies the payload out (the copy
// is priced on its own, measureCopies). No cache eviction: the GPU's L2 is
// not what the CPU probe's eviction is about (the replay refills the
// gradients in host memory before every iteration).
void measureDeviceCodec(World& world, device::Device& dev, const std::string& spec, Measured& m) {
  compressor::Registry cpu;
  compressor::registerCpuCodecs(cpu);
  const std::string canonical = cpu.canonical(spec);
  const std::string name = canonical.substr(0, canonical.find(':'));
  const compressor::Registry& reg = dev.codecs();
  const compressor::Device where = dev.codecDevice();
  // The executor's choice (Executor::setPlan): the device's codec, which a
  // sparse one needs the device's top-k decoder beside (for merged
  // payloads); without them its "gpu" steps run on the CPU. The same on
  // every worker (one build, one kind of device).
  compressor::CodecPtr codec;
  if (reg.has(name, where)) {
    codec = reg.create(canonical, where);
    if (codec->sparse() && !reg.has("topk", where)) codec.reset();
  }
  if (!codec) {
    m.probes.push_back(fmt::format("codec {} on {}: the device has no such codec, so its \"gpu\" "
                                   "steps run on the CPU, priced as the CPU's",
                                   spec, dev.name()));
    return;
  }
  const std::vector<uint64_t>& sizes = m.codecSizes;
  CORTADO_ENFORCE(!sizes.empty(), ErrorCode::kInternal,
                  "measureDeviceCodec before measureCodec: no probe sizes");
  const uint64_t hi = sizes.back();
  const Deadline d = world.deadline();
  const int levels = patternLevels(world.c.size());
  std::vector<float> x(hi);
  for (uint64_t i = 0; i < hi; ++i) x[i] = factor(world.c.rank(), 0) * pattern(0, i, levels);
  auto stream = dev.createStream();
  auto done = dev.createEvent();
  auto wait = [&](const char* what) {
    done->record(*stream);
    done->synchronize(d, what);
  };
  device::Buffer grad(dev, false), sum(dev, false), payload(dev, false);
  float* g = grad.floats(hi);
  float* acc = sum.floats(hi);
  dev.copy(g, x.data(), hi * sizeof(float), device::CopyKind::kHostToDevice, *stream);
  dev.fill(acc, 0.0f, hi, *stream);
  wait("the codec probe's gradient copy");
  auto ef = dev.errorFeedback(codec, m.efState);
  std::byte* out = payload.bytes(ef->payloadBytes(hi));
  uint64_t seed = 0;
  const int reps = 7;
  std::vector<double> enc(sizes.size() * reps), dec(sizes.size() * reps);
  for (int r = -1; r < reps; ++r) {  // pass -1: untimed first touches (allocations, kernels' loads)
    for (size_t i = 0; i < sizes.size(); ++i) {
      const uint64_t n = sizes[i];
      const size_t bytes = ef->payloadBytes(n);
      auto encodeOnce = [&] {
        compressor::EncodeContext ctx = dev.context(*stream);
        ctx.seed = ++seed;
        ef->encode(n, g, n, std::span<std::byte>(out, bytes), ctx, stream.get());
        wait("the codec probe's encode");
      };
      auto decodeOnce = [&] {
        dev.decompressAdd(*codec, std::span<const std::byte>(out, bytes), acc, n, *stream);
        wait("the codec probe's decode");
      };
      if (r < 0) {
        encodeOnce();
        decodeOnce();
        continue;
      }
      world.barrier();
      enc[i * reps + size_t(r)] = medianSeconds(1, encodeOnce);
      world.barrier();
      dec[i * reps + size_t(r)] = medianSeconds(1, decodeOnce);
    }
  }
  const std::string pts = fitCodecProbes(world, sizes, reps, enc, dec, m.gpuEncodeCurve,
                                         m.gpuDecodeCurve, m.gpuEncodeAlpha, m.gpuEncodeBeta,
                                         m.gpuDecodeAlpha, m.gpuDecodeBeta);
  m.hasDeviceCodec = true;
  m.probes.push_back(
      fmt::format("codec {} on {} encode/decode per elements:{}", spec, dev.name(), pts));
}

void measureCopies(World& world, device::Device& dev, uint64_t lo, uint64_t hi, Measured& m) {
  lo = std::max<uint64_t>(4, lo);
  hi = std::max(lo, std::min(hi, kMaxLinkProbe));
  device::Buffer onDevice(dev, false), pinned(dev, true);
  void* dp = onDevice.reserve(hi);
  void* hp = pinned.reserve(hi);
  auto stream = dev.createStream();
  auto done = dev.createEvent();
  const Deadline d = world.deadline();
  auto fit = [&](device::CopyKind kind, const char* what) {
    const auto s = probe(world, probeSizes(lo, hi), [&](uint64_t bytes) {
      if (kind == device::CopyKind::kDeviceToHost)
        dev.copy(hp, dp, bytes, kind, *stream);
      else
        dev.copy(dp, hp, bytes, kind, *stream);
      done->record(*stream);
      done->synchronize(d, "a copy probe");
    });
    std::vector<std::array<double, 3>> rows;
    std::string pts;
    for (const Sample& x : s) {
      rows.push_back({1.0, x.bytes, x.us});
      pts += describe(x);
    }
    const auto [a, b] = fitRelative(rows);
    const AlphaBeta ab{a, 8.0 / (b * 1000.0)};
    m.probes.push_back(fmt::format("copy {} (pinned host memory): {:.0f} us + {:.3f} Gbit/s from{}",
                                   what, ab.alphaUs, ab.gbps, pts));
    return ab;
  };
  m.d2h = fit(device::CopyKind::kDeviceToHost, "device to host");
  m.h2d = fit(device::CopyKind::kHostToDevice, "host to device");
  m.hasCopies = true;
}

}  // namespace replay

std::optional<planner::SyncSkew> parseSyncSkew(const std::string& arg) {
  if (arg == "auto") return std::nullopt;
  if (arg == "off") return planner::SyncSkew{};
  const size_t comma = arg.find(',');
  planner::SyncSkew s;
  auto number = [&](const std::string& text, const char* what) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CORTADO_ENFORCE(used > 0 && used == text.size(), ErrorCode::kInvalidArgument,
                    "--sync-skew '{}': {} '{}' is not a number (give auto, off, or US,FRACTION, "
                    "e.g. 0,0.6)",
                    arg, what, text);
    return v;
  };
  CORTADO_ENFORCE(comma != std::string::npos, ErrorCode::kInvalidArgument,
                  "--sync-skew '{}': give auto (measured), off, or US,FRACTION (e.g. 0,0.6: the "
                  "last worker reaches a step 0 us plus 0.6 times the CPU work before it late)",
                  arg);
  s.us = number(arg.substr(0, comma), "the constant");
  s.fraction = number(arg.substr(comma + 1), "the fraction");
  s.check(fmt::format("--sync-skew '{}'", arg));
  return s;
}

ProbeMean meanLessStrays(std::vector<double> calls) {
  CORTADO_ENFORCE(!calls.empty(), ErrorCode::kInvalidArgument,
                  "a link probe size with no calls: nothing to take the mean of");
  std::vector<double> sorted = calls;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                          : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;
  const double limit = std::max(3.0 * median, median + 10000.0);
  ProbeMean m;
  double sum = 0;
  for (const double c : calls) {
    if (c > limit) {
      ++m.strays;
      continue;
    }
    sum += c;
    ++m.calls;
  }
  m.us = sum / m.calls;  // the median's call is never a stray
  return m;
}

namespace {
// A size measured more than 3x the size below it scaled by their elements
// is taken at that scaled time (smoothCodecProbes says why).
void scaledSpikes(const std::vector<uint64_t>& elements, std::vector<double>& v) {
  for (size_t i = 1; i < elements.size(); ++i) {
    const double ratio = double(elements[i]) / double(std::max<uint64_t>(1, elements[i - 1]));
    const double scaled = v[i - 1] * ratio;
    if (v[i] > 3 * scaled) v[i] = scaled;
  }
}
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
  scaledSpikes(elements, encode);
  // A decode-and-add costs no less for more elements (it scatters or
  // streams in proportion), so a size measured dearer than a larger one is
  // capped at it: one run had 1048576 elements of DGC at 2373 us between 497
  // us below and 406 us above (a worker's medians there all slow), and the
  // compress-everything strategies were predicted 28-33% above the replay
  // (flat allgather: 4 decodes per tensor).
  smoothPassProbes(elements, decode);
}

void smoothPassProbes(const std::vector<uint64_t>& elements, std::vector<double>& us) {
  CORTADO_ENFORCE(elements.size() == us.size(), ErrorCode::kInvalidArgument,
                  "probe smoothing: {} sizes but {} times", elements.size(), us.size());
  scaledSpikes(elements, us);
  for (size_t i = us.size(); i-- > 1;) us[i - 1] = std::min(us[i - 1], us[i]);
}

}  // namespace cortado::launcher
