// Cost models of the timeline simulator, all loaded from JSON so that a job's
// own measurements can replace the defaults (docs/planner.md has the formats):
//  - links: an alpha-beta model per link (intra-machine NVLink or PCIe, the
//    inter-machine network), optionally per operation, and the NCCL
//    performance-note formulas for each collective;
//  - copies: GPU-to-host and host-to-GPU over PCIe;
//  - CPU: the core count shared by CPU codecs and the servers, and the rate at
//    which the servers sum;
//  - codecs: encode and decode time per device as fixed + per-element +
//    per-selected-element terms, and the payload size.
// Times are in microseconds, sizes in bytes.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <map>
#include <string>
#include <vector>

#include "core/plan/plan.h"

namespace cortado::planner {

// Zen's CPU time per (index, value) pair placed, summed, merged or decoded
// (Cluster::zenNsPerPair): an estimate, each a hashed or random access.
inline constexpr double kDefaultZenNsPerPair = 20;

struct AlphaBeta {
  double alphaUs = 0;
  double gbps = 1;  // Gbit/s
  double us(double bytes) const { return alphaUs + bytes * betaUsPerByte(); }
  double betaUsPerByte() const { return 8.0 / (gbps * 1000.0); }
};

// Measured times of one operation over `p` ranks at several sizes (bytes as
// commTimeUs takes them): linear between the sizes, the smallest size's time
// below it, the last two points' slope beyond the largest. Made
// non-decreasing when built (`add` in size order keeps a running maximum; a
// size not above the last one is averaged into the last point instead).
struct MeasuredCurve {
  int p = 0;
  std::vector<std::pair<double, double>> points;  // (bytes, us), bytes increasing
  void add(double bytes, double us);
  double us(double bytes) const;
  // Weighted isotonic regression (pool adjacent violators) of (size, us,
  // weight) rows in increasing size: the non-decreasing times closest to the
  // measured ones. Building a curve with `add` alone keeps the running
  // maximum instead, so one slow size (calls that waited for a descheduled
  // process) becomes the floor of every larger size.
  static MeasuredCurve monotone(const std::vector<std::array<double, 3>>& xyw, int p);
};

struct LinkCost {
  std::string name;
  AlphaBeta base;
  std::map<plan::CommOp, AlphaBeta> perOp;  // measured overrides
  // Measured overrides for compressed steps: a runtime moves payloads of
  // varying size as two collectives (the sizes, then the bytes), so that a
  // compressed allgather costs more than an uncompressed one of equal bytes.
  // Falls back to perOp, then base.
  std::map<plan::CommOp, AlphaBeta> perOpCompressed;
  // Measured curves, used instead of the formulas where one exists for the
  // operation (and compressed or not) and its group size: a job's own probes
  // at its own tensor sizes (`cortado bench model`), where one alpha-beta
  // line does not fit every size (OpenMPI switches algorithms by size).
  std::map<plan::CommOp, MeasuredCurve> curves, curvesCompressed;
  const AlphaBeta& forOp(plan::CommOp op, bool compressed = false) const;
};

// Time of `op` over `p` ranks. `bytes`: the bytes each rank holds before the
// step (for allgather and gather: each rank's contribution; for push and pull:
// what one machine sends or receives in total). `compressed`: the step carries
// compressed payloads (uses the link's perOpCompressed fit where it has one).
double commTimeUs(const LinkCost& link, plan::CommOp op, int p, double bytes,
                  bool compressed = false);

// Named links, copies and CPU rates: one JSON file (profiles of hardware).
// The workers' skew at a synchronizing step (Cluster::syncSkew): a
// collective, or a push to the servers, starts for everybody when its last
// worker arrives, and after CPU work of `w` us the last one arrives
// `us + fraction * w` after the timeline's one worker does (which has
// every worker alike). Nothing after no CPU work. Or, where `curve` has
// points, `curve.us(w)` (below its first point, on the line from no work and
// no wait to it; beyond its last, its last wait): the wait by the work
// before the step, measured by `cortado bench model` as chains of steps
// back to back meet it (launcher/bench_model_probe.cc, measureSkewChain).
// 0 and 0 and no curve (the default) leave the timeline as without it.
struct SyncSkew {
  double us = 0;
  double fraction = 0;
  MeasuredCurve curve;  // (work us, wait us), work increasing
  bool any() const { return us > 0 || fraction > 0 || !curve.points.empty(); }
  double after(double workUs) const {
    if (workUs <= 0) return 0.0;
    if (curve.points.empty()) return us + fraction * workUs;
    const auto& [w0, t0] = curve.points.front();
    if (workUs < w0) return t0 * workUs / w0;
    return workUs >= curve.points.back().first ? curve.points.back().second : curve.us(workUs);
  }
  // Refuses a value that is not finite, is negative, or (fraction) above
  // kMaxFraction, and a curve whose work does not increase, naming `what`
  // (where it came from).
  void check(const std::string& what) const;
  // "0 us + 0.121 x the work", or the curve's points "by work:wait
  // 49:186us 622:852us ...", for logs and reports.
  std::string describe() const;
  static constexpr double kMaxFraction = 10;
};

struct HardwareModel {
  std::map<std::string, LinkCost> links;
  AlphaBeta d2h, h2d;          // per GPU
  double cpuSumGbps = 40;      // one core summing float32 buffers
  double cpuFillGbps = 0;      // cpu.fill_gbps: one core zeroing a decode's region (Cluster::cpuFillGbps)
  double zenNsPerPair = kDefaultZenNsPerPair;  // cpu.zen_ns_per_pair (Cluster::zenNsPerPair)
  SyncSkew syncSkew;           // cpu.sync_skew_us, cpu.sync_skew_fraction (Cluster::syncSkew)
  SyncSkew pushSkew;           // cpu.push_skew_us, _fraction, _curve (Cluster::pushSkew)
  std::string source;          // where the numbers come from

