// One tensor's run of its plan option (Run, core/executor/run.h): the
// steps in order, with the payload framing and the variable-size
// collectives that compressed steps move their pieces with.
#include "core/executor/run.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "compressor/compact.h"
#include "compressor/cpu/kernels.h"
#include "compressor/format.h"
#include "compressor/payload.h"
#include "compressor/registry.h"

namespace cortado::executor::detail {
namespace {

// Blob framing for collectives: u64 count, then per segment u64 off, u64
// count, u64 dense, u64 bytes, bytes. Sized once, then filled: no
// reallocation while a phase's payloads are packed. With `compact`, a
// piece's top-k and DGC payloads go in their compact wire form where that
// is smaller (compressor/compact.h; the blob collectives exchange sizes
// first, so pieces may shrink); unpackInto() expands them.
std::vector<std::byte> pack(const Segs& segs, bool compact) {
  size_t total = 8;
  std::vector<size_t> sizes;
  sizes.reserve(segs.size());
  for (const Seg& s : segs) {
    sizes.push_back(compact && !s.dense ? compressor::compactedRunBytes(s.bytes) : s.bytes.size());
    total += 32 + sizes.back();
  }
  std::vector<std::byte> out(total);
  size_t at = 0;
  auto put = [&](const void* p, size_t n) {
    if (n > 0) std::memcpy(out.data() + at, p, n);
    at += n;
  };
  auto putU64 = [&](uint64_t v) { put(&v, 8); };
  putU64(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    const Seg& s = segs[i];
    putU64(s.off);
    putU64(s.count);
    putU64(s.dense ? 1 : 0);
    putU64(sizes[i]);
    if (sizes[i] == s.bytes.size()) {
      put(s.bytes.data(), s.bytes.size());
    } else {
      compressor::compactRun(s.bytes, std::span<std::byte>(out).subspan(at, sizes[i]));
      at += sizes[i];
    }
  }
  return out;
}
void unpackInto(const std::byte* p, size_t n, Segs& out, uint64_t tensorLen) {
  size_t at = 0;
  auto get = [&]() {
    CORTADO_ENFORCE(at + 8 <= n, ErrorCode::kProtocol, "truncated compressed blob ({} bytes)", n);
    uint64_t v;
    std::memcpy(&v, p + at, 8);
    at += 8;
    return v;
  };
  const uint64_t count = get();
  for (uint64_t i = 0; i < count; ++i) {
    Seg s;
    s.off = get();
    s.count = get();
    s.dense = get() != 0;
    const uint64_t bytes = get();
    CORTADO_ENFORCE(s.off <= tensorLen && s.count <= tensorLen - s.off && bytes <= n - at,
                    ErrorCode::kProtocol, "malformed compressed blob: segment [{}, +{}) of {} bytes",
                    s.off, s.count, bytes);
    const std::span<const std::byte> piece(p + at, bytes);
    std::span<const std::byte> plain = piece;
    std::vector<std::byte> expanded;
    if (!s.dense) {
      try {
        plain = compressor::expandRun(piece, expanded);
      } catch (const Error& e) {
        throw Error(ErrorCode::kProtocol,
                    fmt::format("malformed compressed blob: segment [{}, +{}): {}", s.off,
                                s.count, e.what()));
      }
    }
    if (plain.data() == piece.data())
      s.bytes.assign(piece.begin(), piece.end());
    else
      s.bytes = std::move(expanded);
    at += bytes;
    out.push_back(std::move(s));
  }
}

using Blob = std::vector<std::byte>;

// The concatenation `all` cut into blobs of `counts` bytes, in order.
std::vector<Blob> cutBlobs(const Blob& all, const std::vector<size_t>& counts) {
  std::vector<Blob> out;
  out.reserve(counts.size());
  size_t at = 0;
  for (size_t c : counts) {
    out.emplace_back(all.begin() + at, all.begin() + at + c);
    at += c;
  }
  return out;
}

std::vector<Blob> allgatherBlob(Group g, const Blob& mine, Deadline d) {
  if (g.size() == 1) return {mine};
  std::vector<int64_t> sizes(g.size());
  int64_t my = static_cast<int64_t>(mine.size());
  g.c->allgather(&my, 1, sizes.data(), DType::kInt64, d);
  std::vector<size_t> counts(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  Blob all(total);
  g.c->allgatherv(mine.data(), mine.size(), all.data(), counts, DType::kUInt8, d);
  return cutBlobs(all, counts);
}

std::vector<Blob> alltoallBlob(Group g, const std::vector<Blob>& toEach, Deadline d) {
  if (g.size() == 1) return toEach;
  const int n = g.size();
  std::vector<int64_t> sendSizes(n), recvSizes(n);
  for (int i = 0; i < n; ++i) sendSizes[i] = static_cast<int64_t>(toEach[i].size());
  g.c->alltoall(sendSizes.data(), recvSizes.data(), 1, DType::kInt64, d);
  std::vector<size_t> sc(sendSizes.begin(), sendSizes.end()), rc(recvSizes.begin(), recvSizes.end());
  Blob send;
  for (const Blob& b : toEach) send.insert(send.end(), b.begin(), b.end());
  size_t total = 0;
  for (size_t c : rc) total += c;
  Blob recv(total);
  g.c->alltoallv(send.data(), sc, recv.data(), rc, DType::kUInt8, d);
  return cutBlobs(recv, rc);
}

// On the root: every rank's blob; elsewhere empty.
std::vector<Blob> gatherBlob(Group g, const Blob& mine, Deadline d) {
  if (g.size() == 1) return {mine};
  std::vector<int64_t> sizes(g.size());
  int64_t my = static_cast<int64_t>(mine.size());
  g.c->gather(&my, 1, sizes.data(), DType::kInt64, 0, d);
  std::vector<size_t> counts;
  size_t total = 0;
  if (g.rank() == 0) {
    counts.assign(sizes.begin(), sizes.end());
    for (size_t c : counts) total += c;
  }
  Blob all(total);
  g.c->gatherv(mine.data(), mine.size(), all.data(), counts, DType::kUInt8, 0, d);
  return cutBlobs(all, counts);
}

void broadcastBlob(Group g, Blob& blob, Deadline d) {
  if (g.size() == 1) return;
  int64_t size = static_cast<int64_t>(blob.size());
  g.c->broadcast(&size, 1, DType::kInt64, 0, d);
  blob.resize(static_cast<size_t>(size));
  g.c->broadcast(blob.data(), blob.size(), DType::kUInt8, 0, d);
}

bool isFirst(CommOp op) {
  return op == CommOp::kReduceScatter || op == CommOp::kReduce || op == CommOp::kAlltoall ||
         op == CommOp::kGather;
}

}  // namespace

std::string describeStep(const Step& s) {
  if (s.kind == StepKind::kEncode) return fmt::format("encode on {}", plan::toString(s.device));
  if (s.kind == StepKind::kDecode) return fmt::format("decode on {}", plan::toString(s.device));
  return fmt::format("{} {}{}", plan::toString(s.scope), plan::toString(s.op),
                     s.compressed ? " compressed" : "");
}

void Run::start(const float* in, float* out) {
  // Work in the output: no copy of the tensor beyond the input's.
  lanes_.dev->bindThread();
  x_ = out;
  if (in != out)
    lanes_.dev->copy(out, in, t_.n * sizeof(float), device::CopyKind::kDeviceToDevice,
                     *lanes_.compute);
  if (foldCarry(lanes_, t_, x_, d_)) restart_ = true;
  r_ = Region{0, t_.n};
  step_ = 0;
  runSteps(Until::kBeforeComm);
}

void Run::scale(ReduceOp op) {
  const float scale = op == ReduceOp::kAverage ? 1.0f / float(topo_.size) : 1.0f;
  if (scale != 1.0f) lanes_.dev->scale(x_, scale, t_.n, *lanes_.compute);
  settle("the result");
}

void Run::runSteps(Until until) {
  const auto& steps = t_.option.steps;
  while (step_ < steps.size()) {
    const Step& s = steps[step_];
    const bool comm = s.kind == StepKind::kComm;
    if (comm && until == Until::kBeforeComm) return;
    try {
      const bool wasActive = active_;
      const size_t at = step_;
      const double start = tracer_ ? Tracer::now() : 0;
      // The members of each collective compare this (checkArguments): ranks
      // on different tensors, runs or steps fail naming each one's.
      std::optional<collective::CallLabel> label, deviceLabel;
      const collective::Groups* dg = lanes_.dev->groups();
      if (comm && ((groups_ && groups_->world->checksArguments()) ||
                   (dg && dg != groups_ && dg->world->checksArguments()))) {
        const std::string text =
            fmt::format("tensor '{}' run {} step {} ({}){}", t_.name, t_.round, step_,
                        describeStep(s), t_.members.empty() ? "" : " of " + t_.members);
        if (groups_) label.emplace(*groups_, text);
        if (dg && dg != groups_) deviceLabel.emplace(*dg, text);
      }
      if (prof_) {
        timedStep(s);
      } else {
        runStep(s);
      }
      if (tracer_ && (wasActive || active_)) record(steps, at, start);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("worker {}: tensor '{}', step {} ({}) of plan '{}': {}",
                                        topo_.rank, t_.name, step_, describeStep(s),
                                        t_.option.describe(), e.what()));
    }
    ++step_;
    if (comm && until == Until::kAfterComm) return;
  }
}

void Run::record(const std::vector<Step>& steps, size_t i, double start) {
  const Step& s = steps[i];
  std::string stage, lane;
  if (s.kind == StepKind::kEncode && givenAt(i)) {
    stage = "gravac payload";  // GraVAC's message as the payload: no codec ran
    lane = "cpu";
  } else if (s.kind == StepKind::kEncode || s.kind == StepKind::kDecode) {
    stage = s.kind == StepKind::kEncode ? "encode" : "decode";
    lane = lane_;  // where it ran: a "gpu" step on the host device runs the CPU twin
  } else if (s.op == CommOp::kPush) {
    const Step& pull = steps.at(i + 1);
    stage = fmt::format("inter push{}+pull{}", s.compressed ? "*" : "", pull.compressed ? "*" : "");
    lane = "network";
  } else {
    stage = fmt::format("{} {}{}", plan::toString(s.scope), plan::toString(s.op),
                        s.compressed ? "*" : "");
    lane = s.scope == Scope::kIntra ? "intra" : "network";
  }
  tracer_->record(stage, t_.name, int64_t(t_.iteration()), lane, start, Tracer::now());
}

uint64_t Run::bytesHeld(bool compressed) const {
  if (!compressed) return r_.len * sizeof(float);
  uint64_t b = 0;
  for (const Seg& s : segs_) b += s.bytes.size();
  return b;
}

void Run::timedStep(const Step& s) {
  using Clock = Executor::Profiler::Clock;
  const bool active = active_;
  const size_t first = step_;
  uint64_t elements = r_.len, bytes = 0, chunks = 0;
  int gsize = 1;
  if (s.kind == StepKind::kDecode) {
    elements = 0;
    for (const Seg& x : segs_) elements += x.dense ? 0 : x.count;
  }
  if (s.kind == StepKind::kComm) {
    bytes = bytesHeld(s.compressed);
    gsize = group(s.scope).size();
    if (s.op == CommOp::kPush) {
      bytes *= std::max<size_t>(1, t_.shardKeys.size());
      for (const auto& c : t_.shardChunks) chunks += c.size();
    }
  }
  const auto t0 = Clock::now();
  runStep(s);
  const double us = Executor::Profiler::since(t0);
  // Zen's steps are not reported: the re-planner has no Zen model (its
  // cost needs the tensor's density, which the reports do not carry).
  if (!active || (s.kind == StepKind::kComm && plan::isZen(s.op))) return;
  if (s.kind == StepKind::kEncode) {
    prof_->codec(t_.codecSpec, true, elements, us);
  } else if (s.kind == StepKind::kDecode) {
    prof_->codec(t_.codecSpec, false, elements, us);
  } else {
    const bool push = s.op == CommOp::kPush;
    prof_->comm(s.op, s.scope, s.compressed, gsize, bytes, chunks, push ? uint64_t(r_.len) : 0,
                push && t_.option.steps.at(first + 1).compressed, us);
  }
}

namespace {
Group groupOf(const collective::Groups* groups, Scope s) {
  if (!groups) return Group{};
  switch (s) {
    case Scope::kFlat: return Group{groups->world.get()};
    case Scope::kIntra: return Group{groups->intra.get()};
    case Scope::kInter: return Group{groups->inter.get()};
  }
  return Group{};
}
}  // namespace

Group Run::group(Scope s) const { return groupOf(lanes_.dev->groups(), s); }
Group Run::hostGroup(Scope s) const { return groupOf(groups_, s); }

void Run::runStep(const Step& s) {
  if (s.kind == StepKind::kEncode) {
    if (active_) encode();
    return;
  }
  if (s.kind == StepKind::kDecode) {
    if (active_) decode();
    return;
  }
  Group g = group(s.scope);       // dense data, device memory
  Group hg = hostGroup(s.scope);  // payload blobs, host memory
  if (s.op == CommOp::kPush) {
    replicas_ *= uint64_t(topo_.numMachines);  // every machine's pusher pulls the same sum
    if (active_) pushPull(s, t_.option.steps.at(step_ + 1));
    ++step_;  // the pull ran with it
    return;
  }
  if (plan::isZen(s.op)) {
    replicas_ *= uint64_t(hg.size());  // every member holds the same sum
    if (active_) zenStep(s, hg);
    return;
  }
  if (isFirst(s.op)) {
    frames_.push_back({r_, active_, s.scope});
    if (!active_) return;
    switch (s.op) {
      case CommOp::kReduceScatter: reduceScatter(g); break;
      case CommOp::kReduce:
        if (g.size() > 1) {
          float* sum = lanes_.whole->floats(r_.len);
          settle("the data before a reduce");
          g.c->reduce(x_ + r_.off, sum, r_.len, DType::kFloat32, 0, d_);
          if (g.rank() == 0) copyOnDevice(x_ + r_.off, sum, r_.len);
        }
        active_ = g.rank() == 0;
        break;
      case CommOp::kAlltoall: alltoall(hg); break;
      case CommOp::kGather: {
        if (hg.size() > 1) {
          auto blobs = gatherBlob(hg, pack(segs_, compactBlobs()), d_);
          segs_.clear();
          for (const Blob& b : blobs) unpackInto(b.data(), b.size(), segs_, t_.n);
        }
        active_ = hg.rank() == 0;
        break;
      }
      default: break;
    }
    return;
  }
  // Second steps close the open pair of their scope; else indivisible.
  const bool second = !frames_.empty() && frames_.back().scope == s.scope &&
                      (s.op == CommOp::kAllgather || s.op == CommOp::kBroadcast);
  if (!second) {
    replicas_ *= uint64_t(g.size());  // allreduce, compressed allgather
    if (!active_) return;
    if (s.op == CommOp::kAllreduce) {
      if (g.size() > 1) {
        settle("the data before an allreduce");
        g.c->allreduce(x_ + r_.off, x_ + r_.off, r_.len, DType::kFloat32, d_);
      }
    } else {  // compressed allgather
      allgatherSegs(hg);
    }
    return;
  }
  Frame f = frames_.back();
  frames_.pop_back();
  replicas_ *= uint64_t(g.size());  // the pair's members end with the same data
  if (!f.active) return;  // this rank sat the whole pair out
  if (s.op == CommOp::kAllgather) {
    if (s.compressed) {
      allgatherSegs(hg);
    } else {
      allgatherRaw(g, f.parent);
    }
    r_ = f.parent;
  } else {  // broadcast from the root of the pair
    if (s.compressed && hg.size() > 1) {
      Blob b = active_ ? pack(segs_, compactBlobs()) : Blob{};
      broadcastBlob(hg, b, d_);
      segs_.clear();
      unpackInto(b.data(), b.size(), segs_, t_.n);
    } else if (!s.compressed && g.size() > 1) {
      settle("the data before a broadcast");
      g.c->broadcast(x_ + f.parent.off, f.parent.len, DType::kFloat32, 0, d_);
    }
    r_ = f.parent;
    active_ = true;
  }
}

void Run::reduceScatter(Group g) {
  const int n = g.size();
  const Region mine = block(r_, n, g.rank());
  if (n > 1) {
    const uint64_t b = blockSize(r_, n);
    float* padded = lanes_.whole->floats(b * n);
    float* recv = lanes_.block->floats(b);
    copyOnDevice(padded, x_ + r_.off, r_.len);
    lanes_.dev->fill(padded + r_.len, 0.0f, b * n - r_.len, *lanes_.compute);
    settle("the data before a reduce-scatter");
    g.c->reduceScatter(padded, recv, b, DType::kFloat32, d_);
    copyOnDevice(x_ + mine.off, recv, mine.len);
  }
  r_ = mine;
}

void Run::allgatherRaw(Group g, const Region& parent) {
  const int n = g.size();
  if (n == 1) return;
  const uint64_t b = blockSize(parent, n);
  float* send = lanes_.block->floats(b);
  float* recv = lanes_.whole->floats(b * n);
  copyOnDevice(send, x_ + r_.off, r_.len);
  lanes_.dev->fill(send + r_.len, 0.0f, b - r_.len, *lanes_.compute);
  settle("the data before an allgather");
  g.c->allgather(send, b, recv, DType::kFloat32, d_);
  copyOnDevice(x_ + parent.off, recv, parent.len);
}

void Run::allgatherSegs(Group g) {
  if (g.size() == 1) return;
  auto blobs = allgatherBlob(g, pack(segs_, compactBlobs()), d_);
  segs_.clear();
  for (const Blob& b : blobs) unpackInto(b.data(), b.size(), segs_, t_.n);
}

void Run::alltoall(Group g) {
  const int n = g.size();
  if (n == 1) return;  // every piece stays here; block(r_, 1, 0) is r_
  std::vector<Segs> out(n);
  for (Seg& s : segs_) {
    int dest = -1;
    for (int i = 0; i < n; ++i) {
      Region b = block(r_, n, i);
      if (s.off >= b.off && s.off + s.count <= b.end() && (s.count > 0 || b.len == 0)) {
        dest = i;
        break;
      }
    }
    CORTADO_ENFORCE(dest >= 0, ErrorCode::kInternal,
                    "payload piece [{}, +{}) crosses the alltoall blocks of [{}, +{})", s.off,
                    s.count, r_.off, r_.len);
    out[dest].push_back(std::move(s));
  }
  std::vector<Blob> blobs;
  for (const Segs& s : out) blobs.push_back(pack(s, compactBlobs()));
  auto got = alltoallBlob(g, blobs, d_);
  segs_.clear();
  for (const Blob& b : got) unpackInto(b.data(), b.size(), segs_, t_.n);
  r_ = block(r_, n, g.rank());
}

uint64_t Run::seed(uint64_t piece) const {
  uint64_t s = compressor::format::hash2(t_.seedBase, (uint64_t(step_) << 40) ^ piece);
  s = compressor::format::hash2(s, t_.round);
  if (t_.codec->id() == compressor::CodecId::kRandomK) return s;  // the same on every worker
  // Ranks that hold the same data here (replicas_ > 1) draw the same
  // numbers, so their stochastic encodes and residuals stay equal, as the
  // switch's fold of 1/replicas of each assumes (deterministic codecs
  // ignore the seed).
  if (replicas_ > 1) return s;
  return compressor::format::hash2(s, uint64_t(topo_.rank) + 1);
}

bool Run::onDevice() const {
  const Step& s = t_.option.steps.at(step_);
  // The host device's memory is the CPU's: every step runs there as placed
  // on "gpu" (the CPU twin, no copy); a "cpu" step takes its copy stage
  // only with queued streams, which tests use to exercise the copies and
  // their ordering (with inline streams Lanes::direct skips the staging).
  return s.device == plan::Device::kGpu && t_.deviceCodec != nullptr;
}

namespace {
// Payloads in one device buffer: each at a 16-byte aligned offset (the CUDA
// codecs read 4-byte words).
size_t alignUp(size_t n) { return (n + 15) / 16 * 16; }
}  // namespace

void Run::encodeGiven() {
  // Only where the data is this worker's own, whole (Executor::runGravac
  // picks such steps): the message stands for it.
  const bool whole = r_.off == 0 && r_.len == t_.n;
  CORTADO_ENFORCE(
      t_.codec && t_.codec->id() == compressor::CodecId::kTopK && replicas_ == 1 && whole,
      ErrorCode::kInternal,
      "GraVAC's message for '{}' given to a step that holds [{}, +{}) of {} elements "
      "on {} ranks with codec '{}'",
      t_.name, r_.off, r_.len, t_.n, replicas_, t_.codecSpec);
  lane_ = "cpu";
  segs_.clear();
  const auto& index = t_.given->index;
  const auto& value = t_.given->value;
  std::vector<uint64_t> cuts{r_.off};
  for (auto it = t_.cuts.upper_bound(r_.off); it != t_.cuts.end() && *it < r_.end(); ++it)
    cuts.push_back(*it);
  cuts.push_back(r_.end());
  auto lo = index.begin();
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const uint64_t off = cuts[i], count = cuts[i + 1] - cuts[i];
    auto hi = std::lower_bound(lo, index.end(), cuts[i + 1]);
    if (count == 0) continue;
    const size_t k = size_t(hi - lo), first = size_t(lo - index.begin());
    Seg s;
    s.off = off;
    s.count = count;
    s.bytes.resize(compressor::kHeaderBytes + compressor::format::sparseBody(k));
    compressor::PayloadHeader h;
    h.codec = compressor::CodecId::kTopK;
    h.dtype = DType::kFloat32;
    h.numel = count;
    h.bodyBytes = compressor::format::sparseBody(k);
    h.count = k;
    compressor::writeHeader(h, s.bytes);
    std::byte* idx = s.bytes.data() + compressor::kHeaderBytes;
    std::byte* val = idx + 4 * k;
    for (size_t j = 0; j < k; ++j) {
      compressor::storeLe<uint32_t>(idx + 4 * j, static_cast<uint32_t>(index[first + j] - off));
      compressor::storeLe<float>(val + 4 * j, value[first + j]);
    }
    segs_.push_back(std::move(s));
    lo = hi;
  }
  CORTADO_ENFORCE(lo == index.end(), ErrorCode::kInternal,
                  "GraVAC's message for '{}' lists an index past its {} elements", t_.name, t_.n);
}

