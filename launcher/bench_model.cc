#include "launcher/bench_model.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
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

// Fits t = alphaCount * alpha + bytesFactor * bytes * beta through two
// measurements; alpha >= 0, the rate positive.
AlphaBeta fit(double alphaCount, double bytesFactor, double b1, double t1, double b2, double t2) {
  double beta = (t2 - t1) / (bytesFactor * (b2 - b1));  // us per byte
  if (!(beta > 0)) beta = t2 / (bytesFactor * b2);
  double alpha = std::max(0.0, (t1 - bytesFactor * b1 * beta) / alphaCount);
  AlphaBeta ab;
  ab.alphaUs = alpha;
  ab.gbps = 8.0 / (beta * 1000.0);
  return ab;
}

struct Measured {
  AlphaBeta intra, inter, pushPull;
  // Reduce and broadcast to/from one root, measured on their own: the
  // allreduce fit does not predict them (OpenMPI's reduce on this machine
  // took 30x the allreduce fit's time per byte in a traced run).
  AlphaBeta intraReduce, intraBcast, interReduce, interBcast;
  bool hasIntra = false, hasInter = false;
  double encodeAlpha = 0, encodeBeta = 0, decodeAlpha = 0, decodeBeta = 0;  // s, s per input byte
  double sumGbps = 40;
};

constexpr uint64_t kSmall = 1024, kLarge = 1 << 20;  // float32 elements for the link probes

// Allreduce over a group at two sizes (median of 3 each); every rank of the
// group takes part. Returns the alpha-beta of a ring allreduce.
AlphaBeta measureAllreduce(collective::Collectives& g, Deadline d) {
  std::vector<float> buf(kLarge, 1.0f), out(kLarge);
  auto run = [&](uint64_t n) {
    g.allreduce(buf.data(), out.data(), n, DType::kFloat32, d);  // warm
    return medianSeconds(3, [&] { g.allreduce(buf.data(), out.data(), n, DType::kFloat32, d); }) * 1e6;
  };
  const double t1 = run(kSmall), t2 = run(kLarge);
  const int p = g.size();
  return fit(2.0 * (p - 1), 2.0 * (p - 1) / p, kSmall * 4.0, t1, kLarge * 4.0, t2);
}

// Reduce to root 0 and broadcast from root 0 over a group at two sizes
// (median of 3 each), fitted to the planner's formula for both:
// ceil(log2 p) * a + bytes * b.
std::pair<AlphaBeta, AlphaBeta> measureRootOps(collective::Collectives& g, Deadline d) {
  std::vector<float> buf(kLarge, 1.0f), out(kLarge);
  auto red = [&](uint64_t n) {
    g.reduce(buf.data(), out.data(), n, DType::kFloat32, 0, d);  // warm
    return medianSeconds(3, [&] { g.reduce(buf.data(), out.data(), n, DType::kFloat32, 0, d); }) * 1e6;
  };
  auto bc = [&](uint64_t n) {
    g.broadcast(buf.data(), n, DType::kFloat32, 0, d);  // warm
    return medianSeconds(3, [&] { g.broadcast(buf.data(), n, DType::kFloat32, 0, d); }) * 1e6;
  };
  int lg = 0;
  while ((1 << lg) < g.size()) ++lg;
  const double r1 = red(kSmall), r2 = red(kLarge), b1 = bc(kSmall), b2 = bc(kLarge);
  return {fit(std::max(1, lg), 1.0, kSmall * 4.0, r1, kLarge * 4.0, r2),
          fit(std::max(1, lg), 1.0, kSmall * 4.0, b1, kLarge * 4.0, b2)};
}

// Push and pull of one key by every worker; a machine sends localSize times
// what one worker does. Push and pull are charged a + frac * bytes * b each.
AlphaBeta measurePushPull(Worker& w, const collective::Topology& topo, Deadline d) {
  std::vector<float> buf(kLarge, 1.0f), out(kLarge);
  auto run = [&](uint64_t n) {
    const std::string key = fmt::format("bench.model.probe.{}", n);
    w.declare(key, DType::kFloat32, n, TensorOptions{}, d);
    auto once = [&] {
      w.pushPull(key, DType::kFloat32, n, buf.data(), out.data(), ReduceOp::kSum, 0).wait(d).check();
    };
    once();
    return medianSeconds(3, once) * 1e6;
  };
  const double t1 = run(kSmall), t2 = run(kLarge);
  const int m = std::max(2, topo.numMachines);
  const double frac = double(m - 1) / m;
  const double L = topo.localSize;
  return fit(2.0, 2.0 * frac, kSmall * 4.0 * L, t1, kLarge * 4.0 * L, t2);
}