  static HardwareModel fromJson(const nlohmann::json& j);
  static HardwareModel load(const std::string& path);
  const LinkCost& link(const std::string& name) const;  // throws listing valid names
  std::vector<std::string> linkNames() const;
};

struct Cluster {
  int machines = 1;
  int gpusPerMachine = 1;
  LinkCost intra, inter;
  AlphaBeta d2h, h2d;
  int cpuCores = 8;  // per machine, shared by CPU codecs and the server
  double cpuSumGbps = 40;
  // A decode's first pass: the executor zeroes the region the payloads are
  // decoded into (Run::decodeOnHost), a pass over region elements x 4 bytes
  // before the decode-and-add calls that the codec costs price. A CPU
  // decode's at this rate on one core; 0: not priced (the default; the
  // online re-planner's decode curves are the executor's calls, which
  // include the pass). Where a device's curve has points (us by elements,
  // measured), it is used instead: the pass costs less per element where
  // the region is still in the caches from the encode. A "gpu" decode's is
  // priced by its curve alone (`cortado bench model` sets it where a "gpu"
  // step runs the CPU twin on host buffers), else not at all.
  double cpuFillGbps = 0;
  MeasuredCurve cpuFillCurve, gpuFillCurve;
  // Zen (zen_cost.h): one core's time per (index, value) pair placed,
  // summed, merged or decoded; hardware JSON cpu.zen_ns_per_pair.
  double zenNsPerPair = kDefaultZenNsPerPair;
  bool parameterServer = true;  // servers run on every machine
  // CPU codec calls and the servers' work are split into partitions of this
  // size (the worker's partitioner), each a task for one core.
  double chunkBytes = 4 << 20;
  // How a CPU encode or decode is priced. false (the default): as the
  // partitions above, each a task at the codec's cost for a partition,
  // spread over the cores (the model of a codec pool). true: as the plan
  // executor calls the codec (Run::encode): one call per piece of the
  // tensor it cuts, in turn on the worker's thread, each at the codec's
  // cost for the piece's size: the partitions where the option pushes to
  // the servers, the blocks of the alltoall steps still ahead, otherwise
  // one call for the whole region. `cortado bench model` sets it: its codec
  // curves are the executor's calls, with its codec threads.
  bool cpuCodecByCall = false;
  // true: a runtime that synchronizes one tensor at a time (the plan
  // executor: Executor::run is synchronous). The simulator starts a tensor's
  // first step when the previous tensor's last one has ended (instead of
  // overlapping tensors on separate lanes), so that the planner chooses for
  // the timeline that runs; and push/pull as such a runtime does it: a
  // tensor's shard key is cut into chunks
  // of chunkBytes, each on one server, so a tensor of fewer chunks than
  // machines reaches only that many servers and the busiest server's link
  // carries every machine's share of it (a tensor of one chunk: M - 1 copies
  // into one server). false: balanced over every server, as many tensors in
  // flight are.
  bool oneTensorAtATime = false;
  // Tensor fusion as the plan executor's runBatch does it (with
  // oneTensorAtATime only; 0: off, the default). Each time the executor is
  // free, every tensor ready by then forms its batch; its tensors with a
  // non-fusible option run first, one by one, then per fusible option
  // (plan::TensorOption::fusible; and dtype) its tensors packed in order into
  // groups of at most this many bytes, each run as one execution of its
  // summed size (JobConfig::fusionBytes, CORTADO_FUSION_BYTES).
  uint64_t fusionBytes = 0;
  // The executor's encode pipeline (Executor::setPipeline, CORTADO_PIPELINE;
  // with oneTensorAtATime and without fusionBytes only): while one execution
  // runs its communication steps and the steps after them, the next one's
  // leading local steps (those before its first communication step: the
  // gather into a group's buffer, the encode) run on a second thread. The
  // simulator starts an execution's leading local steps when it is ready and
  // the previous execution's first communication step has begun (SimState::
  // exchangeStart), and its first communication step when they are done and
  // the previous execution has ended: one execution ahead, as the executor.
  bool pipeline = false;
  // A "gpu" encode or decode runs on the GPU that computes the gradients,
  // so the computation waits while it runs (true, the default). false where
  // a "gpu" step runs the CPU twin on host buffers off the training thread
  // (the plan executor, `cortado bench model`, whose computation is the
  // wall clock): the steps still queue one after another on their lane, but
  // the gradients become ready on time. Until 2026-11-26 the planner
  // searched the replay's plans with "gpu" steps delaying the gradients
  // (its `overlapped_ms` for resnet101's compress-everything-on-"gpu" was
  // 391 ms where the replay's own timeline gave 306).
  bool gpuCodecPausesCompute = true;
  // With fusion: what forming a batch costs before it runs (the workers
  // agree on which tensors are ready: in bench model one flat allgather of
  // an int64), paid once per batch.
  double batchAgreeUs = 0;
  // The workers' skew at every synchronizing step after CPU work (SyncSkew;
  // none by default): compileOption() puts SimOp::waitUs before each such
  // step, which delays it and everything after it in that tensor's
  // execution, and occupies no lane.
  SyncSkew syncSkew;
  // The same before a push to the servers, where it is set (any()); else
  // syncSkew there too. A round trip through the servers waits for the last
  // worker's push and then answers the workers one by one, so it can meet a
  // skew of its own (`cortado bench model` measures both, measureSkewChain).
  SyncSkew pushSkew;
  // The skew before a step of `op` after `workUs` of CPU work.
  double skewBefore(plan::CommOp op, double workUs) const {
    return (op == plan::CommOp::kPush && pushSkew.any() ? pushSkew : syncSkew).after(workUs);
  }

