// The measurements behind `cortado bench model`'s predictions (bench_model.cc):
// every collective the plan executor may run, per group and size; push and
// pull through the servers; the codec's encode and decode-and-add; and the
// replay's gradients, which the codec probe encodes too. Every worker calls
// each function at once (they are collectives over `World`); each returns the
// same numbers on every worker (the slowest worker's). Internal to the
// launcher; the choices behind each probe are in bench_model_probe.cc.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "compressor/error_feedback.h"
#include "core/collective/collectives.h"
#include "core/common/deadline.h"
#include "core/device/device.h"
#include "core/plan/profile_report.h"
#include "core/worker.h"
#include "scheduler/planner/cost_model.h"

namespace cortado::launcher::replay {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t) {
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
  std::string broadcast(std::string s, int root = 0) {
    int64_t n = int64_t(s.size());
    c.broadcast(&n, 1, DType::kInt64, root, deadline());
    s.resize(size_t(n));
    c.broadcast(s.data(), s.size(), DType::kUInt8, root, deadline());
    return s;
  }
  // Every worker's `s`, in rank order, on every worker.
  std::vector<std::string> allgather(const std::string& s) {
    std::vector<std::string> out;
    for (int r = 0; r < c.size(); ++r) out.push_back(broadcast(r == c.rank() ? s : std::string(), r));
    return out;
  }
};

// The replay's gradients, integer-valued so that every fp32 and fp16 sum is
// exact: worker `rank`'s element i of tensor j in iteration `it` is
// factor(rank, it) * pattern(j, i, patternLevels(workers)).
int patternLevels(int workers);
float pattern(size_t j, uint64_t i, int levels);
float factor(int rank, int it);

// What the probes found: rank 0 builds the planner's cost models from it.
struct Measured {
  // What the job's error feedback keeps its state in (CORTADO_EF_DTYPE): the
  // codec probes encode with it, as the executor does. Set before probing.
  compressor::StateDType efState = compressor::StateDType::kFloat32;
  // The executor's codec threads (Executor::setCodecThreads): the codec
  // probes and the probe executors run their CPU codec calls on as many.
  int codecThreads = 1;
  planner::AlphaBeta pushPull;
  planner::MeasuredCurve pushPullCurve;  // one push (or pull), by a machine's bytes times the spread
  // Per operation, on the intra-machine and the inter-machine groups; the
  // compressed steps' own ways (sizes first, then the bytes) separately.
  std::map<plan::CommOp, planner::AlphaBeta> intra, inter, intraCompressed, interCompressed;
  std::map<plan::CommOp, planner::MeasuredCurve> intraCurves, interCurves, intraCurvesCompressed,
      interCurvesCompressed;
  bool hasIntra = false, hasInter = false;
  double encodeAlpha = 0, encodeBeta = 0, decodeAlpha = 0, decodeBeta = 0;  // s, s per input byte
  planner::MeasuredCurve encodeCurve, decodeCurve;  // us per call, by elements (what the planner uses)
  // The decode's adds apart: the first payload's, into the region just
  // zeroed, and each further one's (planner::ResolvedCodec::decodeFirstCurve;
  // decodeCurve is their mean over the workers' payloads). Empty where not
  // measured.
  planner::MeasuredCurve decodeFirstCurve, decodeFurtherCurve;
  std::vector<uint64_t> codecSizes;  // the elements measureCodec probed
  // On a CUDA device (measureDeviceCodec, measureCopies): the codec's CUDA
  // encode and decode-and-add, as encodeAlpha.. and encodeCurve.. above
  // (hasDeviceCodec false where the device has no such codec: its "gpu"
  // steps run on the CPU, priced as the CPU's), and the copies between
  // device and pinned host memory (hasCopies false on the host device: no
  // copies).
  bool hasDeviceCodec = false, hasCopies = false;
  double gpuEncodeAlpha = 0, gpuEncodeBeta = 0, gpuDecodeAlpha = 0, gpuDecodeBeta = 0;
  planner::MeasuredCurve gpuEncodeCurve, gpuDecodeCurve;
  planner::AlphaBeta d2h, h2d;
  double sumGbps = 40;
  // The executor's decode zeroes its region first: that pass by elements,
  // right after the region's encode, every worker at once (measureCodec;
  // planner::Cluster::cpuFillCurve), and its rate at the largest size (for
  // the log).
  planner::MeasuredCurve fillCurve;
  double fillGbps = 0;
  // With fusion: the workers' agreement on a batch (one flat allgather of an
  // int64, agreeOnBatch), back to back, mean of the slowest worker's.
  double agreeUs = 0;
  // The workers' skew as --sync-skew sets it (off, or US,FRACTION); with
  // auto, none here: the predictions take it from chainPoints.
  planner::SyncSkew syncSkew;
  // The executor's own compressed exchanges with the servers
  // (measureCompressedExchange): every worker's profile of them, from
  // which the predictions take the compressed push and pull curves
  // (exchangeCurves); empty when not measured.
  std::vector<plan::ProfileReport> exchangeReports;
  // Chains of compressed collectives back to back (measureSkewChain): per
  // size, its steps and the slowest worker's time per step; empty when not
  // measured.
  struct ChainPoint {
    uint64_t elements = 0;
    int steps = 0;
    double stepUs = 0;
    // Its stages per step as traced: the workers' mean encode and decode,
    // and the collective on the worker that spent least in it (the last to
    // arrive, whose wait is the least); 0: not traced.
    double encodeUs = 0, collectiveUs = 0, decodeUs = 0;
  };
  std::vector<ChainPoint> chainPoints;
  // The same chains with each step through the servers (chainOption with servers;
  // measureSkewChain with `servers`): the skew before a push
  // (planner::Cluster::pushSkew). Empty when not measured (one machine).
  std::vector<ChainPoint> serverChainPoints;
  std::vector<std::string> probes;  // what was measured, for the log
};