// The executor's encode (with error feedback, as it runs it) and decode-and-
// add, at two sizes: seconds = alpha + beta * input bytes.
void measureCodec(const std::string& spec, Measured& m) {
  compressor::Registry reg;
  compressor::registerCpuCodecs(reg);
  compressor::CodecPtr codec = reg.create(reg.canonical(spec));
  compressor::ErrorFeedback ef(codec);
  const uint64_t n1 = 16 << 10, n2 = 1 << 20;
  std::vector<float> x(n2), sum(n2);
  for (uint64_t i = 0; i < n2; ++i) x[i] = std::sin(double(i)) + 0.1f;
  std::vector<std::byte> payload;
  uint64_t key = 0;
  auto enc = [&](uint64_t n) {
    payload.resize(ef.payloadBytes(n));
    return medianSeconds(3, [&] {
      compressor::EncodeContext ctx;
      ctx.seed = ++key;
      ef.encode(n, x.data(), n, payload, ctx);
    });
  };
  auto dec = [&](uint64_t n) {
    enc(n);
    return medianSeconds(3, [&] { codec->decompressAdd(payload, sum.data(), n); });
  };
  const double e1 = enc(n1), e2 = enc(n2), d1 = dec(n1), d2 = dec(n2);
  m.encodeBeta = std::max(0.0, (e2 - e1) / (4.0 * (n2 - n1)));
  m.encodeAlpha = std::max(0.0, e1 - m.encodeBeta * 4.0 * n1);
  m.decodeBeta = std::max(0.0, (d2 - d1) / (4.0 * (n2 - n1)));
  m.decodeAlpha = std::max(0.0, d1 - m.decodeBeta * 4.0 * n1);
  const double s = medianSeconds(3, [&] {
    for (uint64_t i = 0; i < n2; ++i) sum[i] += x[i];
  });
  m.sumGbps = 8.0 * 4.0 * n2 / s / 1e9;
}

planner::ModelProfile scaled(planner::ModelProfile p, double k) {
  p.forwardUs *= k;
  for (auto& t : p.tensors) t.backwardUs *= k;
  return p;
}

bool allCpu(const plan::TensorOption& o) {
  for (const plan::Step& s : o.steps)
    if (s.kind != plan::StepKind::kComm && s.device != plan::Device::kCpu) return false;
  return true;
}

struct Prediction {
  std::string strategy;
  plan::Plan plan;
  double predictedUs = 0;  // forward + backward and synchronization, one tensor at a time
  double overlappedUs = 0;  // forward + the simulator's overlapped timeline (the planner's model)
  std::string options;     // the one option everybody runs, or a summary
};

// The replay's timeline: the executor runs one tensor at a time (Executor::run
// is synchronous, on one thread), so tensor j's synchronization starts when it
// is ready (the profile's backward times, a wall-clock schedule that codec
// work does not delay) and tensor j-1's has ended, and takes what it takes
// alone (the simulator's step from an idle state: its operations chained on
// free lanes). The planner's simulator instead overlaps a tensor's stages with
// the next tensors' on separate lanes, which this runtime does not do.
// Returns the end of the last synchronization after the forward pass (us);
// `trace` gets the events on that timeline.
double serialized(planner::Simulator& sim, const std::vector<int>& choice,
                  std::vector<planner::TraceEvent>* trace) {
  double readyUs = 0, endUs = 0;
  std::vector<planner::TraceEvent> ev;
  for (int j = 0; j < sim.tensors(); ++j) {
    planner::SimState st = sim.initialState();
    planner::TensorTiming tm;
    ev.clear();
    sim.step(st, j, choice[j], trace ? &ev : nullptr, &tm);
    const double bw = sim.profile().tensors[j].backwardUs;
    readyUs += bw;
    const double start = std::max(readyUs, endUs);
    for (planner::TraceEvent& e : ev) {
      e.start = e.lane < 0 ? readyUs - bw : e.start - tm.ready + start;
      trace->push_back(std::move(e));
    }
    endUs = start + std::max(0.0, tm.finish - tm.ready);
  }
  return endUs;
}

