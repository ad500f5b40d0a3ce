#include "scheduler/planner/compile.h"

#include <algorithm>
#include <cmath>

#include "core/common/error.h"
#include "core/partition.h"

namespace cortado::planner {
namespace {

using plan::CommOp;
using plan::Device;
using plan::Scope;
using plan::Step;
using plan::StepKind;

class Compiler {
 public:
  Compiler(const Cluster& c, const ResolvedCodec& codec, int64_t elements, int dtypeBytes,
           const Sparsity& sparsity)
      : c_(c),
        codec_(codec),
        e_(double(elements)),
        dtype_(dtypeBytes),
        active_(c.gpusPerMachine),
        sparsity_(sparsity) {
    out_.ops.reserve(16);  // one allocation: options have at most a dozen operations
  }

  CompiledOption run(const plan::TensorOption& o) {
    const auto& steps = o.steps;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      if (s.kind == StepKind::kEncode) {
        moveTo(s.device == Device::kGpu);
        codecOp(OpKind::kEncode, s.device, codec_.encodeUs(s.device, e_), o, i);
        compressed_ = true;
        m_ = 1;
      } else if (s.kind == StepKind::kDecode) {
        moveTo(s.device == Device::kGpu);
        codecOp(OpKind::kDecode, s.device, codec_.decodeUs(s.device, e_, m_), o, i);
        compressed_ = false;
        m_ = 1;
      } else if (plan::isZen(s.op)) {
        zen(s);
      } else if (s.op == CommOp::kPush) {
        CORTADO_ENFORCE(i + 1 < steps.size(), ErrorCode::kInvalidArgument, "push without pull");
        pushPull(s, steps[i + 1]);
        ++i;
      } else {
        collective(s);
      }
    }
    moveTo(true);  // the result is used by the optimizer on the GPU
    for (const SimOp& op : out_.ops) out_.pathUs += op.us;
    applySyncSkew(c_, out_);
    return std::move(out_);
  }

 private:
  // The codec calls the executor makes for the region a codec step at
  // steps[i] covers (Cluster::cpuCodecByCall): its cuts are the servers'
  // chunks where the option pushes (the shard keys, core/executor/plans.cc),
  // and the blocks of every alltoall still ahead (the region is one block of
  // those behind it).
  double callsFrom(const plan::TensorOption& o, size_t i) const {
    double blocks = 1;
    bool push = false, withCodec = false;
    for (size_t k = 0; k < o.steps.size(); ++k) {
      const Step& s = o.steps[k];
      if (s.kind != StepKind::kComm) continue;
      push |= s.op == CommOp::kPush;
      withCodec |= (s.op == CommOp::kPush || s.op == CommOp::kPull) && s.compressed;
      if (k > i && s.op == CommOp::kAlltoall)
        blocks *= s.scope == Scope::kFlat    ? c_.machines * c_.gpusPerMachine
                  : s.scope == Scope::kIntra ? c_.gpusPerMachine
                                             : c_.machines;
    }
    return std::min(std::max(blocks, push ? keyPartitions(e_, withCodec) : 1.0), std::max(1.0, e_));
  }

  // The chunks the workers cut a server key into (serverKeyChunks).
  double keyPartitions(double elements, bool withCodec) const {
    return serverKeyChunks(c_, codec_, elements, dtype_, withCodec);
  }

  // Partitions of `elements` raw elements (at least one, at most 4096).
  double partitions(double elements) const { return keyPartitions(elements, false); }

  double heldBytes() const {
    return compressed_ ? m_ * codec_.payloadBytes(e_) : e_ * dtype_;
  }

