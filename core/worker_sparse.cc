// Sparse (Zen) tensors in the worker (worker_impl.h; docs/zen.md): each
// server p holds one key of the tensor and owns the indices that the
// tensor's ownership hash gives it. A round places the worker's non-zeros
// with the hierarchical hash (compressor/zen/zen_hash.h), pushes server p
// the pairs it owns (delta-coded, ascending, where CORTADO_COMPACT_SPARSE is
// on and that is smaller; COO otherwise), and pulls p's answer (a hash bitmap,
// decoded with I_p, or an index list, whichever p found smaller). Each
// answer is checked as it arrives; the last one's arrival writes the dense
// output from all of them in one pass (zen::assembleDense).
#include "compressor/zen/zen_payload.h"
#include "core/worker_impl.h"

namespace cortado::detail {

namespace zen = compressor::zen;

namespace {

// The spec every sparse push names in its preamble and that the scheduler
// compares between the workers' declarations.
constexpr const char* kZenSpec = "zen";

// The seed of a tensor's ownership hash: from its job-wide key, which the
// scheduler hands out, so every worker and server derives the same.
uint64_t ownershipSeed(uint64_t tensorKey) {
  return compressor::format::hash2(0x7a656e5f6f776e31ull, tensorKey);
}

}  // namespace

void WorkerImpl::setUpSparse(TensorEntry& t) {
  CORTADO_ENFORCE(t.dtype == DType::kFloat32, ErrorCode::kInvalidArgument,
                  "worker {}: sparse tensor '{}' is {}; sparse tensors are float32", self_.rank,
                  t.name, dtypeName(t.dtype));
  CORTADO_ENFORCE(t.options.codec.empty(), ErrorCode::kInvalidArgument,
                  "worker {}: tensor '{}' is declared sparse and with codec '{}': a sparse "
                  "tensor travels as (index, value) pairs, choose one",
                  self_.rank, t.name, t.options.codec);
  CORTADO_ENFORCE(!opts_.async, ErrorCode::kInvalidArgument,
                  "worker {}: sparse tensor '{}' needs the servers in sync mode (CORTADO_ASYNC=0)",
                  self_.rank, t.name);
  CORTADO_ENFORCE(t.numElements <= zen::kMaxElements, ErrorCode::kInvalidArgument,
                  "worker {}: sparse tensor '{}' has {} elements; indices are u32, so at most {}: "
                  "split it",
                  self_.rank, t.name, t.numElements, zen::kMaxElements);
  t.codecSpec = kZenSpec;
}

void WorkerImpl::sparseChunks(TensorEntry& t) {
  const auto S = static_cast<uint32_t>(book_.servers.size());
  CORTADO_ENFORCE(S < kMaxChunksPerTensor, ErrorCode::kInvalidArgument,
                  "sparse tensor '{}': {} servers, more than the {} keys a tensor may have", t.name,
                  S, kMaxChunksPerTensor);
  // I_p for every p: hashing every index once (4 bytes per element).
  t.zen = std::make_unique<zen::IndexLists>(zen::Ownership(t.numElements, S, ownershipSeed(t.key)));
  for (uint32_t p = 0; p < S; ++p) {
    Chunk c;
    c.key = chunkKey(t.key, p);
    c.offset = 0;
    c.numElements = t.numElements;  // each key answers for indices anywhere in the tensor
    c.server = static_cast<int>(p);
    t.chunks.push_back(c);
  }
}

Handle WorkerImpl::pushPullSparse(const std::string& name, const SparseInput& in, float* output,
                                  ReduceOp op, int priority) {
  const zen::IndexLists* lists = nullptr;
  uint64_t numElements = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    checkFailedLocked();
    TensorEntry& t = tensorLocked(name, "push_pull_sparse");
    CORTADO_ENFORCE(t.zen != nullptr, ErrorCode::kInvalidArgument,
                    "worker {}: push_pull_sparse of tensor '{}', which was not declared sparse "
                    "(TensorOptions::sparse)",
                    self_.rank, name);
    CORTADO_ENFORCE(!t.inFlight, ErrorCode::kInvalidArgument,
                    "worker {}: tensor '{}' already has a push_pull in flight; wait for its "
                    "handle before starting another",
                    self_.rank, t.name);
    lists = t.zen.get();
    numElements = t.numElements;
  }
  CORTADO_ENFORCE(numElements == 0 || output != nullptr, ErrorCode::kInvalidArgument,
                  "push_pull_sparse of tensor '{}': null output", name);
  CORTADO_ENFORCE(!(in.dense && (in.indices || in.values || in.count)), ErrorCode::kInvalidArgument,
                  "worker {}: push_pull_sparse of tensor '{}' with both pairs and a dense "
                  "buffer; give one",
                  self_.rank, name);
  CORTADO_ENFORCE(in.dense || in.count == 0 || (in.indices && in.values),
                  ErrorCode::kInvalidArgument,
                  "worker {}: push_pull_sparse of tensor '{}': {} pairs but a null index or "
                  "value array",
                  self_.rank, name, in.count);
  // Level 1 and 2 of the hierarchical hash, on this thread: the input is
  // consumed here and the caller may reuse it at once.
  const zen::Ownership& own = lists->ownership();
  // Compact pushes (CORTADO_COMPACT_SPARSE) need each server's pairs
  // ascending: the placement reads its table out in that order.
  zen::PlacementOptions po;
  po.ascendingLists = opts_.compactSparse;
  zen::HierarchicalHash hh(own, po);
  zen::Partitioned parts;
  try {
    if (in.dense)
      hh.placeDense(in.dense, parts);
    else
      hh.place({in.indices, in.count}, {in.values, in.count}, parts);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("worker {}: push_pull_sparse of tensor '{}': {}", self_.rank,
                                      name, e.what()));
  }
  auto task = std::make_shared<Task>();
  task->sparsePairs = parts.pairs();
  const size_t pre = wire::compressedPreambleBytes(kZenSpec, name);
  for (uint32_t p = 0; p < own.numServers(); ++p) {
    const zen::PushForm form = zen::choosePushForm(parts.indices[p], opts_.compactSparse);
    Buffer body = Buffer::allocate(pre + zen::pushBytes(parts.indices[p], form));
    wire::writeCompressedPreamble(body.data(), kZenSpec, name);
    zen::writePush(own, p, parts.indices[p], parts.values[p], form,
                   {reinterpret_cast<std::byte*>(body.data() + pre), body.size() - pre});
    task->sparse.push_back(std::move(body));
  }
  task->sparseAnswers.resize(own.numServers());
  task->sparseChecked.resize(own.numServers());
  auto state = std::make_shared<Handle::State>();
  state->name = name;
  {
    std::lock_guard<std::mutex> lk(mu_);
    checkFailedLocked();
    TensorEntry& t = tensorLocked(name, "push_pull_sparse");
    task->output = reinterpret_cast<uint8_t*>(output);
    task->input = nullptr;
    task->op = op;
    task->priority = priority;
    enqueueLocked(t, state, task);
  }
  cv_.notify_all();
  return Handle(state);
}