void Run::encode() {
  if (givenAt(step_)) {
    encodeGiven();
    return;
  }
  const bool dev = onDevice();
  lane_ = dev ? lanes_.dev->lane() : "cpu";
  auto& ef = t_.ef[step_];
  if (!ef)
    ef = dev ? lanes_.dev->errorFeedback(t_.deviceCodec, worker_.errorFeedbackState())
             : device::hostErrorFeedback(t_.codec, worker_.errorFeedbackState());
  segs_.clear();
  std::vector<uint64_t> cuts{r_.off};
  for (auto it = t_.cuts.upper_bound(r_.off); it != t_.cuts.end() && *it < r_.end(); ++it)
    cuts.push_back(*it);
  cuts.push_back(r_.end());
  // On the CPU: the region in pinned memory first (a copy stage of its own).
  const float* host = dev ? nullptr : lanes_.toHost(t_, x_ + r_.off, r_.len, d_);
  std::vector<size_t> at;  // each piece's offset in the device payload buffer
  size_t total = 0;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    Seg s;
    s.off = cuts[i];
    s.count = cuts[i + 1] - cuts[i];
    if (s.count == 0) continue;
    s.bytes.resize(ef->payloadBytes(s.count));
    at.push_back(total);
    total += alignUp(s.bytes.size());
    segs_.push_back(std::move(s));
  }
  // Where the host addresses device memory and streams run inline, the
  // device's codec writes the pieces themselves: no payload buffer and no
  // pinned copy per tensor.
  const bool staged = dev && !lanes_.direct;
  std::byte* payloads = staged ? t_.payloads.bytes(total) : nullptr;
  for (size_t k = 0; k < segs_.size(); ++k) {
    Seg& s = segs_[k];
    t_.efPieces[step_][s.off] = s.count;
    t_.efReplicas[step_] = replicas_;
    compressor::EncodeContext ctx;
    ctx.seed = seed(s.off);
    ctx.restartMomentum = restart_;
    if (!dev || lanes_.direct) ctx.pool = lanes_.codecPool;  // a CPU codec
    if (staged) {
      ef->encode(s.off, x_ + s.off, s.count, std::span<std::byte>(payloads + at[k], s.bytes.size()),
                 ctx, lanes_.compute);
    } else if (dev) {
      ef->encode(s.off, x_ + s.off, s.count, s.bytes, ctx, lanes_.compute);
    } else {
      ef->encode(s.off, host + (s.off - r_.off), s.count, s.bytes, ctx, nullptr);
    }
  }
  if (!staged || segs_.empty()) return;
  // The payloads to pinned memory, then into the pieces (which the
  // collectives and the servers take from host memory).
  lanes_.bind(t_);
  t_.copied->synchronize(d_, "the copy from pinned memory");
  std::byte* pinned = t_.pinnedBytes.bytes(total);
  t_.computed->record(*lanes_.compute);
  lanes_.dev->wait(*lanes_.copy, *t_.computed);
  lanes_.dev->copy(pinned, payloads, total, device::CopyKind::kDeviceToHost, *lanes_.copy);
  t_.copied->record(*lanes_.copy);
  t_.copied->synchronize(d_, "the payloads' copy to pinned memory");
  for (size_t k = 0; k < segs_.size(); ++k)
    std::copy_n(pinned + at[k], segs_[k].bytes.size(), segs_[k].bytes.data());
}

