// MPI backend of Collectives: non-blocking MPI collectives polled against the
// caller's deadline; float16/bfloat16 reductions go through float32 scratch.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <vector>

#include "core/collective/mpi/factory.h"
#include "core/common/env.h"
#include "core/common/error.h"
#include "core/common/logging.h"
#include "core/common/reduce.h"

namespace cortado::collective::mpi {

namespace {

std::string mpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, len);
}

MPI_Datatype mpiType(DType t) {
  switch (t) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kFloat16:
    case DType::kBFloat16: return MPI_UINT16_T;  // moved as bits; summed via float32
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kInt8: return MPI_INT8_T;
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("no MPI datatype for dtype {}", static_cast<int>(t)));
}

bool summedViaFloat32(DType t) { return accumulatorDType(t) != t; }

// Waits for `req`, polling MPI_Test: MPI gives no completion notification
// other than a blocking wait, which has no deadline. Polling starts tight
// (small operations finish in microseconds) and backs off to short sleeps so
// that oversubscribed ranks leave the cores to the peers they wait for.
// Returns MPI_SUCCESS, an MPI error code, or -1 when the deadline passed.
int waitRequest(MPI_Request& req, Deadline deadline) {
  const auto start = Clock::now();
  for (long spins = 0;; ++spins) {
    int done = 0;
    int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (done) return MPI_SUCCESS;
    if (deadline.expired()) return -1;
    if (spins < 200) continue;
    if (Clock::now() - start < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// One operation in flight: the request and whatever memory MPI may still
// touch (scratch, count and displacement arrays). Kept after a timeout.
struct Pending {
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<float> in, out;  // float32 scratch of float16/bfloat16 sums
  std::vector<int> counts1, displs1, counts2, displs2;
};

void toInts(std::span<const size_t> v, std::vector<int>& counts, std::vector<int>& displs) {
  counts.resize(v.size());
  displs.resize(v.size());
  int off = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    counts[i] = static_cast<int>(v[i]);  // checked against maxCount() (INT_MAX) already
    displs[i] = off;
    off += counts[i];
  }
}

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives(std::string name, MPI_Comm comm, bool checkArguments)
      : Collectives(std::move(name), commRank(comm), commSize(comm), checkArguments), comm_(comm) {}

  ~MpiCollectives() override {
    for (auto& p : abandoned_) {
      int done = 0;
      if (p->req != MPI_REQUEST_NULL) MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
      if (!done && p->req != MPI_REQUEST_NULL) {
        // A collective request may be neither freed nor cancelled (MPI 3.1
        // §5.12); its memory must outlive it, so it is left to process exit.
        CORTADO_LOG_WARN("collective group '{}': an operation that timed out is still pending at close; "
                         "its memory is left to process exit",
                         name());
        (void)p.release();
      }
    }
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  MemoryKind memory() const override { return MemoryKind::kHost; }

 protected:
  size_t maxCount() const override { return static_cast<size_t>(INT_MAX); }

  void checkUsable(CollOp op) const override {
    CORTADO_ENFORCE(broken_.empty(), ErrorCode::kClosed,
                    "{} on group '{}' (rank {} of {}): the group is unusable after an earlier failure: {}",
                    collOpName(op), name(), rank(), size(), broken_);
  }

  void allgatherBytes(CollOp op, const void* mine, size_t bytes, void* all, Deadline deadline) override {
    auto p = std::make_unique<Pending>();
    int rc = MPI_Iallgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE, comm_,
                            &p->req);
    finish(fmt::format("{} (argument check)", collOpName(op)), rc, std::move(p), deadline);
  }

  void alltoallCounts(CollOp op, std::span<const int64_t> send, std::span<int64_t> recv, Deadline deadline) override {
    auto p = std::make_unique<Pending>();
    int rc = MPI_Ialltoall(send.data(), 1, MPI_INT64_T, recv.data(), 1, MPI_INT64_T, comm_, &p->req);
    finish(fmt::format("{} (argument check)", collOpName(op)), rc, std::move(p), deadline);
  }

  void run(const Call& c, Deadline deadline) override {
    auto p = std::make_unique<Pending>();
    const MPI_Datatype t = mpiType(c.dtype);
    const int n = static_cast<int>(c.count);
    const bool viaF32 = summedViaFloat32(c.dtype);
    int rc = MPI_SUCCESS;
    switch (c.op) {
      case CollOp::kAllreduce:
        if (viaF32) {
          p->in.resize(c.count);
          loadAccumulator(c.dtype, p->in.data(), c.send, c.count);
          rc = MPI_Iallreduce(MPI_IN_PLACE, p->in.data(), n, MPI_FLOAT, MPI_SUM, comm_, &p->req);
        } else {
          rc = MPI_Iallreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv, n, t, MPI_SUM, comm_, &p->req);
        }
        break;
      case CollOp::kReduceScatter:
        if (viaF32) {
          p->in.resize(c.count * size());
          p->out.resize(c.count);
          loadAccumulator(c.dtype, p->in.data(), c.send, p->in.size());
          rc = MPI_Ireduce_scatter_block(p->in.data(), p->out.data(), n, MPI_FLOAT, MPI_SUM, comm_, &p->req);
        } else {
          rc = MPI_Ireduce_scatter_block(c.send, c.recv, n, t, MPI_SUM, comm_, &p->req);
        }
        break;
      case CollOp::kAllgather:
        rc = MPI_Iallgather(c.send, n, t, c.recv, n, t, comm_, &p->req);
        break;
      case CollOp::kAllgatherv:
        toInts(c.counts, p->counts1, p->displs1);
        rc = MPI_Iallgatherv(c.send, n, t, c.recv, p->counts1.data(), p->displs1.data(), t, comm_, &p->req);
        break;
      case CollOp::kAlltoall:
        rc = MPI_Ialltoall(c.send, n, t, c.recv, n, t, comm_, &p->req);
        break;
      case CollOp::kAlltoallv:
        toInts(c.sendCounts, p->counts1, p->displs1);
        toInts(c.recvCounts, p->counts2, p->displs2);
        rc = MPI_Ialltoallv(c.send, p->counts1.data(), p->displs1.data(), t, c.recv, p->counts2.data(),
                            p->displs2.data(), t, comm_, &p->req);
        break;
      case CollOp::kReduce:
        if (viaF32) {
          p->in.resize(c.count);
          if (rank() == c.root) p->out.resize(c.count);
          loadAccumulator(c.dtype, p->in.data(), c.send, c.count);
          rc = MPI_Ireduce(p->in.data(), rank() == c.root ? p->out.data() : nullptr, n, MPI_FLOAT, MPI_SUM, c.root,
                           comm_, &p->req);
        } else {
          rc = MPI_Ireduce(c.send, rank() == c.root ? c.recv : nullptr, n, t, MPI_SUM, c.root, comm_, &p->req);
        }
        break;
      case CollOp::kGather:
        rc = MPI_Igather(c.send, n, t, c.recv, n, t, c.root, comm_, &p->req);
        break;
      case CollOp::kGatherv:
        if (rank() == c.root) toInts(c.counts, p->counts1, p->displs1);
        rc = MPI_Igatherv(c.send, n, t, c.recv, rank() == c.root ? p->counts1.data() : nullptr,
                          rank() == c.root ? p->displs1.data() : nullptr, t, c.root, comm_, &p->req);
        break;
      case CollOp::kBroadcast:
        rc = MPI_Ibcast(c.recv, n, t, c.root, comm_, &p->req);
        break;
    }
    Pending* done = p.get();
    finish(collOpName(c.op), rc, std::move(p), deadline);
    if (!viaF32) {
      completed_.reset();
      return;
    }
    if (c.op == CollOp::kAllreduce) storeAccumulator(c.dtype, c.recv, done->in.data(), c.count);
    if (c.op == CollOp::kReduceScatter) storeAccumulator(c.dtype, c.recv, done->out.data(), c.count);
    if (c.op == CollOp::kReduce && rank() == c.root) storeAccumulator(c.dtype, c.recv, done->out.data(), c.count);
    completed_.reset();  // the scratch is not kept between calls
  }

 private:
  static int commRank(MPI_Comm c) {
    int r = 0;
    MPI_Comm_rank(c, &r);
    return r;
  }
  static int commSize(MPI_Comm c) {
    int s = 0;
    MPI_Comm_size(c, &s);
    return s;
  }

  // Waits for `p` (started with return code `rc`). On success `p` is kept in
  // completed_ so that run() can copy its scratch out, then dropped;
  // after a timeout it is kept for as long as MPI may still use it.
  void finish(const std::string& what, int rc, std::unique_ptr<Pending> p, Deadline deadline) {
    if (rc == MPI_SUCCESS) rc = waitRequest(p->req, deadline);
    if (rc == MPI_SUCCESS) {
      completed_ = std::move(p);  // keeps scratch alive for run() to copy out
      return;
    }
    if (rc == -1) {
      broken_ = fmt::format("{} did not complete by its deadline", what);
      abandoned_.push_back(std::move(p));
      throw Error(ErrorCode::kTimeout,
                  fmt::format("{} on group '{}' (rank {} of {}) did not complete by its deadline: a member has not "
                              "joined (is it alive, and calling the same operations in the same order?); the group "
                              "is unusable from now on",
                              what, name(), rank(), size()));
    }
    broken_ = fmt::format("{} failed in MPI: {}", what, mpiErrorString(rc));
    throw Error(ErrorCode::kInternal, fmt::format("{} on group '{}' (rank {} of {}) failed in MPI: {}", what, name(),
                                                  rank(), size(), mpiErrorString(rc)));
  }

  MPI_Comm comm_;
  std::string broken_;
  std::unique_ptr<Pending> completed_;
  std::vector<std::unique_ptr<Pending>> abandoned_;
};

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS)
    throw Error(ErrorCode::kInternal, fmt::format("forming the collective groups: {} failed: {}", what,
                                                  mpiErrorString(rc)));
}

