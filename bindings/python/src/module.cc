// cortado._C: the pybind11 core of the Python package. It wraps one worker
// engine (core/worker.h) per process in a Runtime object that the Python
// layer (cortado/__init__.py, cortado/torch) owns; there is no global state
// here besides the exception type.
//
// Threads and the GIL (STYLE.md §12)
// - Every call that can block (start, declare, wait, barrier, shutdown) runs
//   with the GIL released; waits are sliced so that Ctrl-C still interrupts.
// - The engine's threads never touch a Python object. The buffers of a
//   push_pull stay alive through a Python reference ("keepalive") that the
//   Runtime and the operation's handle hold until the operation completed
//   (dropped by the handle's successful wait, or else by the next push_pull);
//   those references are only created, inspected and dropped by methods that
//   hold the GIL. References of failed operations are kept until the Runtime
//   closes, because a failed handle can complete while the transport may
//   still read the input.
//
// Errors: cortado::Error (and a failed Status) become cortado.CortadoError
// with the engine's message and a `code` attribute ("timeout", "peer_dead",
// "mismatch", ...).
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "core/backends.h"
#include "core/common/env.h"
#include "core/common/logging.h"
#include "core/common/malloc_tuning.h"
#include "core/config.h"
#include "core/executor/executor.h"
#include "core/plan/plan.h"
#include "core/worker.h"
#include "compressor/registry.h"
#include "cortado/config.h"
#if CORTADO_MPI
#include "core/collective/mpi/factory.h"
#endif
#include "scheduler/planner/gravac_plan.h"
#include "scheduler/planner/report.h"

namespace py = pybind11;