namespace {
void checkInside(const Seg& s, const Region& r) {
  CORTADO_ENFORCE(s.off >= r.off && s.off + s.count <= r.end(), ErrorCode::kInternal,
                  "payload piece [{}, +{}) outside the data's region [{}, +{})", s.off, s.count,
                  r.off, r.len);
  CORTADO_ENFORCE(!s.dense || s.bytes.size() == s.count * sizeof(float), ErrorCode::kProtocol,
                  "dense piece of {} bytes for {} elements", s.bytes.size(), s.count);
}

// The codec that decodes `s`: the tensor's, or the top-k form of the servers'
// sparse sums.
const compressor::Codec& decoderOf(const Seg& s, const compressor::CodecPtr& codec,
                                   const compressor::CodecPtr& sparse, const std::string& spec) {
  const compressor::PayloadHeader h = compressor::parseHeader(s.bytes);
  if (h.codec == codec->id()) return *codec;
  CORTADO_ENFORCE(h.codec == compressor::CodecId::kTopK && sparse, ErrorCode::kProtocol,
                  "a {} payload for a tensor compressed with '{}'",
                  compressor::codecIdName(h.codec), spec);
  return *sparse;
}
}  // namespace

void Run::decodeOnHost() {
  // In pinned memory, then copied to the region (a copy stage of its own;
  // in the region itself where the host addresses device memory).
  float* h = lanes_.stagingFor(t_, x_ + r_.off, r_.len, d_);
  // Zeroed on the codec threads too: a pass over the region (a fused group's
  // can be 100 MB, 10-20 ms on one core of the development VM).
  compressor::cpu::zeroFloats(lanes_.codecPool, h, r_.len);
  for (const Seg& s : segs_) {
    checkInside(s, r_);
    float* dst = h + (s.off - r_.off);
    if (s.dense) {
      const float* src = reinterpret_cast<const float*>(s.bytes.data());
      for (uint64_t i = 0; i < s.count; ++i) dst[i] += src[i];
      continue;
    }
    compressor::EncodeContext ctx;
    ctx.pool = lanes_.codecPool;
    decoderOf(s, t_.codec, t_.sparseDecoder, t_.codecSpec).decompressAdd(s.bytes, dst, s.count, 1.0f, ctx);
  }
  lanes_.fromStaging(t_, x_ + r_.off, r_.len);
}