  void add(SimOp op) {
    if (op.us <= 0) return;
    switch (op.res) {
      case Res::kGpu: out_.work[kWorkGpu] += op.us; break;
      case Res::kCpu: out_.work[kWorkCpu] += op.us * op.tasks; break;
      case Res::kIntra: out_.work[kWorkIntra] += op.us; break;
      case Res::kInter: out_.work[kWorkInter] += op.us; break;
      case Res::kFlat:
        out_.work[kWorkIntra] += op.us;
        out_.work[kWorkInter] += op.us;
        break;
      case Res::kD2H: out_.work[kWorkD2H] += op.us; break;
      case Res::kH2D: out_.work[kWorkH2D] += op.us; break;
    }
    out_.ops.push_back(op);
  }

  void moveTo(bool device) {
    if (onDevice_ == device) return;
    SimOp op;
    op.kind = OpKind::kCopy;
    op.res = device ? Res::kH2D : Res::kD2H;
    op.us = (device ? c_.h2d : c_.d2h).us(heldBytes());
    add(op);
    onDevice_ = device;
  }

  // The codec step at o.steps[i].
  void codecOp(OpKind kind, Device d, double us, const plan::TensorOption& o, size_t i) {
    SimOp op;
    op.kind = kind;
    op.res = d == Device::kGpu ? Res::kGpu : Res::kCpu;
    // One call per GPU that holds data; on the GPU they run in parallel on
    // separate devices, on the CPU they share the machine's cores, one task
    // per partition (or per GPU, its calls in turn: Cluster::cpuCodecByCall).
    op.us = us;
    // A decode's calls on pieces of its region cost no less than one decode
    // of all of it (`us`): it runs after the exchange, on a region the
    // encode left long before, so once the region outgrows the caches every
    // piece is read from memory, while the decode curve prices a piece by a
    // probe on a region of the piece's own size, which the caches may hold.
    // (The encode curve is probed on evicted caches: its pieces are priced
    // cold already.)
    const bool byCall = d == Device::kCpu && c_.cpuCodecByCall;
    auto piece = [&](double elements) {
      return kind == OpKind::kEncode ? codec_.encodeUs(d, elements)
                                     : codec_.decodeUs(d, elements, m_);
    };
    const double whole = kind == OpKind::kDecode ? us : 0;
    if (byCall) {
      // One task per GPU that holds data: its calls one after another.
      const double calls = callsFrom(o, i);
      op.tasks = uint16_t(active_);
      op.us = std::max(calls * piece(e_ / calls), whole);
    } else if (d == Device::kCpu) {
      const double parts = partitions(e_);
      op.tasks = uint16_t(active_ * parts);
      op.us = std::max(piece(e_ / parts), whole / parts);
    }
    // A decode first zeroes the region its payloads are decoded into: every
    // element this rank covers (e_, also where each payload covers a block of
    // it), once, in fp32; priced at the region's size (a measured curve's
    // cost per element grows once the region outgrows the caches), shared
    // by the partitions' tasks.
    if (kind == OpKind::kDecode)
      op.us += c_.fillUs(d, e_) / (d == Device::kCpu && !byCall ? partitions(e_) : 1.0);
    if (d == Device::kGpu) out_.gpuCodec = true;
    add(op);
  }

  SimOp commOp(const Step& s, Res res, double us) {
    SimOp op;
    op.kind = OpKind::kComm;
    op.res = res;
    op.comm = s.op;
    op.scope = s.scope;
    op.compressed = s.compressed;
    op.us = us;
    return op;
  }