void WorkerImpl::sendSparseChunk(const ChunkOp& op, uint32_t id) {
  const TensorEntry& t = *op.task->tensor;
  const Chunk& c = t.chunks[op.chunk];
  const NodeId server = book_.servers[c.server].id;
  DataHeader h;
  h.dtype = DType::kFloat32;
  h.flags = wire::kFlagSparse;
  h.requestId = id;
  h.key = c.key;
  h.round = op.task->round;
  h.numElements = c.numElements;
  h.contributors = t.options.contributors;
  try {
    h.op = Op::kPush;
    const Buffer& body = op.task->sparse[op.chunk];
    h.bodyBytes = body.size();
    countPushed(*op.task, body.size());
    Message push;
    push.parts.push_back(wire::encodeHeader(h));
    push.parts.push_back(body);
    transport_->send(server, std::move(push));
    h.op = Op::kPull;
    h.bodyBytes = 0;
    h.contributors = 0;
    Message pull;
    pull.parts.push_back(wire::encodeHeader(h));
    pull.parts.push_back(Buffer());
    transport_->send(server, std::move(pull));
  } catch (const Error& e) {
    finishChunk(id,
                Status(e.code(), fmt::format("push_pull of sparse tensor '{}' to {}: {}", t.name,
                                             server.toString(), e.what())),
                nullptr);
  }
}

void WorkerImpl::takeSparseAnswer(const TensorEntry& t, Task& task, size_t chunk, const Message& m,
                                  const DataHeader& h) {
  CORTADO_ENFORCE(h.flags & wire::kFlagSparse, ErrorCode::kProtocol,
                  "{} answered a sparse pull with a dense body", m.from.toString());
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(m.parts[1].data()),
                                     m.parts[1].size());
  const auto p = static_cast<uint32_t>(chunk);
  zen::CheckedAnswer& checked = task.sparseChecked[chunk];
  try {
    // Checked whole (and its indices decoded) here; written into the
    // output with the others' once all are in, so nothing is written for a
    // round with a malformed answer.
    zen::checkAnswer(payload, t.zen->ownership(), p, t.zen->of(p), checked);
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol,
                fmt::format("malformed sparse answer from {}: {}", m.from.toString(), e.what()));
  }
  task.sparseAnswers[chunk] = m.parts[1];  // holds the values that `checked` points at
  std::lock_guard<std::mutex> lk(task.handle->mu);
  task.sparseUnion += checked.header.count;
}

void WorkerImpl::assembleSparse(const TensorEntry& t, Task& task) {
  const float scale = task.op == ReduceOp::kAverage ? 1.0f / float(size()) : 1.0f;
  if (t.numElements > 0)
    zen::assembleDense(task.sparseChecked, t.numElements, scale,
                       reinterpret_cast<float*>(task.output));
  task.sparseChecked.clear();
  task.sparseAnswers.clear();  // the transport's buffers go back now
}

void WorkerImpl::noteSparseRound(TensorEntry& t, const Task& task) {
  // Written by the thread that completes the round's last chunk; rounds of a
  // tensor never overlap, so nothing else touches these meanwhile.
  if (t.profiledRounds >= kProfileRounds) return;
  t.profiledPairs += task.sparsePairs;
  t.profiledUnion += task.sparseUnion;
  if (++t.profiledRounds < kProfileRounds || t.numElements == 0) return;
  // Equations (1) and (2) of specs/zen.md with the first rounds' mean
  // density of this worker and of the sum; gamma between 1 and n from the
  // overlap model. Both times scale with 1 / bandwidth, so the nominal
  // 1 Gbit/s only sets the printed times, not the choice.
  const double M = double(t.numElements), R = double(kProfileRounds);
  const auto profile = compressor::zen::profileFromUnion(
      t.numElements, size(), double(t.profiledPairs) / R / M, double(t.profiledUnion) / R / M);
  const auto choice = compressor::zen::chooseScheme(profile, 125e6);
  CORTADO_LOG_INFO(
      "worker {}: sparse tensor '{}' over its first {} rounds: {}{}", self_.rank, t.name,
      kProfileRounds, choice.figures,
      choice.scheme == compressor::zen::Scheme::kBalancedParallelism
          ? ""
          : "; this job runs balanced parallelism through its servers all the same (hierarchical "
            "centralization needs worker-to-worker exchange: docs/zen.md)");
}

}  // namespace cortado::detail