void Run::addDenseOnDevice() {
  uint64_t dense = 0;
  for (const Seg& s : segs_) dense += s.dense ? s.count : 0;
  if (dense == 0) return;
  if (lanes_.direct) {
    for (const Seg& s : segs_)
      if (s.dense)
        lanes_.dev->add(x_ + s.off, reinterpret_cast<const float*>(s.bytes.data()), s.count,
                        *lanes_.compute);
    return;
  }
  float* h = lanes_.hostStaging(t_, dense, d_);
  uint64_t at = 0;
  for (const Seg& s : segs_) {
    if (!s.dense) continue;
    std::copy_n(reinterpret_cast<const float*>(s.bytes.data()), s.count, h + at);
    at += s.count;
  }
  float* src = t_.staged.floats(dense);
  lanes_.toDevice(t_, src, dense);
  at = 0;
  for (const Seg& s : segs_) {
    if (!s.dense) continue;
    lanes_.dev->add(x_ + s.off, src + at, s.count, *lanes_.compute);
    at += s.count;
  }
}

void Run::decode() {
  for (const Seg& s : segs_) checkInside(s, r_);
  if (!onDevice()) {
    lane_ = "cpu";
    decodeOnHost();
    segs_.clear();
    return;
  }
  lane_ = lanes_.dev->lane();
  // Every payload checked on the host before anything is written (the
  // device codecs check again on the device).
  std::vector<const compressor::Codec*> decs;
  size_t total = 0;
  for (const Seg& s : segs_) {
    if (s.dense) continue;
    decoderOf(s, t_.codec, t_.sparseDecoder, t_.codecSpec);
    decs.push_back(&decoderOf(s, t_.deviceCodec, t_.deviceSparseDecoder, t_.codecSpec));
    total += alignUp(s.bytes.size());
  }
  lanes_.dev->fill(x_ + r_.off, 0.0f, r_.len, *lanes_.compute);
  addDenseOnDevice();
  if (total > 0 && lanes_.direct) {
    // The device's codec reads the pieces themselves (see encode()).
    size_t k = 0;
    for (const Seg& s : segs_) {
      if (s.dense) continue;
      lanes_.dev->decompressAdd(*decs[k], s.bytes, x_ + s.off, s.count, *lanes_.compute,
                                lanes_.codecPool);
      ++k;
    }
  } else if (total > 0) {
    lanes_.bind(t_);
    t_.copied->synchronize(d_, "the copy from pinned memory");
    std::byte* pinned = t_.pinnedBytes.bytes(total);
    std::byte* payloads = t_.payloads.bytes(total);
    std::vector<size_t> at;
    size_t off = 0;
    for (const Seg& s : segs_) {
      if (s.dense) continue;
      std::copy_n(s.bytes.data(), s.bytes.size(), pinned + off);
      at.push_back(off);
      off += alignUp(s.bytes.size());
    }
    t_.computed->record(*lanes_.compute);
    lanes_.dev->wait(*lanes_.copy, *t_.computed);
    lanes_.dev->copy(payloads, pinned, total, device::CopyKind::kHostToDevice, *lanes_.copy);
    t_.copied->record(*lanes_.copy);
    lanes_.dev->wait(*lanes_.compute, *t_.copied);
    size_t k = 0;
    for (const Seg& s : segs_) {
      if (s.dense) continue;
      lanes_.dev->decompressAdd(*decs[k],
                                std::span<const std::byte>(payloads + at[k], s.bytes.size()),
                                x_ + s.off, s.count, *lanes_.compute);
      ++k;
    }
  }
  segs_.clear();
}