  void collective(const Step& s) {
    moveTo(true);
    const int M = c_.machines, G = c_.gpusPerMachine;
    int p = 1;
    const LinkCost* link = &c_.intra;
    Res res = Res::kIntra;
    double perRankScale = 1;  // how many ranks' bytes share the link's bandwidth
    switch (s.scope) {
      case Scope::kFlat:
        p = M * G;
        link = M > 1 ? &c_.inter : &c_.intra;
        res = M > 1 ? (G > 1 ? Res::kFlat : Res::kInter) : Res::kIntra;
        break;
      case Scope::kIntra:
        p = G;
        break;
      case Scope::kInter:
        p = M;
        link = &c_.inter;
        res = Res::kInter;
        perRankScale = active_;  // every active GPU's shard crosses the one NIC
        break;
    }
    const double bytes = heldBytes() * perRankScale;
    add(commOp(s, res, commTimeUs(*link, s.op, p, bytes, s.compressed)));

    bool& pending = pendingFirst_[int(s.scope)];
    switch (s.op) {
      case CommOp::kAllreduce: break;
      case CommOp::kReduceScatter: e_ /= p; pending = true; break;
      case CommOp::kAlltoall: e_ /= p; m_ *= p; pending = true; break;
      case CommOp::kReduce:
      case CommOp::kGather:
        if (s.op == CommOp::kGather) m_ *= p;
        if (s.scope == Scope::kIntra) active_ = 1;  // only the root continues
        pending = true;
        break;
      case CommOp::kAllgather:
        if (pending) {
          e_ *= p;  // the second step of a divisible pair: shards become whole
          pending = false;
        } else {
          m_ *= p;  // indivisible: every rank now holds p payloads
        }
        break;
      case CommOp::kBroadcast:
        if (s.scope == Scope::kIntra) active_ = c_.gpusPerMachine;
        pending = false;
        break;
      default: break;
    }
  }

  // Zen over all GPUs on host buffers (zen_cost.h): the CPU work before and
  // after the collectives on one core each, the collectives on the links a
  // flat collective holds.
  // Inter-machine (a hierarchical option, after the intra reduce-scatter):
  // each GPU's shard over the machines, with the density of the sum of the
  // machine's GPUs, every GPU's traffic through the one NIC; its CPU work
  // one task per GPU.
  void zen(const Step& s) {
    moveTo(false);
    const int M = c_.machines, G = c_.gpusPerMachine;
    const bool inter = s.scope == Scope::kInter;
    ZenPath path = zenPath(c_);
    if (inter) path = ZenPath{M, &c_.inter, active_};
    const auto elements = std::max<int64_t>(1, int64_t(std::llround(e_)));
    const ZenCost z = zenCost(c_, zenScheme(s.op), elements, dtype_,
                              inter ? sumOf(sparsity_, G) : sparsity_, &path);
    SimOp cpu;
    cpu.kind = OpKind::kSparse;
    cpu.res = Res::kCpu;
    cpu.tasks = uint16_t(inter ? active_ : 1);
    cpu.us = z.scanUs;
    add(cpu);
    const Res res =
        inter ? Res::kInter : M > 1 ? (G > 1 ? Res::kFlat : Res::kInter) : Res::kIntra;
    add(commOp(s, res, z.commUs));
    cpu.us = z.sumUs;
    add(cpu);
  }

  // Push to the servers and pull back. Each machine's server owns 1/M of the
  // tensor and receives it from all M machines; it decodes (when compressed)
  // and sums on CPU, and re-encodes when the pull is compressed.
  void pushPull(const Step& push, const Step& pull) {
    moveTo(false);
    const int M = c_.machines;
    // The busiest server's share relative to an even one (Cluster::oneTensorAtATime).
    const bool withCodec = push.compressed || pull.compressed;
    double spread = 1;
    if (c_.oneTensorAtATime) {
      // Every active rank pushes its own shard key.
      const double chunks = keyPartitions(e_, withCodec) * active_;
      spread = M * std::ceil(chunks / M) / chunks;
    }
    const double machineBytes = heldBytes() * active_ * spread;
    add(commOp(push, Res::kInter, commTimeUs(c_.inter, CommOp::kPush, M, machineBytes, push.compressed)));

    const double share = std::min(e_ * active_, e_ * active_ / M * spread);  // elements the busiest server owns
    const double parts = keyPartitions(share, withCodec);
    const double part = share / parts;
    SimOp work;
    work.kind = OpKind::kServer;
    work.res = Res::kCpu;
    const double pushed = m_;
    if (compressed_) {
      work.tasks = uint16_t(M * parts);  // every machine's payload of every partition
      // Each a share of its partition's M decodes, of which one is the
      // first into the key's sum.
      work.us = codec_.decodeShareUs(Device::kCpu, part, pushed, M);
      add(work);
    }
    // Top-k and DGC pushes answered in their sparse form: the answer is read
    // from the indices every machine's payloads listed (as many element
    // visits as their decode-and-add), no pass over the dense sum. Otherwise
    // the sum is zeroed or summed densely, and a compressed answer is the
    // codec's encode.
    const bool indexed = compressed_ && pull.compressed && codec_.listsIndices();
    work.tasks = uint16_t(parts);
    work.us = indexed ? codec_.decodeUs(Device::kCpu, part, M * pushed)
                      : M * part * dtype_ * 8.0 / (c_.cpuSumGbps * 1000.0);
    add(work);
    compressed_ = pull.compressed;
    // A top-k or DGC answer is the lossless sum of every payload pushed: the
    // union of their indices, up to all of them (no overlap), or the dense sum
    // where that is smaller. Pulled, then decoded, as that many payloads.
    m_ = indexed ? std::max(1.0, std::min(M * pushed, e_ * dtype_ / codec_.payloadBytes(e_))) : 1;
    if (pull.compressed && !indexed) {
      work.us = codec_.encodeUs(Device::kCpu, part);
      add(work);
    }
    add(commOp(pull, Res::kInter,
               commTimeUs(c_.inter, CommOp::kPull, M, heldBytes() * active_ * spread, pull.compressed)));
  }