namespace cortado::python {

// cortado._C.Gravac (gravac_module.cc).
void bindGravac(py::module_& m, const compressor::Registry& registry);
// One GraVAC decision as a dict (gravac_module.cc).
py::dict gravacStepDict(const compressor::GravacStep& s);
// GraVAC's settings from the keyword arguments that Gravac() and the
// executor's GraVAC take (gravac_module.cc); throws on an unknown policy.
compressor::GravacOptions gravacOptions(const std::string& codec, double minRatio, double maxRatio,
                                        double step, const std::string& policy, uint64_t window,
                                        double epsilon, double omega, double alpha, uint64_t seed);

namespace {

// The Python exception type; created once when the module is imported.
PyObject* gErrorType = nullptr;

const char* codeName(ErrorCode c) {
  switch (c) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerDead: return "peer_dead";
    case ErrorCode::kProtocol: return "protocol";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kClosed: return "closed";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

// Sets cortado.CortadoError(message) with .code; the GIL is held.
void setPythonError(ErrorCode code, const std::string& message) {
  py::object type = py::reinterpret_borrow<py::object>(gErrorType);
  py::object exc = type(message);
  exc.attr("code") = codeName(code);
  PyErr_SetObject(gErrorType, exc.ptr());
}

// Calls `waitSlice(slice)` without the GIL, in slices of at most 200 ms,
// until it returns true (done) or `deadline` passes (returns false), and
// between slices lets signals (Ctrl-C) through. Called with the GIL held.
template <typename F>
bool waitInSlices(Deadline deadline, F&& waitSlice) {
  constexpr Millis kSlice{200};
  for (;;) {
    bool done;
    {
      py::gil_scoped_release nogil;
      done = waitSlice(std::min(kSlice, deadline.remaining()));
    }
    if (done) return true;
    if (deadline.expired()) return false;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

// Waits for `h` until `deadline` (waitInSlices). Called with the GIL held.
Status waitInterruptibly(const Handle& h, Deadline deadline) {
  Status s;
  waitInSlices(deadline, [&](Millis slice) {
    s = h.wait(Deadline::after(slice));
    if (s.code() == ErrorCode::kTimeout && !deadline.expired() && h.poll())
      s = h.wait(Deadline::after(Millis(0)));
    return s.code() != ErrorCode::kTimeout;
  });
  return s;
}

Deadline deadlineFromSeconds(std::optional<double> timeout, Millis fallback) {
  if (!timeout) return Deadline::after(fallback);
  if (*timeout <= 0) return Deadline::after(Millis(0));
  // Cap at a year: "forever" without overflowing the clock.
  double ms = std::min(*timeout * 1000.0, 365.0 * 24 * 3600 * 1000);
  return Deadline::after(Millis(static_cast<int64_t>(ms)));
}

// The Python objects that own one operation's buffers, shared by the
// Runtime's list of operations in flight and the operation's PyHandle. Only
// touched with the GIL held (its last owner may drop it anywhere the GIL is).
struct Keepalive {
  py::object owner;
};

// One push_pull in flight, as seen from Python.
class PyHandle {
 public:
  PyHandle(Handle h, Millis defaultTimeout, std::shared_ptr<Keepalive> keep)
      : h_(std::move(h)), defaultTimeout_(defaultTimeout), keep_(std::move(keep)) {}

  const std::string& name() const { return h_.tensorName(); }
  bool poll() const { return h_.poll(); }

  // Returns when the operation completed; raises CortadoError when it
  // failed, or with code "timeout" when `timeout` seconds passed first
  // (None: the job's CORTADO_TIMEOUT_MS). On success the operation's
  // buffers are let go here, not at the next push_pull: a caller that
  // hands a fresh tensor every step then frees each one before it allocates
  // the next, and the allocator reuses the memory instead of growing the
  // heap and faulting in new pages (docs/python.md, "Fresh tensors").
  // Called with the GIL held.
  void wait(std::optional<double> timeout) const {
    Status s = waitInterruptibly(h_, deadlineFromSeconds(timeout, defaultTimeout_));
    if (s.ok() && keep_) keep_->owner = py::object();
    s.check();
  }

  // Whether the handle still holds its operation's buffers (for tests).
  bool holdsBuffers() const { return keep_ && keep_->owner; }

 private:
  Handle h_;
  Millis defaultTimeout_;
  std::shared_ptr<Keepalive> keep_;
};

class Runtime {
 public:
  // Joins the job described by the CORTADO_* environment (as `cortado
  // launch` sets it). Blocks (without the GIL) until registered.
  static std::unique_ptr<Runtime> start(std::optional<double> connectTimeout) {
    auto rt = std::make_unique<Runtime>();
    JobConfig job = readJobConfig(true);
    CORTADO_ENFORCE(job.role == Role::kWorker, ErrorCode::kInvalidArgument,
                    "cortado.init() runs in a worker, but CORTADO_ROLE is {}", roleName(job.role));
    setupLogging(fmt::format("worker {}", job.rank), job.logLevel);
    // Before the training allocates its tensors (core/common/malloc_tuning.h).
    rt->malloc_ = keepFreedMemory(job.mallocKeepBytes);
    CORTADO_LOG_INFO("worker {}: malloc {}", job.rank, rt->malloc_.detail);
    Deadline deadline = deadlineFromSeconds(connectTimeout, job.connectTimeout);
    {
      py::gil_scoped_release nogil;
      rt->worker_ = startWorker(job, deadline);
    }
    rt->job_ = job;
    // One machine per job today: the local group is the whole job unless the
    // caller (a multi-machine launcher) says otherwise.
    rt->localRank_ = rt->worker_->rank();
    rt->localSize_ = rt->worker_->size();
    if (auto v = getEnvInt({"CORTADO_LOCAL_RANK", "BYTEPS_LOCAL_RANK", "HOROVOD_LOCAL_RANK"}))
      rt->localRank_ = int(*v);
    if (auto v = getEnvInt({"CORTADO_LOCAL_SIZE", "BYTEPS_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE"}))
      rt->localSize_ = int(*v);
    return rt;
  }

  ~Runtime() {
    try {
      close();
    } catch (const std::exception& e) {  // a destructor must not throw
      CORTADO_LOG_ERROR("cortado: closing the worker: {}", e.what());
    }
  }

  Worker& worker() const {
    CORTADO_ENFORCE(worker_ != nullptr, ErrorCode::kClosed,
                    "cortado was shut down: call cortado.init() in a new process");
    return *worker_;
  }

  int rank() const { return worker().rank(); }
  int size() const { return worker().size(); }
  int numServers() const { return worker().numServers(); }
  uint64_t pushedBytes() const { return worker().pushedBytes(); }
  uint64_t pulledBytes() const { return worker().pulledBytes(); }
  int localRank() const { return localRank_; }
  int localSize() const { return localSize_; }
  double timeoutSeconds() const { return job_.opTimeout.count() / 1000.0; }

  // `codec`: "" (uncompressed) or a registry spec that the engine encodes
  // with, keeping error-feedback residuals here when `errorFeedback`.
  // `sparse`: a Zen tensor (TensorOptions::sparse; docs/zen.md).
  uint64_t declare(const std::string& name, const std::string& dtype, uint64_t count,
                   std::optional<double> timeout, const std::string& codec, bool errorFeedback,
                   bool sparse) {
    DType t = parseDType(dtype);
    Worker& w = worker();
    Deadline d = deadlineFromSeconds(timeout, job_.opTimeout);
    TensorOptions options;
    options.codec = codec;
    options.errorFeedback = errorFeedback;
    options.sparse = sparse;
    py::gil_scoped_release nogil;
    return w.declare(name, t, count, options, d);
  }

  bool isDeclared(const std::string& name) const { return worker().isDeclared(name); }
  bool isReleased(const std::string& name) const { return worker().isReleased(name); }

  void release(const std::string& name) {
    Worker& w = worker();
    py::gil_scoped_release nogil;
    w.release(name);
  }

  // A started operation's handle for Python: `keepalive` (what owns the
  // operation's memory) is held until it completed, also when Python drops
  // the handle first (prune()).
  PyHandle track(const Handle& h, py::object keepalive) {
    auto keep = std::make_shared<Keepalive>(Keepalive{std::move(keepalive)});
    inflight_.push_back({h, keep});
    return PyHandle(h, job_.opTimeout, std::move(keep));
  }

  // Raw pointers: `input` and `output` hold `count` elements of `dtype`;
  // `keepalive` owns that memory and is held until the operation completed.
  PyHandle pushPull(const std::string& name, const std::string& dtype, uint64_t count,
                    uintptr_t input, uintptr_t output, bool average, int priority,
                    py::object keepalive) {
    prune();
    DType t = parseDType(dtype);
    Worker& w = worker();
    Handle h;
    {
      py::gil_scoped_release nogil;
      h = w.pushPull(name, t, count, reinterpret_cast<const void*>(input),
                     reinterpret_cast<void*>(output),
                     average ? ReduceOp::kAverage : ReduceOp::kSum, priority);
    }
    return track(h, std::move(keepalive));
  }

  // A sparse tensor's pairs: `count` u32 indices and f32 values (read before
  // this returns) and an output of the declared count of f32, which
  // `keepalive` owns until the operation completed.
  PyHandle pushPullSparse(const std::string& name, uintptr_t indices, uintptr_t values,
                          uint64_t count, uintptr_t output, bool average, int priority,
                          py::object keepalive) {
    prune();
    Worker& w = worker();
    SparseInput in;
    in.indices = reinterpret_cast<const uint32_t*>(indices);
    in.values = reinterpret_cast<const float*>(values);
    in.count = count;
    Handle h;
    {
      py::gil_scoped_release nogil;
      h = w.pushPullSparse(name, in, reinterpret_cast<float*>(output),
                           average ? ReduceOp::kAverage : ReduceOp::kSum, priority);
    }
    return track(h, std::move(keepalive));
  }

  // Buffer protocol: C-contiguous `input` and writable `output` (may be the
  // same object) of one format and length. Declares the name on first use.
  PyHandle pushPullBuffer(const std::string& name, const py::buffer& input,
                          const py::buffer& output, bool average, int priority) {
    auto in = std::make_shared<py::buffer_info>(input.request());
    auto out = std::make_shared<py::buffer_info>(output.request(true));
    const std::string dtype = formatToDType(in->format, in->itemsize, "input");
    const std::string outType = formatToDType(out->format, out->itemsize, "output");
    CORTADO_ENFORCE(dtype == outType, ErrorCode::kInvalidArgument,
                    "push_pull of '{}': input is {} but output is {}", name, dtype, outType);
    CORTADO_ENFORCE(in->size == out->size, ErrorCode::kInvalidArgument,
                    "push_pull of '{}': input has {} elements but output has {}", name, in->size,
                    out->size);
    checkContiguous(*in, name, "input");
    checkContiguous(*out, name, "output");
    const auto count = static_cast<uint64_t>(in->size);
    if (!worker().isDeclared(name)) declare(name, dtype, count, std::nullopt, "", false, false);
    // The buffer views pin the memory (a bytearray cannot be resized while
    // viewed); they are released with the keepalive, under the GIL.
    using Views = std::pair<std::shared_ptr<py::buffer_info>, std::shared_ptr<py::buffer_info>>;
    py::capsule views(new Views(in, out), [](void* p) { delete static_cast<Views*>(p); });
    py::object keep = py::make_tuple(input, output, views);
    return pushPull(name, dtype, count, reinterpret_cast<uintptr_t>(in->ptr),
                    reinterpret_cast<uintptr_t>(out->ptr), average, priority, std::move(keep));
  }

  void barrier(std::optional<double> timeout) {
    Worker& w = worker();
    Deadline d = deadlineFromSeconds(timeout, job_.opTimeout);
    py::gil_scoped_release nogil;
    w.barrier(d);
  }

  // None when healthy, else (code, message) of the first failure.
  std::optional<std::pair<std::string, std::string>> failure() const {
    if (!worker_) return std::nullopt;
    Status s = worker_->failure();
    if (s.ok()) return std::nullopt;
    return std::make_pair(std::string(codeName(s.code())), s.message());
  }

  // Orderly end: tells the scheduler this worker is done, waits for the
  // job's shutdown, closes. Safe to call twice.
  void shutdown(std::optional<double> timeout) {
    if (!worker_) return;
    Deadline d = deadlineFromSeconds(timeout, job_.opTimeout);
    auto hooks = std::exchange(closeHooks_, {});
    {
      py::gil_scoped_release nogil;
      for (auto& [id, stop] : hooks) stop(false);
      worker_->shutdown(d);
      worker_.reset();
#if CORTADO_MPI
      mpi_.reset();  // MPI_Finalize, after the executors' groups went (their hooks)
#endif
    }
    inflight_.clear();
  }

  // Abrupt end (an uncaught exception): closes without telling the scheduler
  // that this worker finished, so the others fail fast instead of waiting.
  void close() {
    if (worker_) {
      auto hooks = std::exchange(closeHooks_, {});
      py::gil_scoped_release nogil;
      for (auto& [id, stop] : hooks) stop(true);
      worker_.reset();
#if CORTADO_MPI
      // No MPI_Finalize on an abrupt end: it may wait for a peer that died;
      // mpirun ends the job's ranks when this process exits.
      (void)mpi_.release();
#endif
    }
    inflight_.clear();
  }

#if CORTADO_MPI
  // MPI in this process, initialized on first use (the plan executor's
  // collective groups) and finalized by shutdown().
  collective::mpi::Runtime& mpi() {
    worker();  // not after shutdown: MPI cannot be initialized again
    if (!mpi_) mpi_ = std::make_unique<collective::mpi::Runtime>();
    return *mpi_;
  }
#endif

  // What must stop before the worker goes (an executor's thread): run by
  // shutdown() (argument false: let the submitted work finish) and close()
  // (true: abort it) without the GIL, once. Called with the GIL.
  uint64_t addCloseHook(std::function<void(bool)> stop) {
    closeHooks_[++lastHook_] = std::move(stop);
    return lastHook_;
  }
  void removeCloseHook(uint64_t id) { closeHooks_.erase(id); }

  // What cortado.init() did to malloc: (applied, what or why not).
  std::pair<bool, std::string> mallocTuning() const { return {malloc_.applied, malloc_.detail}; }

  bool closed() const { return worker_ == nullptr; }
  size_t inflightCount() const { return inflight_.size(); }

 private:
  struct Inflight {
    Handle handle;
    std::shared_ptr<Keepalive> keep;
  };

  // Drops the references of operations that completed successfully.
  void prune() {
    std::erase_if(inflight_, [](const Inflight& f) {
      return f.handle.poll() && f.handle.wait(Deadline::after(Millis(0))).ok();
    });
  }

  static std::string formatToDType(const std::string& format, py::ssize_t itemsize,
                                   const char* which) {
    // Struct-module codes, with an optional byte-order prefix.
    std::string f = format;
    if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@' || f[0] == '!' || f[0] == '>')) {
      CORTADO_ENFORCE(f[0] != '>' && f[0] != '!', ErrorCode::kInvalidArgument,
                      "{} buffer is big-endian ('{}'); convert it to native order", which, format);
      f = f.substr(1);
    }
    if (f == "f" && itemsize == 4) return "float32";
    if (f == "d" && itemsize == 8) return "float64";
    if (f == "e" && itemsize == 2) return "float16";
    if ((f == "i" || f == "l" || f == "q") && itemsize == 4) return "int32";
    if ((f == "i" || f == "l" || f == "q") && itemsize == 8) return "int64";
    if (f == "B" && itemsize == 1) return "uint8";
    if (f == "b" && itemsize == 1) return "int8";
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} buffer has element format '{}' ({} bytes), which Cortado does "
                            "not sum: supported are float32, float64, float16, int32, int64, "
                            "uint8, int8 (bfloat16 through raw pointers, as cortado.torch does)",
                            which, format, itemsize));
  }