void Run::pushPull(const Step& push, const Step& pull) {
  // The shard: this rank's intra block after a split, else the whole tensor.
  const size_t shard = t_.ownShard(topo_.localRank);
  CORTADO_ENFORCE(shard < t_.shardKeys.size() && t_.shardRegions[shard] == r_,
                  ErrorCode::kInternal, "push of [{}, +{}) matches no shard key", r_.off, r_.len);
  const std::string& key = t_.shardKeys[shard];
  const auto& chunks = t_.shardChunks[shard];
  Exchange ex;
  if (push.compressed) {
    for (const ChunkSpan& c : chunks) {
      Buffer b;
      std::vector<std::byte> cat;
      for (const Seg& s : segs_) {
        if (s.off != r_.off + c.offset) continue;
        CORTADO_ENFORCE(s.count == c.numElements && !s.dense, ErrorCode::kInternal,
                        "payload piece [{}, +{}) does not match server chunk [{}, +{})", s.off,
                        s.count, r_.off + c.offset, c.numElements);
        cat.insert(cat.end(), s.bytes.begin(), s.bytes.end());
      }
      ex.payloads.push_back(Buffer::copyOf(cat.data(), cat.size()));
    }
  } else {
    // From pinned memory: the region copied there first.
    ex.rawInput = lanes_.toHost(t_, x_ + r_.off, r_.len, d_);
  }
  auto answersOwned = std::make_shared<std::vector<ExchangeAnswer>>();
  auto& answers = *answersOwned;
  if (pull.compressed) {
    ex.answers = answersOwned;
  } else {
    // In place in pinned memory, as pushPull allows (the answer comes only
    // after the servers have every push of the round, ours included), then
    // copied back to the region (in the region itself where the host
    // addresses device memory).
    ex.rawOutput = lanes_.stagingFor(t_, x_ + r_.off, r_.len, d_);
  }
  ex.flushResidual = flushResidual_;
  Handle h = worker_.exchange(key, std::move(ex), 0);
  Status st = h.wait(d_);
  if (st.code() == ErrorCode::kTimeout) {
    // The round is half done and its answers would still land in the
    // output after run() returned: end this worker's operations first (the
    // job cannot go on, as after a collective that timed out).
    Status why(ErrorCode::kTimeout, fmt::format("push/pull of key '{}': {}", key, st.message()));
    worker_.abort(why);
    throw Error(why.code(), why.message());
  }
  if (!st.ok()) throw Error(st.code(), fmt::format("push/pull of key '{}': {}", key, st.message()));
  // What went on the wire (top-k and DGC payloads compact where smaller).
  if (t_.pushedTotal) *t_.pushedTotal += h.pushedBytes();
  if (!pull.compressed) lanes_.fromStaging(t_, x_ + r_.off, r_.len);
  segs_.clear();
  if (pull.compressed) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].numElements == 0) continue;
      Seg s;
      s.off = r_.off + chunks[i].offset;
      s.count = chunks[i].numElements;
      s.dense = !answers[i].compressed;
      const auto* p = reinterpret_cast<const std::byte*>(answers[i].bytes.data());
      s.bytes.assign(p, p + answers[i].bytes.size());
      segs_.push_back(std::move(s));
    }
  }
}

}  // namespace cortado::executor::detail
