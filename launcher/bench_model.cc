#include "launcher/bench_model.h"
#include "launcher/bench_model_gravac.h"
#include "launcher/bench_model_predict.h"
#include "launcher/bench_model_probe.h"

#include <nlohmann/json.hpp>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <thread>

#include "compressor/error_feedback.h"
#include "compressor/registry.h"
#include "core/backends.h"
#include "core/collective/mpi/factory.h"
#include "core/common/env.h"
#include "core/common/logging.h"
#include "core/common/memory.h"
#include "core/device/host/factory.h"
#include "core/executor/executor.h"
#include "core/shm/shm_segment.h"
#include "scheduler/planner/cost_model.h"
#include "scheduler/planner/fusion_search.h"
#include "scheduler/planner/profile.h"
#include "scheduler/planner/report.h"

namespace cortado::launcher {
namespace {

using nlohmann::json;
using namespace replay;  // the probes and predictions (bench_model_probe.h, bench_model_predict.h)

planner::ModelProfile scaled(planner::ModelProfile p, double k) {
  p.forwardUs *= k;
  for (auto& t : p.tensors) t.backwardUs *= k;
  return p;
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
  // replan: the mean of Executor::beginIteration before each timed iteration
  // of the first round (closing a profiling window: its report; the
  // scheduler's verdicts), each the slowest worker's. Outside the iteration
  // time, as the barrier after it.
  double beginMeanMs = 0;
  // Rank 0: each round's prediction (from that round's probe; all from the
  // first with --probe-once); predictedMs is their mean.
  std::vector<double> roundPredictedMs;
  uint64_t offlineVersion = 0;  // the version of the plan rank 0 computed for it
  uint64_t planVersion = 0;  // replan: the version reached
  int switchedAt = -1;       // replan: the iteration of the first switch
  int timedFrom = -1;        // replan: the iteration the timing starts (after the check of a switch)
  uint64_t checked = 0, wrong = 0, lossyTensors = 0;
  uint64_t batches = 0, iterationsRun = 0;  // Executor::runBatch calls, replay iterations
  std::string searchSummary;  // mergecomp (rank 0): FusionSearch::summary()
  std::string searchTimes;    // mergecomp (rank 0): every time its search measured
  // gravac: the CF sent in each timed iteration, the re-plans and rank 0's
  // summary.
  std::vector<double> gravacRatios;
  uint64_t gravacReplans = 0;
  std::string gravacNote;
};

}  // namespace

std::vector<std::string> modelBenchStrategies() {
  return {"none", "gpu", "cpu", "pertensor", "plan", "mergecomp", "replan", "gravac"};
}

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
                  "--strategies is empty: name some of {}", fmt::join(modelBenchStrategies(), ", "));
  for (const std::string& s : o.strategies) {
    const auto all = modelBenchStrategies();
    CORTADO_ENFORCE(std::find(all.begin(), all.end(), s) != all.end(), ErrorCode::kInvalidArgument,
                    "--strategies: unknown strategy '{}' (valid: {})", s,
                    fmt::join(modelBenchStrategies(), ", "));
    if (s == "replan") {
      const auto w = getEnvInt({"CORTADO_PROFILE_WINDOW"});
      CORTADO_ENFORCE(w && *w > 0, ErrorCode::kInvalidArgument,
                      "--strategies: 'replan' needs online profiling: set CORTADO_PROFILE_WINDOW "
                      "(iterations per profiling window, e.g. 3) for the job, and "
                      "CORTADO_REPLAN_CODEC to the codec the scheduler may use (e.g. the same as "
                      "--codec)");
    }
    if (s == "gravac") parseGravacSettings(o.gravac, o.codec);
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
  parseSyncSkew(o.syncSkew);
  const auto deviceEnv = getEnv({"CORTADO_DEVICE"});
  const std::string device = deviceEnv ? deviceEnv->value : "host";
  CORTADO_ENFORCE(!o.queuedStreams || device == "host", ErrorCode::kInvalidArgument,
                  "--queued-streams is a mode of the host device, but CORTADO_DEVICE is '{}': "
                  "leave one of them out",
                  device);
  if (device == "cuda") {
    CORTADO_ENFORCE(cudaDeviceBuilt(), ErrorCode::kInvalidArgument,
                    "CORTADO_DEVICE=cuda, but this build has no CUDA device (it needs CUDA and "
                    "NCCL at configure time); use CORTADO_DEVICE=host, or --queued-streams to "
                    "run the device path's copies on the host");
    CORTADO_ENFORCE(cudaDeviceCount() > 0, ErrorCode::kInvalidArgument,
                    "CORTADO_DEVICE=cuda, but no CUDA device is visible here; run on a GPU "
                    "machine, or use CORTADO_DEVICE=host (--queued-streams runs the device "
                    "path's copies on the host)");
    CORTADO_ENFORCE(std::find(o.strategies.begin(), o.strategies.end(), "gravac") ==
                        o.strategies.end(),
                    ErrorCode::kInvalidArgument,
                    "--strategies gravac runs on host buffers only (GraVAC's messages are made "
                    "on the CPU): leave it out with CORTADO_DEVICE=cuda");
  }
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
  const planner::ModelProfile profile = [&] {
    planner::ModelProfile p =
        scaled(planner::loadModel(o.profile, planner::resolveDataDir(o.dataDir)), o.computeScale);
    p.contiguousGradients = !o.separateBuffers;
    return p;
  }();

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
  // The memory report (CORTADO_REPORT_MEMORY=1): the worker and its
  // executor's memory counts against the gradients, from before they start.
  MemoryPeaks memory;
  executor::Executor::Memory exPeak;  // the executor's share, at its peaks
  auto worker = startWorker(job, Deadline::after(job.connectTimeout));
  // Where the gradients live and the "gpu" steps run (CORTADO_DEVICE).
  std::shared_ptr<device::Device> dev;
  if (o.queuedStreams) {  // with the host device (validateModelBench)
    device::host::Options ho;
    ho.queued = true;
    ho.groups = &groups;
    dev = device::host::create(ho);
  } else {
    dev = makeDevice(job, &groups, nullptr, setup);
  }
  // The uncompressed steps run on the device's groups (NCCL on CUDA).
  const collective::Groups& rawGroups = dev->groups() ? *dev->groups() : groups;
  const bool direct = dev->hostAddressable();
  executor::Executor ex(*worker, &groups, nullptr, {}, dev);
  ex.setFusionBytes(job.fusionBytes);  // CORTADO_FUSION_BYTES
  ex.setPhaseBytes(job.phaseBytes);    // CORTADO_PHASE_BYTES
  ex.setCompactSparse(job.compactSparse);  // CORTADO_COMPACT_SPARSE
  ex.setPipeline(job.pipeline);        // CORTADO_PIPELINE
  auto tracer = std::make_shared<Tracer>(TraceOptions::fromEnv(fmt::format("worker {}", job.rank)));
  if (tracer->enabled()) ex.setTracer(tracer);
  const collective::Topology& topo = ex.topology();
  ex.setCodecThreads(executor::codecThreadsFor(job, topo.localSize));  // CORTADO_CODEC_THREADS
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
  // The largest fused group the planner may form (planner::FusionConfig's
  // members at most, consecutive): its encode, decode and payload are
  // probed at that size too instead of extrapolated from the largest
  // tensor's (DGC on 2-4 Mi elements took 2-3x the extrapolated time).
  uint64_t groupElems = maxElems;
  {
    const size_t members = size_t(std::max(1, planner::FusionConfig{}.maxGroupTensors));
    uint64_t window = 0;
    for (size_t j = 0; j < profile.tensors.size(); ++j) {
      window += uint64_t(std::max<int64_t>(1, profile.tensors[j].elements));
      if (j >= members)
        window -= uint64_t(std::max<int64_t>(1, profile.tensors[j - members].elements));
      groupElems = std::max(groupElems, window);
    }
  }
  uint64_t maxPayload = 64;
  {
    compressor::Registry reg;
    compressor::registerCpuCodecs(reg);
    maxPayload = std::max<uint64_t>(
        64,
        reg.create(reg.canonical(o.codec))->payloadBytes(std::min(groupElems, uint64_t(1) << 26)));
  }
  // Every probe, at the start and (--probe-once not given) again before
  // every later round: the rounds' predictions then come from the costs of
  // their own minutes on a machine whose speed drifts (docs/model_bench.md).
  auto measureAll = [&](Measured& into, int tag) {
    const Deadline d = Deadline::after(Millis(600000));
    into.efState = worker->errorFeedbackState();
    into.codecThreads = ex.codecThreads();
    if (topo.localSize > 1) {
      measureGroup(world, *groups.intra, *rawGroups.intra, *dev, 4 * minElems, 4 * maxElems,
                   maxPayload, d, into.intra,
                   into.intraCompressed, into.intraCurves, into.intraCurvesCompressed, into.probes,
                   "intra");
      into.hasIntra = true;
    }
    if (topo.numMachines > 1) {
      measureGroup(world, *groups.inter, *rawGroups.inter, *dev, 4 * minElems, 4 * maxElems,
                   maxPayload, d, into.inter,
                   into.interCompressed, into.interCurves, into.interCurvesCompressed, into.probes,
                   "inter");
      into.hasInter = true;
    }
    into.pushPull = measurePushPull(world, *worker, topo, 4 * minElems, 4 * maxElems,
                                    job.partitionBytes, d, into.pushPullCurve, into.probes, tag);
    // The largest tensor's size is a point of its own: between the 4x
    // steps the curve is linear, and per element a 4 Mi-element encode
    // costs 2-3x a 1 Mi-element one here (caches), which priced resnet101's
    // 2.4 Mi-element tensors 30-40% high.
    measureCodec(world, o.codec, minElems, groupElems, into, {maxElems});
    if (topo.numMachines > 1)
      measureCompressedExchange(world, *worker, groups, o.codec, minElems, groupElems, into, tag,
                                {maxElems});
    if (!direct) {
      // The device's own codec and the copies to and from pinned memory.
      measureDeviceCodec(world, *dev, o.codec, into);
      measureCopies(world, *dev, 4 * minElems, 4 * groupElems, into);
    }
    if (const auto set = parseSyncSkew(o.syncSkew)) {
      into.syncSkew = *set;
      into.probes.push_back(
          fmt::format("sync skew: not measured (--sync-skew {}): {:.0f} us + {:.3f} x the work",
                      o.syncSkew, set->us, set->fraction));
    } else {
      measureSkewChain(world, *worker, groups, o.codec, job.pipeline, into);
      if (topo.numMachines > 1)
        measureSkewChain(world, *worker, groups, o.codec, job.pipeline, into, /*servers=*/true,
                         tag);
    }
    // The probes encoded up to the largest group the planner may form; a
    // bf16 state's scratch from them would stay beside the replay's.
    compressor::ErrorFeedback::releaseIdleScratch();
#ifdef __GLIBC__
    // And the heap the probes freed goes back to the system: the compressed
    // exchange probe's executor left 30-55 MiB of freed heap in each
    // worker, which the memory report (CORTADO_REPORT_MEMORY) counted as
    // the replay's (resnet50/EFSignSGD on 2 emulated machines: 1.41-1.68x
    // the gradients against 1.06-1.13x without that probe).
    malloc_trim(0);
#endif
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
  // Each worker runs one codec call at a time (a tensor's pieces one after
  // the other, each over its codec threads, which the codec probe ran
  // with), as the online re-planner counts them (scheduler/replan.cc): this
  // host's cores over the job's machines (emulated machines share them), at
  // most the machine's workers.
  const int cpuCores = o.cpuCores > 0 ? o.cpuCores
                                      : std::max(1, std::min(hw / std::max(1, topo.numMachines),
                                                             topo.localSize));

  // 2. Plans and predictions on rank 0, plans to everybody.
  std::vector<Prediction> preds;
  std::shared_ptr<planner::Simulator> simulator;  // rank 0: for the plans handed out during replan
  std::string costNote, err;
  if (lead) {
    try {
      preds = predict(o, profile, topo, m, cpuCores, job.partitionBytes, job.fusionBytes,
                      job.pipeline, &costNote, &simulator);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = world.broadcast(err);
  if (!err.empty()) throw Error(ErrorCode::kInvalidArgument, "planning the strategies: " + err);
  std::vector<std::string> planJson;
  for (size_t i = 0; i < o.strategies.size(); ++i)
    planJson.push_back(world.broadcast(lead ? plan::toJsonString(preds[i].plan) : std::string()));
  // mergecomp: the compress-everything plans its search tries in turn.
  std::vector<plan::Plan> mergecompAlternatives;
  for (size_t i = 0; i < o.strategies.size(); ++i) {
    if (o.strategies[i] != "mergecomp") continue;
    const std::string n =
        world.broadcast(lead ? std::to_string(preds[i].alternatives.size()) : std::string());
    for (size_t a = 0; a < std::stoul(n); ++a)
      mergecompAlternatives.push_back(plan::planFromJsonString(
          world.broadcast(lead ? plan::toJsonString(preds[i].alternatives[a]) : std::string())));
  }
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
               "ms), {} iterations after {} warm-up, gradients {} on {}, tensor fusion {}, {}, {} codec "
               "thread(s) a worker (CORTADO_CODEC_THREADS){}{}\n"
               "# measured {}\n",
               profile.model, T, totalElements / 1e6, o.codec, topo.size, topo.numMachines,
               topo.localSize, worker->numServers(), o.computeScale, profile.forwardUs / 1e3,
               profile.backwardUs() / 1e3, o.iterations, o.warmup,
               o.separateBuffers ? "in buffers of their own (--separate-buffers: groups copied)"
                                 : "in one flat buffer (groups in place)",
               dev->name(),
               job.fusionBytes > 0 ? fmt::format("up to {} bytes (CORTADO_FUSION_BYTES; batch "
                                                 "agreement {:.0f} us)",
                                                 job.fusionBytes, m.agreeUs)
                                   : std::string("off (CORTADO_FUSION_BYTES=0)"),
               job.phaseBytes > 0 ? fmt::format("phases of up to {} bytes (CORTADO_PHASE_BYTES)", job.phaseBytes)
                                  : std::string("one tensor after the other (CORTADO_PHASE_BYTES=0)"),
               ex.codecThreads(),
               job.pipeline ? (job.fusionBytes == 0
                                    ? ", encode pipeline on (CORTADO_PIPELINE=1: one batch an "
                                      "iteration, its items awaited; modelled)"
                                    : ", encode pipeline on (CORTADO_PIPELINE=1: within each batch; "
                                      "the predictions do not model it with fusion by size)")
                            : "",
               worker->errorFeedbackState() == compressor::StateDType::kBFloat16
                   ? ", error feedback in bf16 (CORTADO_EF_DTYPE=bf16)"
                   : "",
               costNote);
    std::fflush(stdout);
  }
  // The gradients: spans of one flat buffer in gradient-ready order (a
  // plan group's tensors consecutive, so that it runs in place), or each in
  // a buffer of its own (--separate-buffers).
  std::vector<std::vector<float>> pat(T), own(T);
  std::vector<float> flat(o.separateBuffers ? 0 : totalElements);
  std::vector<std::span<float>> buf(T);
  const int levels = patternLevels(topo.size);
  for (size_t j = 0, at = 0; j < T; ++j) {
    const auto& t = profile.tensors[j];
    ex.declare(t.name, DType::kFloat32, uint64_t(t.elements));
    pat[j].resize(size_t(t.elements));
    if (o.separateBuffers) {
      own[j].resize(size_t(t.elements));
      buf[j] = own[j];
    } else {
      buf[j] = std::span<float>(flat).subspan(at, size_t(t.elements));
      at += size_t(t.elements);
    }
    for (uint64_t i = 0; i < uint64_t(t.elements); ++i) pat[j][i] = pattern(j, i, levels);
  }
  // On a device whose memory is not the host's, the executor's buffers are
  // the device's (laid out as `buf`), and `buf` stages them on the host:
  // copied in before each iteration's timing starts, out after it ends.
  std::vector<float*> gradient(T);
  device::Buffer deviceFlat(*dev, false);
  std::vector<device::Buffer> deviceOwn;
  std::unique_ptr<device::Stream> staging;
  std::unique_ptr<device::Event> staged;
  if (direct) {
    for (size_t j = 0; j < T; ++j) gradient[j] = buf[j].data();
  } else {
    staging = dev->createStream();
    staged = dev->createEvent();
    if (o.separateBuffers) {
      deviceOwn.reserve(T);
      for (size_t j = 0; j < T; ++j) {
        deviceOwn.emplace_back(*dev, false);
        gradient[j] = deviceOwn.back().floats(buf[j].size());
      }
    } else {
      float* base = deviceFlat.floats(totalElements);
      for (size_t j = 0, at = 0; j < T; at += buf[j].size(), ++j) gradient[j] = base + at;
    }
  }
  // kind: to the device (before an iteration) or back (after it).
  auto stage = [&](device::CopyKind kind) {
    if (direct) return;
    const bool in = kind == device::CopyKind::kHostToDevice;
    auto copy = [&](float* d, float* h, size_t n) {
      dev->copy(in ? static_cast<void*>(d) : h, in ? static_cast<const void*>(h) : d,
                n * sizeof(float), kind, *staging);
    };
    if (o.separateBuffers) {
      for (size_t j = 0; j < T; ++j) copy(gradient[j], buf[j].data(), buf[j].size());
    } else {
      copy(gradient[0], flat.data(), flat.size());
    }
    staged->record(*staging);
    staged->synchronize(opDeadline, in ? "the gradients' copy to the device"
                                       : "the results' copy from the device");
  };
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
  // mergecomp: the plan its search ended on in the first round, which the
  // later rounds run as a fixed plan.
  std::optional<plan::Plan> searched;
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
                               job.pipeline, nullptr, nullptr);
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
    // mergecomp: MergeComp's search for the groups (Executor::setFusionSearch)
    // in the first round only, from the per-tensor plan.
    const bool mergecomp = r.strategy == "mergecomp" && round == 0;
    // gravac: one runBatch per iteration (every gradient, once all are
    // ready), GraVAC's messages summed by the plan the planner makes at its CF.
    const bool gravac = r.strategy == "gravac";
    const plan::Plan p = r.strategy == "replan" && round > 0      ? *replanned
                         : r.strategy == "mergecomp" && round > 0 ? *searched
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
    if (gravac) {
      std::fill(exact.begin(), exact.end(), false);  // lossy: nothing checked
      r.lossyTensors = T;
      ex.setGravacReplanner(gravacBenchReplanner(world, simulator, lead),
                            "the Espresso planner with this run's measured costs");
      ex.setGravac(parseGravacSettings(o.gravac, o.codec), double(topo.size));
      r.gravacRatios.clear();
    }
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
    if (mergecomp) {
      // Short windows: each candidate costs settle + window + 1 iterations.
      executor::FusionSearchOptions fo;
      fo.warmup = uint64_t(std::max(1, o.warmup));
      fo.window = 3;
      fo.settle = 1;
      ex.setFusionSearch(fo, mergecompAlternatives);
      cap = 2000;  // the search ends well before (about 3 log2(groups) + 2 candidates)
    }
    if (round == 0) r.planVersion = r.offlineVersion = p.version;
    Progress bar(progressOn, replan ? cap + 3 * (2 * windowLen + int(job.replanAhead)) + o.warmup +
                                          o.iterations
                                    : o.warmup + o.iterations);
    std::vector<double> times, begins;  // begins: replan's beginIteration
    double beginSecs = 0;
    for (int it = 0;; ++it) {
      if (!replan && !mergecomp && it >= o.warmup + o.iterations) break;
      if (mergecomp) {
        if (settled >= 0 && it - settled >= o.warmup + o.iterations) break;
        CORTADO_ENFORCE(it < cap, ErrorCode::kTimeout,
                        "--strategies mergecomp: the fusion search has not ended by iteration {}", it);
        const auto b0 = Clock::now();
        ex.beginIteration(uint64_t(it), opDeadline);
        beginSecs = secondsSince(b0);
        if (ex.currentPlan().version != r.planVersion) {
          // A candidate's groups: residuals of the previous one's encode
          // points are folded into this iteration's inputs.
          r.planVersion = ex.currentPlan().version;
          ++changes;
          // NOLINTNEXTLINE(performance-unnecessary-copy-initialization)
          const std::vector<bool> before = exact;
          for (size_t j = 0; j < T; ++j) tainted[j] = tainted[j] || !before[j];
          classify(ex.currentPlan());
          for (size_t j = 0; j < T; ++j) folding[j] = !before[j];
          times.clear();
        }
        if (settled < 0 && ex.fusionSearchInForce()) {
          settled = it;  // the search's answer runs from here
          r.switchedAt = it;
        }
      }
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
        const auto b0 = Clock::now();
        ex.beginIteration(uint64_t(it), opDeadline);
        beginSecs = secondsSince(b0);
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
            begins.clear();
          }
          r.planVersion = ex.currentPlan().version;
          // A copy: classify() rewrites `exact`.
          // NOLINTNEXTLINE(performance-unnecessary-copy-initialization)
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
      stage(device::CopyKind::kHostToDevice);
      world.barrier();
      const auto t0 = Clock::now();
      const double traceT0 = Tracer::now();
      // Each time the executor is free: every gradient ready by now is the
      // batch (none: the next one, when it is ready). With fusion (or the
      // encode pipeline, below) the workers agree on it first (the largest
      // of their counts; each waits for those on its own clock), so that all
      // run the same items.
      auto readyAt = [&](size_t j) {
        return t0 + std::chrono::nanoseconds(int64_t(readyTimes[j] * 1e3));
      };
      // The plan's groups are handed over whole: a batch that would end
      // inside one waits for its last tensor (Executor::runBatch runs a group
      // once when the batch holds all of it).
      std::vector<size_t> groupEnd(T);
      for (size_t j = 0; j < T; ++j) groupEnd[j] = j + 1;
      for (const auto& [first, last] : planner::groupRanges(profile, ex.currentPlan()))
        for (int j = first; j <= last; ++j) groupEnd[size_t(j)] = size_t(last) + 1;
      // With the encode pipeline and no fusion by size, the iteration is one
      // batch whose items the executor waits for (Executor::runBatch with an
      // AwaitItem): every execution's encode may overlap the previous one's
      // exchange, with no batch boundary between them, and the units are the
      // same on every worker without agreeing (ready order, groups whole).
      const bool streamed = ex.pipeline() && ex.fusionBytes() == 0 && !gravac;
      if (streamed) {
        batch.clear();
        for (size_t k = 0; k < T; ++k)
          batch.push_back({profile.tensors[k].name, gradient[k], gradient[k], buf[k].size()});
        ex.runBatch(batch, ReduceOp::kSum, opDeadline, [&](size_t k) {
          std::this_thread::sleep_until(readyAt(k));
          const auto& t = profile.tensors[k];
          if (tracer->enabled() && t.backwardUs > 0)
            tracer->record("backward", t.name, int64_t(ex.runs(t.name)), "gpu",
                           traceT0 + readyTimes[k] - t.backwardUs, traceT0 + readyTimes[k]);
        });
        ++r.batches;
      }
      for (size_t j = streamed ? T : 0; j < T;) {
        std::this_thread::sleep_until(readyAt(j));
        size_t end = gravac ? T : groupEnd[j];
        // With fusion, or the encode pipeline (which overlaps the units of
        // one batch: alone, each unit would be a batch of its own and there
        // would be nothing to overlap), every gradient ready by now.
        if ((ex.fusionBytes() > 0 || ex.pipeline()) && !gravac) {
          const auto now = Clock::now();
          while (end < T && readyAt(end) <= now) ++end;
          end = groupEnd[end - 1];
          end = agreeOnBatch(*groups.world, end, opDeadline);
        }
        std::this_thread::sleep_until(readyAt(end - 1));
        batch.clear();
        for (size_t k = j; k < end; ++k) {
          const auto& t = profile.tensors[k];
          // The executor's iteration is the tensor's run count: the same here.
          if (tracer->enabled() && t.backwardUs > 0)
            tracer->record("backward", t.name, int64_t(ex.runs(t.name)), "gpu",
                           traceT0 + readyTimes[k] - t.backwardUs, traceT0 + readyTimes[k]);
          batch.push_back({t.name, gradient[k], gradient[k], buf[k].size()});
        }
        ex.runBatch(batch, ReduceOp::kSum, opDeadline);
        ++r.batches;
        j = end;
      }
      const double secs = secondsSince(t0);
      stage(device::CopyKind::kDeviceToHost);
      if (job.reportMemory) {
        // After every iteration: a plan switch's residuals and carry side
        // by side count too.
        memory.sample();
        const executor::Executor::Memory em = ex.memory();
        exPeak.residuals = std::max(exPeak.residuals, em.residuals);
        exPeak.carry = std::max(exPeak.carry, em.carry);
        exPeak.buffers = std::max(exPeak.buffers, em.buffers);
      }
      if (replan || mergecomp ? settled >= 0 && it >= settled + o.warmup : it >= o.warmup) {
        times.push_back(secs);
        if (replan) begins.push_back(beginSecs);
        if (gravac) r.gravacRatios.push_back(ex.gravacHistory().back().ratio);
      }
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
    if (replan || mergecomp) r.timedFrom = settled + o.warmup;
    if (mergecomp) {
      searched = ex.currentPlan();
      if (lead) r.searchSummary = ex.fusionSearchSummary(), r.searchTimes = ex.fusionSearchTimes();
      ex.setFusionSearch(std::nullopt);  // the next strategy's plan stays
    }
    for (size_t j = 0; j < T; ++j) {
      // Lossless codecs on this data (fp16 of integers) leave zero residuals.
      const auto& opt = ex.currentPlan().tensors.at(profile.tensors[j].name);
      compressedBefore[j] = gravac || (opt.compressed() && !losslessFor(opt.codec));
    }
    if (gravac) {
      r.gravacReplans = ex.gravacReplans();
      if (lead) r.gravacNote = gravacSummary(ex, r.gravacRatios, T);
      ex.setGravac(std::nullopt);  // its residuals join the next strategy's first inputs
    }
    if (replan) {
      ex.setOnline({});  // no later plan may replace the next strategy's
      replanned = ex.currentPlan();
      begins = world.max(begins);
      for (double t : begins) r.beginMeanMs += t * 1e3 / double(begins.size());
    }
    times = world.max(times);  // an iteration ends when the last worker is done
    double roundSum = 0;
    for (double t : times) r.timesMs.push_back(t * 1e3), roundSum += t;
    r.roundMs.push_back(roundSum / double(times.size()) * 1e3);
    if (job.reportMemory) memory.sample();
  }
  if (job.reportMemory) {
    // The benchmark's own buffers: the gradients and their input patterns.
    const uint64_t gradientBytes = uint64_t(totalElements) * sizeof(float);
    const uint64_t overhead = printWorkerMemory(
        job.rank, memory.baseline(), memory.peak(), 2 * gradientBytes, gradientBytes,
        job.sharedMemory
            ? shm::ownedSegmentBytes(shm::jobPrefix(job.token), NodeId{Role::kWorker, job.rank})
            : 0);
    // What of it the executor holds (peaks over the iterations): the
    // error-feedback residuals are inherent to error feedback (1x the
    // compressed tensors; 2x with DGC's momentum).
    const uint64_t beyond = overhead > exPeak.residuals ? overhead - exPeak.residuals : 0;
    fmt::print(stderr,
               "memory: worker {}: of which error-feedback residuals {} ({:.2f}x the gradients), "
               "retired residuals not yet folded {}, executor buffers {} (peaks); beyond the "
               "residuals {} ({:.2f}x the gradients)\n",
               job.rank, mebibytes(exPeak.residuals),
               double(exPeak.residuals) / double(std::max<uint64_t>(1, gradientBytes)),
               mebibytes(exPeak.carry), mebibytes(exPeak.buffers), mebibytes(beyond),
               double(beyond) / double(std::max<uint64_t>(1, gradientBytes)));
  }
  for (size_t si = 0; si < S; ++si) {
    Result& r = results[si];
    const bool replan = r.strategy == "replan";
    const bool mergecomp = r.strategy == "mergecomp";
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
        r.options += fmt::format("; beginIteration (window reports, verdicts) {:.1f} ms per "
                                 "timed iteration of the first round, outside the timing",
                                 r.beginMeanMs);
      }
      if (r.strategy == "gravac") {
        // Its plans change with the CF: no one prediction.
        r.predictedMs = 0, overlappedMs = 0;
        r.options = r.gravacNote;
      }
      if (mergecomp) {
        // The groups the search ended on, predicted as every other plan.
        r.predictedMs = 0, overlappedMs = 0;
        const std::string tracePath =
            o.predictedTrace.empty() ? std::string() : predictedTracePath(o.predictedTrace, "mergecomp");
        if (auto pr = predictPlan(*simulator, *searched, tracePath)) {
          r.predictedMs = pr->first / 1e3;
          overlappedMs = pr->second / 1e3;
        }
        size_t fused = 0;
        for (const auto& g : searched->groups) fused += g.size();
        r.options = fmt::format("{} {}; {}; {} groups of {} tensors; searched until iteration {}, "
                                "timed from {}",
                                searched->tensors.begin()->second.describe(), searched->tensors.begin()->second.codec,
                                r.searchSummary, searched->groups.size(), fused, r.switchedAt, r.timedFrom);
      }
      // Each later round's prediction from its own probe, the same plan:
      // the strategy's is their mean, as its measured time is the mean over
      // the rounds (each has --iterations).
      r.roundPredictedMs = {r.predictedMs};
      if (r.predictedMs > 0) {
        const plan::Plan& p = replan ? *replanned : mergecomp ? *searched : preds[si].plan;
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
        // The skew the predictions charged: --sync-skew's, or the chains'.
        const planner::SyncSkew& skew = simulator ? simulator->cluster().syncSkew : m.syncSkew;
        json jr = {{"model", profile.model}, {"codec", o.codec}, {"strategy", r.strategy},
                   {"measured_ms", r.meanMs}, {"stdev_ms", r.stdMs}, {"min_ms", r.minMs},
                   {"predicted_ms", r.predictedMs}, {"error_pct", errPct},
                   {"overlapped_ms", overlappedMs},
                   {"predicted_noskew_ms", preds[si].noSkewUs / 1e3},
                   {"sync_skew_us", skew.us}, {"sync_skew_fraction", skew.fraction},
                   {"sync_skew_curve", skew.curve.points},
                   {"push_skew_curve", simulator ? simulator->cluster().pushSkew.curve.points
                                                 : std::vector<std::pair<double, double>>{}},
                   {"iterations", o.iterations}, {"rounds", o.rounds}, {"round_ms", r.roundMs},
                   {"round_predicted_ms", r.roundPredictedMs}, {"probe_s", probeSeconds},
                   {"workers", topo.size}, {"device", dev->name()},
                   {"machines", topo.numMachines}, {"compute_scale", o.computeScale},
                   {"checked_elements", r.checked}, {"wrong_elements", r.wrong},
                   {"lossy_tensors", r.lossyTensors}, {"options", r.options},
                   {"fusion_bytes", job.fusionBytes},
                   {"phase_bytes", job.phaseBytes},
                   {"pipeline", job.pipeline},
                   {"codec_threads", ex.codecThreads()},
                   {"ef_dtype", compressor::toString(worker->errorFeedbackState())},
                   {"batches_per_iteration", double(r.batches) / double(std::max<uint64_t>(1, r.iterationsRun))},
                   {"iteration_ms", r.timesMs}};
        if (!(r.predictedMs > 0)) {
          jr["predicted_ms"] = nullptr;
          jr["overlapped_ms"] = nullptr;
          jr["error_pct"] = nullptr;
        }
        if (!(r.predictedMs > 0) || replan || mergecomp || o.rounds > 1)
          jr["predicted_noskew_ms"] = nullptr;
        if (r.strategy == "mergecomp") {
          jr["search"] = r.searchSummary;
          jr["search_times"] = r.searchTimes;
          jr["timed_from"] = r.timedFrom;
        }
        if (r.strategy == "gravac") {
          jr["gravac_ratios"] = r.gravacRatios;
          jr["gravac_replans"] = r.gravacReplans;
        }
        if (replan) {
          jr["begin_iteration_ms"] = r.beginMeanMs;
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
                 *replanned = find("replan"), *perTensor = find("pertensor"), *mc = find("mergecomp");
    // Fused groups: the plan against Espresso's per-tensor plan (the best
    // unfused one), and MergeComp's measured groups against the plan's.
    if (plan && (perTensor || mc)) {
      const double vsPer = perTensor ? perTensor->meanMs / plan->meanMs : 0;
      const double mcVs = mc ? plan->meanMs / mc->meanMs : 0;
      if (o.json) {
        json js = {{"model", profile.model}, {"codec", o.codec}, {"summary", true}};
        if (perTensor) js["plan_speedup_vs_pertensor"] = vsPer;
        if (mc) js["mergecomp_speed_vs_plan"] = mcVs;
        fmt::print("{}\n", js.dump());
      } else {
        if (perTensor) fmt::print("plan (fused) vs pertensor: {:.2f}x\n", vsPer);
        if (mc) fmt::print("mergecomp vs plan (fused): {:.2f}x\n", mcVs);
      }
    }
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