  const Cluster& c_;
  const ResolvedCodec& codec_;
  double e_;       // elements this rank covers
  int dtype_;
  int active_;     // GPUs per machine that hold data
  double m_ = 1;   // compressed contributions per element not yet summed
  bool compressed_ = false;
  bool onDevice_ = true;
  bool pendingFirst_[3] = {false, false, false};
  Sparsity sparsity_;
  CompiledOption out_;
};

}  // namespace

double serverKeyChunks(const Cluster& cluster, const ResolvedCodec& codec, double elements,
                       double elementBytes, bool withCodec) {
  auto cut = [&](double bytes) {
    return std::clamp(std::ceil(elements * elementBytes / bytes), 1.0, 4096.0);
  };
  const double raw = cut(cluster.chunkBytes);
  if (!withCodec) return raw;
  const double payload = codec.payloadBytes(elements);
  const double spread =
      std::min(double(cluster.machines), std::floor(payload / double(kSpreadPayloadBytes)));
  const double region = cut(std::max(cluster.chunkBytes, double(kMaxCompressedChunkBytes)));
  return std::min(raw, std::max({1.0, std::ceil(payload / cluster.chunkBytes), spread, region}));
}

double opDurationUs(const Cluster& cluster, const SimOp& op) {
  const double cores = std::max(1, cluster.cpuCores);
  return op.res == Res::kCpu ? op.us * std::ceil(double(op.tasks) / cores) : op.us;
}

void applySyncSkew(const Cluster& cluster, CompiledOption& c) {
  double work = 0;  // since the previous communication op
  for (SimOp& op : c.ops) {
    c.pathUs -= op.waitUs;
    op.waitUs = 0;
    switch (op.kind) {
      case OpKind::kComm:
        op.waitUs = cluster.skewBefore(op.comm, work);
        c.pathUs += op.waitUs;
        work = 0;
        break;
      case OpKind::kEncode:
      case OpKind::kDecode:
      case OpKind::kSparse: work += opDurationUs(cluster, op); break;
      case OpKind::kCopy:
        if (op.res == Res::kCpu) work += opDurationUs(cluster, op);  // a group's gather, not a PCIe copy
        break;
      case OpKind::kServer: break;  // the servers', not the workers'
    }
  }
}

CompiledOption compileOption(const Cluster& cluster, const ResolvedCodec& codec, int64_t elements,
                             int dtypeBytes, const plan::TensorOption& option,
                             const Sparsity& sparsity) {
  return Compiler(cluster, codec, elements, dtypeBytes, sparsity).run(option);
}

}  // namespace cortado::planner
