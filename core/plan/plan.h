// Plan data types: what the planner decides for each tensor and what the
// worker's plan executor (issue 7) runs. A plan is data: it is versioned,
// serialized to JSON, and validated by every worker before use, so a plan that
// would sum compressed payloads in a collective never reaches the data path.
//
// A tensor's option is the sequence of steps its gradient goes through after it
// is ready: encodes and decodes (on GPU or CPU) and communication steps (an
// operation over a scope of ranks, carrying raw or compressed data). Where the
// data lives between steps (device or host) is implied by the steps; the
// executor inserts the copies.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace cortado::plan {

enum class Device : uint8_t { kGpu, kCpu };

// Which ranks a communication step spans. kFlat: all workers of the job;
// kIntra: the GPUs of one machine; kInter: one rank per machine (or, for push
// and pull, the workers of each machine and the CPU servers).
enum class Scope : uint8_t { kFlat, kIntra, kInter };

enum class CommOp : uint8_t {
  kAllreduce,
  kReduceScatter,
  kReduce,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kGather,
  kPush,  // to the CPU servers, which sum (decoding first if compressed)
  kPull,  // from the CPU servers (re-encoded there if compressed)
  // Zen for sparse tensors (docs/zen.md): the raw tensor scanned for its
  // non-zeros and summed as (index, value) pairs over the world group
  // (core/zen_collective.h, host memory), with balanced parallelism or
  // hierarchical centralization. A flat option's only step, or the inter
  // step between an intra reduce-scatter and allgather.
  kZenBalanced,
  kZenCentralized,
};
// True for kZenBalanced and kZenCentralized.
bool isZen(CommOp op);

enum class StepKind : uint8_t { kEncode, kDecode, kComm };

struct Step {
  StepKind kind = StepKind::kComm;
  Device device = Device::kGpu;  // encode and decode only
  Scope scope = Scope::kFlat;    // comm only
  CommOp op = CommOp::kAllreduce;  // comm only
  bool compressed = false;         // comm only: carries codec payloads

  static Step encode(Device d) { return Step{StepKind::kEncode, d, Scope::kFlat, CommOp::kAllreduce, false}; }
  static Step decode(Device d) { return Step{StepKind::kDecode, d, Scope::kFlat, CommOp::kAllreduce, false}; }
  static Step comm(Scope s, CommOp op, bool compressed) {
    return Step{StepKind::kComm, Device::kGpu, s, op, compressed};
  }
  bool operator==(const Step& o) const;
};

// One tensor's strategy.
struct TensorOption {
  bool hierarchical = false;
  std::vector<Step> steps;
  std::string codec;  // codec spec ("dgc:ratio=0.01"); empty when nothing is compressed

  bool compressed() const;  // true when some step carries compressed data
  // Tensor fusion (docs/executor.md, "Tensor fusion"): tensors of a batch
  // with the same fusible option may run as one execution on their
  // concatenation. Fusible: nothing compressed and no codec (a codec encodes
  // each tensor on its own; error-feedback residuals are per tensor) and no
  // push/pull (shard keys are declared per tensor with the servers): only
  // collectives, each of which sums element by element. A Zen step is not
  // fusible (its cost depends on each tensor's own density).
  bool fusible() const;
  // The option is Zen's (its one step is kZenBalanced or kZenCentralized).
  bool zen() const;
  // Short human-readable form, e.g. "H: rs | E(gpu) a2a* ag* D(gpu) | ag".
  std::string describe() const;
  bool operator==(const TensorOption& o) const = default;
};

// A versioned plan. Workers switch plans at the same iteration boundary, so a
// plan carries the version the scheduler assigned to it.
struct Plan {
  uint64_t version = 0;
  std::map<std::string, TensorOption> tensors;  // keyed by tensor name
  // Fused groups (Cupcake, MergeComp; docs/executor.md, "Fused groups"): each
  // a list of two or more tensors, consecutive in gradient-ready order, that
  // share one option and run it once on their concatenation (one encode, one
  // communication step or server key, one decode). A tensor is in at most
  // one group; tensors in none run on their own. Any option may be grouped,
  // compressed and push/pull included; the codec's statistics are then the
  // group's (top-k selects over the whole group).
  std::vector<std::vector<std::string>> groups;

  // The index into `groups` of the group holding `tensor`, or -1.
  int groupOf(std::string_view tensor) const;
};

// Throws cortado::Error (kInvalidArgument) naming the tensor and the step when
// the option is not a valid path through the decision tree: a compressed step
// that sums (allreduce, reduce-scatter, reduce), an encode of compressed data,
// an unpaired first step, a flat step in a hierarchical option, data left
// compressed at the end, a missing codec, a Zen step that is neither a flat
// option's only raw step nor the inter step of 'i.rs x.zen i.ag', and so on.
void validate(const TensorOption& option, std::string_view tensor = "<tensor>");
// A plan: every option, and every group: two or more members, each a tensor of
// the plan, in one group at most, all on the same option, with a codec that
// can encode a concatenation (not powersgd, which needs a matrix shape), and
// not Zen.
void validate(const Plan& plan);

std::string_view toString(Device d);
std::string_view toString(Scope s);
std::string_view toString(CommOp op);
Device deviceFromString(std::string_view s);
Scope scopeFromString(std::string_view s);
CommOp commOpFromString(std::string_view s);

// JSON: see docs/planner.md. Parsing validates.
nlohmann::json toJson(const TensorOption& option);
nlohmann::json toJson(const Plan& plan);
TensorOption optionFromJson(const nlohmann::json& j, std::string_view tensor = "<tensor>");
Plan planFromJson(const nlohmann::json& j);
std::string toJsonString(const Plan& plan, int indent = 2);
Plan planFromJsonString(std::string_view text);

}  // namespace cortado::plan