  static void checkContiguous(const py::buffer_info& b, const std::string& name,
                              const char* which) {
    py::ssize_t expect = b.itemsize;
    for (py::ssize_t d = b.ndim - 1; d >= 0; --d) {
      if (b.shape[d] != 1 && b.strides[d] != expect)
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("push_pull of '{}': the {} is not C-contiguous (strides {}); "
                                "pass a contiguous copy (numpy.ascontiguousarray)",
                                name, which, fmt::join(b.strides, ", ")));
      expect *= b.shape[d];
    }
  }

  // Declared first, destroyed last: the keepalives outlive the worker.
  std::vector<Inflight> inflight_;
  std::unique_ptr<Worker> worker_;
  std::map<uint64_t, std::function<void(bool)>> closeHooks_;
  uint64_t lastHook_ = 0;
  JobConfig job_;
  MallocTuning malloc_;
#if CORTADO_MPI
  std::unique_ptr<collective::mpi::Runtime> mpi_;
#endif
  int localRank_ = 0;
  int localSize_ = 1;
};

// The plan executor (core/executor/executor.h) over a Runtime's worker: each tensor
// runs its plan option (BytePS's default, a CORTADO_PLAN file, a plan set
// from Python, or the scheduler's plans with online re-planning). Workers
// started under mpirun (`cortado launch --mpi`) get MPI's collective groups
// (makeGroups), so every option of the planner's tree runs: flat and
// hierarchical collectives, push/pull with the intra-machine steps around
// it. Without mpirun every worker is its machine's only worker and plans use
// push/pull through the servers (with or without compression); plans with
// collectives are refused naming the tensor. run() is synchronous and
// releases the GIL while it runs.
class PyExecutor {
 public:
  explicit PyExecutor(Runtime& rt)
      : rt_(rt), job_(readJobConfig(false)), groups_(makeGroups(rt, job_)),
        device_(makeExecutorDevice(job_, groups_.get())),
        ex_(std::make_unique<executor::Executor>(rt.worker(), groups_.get(), nullptr,
                                                 job_.planFile, device_)) {
    ex_->setFusionBytes(job_.fusionBytes);  // CORTADO_FUSION_BYTES
    ex_->setPhaseBytes(job_.phaseBytes);    // CORTADO_PHASE_BYTES
    ex_->setCompactSparse(job_.compactSparse);  // CORTADO_COMPACT_SPARSE
    ex_->setCodecThreads(executor::codecThreadsFor(job_, ex_->topology().localSize));  // CORTADO_CODEC_THREADS
    // CORTADO_TRACE_DIR (cortado launch --trace): the executor's stages,
    // GraVAC's among them, as a bench model worker records them.
    tracer_ = std::make_shared<Tracer>(TraceOptions::fromEnv(fmt::format("worker {}", rt.rank())));
    if (tracer_->enabled()) ex_->setTracer(tracer_);
    // cortado.shutdown() (or an abrupt close) stops the thread before the
    // worker it runs on goes, and writes the trace of what it ran.
    hook_ = rt_.addCloseHook([this](bool abort) {
      stopThread(abort);
      flushTrace();
      if (groups_) {
        // The groups' communicators (MPI's, the device's NCCL ones) go
        // before MPI is finalized (shutdown()).
        std::lock_guard<std::mutex> lk(exMu_);
        ex_.reset();
        device_.reset();
        groups_.reset();
      }
    });
  }

  // The collective groups of a worker started under mpirun (`cortado
  // launch --mpi`): MPI's world of the job's workers, split into machines
  // by the host they run on (CORTADO_FAKE_HOST_SIZE emulates machines on one
  // host). Null without mpirun, with CORTADO_EXECUTOR_MPI=0, or in a build
  // without MPI: push/pull plans only. Collective over the workers.
  static std::unique_ptr<collective::Groups> makeGroups(Runtime& rt, const JobConfig& job) {
    const bool underMpirun = getEnvInt({"OMPI_COMM_WORLD_SIZE"}).has_value();
    if (!underMpirun || !getEnvBool({"CORTADO_EXECUTOR_MPI"}).value_or(true))
      return nullptr;
#if CORTADO_MPI
    collective::mpi::Runtime& mpi = rt.mpi();
    CORTADO_ENFORCE(mpi.worldSize() == rt.size() && mpi.worldRank() == rt.rank(),
                    ErrorCode::kInvalidArgument,
                    "the plan executor's MPI world (rank {} of {}) is not the job's workers "
                    "(worker {} of {}): start the workers alone under one mpirun (`cortado "
                    "launch --mpi`), or set CORTADO_EXECUTOR_MPI=0 for push/pull plans only",
                    mpi.worldRank(), mpi.worldSize(), rt.rank(), rt.size());
    py::gil_scoped_release nogil;
    return std::make_unique<collective::Groups>(collective::mpi::createGroups(
        mpi, collective::mpi::Options::fromEnv(), Deadline::after(job.connectTimeout)));
#else
    (void)rt;
    (void)job;
    CORTADO_LOG_WARN("the plan executor runs push/pull plans only: this build has no MPI "
                     "(configure with -DCORTADO_WITH_MPI=ON where OpenMPI is installed)");
    return nullptr;
#endif
  }