// The replay's batch agreement (tensor fusion on): the largest of the
// workers' ready counts. A collective over `world`.
size_t agreeOnBatch(collective::Collectives& world, size_t readyCount, Deadline d);

// Every operation the executor may run on one scope (uncompressed from lo to
// hi bytes, compressed from 64 bytes to payloadHi, a compressed broadcast to
// p times that: it follows a gather*), each fitted to the
// planner's formula (`ops`, `compressedOps`) and kept as a curve; one line
// per operation in `log`. `scope` names the group in the log. As the
// executor runs them (core/executor/run.h, Run::group and Run::hostGroup):
// the uncompressed steps on `raw`, the device's group, in memory of `dev`
// (NCCL on CUDA buffers; on the host device the MPI group, host memory), the
// compressed ones' payloads on `g`, the MPI group, in host memory.
void measureGroup(World& world, collective::Collectives& g, collective::Collectives& raw,
                  device::Device& dev, uint64_t lo, uint64_t hi,
                  uint64_t payloadHi, Deadline d, std::map<plan::CommOp, planner::AlphaBeta>& ops,
                  std::map<plan::CommOp, planner::AlphaBeta>& compressedOps,
                  std::map<plan::CommOp, planner::MeasuredCurve>& curves,
                  std::map<plan::CommOp, planner::MeasuredCurve>& compressedCurves,
                  std::vector<std::string>& log, const char* scope);

// Push and pull of one key through the servers by every worker, lo to hi
// bytes: the fit (per push and per pull), and `curve` by a machine's bytes.
// `tag` keeps this probe's keys apart from an earlier probe's; they are
// released before it returns.
planner::AlphaBeta measurePushPull(World& world, Worker& w, const collective::Topology& topo,
                                   uint64_t lo, uint64_t hi, uint64_t chunkBytes, Deadline d,
                                   planner::MeasuredCurve& curve, std::vector<std::string>& log,
                                   int tag);

// The codec probe's element counts: lo to hi 4x apart with both ends, and
// each of `also` (the largest tensor's size) strictly between them; hi at
// most 16 Mi elements, unless one of `also` up to hi is larger, which then
// is the last size (a tensor of the model is probed at its own size; a
// larger fused group takes the last slope).
std::vector<uint64_t> codecProbeSizes(uint64_t lo, uint64_t hi, const std::vector<uint64_t>& also);