  int gpus() const { return machines * gpusPerMachine; }
  // The zeroing pass of a decode on `d` over `elements` (above), us.
  double fillUs(plan::Device d, double elements) const;
};

struct LinearCost {
  double fixedUs = 0;
  double nsPerElement = 0;
  double nsPerSelected = 0;
  double us(double elements, double selected) const {
    return fixedUs + (elements * nsPerElement + selected * nsPerSelected) / 1000.0;
  }
};

struct CodecCost {
  std::string name;
  bool summable = false;  // informational: the planner never sums payloads
  double headerBytes = 16;
  double bitsPerElement = 0;    // dense part of the payload
  double bytesPerSelected = 0;  // sparse part: (value, index) per kept element
  std::map<std::string, double> params;  // accepted parameters and defaults
  LinearCost encode[2], decode[2];       // indexed by plan::Device
};

// A codec spec ("dgc:ratio=0.01") resolved against the cost table.
// NOLINTNEXTLINE(bugprone-reserved-identifier): clang 14 names its implicit array copy
struct ResolvedCodec {
  std::string spec;
  CodecCost cost;
  double selectedFraction = 0;  // kept elements / elements (sparsifiers)
  std::string costSource = "defaults";  // or where the measured CPU fits come from
  // Measured per-call times by element count (MeasuredCurve with elements in
  // place of bytes; indexed by plan::Device), used instead of the linear
  // costs where set: a job's own probes at its own tensor sizes (`cortado
  // bench model`), where one line fitted through every size lets the noisy
  // mid sizes pull the large ones. decodeUs charges `contributions` calls.
  MeasuredCurve encodeCurve[2], decodeCurve[2];
  // Where set, the first payload's decode-and-add into a region just zeroed
  // (decodeCurve then prices each further one): the first reads the region
  // from memory, the others find it in the caches (a probe of bert-base's
  // sizes: DGC's first of 2 Mi elements 177 us against 59 for each further
  // one, EFSignSGD's 904 against 402), so a decode of one payload (the
  // servers' sum after a pull) costs more than a share of four.
  MeasuredCurve decodeFirstCurve[2];