  // CORTADO_DEVICE=cuda: the CUDA device (NCCL groups over the MPI groups'
  // topology, the CUDA codecs); its buffers are CUDA memory (torch's CUDA
  // tensors). Null for host: the executor makes the host device.
  static std::shared_ptr<device::Device> makeExecutorDevice(const JobConfig& job,
                                                            const collective::Groups* groups) {
    if (device::parseKind(job.device) == device::Kind::kHost) return nullptr;
    py::gil_scoped_release nogil;  // collective: the NCCL id's broadcast
    return makeDevice(job, groups, nullptr, Deadline::after(job.connectTimeout));
  }

  // "host" or "cuda": where run()'s and submit()'s buffers must live.
  std::string device() { return device::kindName(ex().device().kind()); }

  // Whether this executor has collective groups, and where this worker is.
  bool collectives() const { return groups_ != nullptr; }
  py::dict topology() {
    const collective::Topology& t = ex().topology();
    py::dict d;
    d["rank"] = t.rank;
    d["size"] = t.size;
    d["machine"] = t.machine;
    d["machines"] = t.numMachines;
    d["local_rank"] = t.localRank;
    d["local_size"] = t.localSize;
    return d;
  }

  // The submitted runs finish first (within their deadlines).
  ~PyExecutor() {
    rt_.removeCloseHook(hook_);
    try {
      py::gil_scoped_release nogil;
      stopThread(false);
    } catch (const std::exception& e) {  // releasing the GIL failed: stop with it held
      CORTADO_LOG_WARN("plan executor: {}", e.what());
      stopThread(false);
    }
    flushTrace();
  }

  void declare(const std::string& name, uint64_t count) {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    e.declare(name, DType::kFloat32, count);
  }

  void setPlan(const std::string& json, std::optional<double> timeout) {
    plan::Plan p = plan::planFromJsonString(json);
    Deadline d = deadlineFromSeconds(timeout, job_.opTimeout);
    drain(d);
    auto& e = ex();
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(exMu_);
    e.setPlan(p, d);
  }