// Rank 0: the cost models from the measurements, and every strategy's plan
// and predicted iteration time.
std::vector<Prediction> predict(const ModelBenchOptions& o, const planner::ModelProfile& profile,
                                const collective::Topology& topo, const Measured& m,
                                int cpuCores, uint64_t chunkBytes, std::string* costNote) {
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
  cl.inter.name = "measured inter";
  cl.inter.base = m.hasInter ? m.inter : m.pushPull;
  cl.inter.perOp[plan::CommOp::kPush] = m.pushPull;
  cl.inter.perOp[plan::CommOp::kPull] = m.pushPull;
  cl.intra.name = "measured intra";
  cl.intra.base = m.hasIntra ? m.intra : cl.inter.base;
  if (m.hasInter) {
    cl.inter.perOp[plan::CommOp::kReduce] = m.interReduce;
    cl.inter.perOp[plan::CommOp::kBroadcast] = m.interBcast;
  }
  if (m.hasIntra) {
    cl.intra.perOp[plan::CommOp::kReduce] = m.intraReduce;
    cl.intra.perOp[plan::CommOp::kBroadcast] = m.intraBcast;
  }
  // No copies: the replay's buffers are host memory.
  cl.d2h = cl.h2d = AlphaBeta{0, 1e9};
  cl.cpuCores = cpuCores;
  cl.cpuSumGbps = m.sumGbps;
  cl.parameterServer = true;
  cl.chunkBytes = double(chunkBytes);
  planner::ResolvedCodec codec = codecs.resolve(o.codec);
  auto options = planner::plannerOptions(cl, codec.spec);
  const plan::TensorOption byteps = executor::defaultOption();
  int bytepsIdx = -1;
  for (size_t i = 0; i < options.size(); ++i)
    if (options[i] == byteps) bytepsIdx = int(i);
  if (bytepsIdx < 0) {
    options.push_back(byteps);
    bytepsIdx = int(options.size()) - 1;
  }
  planner::Simulator sim(cl, codec, profile, options);
  planner::Planner pl(sim);
  const int T = sim.tensors();
  *costNote = fmt::format(
      "links: intra allreduce {:.0f} us + {:.2f} Gbit/s{}, inter allreduce {:.0f} us + {:.2f} "
      "Gbit/s{}, push/pull {:.0f} us + {:.2f} Gbit/s; reduce intra {:.0f} us + {:.2f} Gbit/s, "
      "inter {:.0f} us + {:.2f} Gbit/s; broadcast intra {:.0f} us + {:.2f} Gbit/s, inter {:.0f} us "
      "+ {:.2f} Gbit/s; codec {} encode {:.0f} us + {:.2f} ns/elem, "
      "decode {:.0f} us + {:.2f} ns/elem (CPU, also used for \"gpu\"); sum {:.1f} Gbit/s; {} CPU "
      "cores per machine",
      cl.intra.base.alphaUs, cl.intra.base.gbps, m.hasIntra ? "" : " (not measured)",
      cl.inter.base.alphaUs, cl.inter.base.gbps, m.hasInter ? "" : " (not measured)",
      m.pushPull.alphaUs, m.pushPull.gbps, m.intraReduce.alphaUs, m.intraReduce.gbps,
      m.interReduce.alphaUs, m.interReduce.gbps, m.intraBcast.alphaUs, m.intraBcast.gbps,
      m.interBcast.alphaUs, m.interBcast.gbps, o.codec, m.encodeAlpha * 1e6, m.encodeBeta * 4e9,
      m.decodeAlpha * 1e6, m.decodeBeta * 4e9, m.sumGbps, cpuCores);
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
      // The best single all-CPU compressed option, as compressAllGpu() for the GPU.
      s.iterUs = planner::Simulator::kInf;
      for (int i = 0; i < int(options.size()); ++i) {
        if (!options[i].compressed() || !allCpu(options[i])) continue;
        planner::Strategy c = uniform(i);
        if (c.iterUs < s.iterUs) s = c;
      }
      CORTADO_ENFORCE(!s.choice.empty(), ErrorCode::kInvalidArgument,
                      "codec '{}' has no option compressed on the CPU", o.codec);
    } else if (name == "plan" || name == "replan") {
      // replan starts from the offline plan; what the scheduler switches it
      // to is reported after the run.
      s = pl.decide();
      if (name == "plan" && !o.predictedTrace.empty()) {
        std::vector<planner::TraceEvent> ev;
        serialized(sim, s.choice, &ev);
        std::ofstream f(o.predictedTrace);
        f << planner::chromeTrace(sim, ev) << "\n";
        CORTADO_ENFORCE(f.good(), ErrorCode::kInvalidArgument, "--predicted-trace: cannot write '{}'",
                        o.predictedTrace);
      }
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

// Integer-valued gradients: worker r's element i of tensor j in iteration it
// is (r + 1) * (1 + it % 3) * pattern_j[i], pattern in [-2, 2]; every fp32 and
// fp16 sum of them is exact.
float pattern(size_t j, uint64_t i) { return float(int((i * 7 + j * 13 + (i * i + j) % 11) % 5) - 2); }
float factor(int rank, int it) { return float((rank + 1) * (1 + it % 3)); }

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
  uint64_t planVersion = 0;  // replan: the version reached
  int switchedAt = -1;       // replan: the iteration of the first switch
  uint64_t checked = 0, wrong = 0, lossyTensors = 0;
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
  auto tracer = std::make_shared<Tracer>(TraceOptions::fromEnv(fmt::format("worker {}", job.rank)));
  if (tracer->enabled()) ex.setTracer(tracer);
  const collective::Topology& topo = ex.topology();
  const bool lead = topo.rank == 0;
  World world{*groups.world};
  const Deadline opDeadline = Deadline::after(Millis(3600000));

  // 1. Measure.
  Measured m;
  if (topo.localSize > 1) {
    m.intra = measureAllreduce(*groups.intra, setup);
    std::tie(m.intraReduce, m.intraBcast) = measureRootOps(*groups.intra, setup);
    m.hasIntra = true;
  }
  if (topo.numMachines > 1) {
    m.inter = measureAllreduce(*groups.inter, setup);
    std::tie(m.interReduce, m.interBcast) = measureRootOps(*groups.inter, setup);
    m.hasInter = true;
  }
  m.pushPull = measurePushPull(*worker, topo, setup);
  measureCodec(o.codec, m);
  {
    auto v = world.mean({m.intra.alphaUs, m.intra.gbps, m.inter.alphaUs, m.inter.gbps,
                         m.pushPull.alphaUs, m.pushPull.gbps, m.encodeAlpha, m.encodeBeta,
                         m.decodeAlpha, m.decodeBeta, m.sumGbps, m.intraReduce.alphaUs,
                         m.intraReduce.gbps, m.intraBcast.alphaUs, m.intraBcast.gbps,
                         m.interReduce.alphaUs, m.interReduce.gbps, m.interBcast.alphaUs,
                         m.interBcast.gbps});
    m.intraReduce = {v[11], v[12]};
    m.intraBcast = {v[13], v[14]};
    m.interReduce = {v[15], v[16]};
    m.interBcast = {v[17], v[18]};
    m.intra = {v[0], v[1]};
    m.inter = {v[2], v[3]};
    m.pushPull = {v[4], v[5]};
    m.encodeAlpha = v[6], m.encodeBeta = v[7], m.decodeAlpha = v[8], m.decodeBeta = v[9];
    m.sumGbps = v[10];
  }
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const int cpuCores = o.cpuCores > 0 ? o.cpuCores : std::max(1, hw / std::max(1, topo.numMachines));

  // 2. Plans and predictions on rank 0, plans to everybody.
  std::vector<Prediction> preds;
  std::string costNote, err;
  if (lead) {
    try {
      preds = predict(o, profile, topo, m, cpuCores, job.partitionBytes, &costNote);
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
               "ms), {} iterations after {} warm-up\n# measured {}\n",
               profile.model, T, totalElements / 1e6, o.codec, topo.size, topo.numMachines,
               topo.localSize, worker->numServers(), o.computeScale, profile.forwardUs / 1e3,
               profile.backwardUs() / 1e3, o.iterations, o.warmup, costNote);
    std::fflush(stdout);
  }
  std::vector<std::vector<float>> pat(T), buf(T);
  for (size_t j = 0; j < T; ++j) {
    const auto& t = profile.tensors[j];
    ex.declare(t.name, DType::kFloat32, uint64_t(t.elements));
    pat[j].resize(size_t(t.elements));
    buf[j].resize(size_t(t.elements));
    for (uint64_t i = 0; i < uint64_t(t.elements); ++i) pat[j][i] = pattern(j, i);
  }
  const bool progressOn = lead && (o.progress || isatty(2));
  const double sumFactor = double(topo.size) * (topo.size + 1) / 2.0;
  std::vector<Result> results;
  // Tensors that were lossy under the strategy before: setPlan() retires
  // their encode points and folds the residuals into the next input too.
  std::vector<bool> compressedBefore(T, false);
  for (size_t si = 0; si < o.strategies.size(); ++si) {
    const plan::Plan p = plan::planFromJsonString(planJson[si]);
    ex.setPlan(p, opDeadline);
    Result r;
    r.strategy = o.strategies[si];
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
    // the scheduler's first complete window plans (switch at warm-up +
    // window + CORTADO_REPLAN_AHEAD); o.iterations are measured after the
    // switch. No switch by `cap` iterations fails the strategy.
    const bool replan = r.strategy == "replan";
    int cap = o.warmup + o.iterations;
    if (replan) {
      executor::OnlineOptions ol = executor::onlineOptions(job);
      ol.warmup = uint64_t(std::max(1, o.warmup));
      ex.setOnline(ol);
      cap = int(ol.warmup + 3 * ol.window + job.replanAhead) + 5;
    }
    r.planVersion = p.version;
    Progress bar(progressOn, replan ? cap + o.iterations : o.warmup + o.iterations);
    std::vector<double> times;
    for (int it = 0;; ++it) {
      if (!replan && it >= o.warmup + o.iterations) break;
      if (replan) {
        if (r.switchedAt >= 0 && it - r.switchedAt >= o.iterations) break;
        // Every worker switches at the same iteration, so all stop together.
        CORTADO_ENFORCE(r.switchedAt >= 0 || it < cap, ErrorCode::kTimeout,
                        "--strategies replan: no new plan by iteration {} (profiling windows of {} "
                        "iterations after {} warm-up, CORTADO_REPLAN_AHEAD {}): the scheduler "
                        "handed out none; see its log for the re-planning error",
                        it, job.profileWindow, std::max(1, o.warmup), job.replanAhead);
        ex.beginIteration(uint64_t(it), opDeadline);
        if (ex.currentPlan().version != r.planVersion) {
          if (r.switchedAt < 0) r.switchedAt = it;
          r.planVersion = ex.currentPlan().version;
          const std::vector<bool> before = exact;
          for (size_t j = 0; j < T; ++j) tainted[j] = tainted[j] || !before[j];
          classify(ex.currentPlan());
          for (size_t j = 0; j < T; ++j) folding[j] = !before[j];
        }
      }
      const float f = factor(topo.rank, it);
      for (size_t j = 0; j < T; ++j)
        for (size_t i = 0; i < buf[j].size(); ++i) buf[j][i] = f * pat[j][i];
      world.barrier();
      const auto t0 = Clock::now();
      double readyUs = profile.forwardUs;
      const double traceT0 = Tracer::now();
      for (size_t j = 0; j < T; ++j) {
        const auto& t = profile.tensors[j];
        const double prevReady = readyUs;
        readyUs += t.backwardUs;
        std::this_thread::sleep_until(t0 + std::chrono::nanoseconds(int64_t(readyUs * 1e3)));
        // The executor's iteration is the tensor's run count: the same here.
        if (tracer->enabled() && t.backwardUs > 0)
          tracer->record("backward", t.name, int64_t(ex.runs(t.name)), "gpu",
                         traceT0 + prevReady, traceT0 + readyUs);
        ex.run(t.name, buf[j].data(), buf[j].data(), buf[j].size(), ReduceOp::kSum, opDeadline);
      }
      const double secs = secondsSince(t0);
      if (replan ? r.switchedAt >= 0 : it >= o.warmup) times.push_back(secs);
      const float want = float(sumFactor * (1 + it % 3));
      for (size_t j = 0; j < T; ++j) {
        if (!exact[j] || folding[j]) continue;
        r.checked += buf[j].size();
        for (size_t i = 0; i < buf[j].size(); ++i) r.wrong += buf[j][i] != want * pat[j][i];
      }
      std::fill(folding.begin(), folding.end(), false);
      bar.update(r.strategy, it + 1, secs * 1e3);
    }
    bar.done();
    for (size_t j = 0; j < T; ++j) {
      // Lossless codecs on this data (fp16 of integers) leave zero residuals.
      const auto& opt = ex.currentPlan().tensors.at(profile.tensors[j].name);
      compressedBefore[j] = opt.compressed() && !losslessFor(opt.codec);
    }
    if (replan) ex.setOnline({});  // no later plan may replace the next strategy's
    times = world.max(times);  // an iteration ends when the last worker is done
    double sum = 0, sq = 0;
    for (double t : times) sum += t, sq += t * t;
    const double n = double(times.size());
    r.meanMs = sum / n * 1e3;
    r.stdMs = std::sqrt(std::max(0.0, sq / n - (sum / n) * (sum / n))) * 1e3;
    r.minMs = *std::min_element(times.begin(), times.end()) * 1e3;
    auto wrong = world.mean({double(r.wrong), double(r.checked)});
    r.wrong = uint64_t(std::llround(wrong[0] * topo.size));
    r.checked = uint64_t(std::llround(wrong[1] * topo.size));
    if (lead) {
      r.predictedMs = preds[si].predictedUs / 1e3;
      r.options = preds[si].options;
      if (replan) {
        // The scheduler's plan was made from its own fits, which this
        // benchmark's simulator does not have: no prediction for it.
        r.predictedMs = 0;
        std::map<std::string, int> count;
        int compressed = 0;
        for (const auto& [name, opt] : ex.currentPlan().tensors) {
          ++count[opt.describe() + (opt.codec.empty() ? "" : " " + opt.codec)];
          compressed += opt.compressed();
        }
        r.options = fmt::format("offline plan (version {}), then version {} from iteration {}: {}",
                                p.version, r.planVersion, r.switchedAt,
                                count.size() == 1
                                    ? count.begin()->first
                                    : fmt::format("{} distinct options, {} of {} tensors compressed",
                                                  count.size(), compressed, T));
      }
      const double errPct = r.predictedMs > 0 ? 100.0 * (r.predictedMs - r.meanMs) / r.meanMs : 0;
      const std::string check = r.wrong ? fmt::format("WRONG ({} of {})", r.wrong, r.checked)
                                : r.lossyTensors == T ? "lossy"
                                : fmt::format("exact ({} lossy tensors)", r.lossyTensors);
      if (o.json) {
        json jr = {{"model", profile.model}, {"codec", o.codec}, {"strategy", r.strategy},
                   {"measured_ms", r.meanMs}, {"stdev_ms", r.stdMs}, {"min_ms", r.minMs},
                   {"predicted_ms", r.predictedMs}, {"error_pct", errPct},
                   {"overlapped_ms", preds[si].overlappedUs / 1e3},
                   {"iterations", o.iterations}, {"workers", topo.size},
                   {"machines", topo.numMachines}, {"compute_scale", o.computeScale},
                   {"checked_elements", r.checked}, {"wrong_elements", r.wrong},
                   {"lossy_tensors", r.lossyTensors}, {"options", r.options}};
        if (replan) {
          jr["predicted_ms"] = nullptr;
          jr["overlapped_ms"] = nullptr;
          jr["error_pct"] = nullptr;
          jr["plan_version"] = r.planVersion;
          jr["switched_at"] = r.switchedAt;
        }
        fmt::print("{}\n", jr.dump());
      } else {
        if (si == 0)
          fmt::print("| strategy | measured ms | stdev | predicted ms | error | check | options |\n"
                     "|---|---|---|---|---|---|---|\n");
        if (replan)
          fmt::print("| {} | {:.1f} | {:.1f} | - | - | {} | {} |\n", r.strategy, r.meanMs, r.stdMs,
                     check, r.options);
        else
          fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:+.1f}% | {} | {} |\n", r.strategy,
                     r.meanMs, r.stdMs, r.predictedMs, errPct, check, r.options);
      }
      std::fflush(stdout);
    }
    results.push_back(r);
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