// Blocks until every world rank has arrived, or throws kTimeout: the group
// constructors that follow (MPI_Comm_split has no non-blocking form) then do
// not wait on absent ranks.
void arriveAll(MPI_Comm comm, Deadline deadline, const char* stage) {
  MPI_Request req;
  check(MPI_Ibarrier(comm, &req), "MPI_Ibarrier");
  int rc = waitRequest(req, deadline);
  if (rc == -1)
    throw Error(ErrorCode::kTimeout,
                fmt::format("forming the collective groups ({}): not every MPI rank arrived by the deadline; is "
                            "every rank calling createGroups?",
                            stage));
  check(rc, "MPI_Ibarrier");
}

}  // namespace

Options Options::fromEnv() {
  Options o;
  if (auto v = getEnvInt({"CORTADO_FAKE_HOST_SIZE"})) {
    CORTADO_ENFORCE(*v >= 0 && *v <= INT_MAX, ErrorCode::kInvalidArgument,
                    "CORTADO_FAKE_HOST_SIZE={} is not a number of ranks per emulated machine (0 = use the real "
                    "machines, N > 0 = N consecutive ranks per machine)",
                    *v);
    o.fakeHostSize = static_cast<int>(*v);
  }
  if (auto v = getEnvBool({"CORTADO_COLLECTIVE_CHECK"})) o.checkArguments = *v;
  return o;
}