  std::string planJson() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    return e.hasPlan() ? plan::toJsonString(e.currentPlan()) : std::string();
  }
  uint64_t planVersion() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    return e.hasPlan() ? e.currentPlan().version : 0;
  }

  // Online re-planning as the job asks for it (CORTADO_PROFILE_WINDOW);
  // returns the window (0: off).
  uint64_t enableOnline() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    e.setOnline(executor::onlineOptions(job_));
    return job_.profileWindow;
  }

  // Waits for the submitted runs first (their errors are raised here).
  void beginIteration(uint64_t iteration, std::optional<double> timeout) {
    Deadline d = deadlineFromSeconds(timeout, job_.opTimeout);
    drain(d);
    auto& e = ex();
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(exMu_);
    e.beginIteration(iteration, d);
  }

  // `input` and `output` hold `count` float32 values (may be the same).
  // Waits for the submitted runs first, so that every worker runs its
  // tensors in the order it handed them over.
  void run(const std::string& name, uint64_t count, uintptr_t input, uintptr_t output,
           bool average, std::optional<double> timeout) {
    Deadline d = deadlineFromSeconds(timeout, job_.opTimeout);
    drain(d);
    auto& e = ex();
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(exMu_);
    e.run(name, reinterpret_cast<const float*>(input), reinterpret_cast<float*>(output), count,
          average ? ReduceOp::kAverage : ReduceOp::kSum, d);
  }

  // Queues the same run on the executor's own thread and returns at once:
  // runs go in submission order, in batches of what is queued when the
  // thread is free (serve()), each batch with the job's operation deadline
  // (CORTADO_TIMEOUT_MS), while the caller goes on (the optimizer's hooks
  // during the backward pass). The gradient counts as
  // ready now (online profiling). The buffers must stay alive and unchanged
  // until wait() returns.
  void submit(const std::string& name, uint64_t count, uintptr_t input, uintptr_t output,
              bool average) {
    ex();
    {
      std::lock_guard<std::mutex> lk(qmu_);
      CORTADO_ENFORCE(!stop_, ErrorCode::kClosed,
                      "the plan executor was stopped (cortado was shut down): tensor '{}' not run",
                      name);
    }
    executor::BatchItem item{name, reinterpret_cast<const float*>(input),
                             reinterpret_cast<float*>(output), count,
                             std::chrono::steady_clock::now()};
    std::lock_guard<std::mutex> lk(qmu_);
    queue_.push_back({std::move(item), average ? ReduceOp::kAverage : ReduceOp::kSum});
    ++pending_;
    if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
    qcv_.notify_all();
  }

  // Returns when every submitted run has finished. Raises the first one's
  // error (the runs queued after it are not run: a failed step leaves the
  // executor's keys mid-round), or "timeout" when `timeout` seconds passed
  // first (None: the job's CORTADO_TIMEOUT_MS per run still queued).
  void wait(std::optional<double> timeout) {
    size_t pending;
    {
      std::lock_guard<std::mutex> lk(qmu_);
      pending = pending_;
    }
    drain(timeout ? deadlineFromSeconds(timeout, job_.opTimeout)
                  : Deadline::after(queueTime(pending)));
  }

  // GraVAC (Executor::setGravac): every submitted batch is held until it
  // holds each declared tensor once (one iteration, serve()).
  void enableGravac(const std::string& codec, double minRatio, double maxRatio, double step,
                    const std::string& policy, uint64_t window, double epsilon, double omega,
                    double alpha, uint64_t seed, double samples) {
    const compressor::GravacOptions o = gravacOptions(codec, minRatio, maxRatio, step, policy,
                                                      window, epsilon, omega, alpha, seed);
    auto& e = ex();
    size_t declared = 0;
    {
      std::lock_guard<std::mutex> lk(exMu_);
      e.setGravac(o, samples);
      declared = e.declaredCount();
    }
    std::lock_guard<std::mutex> lk(qmu_);
    gravacIteration_ = declared;
  }
  py::list gravacHistory() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    py::list out;
    const auto& steps = e.gravacHistory();
    const auto& bytes = e.gravacBytes();
    for (size_t i = 0; i < steps.size(); ++i) {
      py::dict d = gravacStepDict(steps[i]);
      d["bytes"] = i < bytes.size() ? bytes[i] : 0;  // pushed to the servers in that step
      d["previous_seconds"] = e.gravacSeconds()[i];  // 0: not timed (the first, a pause)
      out.append(d);
    }
    return out;
  }
  // Executor::excludeGravacPause: the time up to the next iteration is a pause.
  void gravacExcludePause() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    e.excludeGravacPause();
  }
  // GraVAC's re-plans by the Espresso planner (planner::gravacReplanner) on
  // a profile of the parameters: `machines` one-worker machines with CPU
  // servers, push/pull options only (this executor has no MPI groups).
  void setGravacPlanner(const std::string& profile, int machines, const std::string& intra,
                        const std::string& inter, int cpuCores, const std::string& dataDir) {
    planner::PlanConfig cfg;
    cfg.model = profile;
    cfg.machines = machines;
    cfg.gpusPerMachine = 1;
    cfg.intra = intra;
    cfg.inter = inter;
    cfg.cpuCores = cpuCores;
    cfg.parameterServer = true;
    cfg.pushPullOnly = true;
    cfg.dataDir = dataDir;
    planner::PlanAtRatio r;
    {
      py::gil_scoped_release nogil;
      r = planner::gravacReplanner(cfg);  // loads the profile and the cost models now
    }
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    e.setGravacReplanner(std::move(r),
                         fmt::format("the Espresso planner ({} machines, {} link, a profile of the "
                                     "parameters)",
                                     machines, inter));
  }
  std::string gravacReplanner() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    return e.gravacReplannerName();
  }
  std::pair<double, uint64_t> gravacPlan() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    return {e.gravacPlanRatio(), e.gravacReplans()};
  }

  // MergeComp's fusion search (Executor::setFusionSearch), over the
  // current plan's options or over `alternatives` (plan JSON texts, each
  // searched in turn; more than `searched` of them are screened first).
  void enableFusionSearch(uint64_t warmup, uint64_t window, uint64_t settle, uint64_t step,
                          double minGain, int maxGroups, uint64_t finalists, uint64_t searched,
                          const std::vector<std::string>& alternatives) {
    executor::FusionSearchOptions o;
    o.warmup = warmup;
    o.window = window;
    o.settle = settle;
    o.step = step;
    o.minGain = minGain;
    o.maxGroups = maxGroups;
    o.finalists = finalists;
    o.searched = searched;
    std::vector<plan::Plan> plans;
    for (size_t a = 0; a < alternatives.size(); ++a) {
      try {
        plans.push_back(plan::planFromJsonString(alternatives[a]));
      } catch (const Error& err) {
        throw Error(err.code(), fmt::format("fusion search, alternative {} of {}: {}", a + 1,
                                            alternatives.size(), err.what()));
      }
    }
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    e.setFusionSearch(o, std::move(plans));
  }
  // None while the search has not started (or is off), else its summary.
  std::optional<py::dict> fusionSearch() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    const executor::FusionSearch* s = e.fusionSearch();
    if (!s) return std::nullopt;
    py::dict d;
    d["done"] = e.fusionSearchDone();
    d["in_force"] = e.fusionSearchInForce();
    d["summary"] = e.fusionSearchSummary();
    d["timed"] = s->history().size();
    if (const auto kept = e.fusionSearchResult()) {
      d["cuts"] = std::vector<uint64_t>(kept->second.begin(), kept->second.end());
      d["alternative"] = kept->first;  // index into the alternatives (0 without)
    } else if (!s->history().empty()) {
      const auto best = s->best();
      d["cuts"] = std::vector<uint64_t>(best.begin(), best.end());
    }
    return d;
  }

  uint64_t groupRuns() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    return e.groupRuns();
  }

  uint64_t inPlaceGroupRuns() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    return e.inPlaceGroupRuns();
  }

  // Submitted runs not finished yet.
  size_t pending() {
    std::lock_guard<std::mutex> lk(qmu_);
    return pending_;
  }

  std::string lastReport() {
    auto& e = ex();
    std::lock_guard<std::mutex> lk(exMu_);
    return e.lastReport() ? plan::toJsonString(*e.lastReport()) : std::string();
  }

 private:
  // Without the worker (after cortado shut down) nothing may touch it.
  executor::Executor& ex() {
    CORTADO_ENFORCE(!rt_.closed() && ex_, ErrorCode::kClosed,
                    "the plan executor's worker was shut down: make a new Executor after "
                    "cortado.init() in a new process");
    return *ex_;
  }

  // The longest `pending` submitted runs may take: each run's deadline
  // (CORTADO_TIMEOUT_MS), and one more for the run in progress.
  Millis queueTime(size_t pending) const {
    return job_.opTimeout * static_cast<int64_t>(pending + 1);
  }

  // Waits (waitInSlices) until the submitted runs have finished, then raises
  // the first error among them. Called with the GIL held.
  void drain(Deadline deadline) {
    {
      std::lock_guard<std::mutex> lk(qmu_);
      ++draining_;  // serve() runs what it holds back
    }
    qcv_.notify_all();
    bool done = false;
    try {
      done = waitInSlices(deadline, [&](Millis slice) {
        std::unique_lock<std::mutex> lk(qmu_);
        return qcv_.wait_for(lk, slice, [&] { return pending_ == 0; });
      });
    } catch (...) {
      std::lock_guard<std::mutex> lk(qmu_);
      --draining_;
      throw;
    }
    std::unique_lock<std::mutex> lk(qmu_);
    --draining_;
    if (!done) {
      throw Error(ErrorCode::kTimeout,
                  fmt::format("plan executor: {} submitted run{} not finished in time (running "
                              "'{}'): a peer or the servers may be stuck; "
                              "CORTADO_TIMEOUT_MS sets the deadline of each run",
                              pending_, pending_ == 1 ? "" : "s", running_));
    }
    Status first = std::exchange(error_, Status());
    lk.unlock();
    first.check();
  }

  // Ends the thread. Without `abort` (cortado.shutdown(), the executor
  // dropped) the submitted runs finish first: every worker runs the same
  // tensors, so none waits on a peer that dropped one; only when they do not
  // finish within their deadlines are they aborted. With `abort` (an abrupt
  // close) the runs not started are dropped (wait() says so) and the one in
  // progress is failed at once (Worker::abort). No GIL held.
  // Writes the trace (CORTADO_TRACE_DIR) of what the executor ran so far.
  void flushTrace() noexcept {
    if (!tracer_ || !tracer_->enabled() || tracer_->events() == 0) return;
    try {
      tracer_->flush();
    } catch (const std::exception& e) {
      CORTADO_LOG_WARN("plan executor: the trace was not written: {}", e.what());
    }
  }

  void stopThread(bool abort) noexcept {
    std::unique_lock<std::mutex> lk(qmu_);
    if (!abort) {
      ++draining_;  // what is held back runs too
      qcv_.notify_all();
      abort = !qcv_.wait_for(lk, queueTime(pending_), [&] { return pending_ == 0; });
      --draining_;
    }
    for (Queued& q : held_) queue_.push_back(std::move(q));
    held_.clear();
    if (!queue_.empty() && error_.ok())
      error_ = Status(ErrorCode::kClosed,
                      fmt::format("cortado was shut down with {} submitted run{} not started "
                                  "(the first: tensor '{}')",
                                  queue_.size(), queue_.size() == 1 ? "" : "s",
                                  queue_.front().item.name));
    pending_ -= queue_.size();
    queue_.clear();
    stop_ = true;
    if (abort && pending_ > 0 && !rt_.closed())
      rt_.worker().abort(Status(ErrorCode::kClosed,
                                fmt::format("cortado was shut down while the plan executor ran {}",
                                            running_)));
    lk.unlock();
    qcv_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
      try {
        thread_.join();
      } catch (const std::system_error&) {
        thread_.detach();
      }
    }
  }

  // The executor's thread: whenever it is free, runs everything queued by
  // then (with the same reduction) as one batch (Executor::runBatch: its
  // phases run every encode, then each communication step in turn, then
  // every decode). Without MPI groups plans are push/pull only, so the
  // workers need not agree on the batches: each key's round completes
  // whatever the order; with them, agreeOnBatch() makes the batches the
  // same on every worker. After a failure, drops what is queued until
  // wait() has taken the error.
  //
  // The plan's fused groups (plan::Plan::groups) run as one execution only
  // when a batch holds all their tensors; a batch of some of them would run
  // those on their own, and a worker whose batches were cut elsewhere would
  // push the group's key while this one pushes the tensors' keys: both would
  // wait. So the tensors of a group not yet complete are held back (held_)
  // until its last one is submitted, and the group then runs whole on every
  // worker, whatever the timing. A drain (wait(), begin_iteration(), run(),
  // set_plan(), shutdown) runs what is held as it is: without MPI groups
  // this worker's drain; with them, only once every worker drains (a worker
  // that drains first waits for the others' submissions to complete its
  // groups, as DistributedOptimizer's synchronize() submits every gradient
  // before it drains).
  void serve() {
    std::unique_lock<std::mutex> lk(qmu_);
    bool gravacGaveUp = false;  // no whole GraVAC iteration came within the timeout
    for (;;) {
      qcv_.wait(lk, [&] { return stop_ || !queue_.empty() || (draining_ > 0 && !held_.empty()); });
      if (stop_) return;
      // Held tensors first (they were submitted first), then the queue.
      std::deque<Queued> take = std::exchange(held_, {});
      for (Queued& q : queue_) take.push_back(std::move(q));
      queue_.clear();
      bool draining = draining_ > 0;
      // GraVAC under MPI groups: the workers agree on a batch only once this
      // one holds a whole iteration (every declared tensor), draining or
      // not: the agreed batch is the fewest runs any worker holds, and part
      // of an iteration is refused by GraVAC. After the job's timeout with
      // none, what there is runs (and fails, naming the count).
      if (groups_ && error_.ok() && gravacIteration_ > take.size() && !gravacGaveUp) {
        requeueFront(take);
        if (!qcv_.wait_for(lk, job_.opTimeout, [&] {
              return stop_ || !error_.ok() || queue_.size() >= gravacIteration_;
            }))
          gravacGaveUp = true;
        continue;
      }
      gravacGaveUp = false;
      if (groups_ && error_.ok() && !agreeOnBatch(lk, take, draining)) continue;
      const ReduceOp op = take.front().op;
      std::vector<executor::BatchItem> batch;
      while (!take.empty() && take.front().op == op) {
        batch.push_back(std::move(take.front().item));
        take.pop_front();
      }
      // Another reduction waits for the next batch, in order.
      requeueFront(take);
      if (!draining && error_.ok()) {
        lk.unlock();
        std::vector<executor::BatchItem> later;
        {
          std::lock_guard<std::mutex> exLk(exMu_);
          later = holdIncompleteGroups(batch);
        }
        lk.lock();
        for (executor::BatchItem& item : later) held_.push_back({std::move(item), op});
        if (batch.empty()) continue;
      }
      const bool skip = !error_.ok();
      running_ = batch.size() == 1 ? batch[0].name
                                   : fmt::format("{} .. {}, {} tensors", batch.front().name,
                                                 batch.back().name, batch.size());
      lk.unlock();
      Status st;
      if (!skip) {
        try {
          CORTADO_ENFORCE(!rt_.closed(), ErrorCode::kClosed,
                          "the plan executor's worker was shut down before tensor '{}' ran",
                          batch[0].name);
          std::lock_guard<std::mutex> exLk(exMu_);
          ex_->runBatch(batch, op, Deadline::after(job_.opTimeout));
        } catch (const Error& e) {
          st = Status::fromError(e);
        } catch (const std::exception& e) {
          st = Status(ErrorCode::kInternal, e.what());
        }
      }
      lk.lock();
      if (!st.ok() && error_.ok()) error_ = st;
      running_.clear();
      pending_ -= batch.size();
      qcv_.notify_all();
    }
  }

  struct Queued {
    executor::BatchItem item;
    ReduceOp op;
  };

  // With collective groups every worker must run the same batches, in the
  // same order (the collectives of a batch are matched by order, and a batch
  // fuses what it holds), but each worker's thread finds a different part of
  // the submitted runs queued. So the workers agree first (one allgather of
  // two int64 over the world group): the batch is the first n of `take`, n
  // the fewest any worker holds, and it is drained as is (incomplete plan
  // groups run as they are) only when every worker is draining. While some
  // worker still submits, the groups its batch does not hold whole wait on
  // every worker (held_), as they would without a drain: the slower
  // workers' next submissions complete them. The submission
  // order is the same on every worker (the gradients' hooks fire in the
  // same order); where it is not, the executor's call labels stop the first
  // collective of a mismatched tensor with an error naming both (kMismatch)
  // instead of summing one tensor into another. The rest goes back to the
  // front of the queue. Called with qmu_ held (through `lk`, released for
  // the allgather); false when this worker failed meanwhile (`take` is then
  // back in the queue for the failure path).
  bool agreeOnBatch(std::unique_lock<std::mutex>& lk, std::deque<Queued>& take, bool& draining) {
    const int64_t mine[2] = {int64_t(take.size()), draining ? 1 : 0};
    std::vector<int64_t> all(2 * size_t(groups_->topology.size));
    lk.unlock();
    Status st;
    try {
      std::lock_guard<std::mutex> exLk(exMu_);
      collective::CallLabel scope(*groups_->world, "the executor's next batch");
      groups_->world->allgather(mine, 2, all.data(), DType::kInt64,
                                Deadline::after(job_.opTimeout));
    } catch (const Error& e) {
      st = Status::fromError(e);
    } catch (const std::exception& e) {
      st = Status(ErrorCode::kInternal, e.what());
    }
    lk.lock();
    if (!st.ok()) {
      if (error_.ok())
        error_ = Status(st.code(), fmt::format("plan executor: the workers did not agree on the "
                                               "next batch ({} runs from '{}'): {}",
                                               take.size(), take.front().item.name,
                                               st.message()));
      requeueFront(take);
      return false;
    }
    size_t n = take.size();
    draining = true;
    for (size_t r = 0; r < all.size(); r += 2) {
      n = std::min(n, size_t(all[r]));
      draining = draining && all[r + 1] != 0;
    }
    std::deque<Queued> rest(std::make_move_iterator(take.begin() + ptrdiff_t(n)),
                            std::make_move_iterator(take.end()));
    take.resize(n);
    requeueFront(rest);
    return true;
  }

  // Puts `items` back at the front of the queue, in their order (they were
  // taken from it, or held, before what it holds now). qmu_ held.
  void requeueFront(std::deque<Queued>& items) {
    for (auto it = items.rbegin(); it != items.rend(); ++it) queue_.push_front(std::move(*it));
    items.clear();
  }

  // Moves the items of `batch` whose plan group the batch does not hold
  // whole out of it, and returns them (serve()). The plan is set first (the
  // CORTADO_PLAN file or the default), so that the first batch sees its
  // groups too. Called with exMu_ held.
  std::vector<executor::BatchItem> holdIncompleteGroups(std::vector<executor::BatchItem>& batch) {
    if (rt_.closed()) return {};
    try {
      ex_->ensurePlan(Deadline::after(job_.opTimeout));
    } catch (const Error&) {
      return {};  // runBatch reports it
    }
    if (ex_->gravacOn()) return holdUntilIteration(batch);
    const plan::Plan& p = ex_->currentPlan();
    if (p.groups.empty()) return {};
    std::map<int, std::set<std::string>> present;  // group -> its tensors in the batch
    for (const auto& item : batch) {
      const int g = p.groupOf(item.name);
      if (g >= 0) present[g].insert(item.name);
    }
    std::vector<executor::BatchItem> keep, later;
    for (auto& item : batch) {
      const int g = p.groupOf(item.name);
      if (g >= 0 && present[g].size() < p.groups[size_t(g)].size())
        later.push_back(std::move(item));
      else
        keep.push_back(std::move(item));
    }
    batch = std::move(keep);
    return later;
  }

  // GraVAC: a batch is one iteration, each declared tensor once; the rest
  // waits (all of it while some tensor is missing).
  std::vector<executor::BatchItem> holdUntilIteration(std::vector<executor::BatchItem>& batch) {
    std::set<std::string> names;
    std::vector<executor::BatchItem> keep, later;
    for (auto& item : batch) {
      if (names.insert(item.name).second)
        keep.push_back(std::move(item));
      else
        later.push_back(std::move(item));
    }
    if (names.size() < ex_->declaredCount()) {
      for (auto& item : later) keep.push_back(std::move(item));
      later = std::move(keep);
      keep.clear();
    }
    batch = std::move(keep);
    return later;
  }

  Runtime& rt_;
  JobConfig job_;
  std::unique_ptr<collective::Groups> groups_;  // MPI's, under mpirun (makeGroups); before ex_
  std::shared_ptr<device::Device> device_;      // CORTADO_DEVICE=cuda's; before ex_
  std::unique_ptr<executor::Executor> ex_;
  std::mutex exMu_;  // one executor call at a time (the executor is not thread-safe)
  std::mutex qmu_;   // the queue and what goes with it
  std::condition_variable qcv_;
  std::deque<Queued> queue_;
  std::deque<Queued> held_;  // tensors of plan groups not yet complete (serve())
  size_t gravacIteration_ = 0;  // runs of one GraVAC iteration (declared tensors); 0: off
  int draining_ = 0;         // drain() calls waiting: run what is held
  size_t pending_ = 0;       // queued, held or running
  Status error_;             // the first failure since the last drain
  std::string running_;
  bool stop_ = false;
  std::thread thread_;
  uint64_t hook_ = 0;  // in rt_'s close hooks
  std::shared_ptr<Tracer> tracer_;  // off unless CORTADO_TRACE_DIR is set
};