  double payloadBytes(double elements) const;
  double encodeUs(plan::Device d, double elements) const;
  // Decoding `contributions` payloads of `elements` each and summing them
  // (with decodeFirstCurve: the first at its price, the rest at decodeCurve's).
  double decodeUs(plan::Device d, double elements, double contributions) const;
  // Whether decodeUs prices the first payload apart (both curves set).
  bool decodesFirstApart(plan::Device d) const;
  // One of `calls` decode calls that each add `contributions` payloads into
  // the same region (a server's decodes of the M machines' pushes into a
  // key's sum). With the first payload priced apart, a 1/calls share of the
  // region's calls x contributions decodes, only one of which is the first;
  // with linear costs or one curve, one call's decodeUs (each call keeps its
  // own fixed cost).
  double decodeShareUs(plan::Device d, double elements, double contributions, double calls) const;
  ResolvedCodec zeroCost() const;  // for the upper bound
  // Top-k and DGC: payloads list their indices, so a server builds a round's
  // answer from them (compressor::IndexUnion) without a pass over the sum.
  bool listsIndices() const;
};

class CodecModel {
 public:
  // A table ("format": "cortado-codec-costs").
  static CodecModel fromJson(const nlohmann::json& j);
  static CodecModel load(const std::string& path);
  // Measured fits as `cortado_codec_bench --export_costs` writes them
  // ("schema": "cortado.codec_costs.v1": seconds = alpha + beta * input_bytes
  // per codec spec, device and op). They replace the table's terms for the
  // exact spec measured (parameters compared by value, table defaults filled
  // in); decompress_add is the decode the planner needs (decode and sum).
  // Fits taken with T threads are scaled to one core's work (beta * T).
  void applyMeasured(const nlohmann::json& j, const std::string& origin);
  // Loads `path` in either format: a table replaces this model, measured
  // fits are applied on top of it.
  void loadInto(const std::string& path);
  // Throws cortado::Error listing the valid codecs or parameters.
  ResolvedCodec resolve(const std::string& spec) const;
  std::vector<std::string> names() const;
  const std::string& source() const { return source_; }

 private:
  struct Measured {
    std::string spec, origin;
    std::map<std::string, double> params;
    std::map<std::pair<int, std::string>, LinearCost> fits;  // (device, op)
  };
  std::map<std::string, CodecCost> codecs_;
  std::vector<Measured> measured_;
  std::string source_;
};

// The folder with the default cost files (set at build time).
std::string defaultDataDir();

}  // namespace cortado::planner
