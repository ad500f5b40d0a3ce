// The collective plane (DESIGN.md, "Three planes"): one interface for the
// intra-machine and flat operations that a plan's communication steps use,
// with one backend per kind of memory: MPI for host buffers (mpi/factory.h),
// NCCL for CUDA buffers (nccl/factory.h).
//
// Contract, for every backend:
// - A Collectives object is one group of ranks (the job's world, the ranks of
//   one machine, or one rank per machine). Every member calls the same
//   operations in the same order with matching arguments; counts are in
//   elements of `dtype`.
// - Buffers belong to the caller and must stay valid and unwritten until the
//   call returns. Calls are blocking and run on the calling thread; a group is
//   used by one thread at a time.
// - Every call takes a Deadline. When it passes, the call throws
//   Error(kTimeout) naming the operation and the group, and the group is
//   broken: later calls throw Error(kClosed) naming the first failure. The
//   peers may still arrive later and the backend may then still write into
//   the timed-out call's receive buffer: after a timeout, keep the buffers
//   alive or end the process (the worker ends the job).
// - Arguments that one rank can check alone (a root out of range, a counts
//   list of the wrong length, an element count beyond what the backend can
//   address, null pointers) throw Error(kInvalidArgument) before any
//   communication. With `checkArguments` on (the default), the members also
//   compare the operation, dtype, root and counts with each other first, and
//   every member throws the same Error(kMismatch) naming the ranks that
//   disagree, instead of letting the backend hang or truncate. They also
//   compare what the call is for (setCallLabel, CallLabel), so that members
//   running different tensors of the same size fail instead of summing one
//   into the other.
// - Sums of float16 and bfloat16 are accumulated in float32 and rounded once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/deadline.h"
#include "core/common/dtype.h"

namespace cortado::collective {

enum class MemoryKind : uint8_t { kHost, kCuda };

enum class CollOp : uint8_t {
  kAllreduce,
  kReduceScatter,
  kAllgather,
  kAllgatherv,
  kAlltoall,
  kAlltoallv,
  kReduce,
  kGather,
  kGatherv,
  kBroadcast,
};
const char* collOpName(CollOp op);

// Where this process sits. Machines are numbered by their lowest world rank.
struct Topology {
  int rank = 0;  // in the world group
  int size = 1;
  int machine = 0;
  int numMachines = 1;
  int localRank = 0;  // within the machine
  int localSize = 1;
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  // E.g. "world", "intra[machine 1]", "inter[local rank 0]"; in every error.
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual MemoryKind memory() const = 0;

  // What the next calls are for, compared across the members with
  // checkArguments on (see CallLabel, which sets it for a scope). Empty: an
  // unlabeled call, which matches only other unlabeled calls. Labels are
  // compared by a hash of the whole text and shown up to kShownLabelBytes.
  static constexpr size_t kShownLabelBytes = 127;
  void setCallLabel(std::string label) { label_ = std::move(label); }
  const std::string& callLabel() const { return label_; }
  // Whether the members compare their arguments and labels (checkArguments);
  // without it a label has no effect, and callers need not build one.
  bool checksArguments() const { return checkArguments_; }

  // recv[i] = sum over ranks of send[i]; send == recv is allowed (in place).
  void allreduce(const void* send, void* recv, size_t count, DType dtype, Deadline deadline);
  // send holds size() blocks of recvCount; recv = the sum of block rank().
  void reduceScatter(const void* send, void* recv, size_t recvCount, DType dtype, Deadline deadline);
  // recv (size() * count) = every rank's send (count), in rank order.
  void allgather(const void* send, size_t count, void* recv, DType dtype, Deadline deadline);
  // As allgather with rank r sending counts[r]; count must equal counts[rank()].
  // recv holds sum(counts), packed in rank order.
  void allgatherv(const void* send, size_t count, void* recv, std::span<const size_t> counts, DType dtype,
                  Deadline deadline);
  // Block j (countPerPeer) of send goes to rank j; block i of recv came from rank i.
  void alltoall(const void* send, void* recv, size_t countPerPeer, DType dtype, Deadline deadline);
  // sendCounts[j] elements go to rank j and recvCounts[i] come from rank i,
  // packed in rank order on both sides.
  void alltoallv(const void* send, std::span<const size_t> sendCounts, void* recv,
                 std::span<const size_t> recvCounts, DType dtype, Deadline deadline);
  // The sum lands in recv on `root`; recv is not touched (may be null) elsewhere.
  void reduce(const void* send, void* recv, size_t count, DType dtype, int root, Deadline deadline);
  // recv (size() * count, root only) = every rank's send, in rank order.
  void gather(const void* send, size_t count, void* recv, DType dtype, int root, Deadline deadline);
  // As gather with rank r sending counts[r]. counts is read on the root only
  // (others may pass an empty span); if given elsewhere it must agree.
  void gatherv(const void* send, size_t count, void* recv, std::span<const size_t> counts, DType dtype, int root,
               Deadline deadline);
  // buf (count) on `root` is copied into buf on every other rank.
  void broadcast(void* buf, size_t count, DType dtype, int root, Deadline deadline);