// The CPU codecs, as workers and servers know them. Built once, never
// changed afterwards (immutable, so sharing it between threads is safe).
const compressor::Registry& cpuCodecs() {
  static const compressor::Registry registry = [] {
    compressor::Registry r;
    compressor::registerCpuCodecs(r);
    return r;
  }();
  return registry;
}

// One run of the Espresso planner (scheduler/planner) for a model profile,
// as `cortado plan --model PROFILE --json` does: the plan JSON plus the
// simulated iteration times that the caller compares across codecs. The
// planner's data (costs/) is dataDir, else CORTADO_PLANNER_DATA, else the
// planner's default (the Python side passes the installed copy it found).
py::dict planModel(const std::string& profilePath, const std::string& codec, int machines,
                   int gpusPerMachine, const std::string& intra, const std::string& inter,
                   int cpuCores, bool parameterServer, const std::string& dataDir) {
  planner::PlanConfig cfg;
  cfg.dataDir = dataDir;
  cfg.model = profilePath;
  cfg.codec = codec;
  cfg.machines = machines;
  cfg.gpusPerMachine = gpusPerMachine;
  cfg.intra = intra;
  cfg.inter = inter;
  cfg.cpuCores = cpuCores;
  cfg.parameterServer = parameterServer;
  cfg.upperBound = false;
  std::string planJson;
  double espresso = 0, none = 0, all = 0;
  {
    py::gil_scoped_release nogil;
    planner::PlanRun run = planner::runPlanner(cfg);
    planJson = plan::toJsonString(run.plan);
    espresso = run.report.espresso.iterUs;
    none = run.report.noCompression.iterUs;
    all = run.report.compressAllGpu.iterUs;
  }
  py::dict d;
  d["plan"] = planJson;
  d["iter_us"] = espresso;
  d["no_compression_us"] = none;
  d["compress_all_us"] = all;
  return d;
}

}  // namespace
}  // namespace cortado::python