Runtime::Runtime() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  CORTADO_ENFORCE(!finalized, ErrorCode::kUnavailable,
                  "MPI was already finalized in this process and cannot be initialized again");
  if (!initialized) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    CORTADO_ENFORCE(rc == MPI_SUCCESS, ErrorCode::kUnavailable, "MPI_Init_thread failed: {}", mpiErrorString(rc));
    owns_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

Runtime::~Runtime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

int Runtime::worldRank() const {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int Runtime::worldSize() const {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

Groups createGroups(Runtime& runtime, const Options& options, Deadline deadline) {
  CORTADO_ENFORCE(options.fakeHostSize >= 0, ErrorCode::kInvalidArgument,
                  "fakeHostSize {} is negative: use 0 for the real machines or N > 0 ranks per emulated machine",
                  options.fakeHostSize);
  Groups g;
  Topology& topo = g.topology;
  topo.rank = runtime.worldRank();
  topo.size = runtime.worldSize();
  arriveAll(MPI_COMM_WORLD, deadline, "world");

  MPI_Comm world, intra, inter;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  if (options.fakeHostSize > 0) {
    check(MPI_Comm_split(world, topo.rank / options.fakeHostSize, topo.rank, &intra), "MPI_Comm_split (fake hosts)");
  } else {
    check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, topo.rank, MPI_INFO_NULL, &intra),
          "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  }
  MPI_Comm_set_errhandler(intra, MPI_ERRORS_RETURN);
  MPI_Comm_rank(intra, &topo.localRank);
  MPI_Comm_size(intra, &topo.localSize);

  // Machine k is the k-th lowest of the machines' lowest world ranks.
  int myRoot = topo.rank;
  MPI_Request req;
  check(MPI_Iallreduce(MPI_IN_PLACE, &myRoot, 1, MPI_INT, MPI_MIN, intra, &req), "MPI_Iallreduce");
  int rc = waitRequest(req, deadline);
  if (rc == -1) throw Error(ErrorCode::kTimeout, "forming the collective groups: the intra-machine step timed out");
  check(rc, "MPI_Iallreduce");
  std::vector<int> roots(topo.size);
  check(MPI_Iallgather(&myRoot, 1, MPI_INT, roots.data(), 1, MPI_INT, world, &req), "MPI_Iallgather");
  rc = waitRequest(req, deadline);
  if (rc == -1) throw Error(ErrorCode::kTimeout, "forming the collective groups: the machine numbering timed out");
  check(rc, "MPI_Iallgather");
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  topo.numMachines = static_cast<int>(roots.size());
  topo.machine = static_cast<int>(std::lower_bound(roots.begin(), roots.end(), myRoot) - roots.begin());

  int color = options.inter == InterGroups::kSameLocalRank ? topo.localRank
                                                            : (topo.localRank == 0 ? 0 : MPI_UNDEFINED);
  check(MPI_Comm_split(world, color, topo.machine, &inter), "MPI_Comm_split (inter-machine)");
  if (inter != MPI_COMM_NULL) MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);

  const bool chk = options.checkArguments;
  g.world = std::make_unique<MpiCollectives>("world", world, chk);
  g.intra = std::make_unique<MpiCollectives>(fmt::format("intra[machine {}]", topo.machine), intra, chk);
  if (inter != MPI_COMM_NULL) {
    std::string name = options.inter == InterGroups::kSameLocalRank ? fmt::format("inter[local rank {}]", topo.localRank)
                                                                      : std::string("inter[machine roots]");
    g.inter = std::make_unique<MpiCollectives>(std::move(name), inter, chk);
  }
  CORTADO_LOG_DEBUG("collective groups: rank {}/{} on machine {}/{} as local rank {}/{}{}", topo.rank, topo.size,
                    topo.machine, topo.numMachines, topo.localRank, topo.localSize,
                    options.fakeHostSize ? fmt::format(" (emulated machines of {} ranks)", options.fakeHostSize)
                                         : std::string());
  return g;
}

}  // namespace cortado::collective::mpi