// The codec `spec`'s encode (with error feedback) and decode-and-add from lo
// to hi elements (sizes 4x apart, and each of `also` within them), into m's
// encode and decode curves and fits, the CPU's sum rate into m.sumGbps and its
// time zeroing a region (the decode's first pass) into m.fillCurve.
void measureCodec(World& world, const std::string& spec, uint64_t lo, uint64_t hi, Measured& m,
                  const std::vector<uint64_t>& also = {});

// The skew chains' element counts: the sizes that `encode` prices at about
// 0.03, 0.12, 0.5 and 2 ms (powers of 2 from 1024, the first at or above
// each), at most 1 Mi elements and at most the codec probe's largest size
// (codecSizes' last, at least 1024), each once.
std::vector<uint64_t> skewChainSizes(const planner::MeasuredCurve& encode,
                                     const std::vector<uint64_t>& codecSizes);

// The workers' skew as chains of steps meet it (planner::SyncSkew's curve):
// at the sizes that m.encodeCurve prices at about 0.03, 0.12, 0.5 and 2 ms
// (1 Mi elements, or the codec probe's largest size, at most), a batch of 4
// to 48 tensors (about 40 ms of encodes), each run as `F: E(c) ag* D(c)`
// (chainOption) on an executor of its own over `w` and `groups`
// (`pipeline`: the replay's encode pipeline), every worker at once after a
// barrier; an untimed pass and 5 timed ones. Into m.chainPoints the slowest
// worker's time per step (median of the passes) and its stages as traced
// (the workers' encodes and decodes, the fastest worker's collective); a
// line in m.probes. Its tensors keep no keys on the servers. `servers`:
// each step `H: i.rs E(c) x.push* x.pull* i.ag* D(c)` (chainOption with servers)
// instead, into m.serverChainPoints (its collective traced as the push and
// pull); the servers' keys released after, and `tag` in their names keeps
// them apart from an earlier probe round's (as measurePushPull's and
// measureCompressedExchange's tags do).
void measureSkewChain(World& world, Worker& w, const collective::Groups& groups,
                      const std::string& spec, bool pipeline, Measured& m, bool servers = false,
                      int tag = 0);

// The plan executor's compressed exchange with the servers, as it runs one
// (`H: i.rs E x.push* x.pull* i.ag* D` with the codec `spec`: the payloads
// pushed, the servers' decode, sum and answer, the answers pulled), at lo to
// hi elements (4x apart, and `also`; 4 Mi at most: beyond, the curve's last
// slope), on an executor of its own over `w`
// and `groups`, every worker at once, 5 passes over the sizes after an
// untimed one. Each worker's profile of the exchanges (the executor's
// profiling window: per payload size, its calls and time) into
// m.exchangeReports (on every worker), a line in m.probes. Its keys are
// released before it returns. Where the uncompressed push/pull probe at
// the payloads' sizes priced bert-base/DGC's compressed exchanges at
// 0.3-0.4x their traced time (docs/benchmarks.md).
void measureCompressedExchange(World& world, Worker& w, const collective::Groups& groups,
                               const std::string& spec, uint64_t lo, uint64_t hi, Measured& m,
                               int tag, const std::vector<uint64_t>& also = {});

// On a device whose memory is not the host's (CUDA): the codec `spec`'s
// encode with the device's error feedback and its decode-and-add, on the
// device's own codecs, at `sizes` elements (measureCodec's), each call on a
// stream and waited for, every worker at once (they share the device as in
// the replay), at measureCodec's sizes (m.codecSizes: call it first); per
// size each worker's median, then the slowest worker's.
// Into m.gpuEncode*/m.gpuDecode* with m.hasDeviceCodec; nothing (and a line
// saying so) where the device has no such codec.
void measureDeviceCodec(World& world, device::Device& dev, const std::string& spec, Measured& m);

// On such a device: copies from device to pinned host memory and back, lo to
// hi bytes (4x apart), every worker at once; the slowest worker's mean per
// size fitted to a + bytes / rate into m.d2h and m.h2d, m.hasCopies set.
void measureCopies(World& world, device::Device& dev, uint64_t lo, uint64_t hi, Measured& m);

}  // namespace cortado::launcher::replay