PYBIND11_MODULE(_C, m) {
  using namespace cortado;
  using namespace cortado::python;
  m.doc() = "Cortado's core: the worker engine behind the cortado package";

  gErrorType = PyErr_NewExceptionWithDoc(
      "cortado.CortadoError",
      "An error from Cortado. `str(e)` is the message (naming the tensor, the rank and the "
      "peer); `e.code` is one of invalid_argument, mismatch, timeout, peer_dead, protocol, "
      "unavailable, closed, internal.",
      PyExc_RuntimeError, nullptr);
  m.attr("CortadoError") = py::handle(gErrorType);
  // pybind11 takes a plain function of a std::exception_ptr by value.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      setPythonError(e.code(), e.what());
    }
  });

  m.attr("built_with_cuda") = bool(CORTADO_CUDA);
  // The collective backends compiled into the core (core/collective). The
  // Python layer's operations go through the servers (Python workers have
  // no MPI or NCCL groups); Horovod's nccl_built()/mpi_built() report these.
  m.attr("built_with_nccl") = bool(CORTADO_NCCL);
  m.attr("built_with_mpi") = bool(CORTADO_MPI);
  // The worker engine encodes declared codecs in push-pull (core/worker.h
  // TensorOptions); the Python layer checks this before it offers them.
  m.attr("engine_codecs") = true;
  m.attr("version") = CORTADO_VERSION;
  m.def("dtype_size", [](const std::string& name) { return dtypeSize(parseDType(name)); },
        "Bytes per element of a dtype name (float32, fp16, bfloat16, int64, ...).");
  m.def("raise_error", [](const std::string& code, const std::string& message) {
    for (int c = 0; c <= int(ErrorCode::kInternal); ++c)
      if (code == codeName(ErrorCode(c))) throw Error(ErrorCode(c), message);
    throw Error(ErrorCode::kInvalidArgument, message);
  }, "Raises CortadoError with this code and message (for the Python layer).");

  m.def("codec_names", [] { return cpuCodecs().names(); },
        "The codecs of the CPU codec registry (compressor/), by spec name.");
  m.def("codec_help", [] { return cpuCodecs().help(); },
        "Every codec of the registry with its parameters, as text.");
  m.def("canonical_codec", [](const std::string& spec) { return cpuCodecs().canonical(spec); },
        py::arg("spec"),
        "The spec with defaults filled in ('topk' -> 'topk:ratio=...'); raises CortadoError "
        "naming the valid codecs or parameters when the spec is wrong.");
  bindGravac(m, cpuCodecs());
  m.def("plan_model", &planModel, py::arg("profile"), py::arg("codec"), py::arg("machines"),
        py::arg("gpus_per_machine"), py::arg("intra"), py::arg("inter"), py::arg("cpu_cores"),
        py::arg("parameter_server") = true, py::arg("data_dir") = "",
        "Runs the Espresso planner on a model profile (.json, scheduler/planner/profile.h) "
        "with the cost models of data_dir (empty: CORTADO_PLANNER_DATA or the planner's "
        "default); returns {plan: JSON text, iter_us, no_compression_us, compress_all_us}.");

  py::class_<PyHandle>(m, "Handle")
      .def_property_readonly("name", &PyHandle::name)
      .def("poll", &PyHandle::poll, "True once the operation completed (or failed).")
      .def("wait", &PyHandle::wait, py::arg("timeout") = py::none(),
           "Waits (without the GIL) until completion; raises CortadoError on failure or "
           "timeout (seconds; None: the job's CORTADO_TIMEOUT_MS). On success the "
           "operation's buffers are no longer referenced by the core.")
      .def_property_readonly("holds_buffers", &PyHandle::holdsBuffers,
                             "True while the core references the operation's buffers.");

  py::class_<PyExecutor>(m, "Executor")
      .def(py::init<Runtime&>(), py::arg("runtime"), py::keep_alive<1, 2>(),
           "The plan executor over this runtime's worker: collective over the workers. Under "
           "mpirun (`cortado launch --mpi`) it has MPI's collective groups and runs every "
           "option; otherwise push/pull plans only.")
      .def_property_readonly("device", &PyExecutor::device,
                             "where the buffers of run() and submit() live: host, or cuda "
                             "(CORTADO_DEVICE=cuda under mpirun: CUDA memory, NCCL, the CUDA "
                             "codecs)")
      .def_property_readonly("collectives", &PyExecutor::collectives,
                             "True when the executor has MPI's collective groups (workers "
                             "started under mpirun): plans may use collectives")
      .def_property_readonly("topology", &PyExecutor::topology,
                             "this worker's place: rank, size, machine, machines, local_rank, "
                             "local_size")
      .def("declare", &PyExecutor::declare, py::arg("name"), py::arg("count"))
      .def("set_plan", &PyExecutor::setPlan, py::arg("plan_json"), py::arg("timeout") = py::none(),
           "Sets a plan (plan::Plan JSON, as `cortado plan --json` prints it) on every worker: "
           "collective.")
      .def_property_readonly("plan_json", &PyExecutor::planJson)
      .def_property_readonly("plan_version", &PyExecutor::planVersion)
      .def("enable_online", &PyExecutor::enableOnline,
           "Online re-planning as CORTADO_PROFILE_WINDOW asks; returns the window (0: off).")
      .def("begin_iteration", &PyExecutor::beginIteration, py::arg("iteration"),
           py::arg("timeout") = py::none())
      .def("run", &PyExecutor::run, py::arg("name"), py::arg("count"), py::arg("input"),
           py::arg("output"), py::arg("average") = true, py::arg("timeout") = py::none(),
           "Sums (or averages) a float32 tensor over every worker by its plan option; blocks "
           "without the GIL (after the submitted runs).")
      .def("submit", &PyExecutor::submit, py::arg("name"), py::arg("count"), py::arg("input"),
           py::arg("output"), py::arg("average") = true,
           "Queues the same run on the executor's thread and returns at once (runs go in "
           "submission order, what is queued when the thread is free as one batch); the "
           "buffers must stay alive until wait().")
      .def("wait", &PyExecutor::wait, py::arg("timeout") = py::none(),
           "Returns when every submitted run finished; raises the first one's error.")
      .def_property_readonly("pending", &PyExecutor::pending)
      .def("enable_fusion_search", &PyExecutor::enableFusionSearch, py::arg("warmup") = 3,
           py::arg("window") = 5, py::arg("settle") = 1, py::arg("step") = 1,
           py::arg("min_gain") = 0.02, py::arg("max_groups") = 0, py::arg("finalists") = 2,
           py::arg("searched") = 2, py::arg("alternatives") = std::vector<std::string>{},
           "MergeComp's search for the plan's groups by timing real iterations "
           "(Executor::setFusionSearch: the number of byte-balanced groups doubles while "
           "that gains min_gain, then a binary search between; max_groups 0: a quarter of "
           "the tensors; the finalists fastest timed again in two mirrored passes at the end, "
           "0: none); needs begin_iteration() every iteration. alternatives: plan JSON texts "
           "whose options are searched in turn instead of the current plan's (their groups "
           "ignored), the fastest pair of options and groups kept; with more than `searched`, "
           "each one's every-tensor-on-its-own grouping is timed first and only the "
           "`searched` fastest are searched on")
      .def_property_readonly("fusion_search", &PyExecutor::fusionSearch,
                             "None, or the fusion search's state: done, summary, timed, cuts "
                             "and, once done, alternative (the index of the one kept)")
      .def_property_readonly("group_runs", &PyExecutor::groupRuns,
                             "executions of the plan's fused groups so far (each: one encode, "
                             "one server key, one decode for all its tensors)")
      .def_property_readonly("in_place_group_runs", &PyExecutor::inPlaceGroupRuns,
                             "of those and of the groups fused by size, the executions that ran "
                             "in place on consecutive gradients, with no copy")
      .def_property_readonly("last_report", &PyExecutor::lastReport)
      .def("enable_gravac", &PyExecutor::enableGravac, py::arg("codec") = "dgc",
           py::arg("min_ratio") = 10.0, py::arg("max_ratio") = 1000.0, py::arg("step") = 2.0,
           py::arg("policy") = "exponential", py::arg("window") = 500, py::arg("epsilon") = 0.9,
           py::arg("omega") = 0.01, py::arg("alpha") = 0.0, py::arg("seed") = 0,
           py::arg("samples_per_iteration") = 1.0,
           "GraVAC for every tensor (Executor::setGravac): each submitted iteration (every "
           "declared tensor once) runs as one batch; call it at an iteration boundary (every "
           "declared tensor run as often), on every worker alike; GraVAC then starts afresh")
      .def("gravac_exclude_pause", &PyExecutor::gravacExcludePause,
           "GraVAC: the time from now to the next iteration is not an iteration's (an "
           "evaluation): the controller leaves it out, on every worker if any marks it "
           "(Executor::excludeGravacPause)")
      .def_property_readonly("gravac_history", &PyExecutor::gravacHistory,
                             "GraVAC's decision of each iteration (dicts, as Gravac.decide)")
      .def("set_gravac_planner", &PyExecutor::setGravacPlanner, py::arg("profile"),
           py::arg("machines"), py::arg("intra"), py::arg("inter"), py::arg("cpu_cores"),
           py::arg("data_dir") = "",
           "GraVAC's re-plans by the Espresso planner on a model profile (.json) instead of "
           "keeping the plan's options (Executor::setGravacReplanner)")
      .def_property_readonly("gravac_replanner", &PyExecutor::gravacReplanner,
                             "what plans at GraVAC's 2x CF moves (for the log)")
      .def_property_readonly("gravac_plan", &PyExecutor::gravacPlan,
                             "(the CF the plan carries, GraVAC's re-plans so far)");

  py::class_<Runtime>(m, "Runtime")
      .def_static("start", &Runtime::start, py::arg("connect_timeout") = py::none(),
                  "Joins the job that the CORTADO_* environment describes.")
      .def_property_readonly("rank", &Runtime::rank)
      .def_property_readonly("size", &Runtime::size)
      .def_property_readonly("num_servers", &Runtime::numServers)
      .def_property_readonly("pushed_bytes", &Runtime::pushedBytes,
                             "bytes of tensor data this worker pushed so far, as they went on "
                             "the wire (Worker::pushedBytes)")
      .def_property_readonly("pulled_bytes", &Runtime::pulledBytes,
                             "bytes of tensor data this worker received in answers so far")
      .def_property_readonly("local_rank", &Runtime::localRank)
      .def_property_readonly("local_size", &Runtime::localSize)
      .def_property_readonly("timeout", &Runtime::timeoutSeconds)
      .def_property_readonly("closed", &Runtime::closed)
      .def_property_readonly("inflight_count", &Runtime::inflightCount)
      .def_property_readonly("malloc_tuning", &Runtime::mallocTuning,
                             "(applied, detail): what init() did to glibc's malloc "
                             "(CORTADO_MALLOC_KEEP_BYTES)")
      .def("declare", &Runtime::declare, py::arg("name"), py::arg("dtype"), py::arg("count"),
           py::arg("timeout") = py::none(), py::arg("codec") = "", py::arg("error_feedback") = true,
           py::arg("sparse") = false)
      .def("is_declared", &Runtime::isDeclared, py::arg("name"),
           "Whether the name was declared (released since or not).")
      .def("is_released", &Runtime::isReleased, py::arg("name"),
           "Whether the name was declared and released since: declaring it again makes a new "
           "tensor.")
      .def("release", &Runtime::release, py::arg("name"),
           "Done with a tensor (Worker::release): its servers free its state once every worker "
           "released it; a later push_pull of the name raises.")
      .def("push_pull", &Runtime::pushPull, py::arg("name"), py::arg("dtype"), py::arg("count"),
           py::arg("input"), py::arg("output"), py::arg("average"), py::arg("priority"),
           py::arg("keepalive"))
      .def("push_pull_sparse", &Runtime::pushPullSparse, py::arg("name"), py::arg("indices"),
           py::arg("values"), py::arg("count"), py::arg("output"), py::arg("average"),
           py::arg("priority"), py::arg("keepalive"),
           "A sparse tensor's (index, value) pairs, summed through Zen (docs/zen.md).")
      .def("push_pull_buffer", &Runtime::pushPullBuffer, py::arg("name"), py::arg("input"),
           py::arg("output"), py::arg("average") = false, py::arg("priority") = 0)
      .def("barrier", &Runtime::barrier, py::arg("timeout") = py::none())
      .def("failure", &Runtime::failure)
      .def("shutdown", &Runtime::shutdown, py::arg("timeout") = py::none())
      .def("close", &Runtime::close);
}