 protected:
  Collectives(std::string name, int rank, int size, bool checkArguments)
      : name_(std::move(name)), rank_(rank), size_(size), checkArguments_(checkArguments) {}

  // One call's arguments, as every member describes its part of it.
  struct Call {
    CollOp op;
    DType dtype;
    int root = -1;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;                      // this rank's count (see each operation)
    std::span<const size_t> counts{};      // allgatherv, gatherv: per-rank counts
    std::span<const size_t> sendCounts{};  // alltoallv
    std::span<const size_t> recvCounts{};  // alltoallv
  };

  // The backend: runs `call` (already checked) before the deadline, or throws.
  virtual void run(const Call& call, Deadline deadline) = 0;
  // The backend's cross-rank comparison: every member contributes `mine` (a
  // fixed-size record) and gets everyone's, in rank order, before the deadline.
  // alltoallv's check also needs the transposed counts: exchange(send) -> recv.
  // `op` is the operation being checked, for error messages.
  virtual void allgatherBytes(CollOp op, const void* mine, size_t bytes, void* all, Deadline deadline) = 0;
  virtual void alltoallCounts(CollOp op, std::span<const int64_t> send, std::span<int64_t> recv,
                              Deadline deadline) = 0;
  // Throws Error(kClosed) when an earlier call broke the group.
  virtual void checkUsable(CollOp op) const = 0;
  // The largest element count the backend can take in one argument.
  virtual size_t maxCount() const = 0;
  // Throws Error(kInvalidArgument) when a buffer of the call is memory the
  // backend cannot touch (NCCL: host memory), before any rank communicates.
  virtual void checkMemory(const Call& call) const {}

 private:
  void dispatch(const Call& call, Deadline deadline);
  void checkLocal(const Call& call) const;
  void checkAcrossRanks(const Call& call, Deadline deadline);

  std::string name_;
  int rank_;
  int size_;
  bool checkArguments_;
  std::string label_;
};

enum class GroupKind : uint8_t { kWorld, kIntra, kInter };
const char* groupKindName(GroupKind kind);

// How the inter-machine groups are formed.
enum class InterGroups : uint8_t {
  kSameLocalRank,  // local rank l of every machine forms group l (every rank has one)
  kRootsOnly,      // only the machine roots (local rank 0) form one group
};

// The three groups a hierarchical plan uses.
struct Groups {
  Topology topology;
  std::unique_ptr<Collectives> world;
  std::unique_ptr<Collectives> intra;
  std::unique_ptr<Collectives> inter;  // null where this rank has none (kRootsOnly)

  // The group, or Error(kInvalidArgument) saying why this rank has none.
  Collectives& get(GroupKind kind) const;
};

// Labels a group's calls, or every group of a Groups, with what they are for
// while it lives, and puts the labels it replaced back when it ends (so
// labels nest). A caller that runs a named thing's collectives (the plan
// executor: a tensor, its run and its step) labels them; members whose
// labels differ throw the same Error(kMismatch), listing every member's
// label, before any data moves: workers that run their tensors in different
// orders would otherwise sum one tensor into another of the same size,
// silently. Like the group's calls, on the thread that uses the group.
class CallLabel {
 public:
  CallLabel(Collectives& group, const std::string& label);
  CallLabel(const Groups& groups, const std::string& label);
  ~CallLabel();
  CallLabel(const CallLabel&) = delete;
  CallLabel& operator=(const CallLabel&) = delete;

 private:
  void label(Collectives* group, const std::string& label);
  std::vector<std::pair<Collectives*, std::string>> replaced_;
};

}  // namespace cortado::collective
