#include "core/plan/plan.h"

#include <nlohmann/json.hpp>

#include <array>
#include <utility>

#include "core/common/error.h"

namespace cortado::plan {
namespace {

using nlohmann::json;

constexpr std::array<std::pair<Device, std::string_view>, 2> kDevices{{
    {Device::kGpu, "gpu"},
    {Device::kCpu, "cpu"},
}};
constexpr std::array<std::pair<Scope, std::string_view>, 3> kScopes{{
    {Scope::kFlat, "flat"},
    {Scope::kIntra, "intra"},
    {Scope::kInter, "inter"},
}};
constexpr std::array<std::pair<CommOp, std::string_view>, 11> kOps{{
    {CommOp::kAllreduce, "allreduce"},
    {CommOp::kReduceScatter, "reduce_scatter"},
    {CommOp::kReduce, "reduce"},
    {CommOp::kAllgather, "allgather"},
    {CommOp::kBroadcast, "broadcast"},
    {CommOp::kAlltoall, "alltoall"},
    {CommOp::kGather, "gather"},
    {CommOp::kPush, "push"},
    {CommOp::kPull, "pull"},
    {CommOp::kZenBalanced, "zen_bp"},
    {CommOp::kZenCentralized, "zen_hc"},
}};

template <typename E, size_t N>
std::string_view nameOf(const std::array<std::pair<E, std::string_view>, N>& table, E v) {
  for (const auto& [e, s] : table)
    if (e == v) return s;
  return "?";
}

template <typename E, size_t N>
E parseName(const std::array<std::pair<E, std::string_view>, N>& table, std::string_view s,
            const char* what) {
  std::string valid;
  for (const auto& [e, name] : table) {
    if (name == s) return e;
    valid += valid.empty() ? "" : ", ";
    valid += name;
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown {} '{}' (valid: {})", what, s, valid));
}

std::string_view shortOp(CommOp op) {
  switch (op) {
    case CommOp::kAllreduce: return "ar";
    case CommOp::kReduceScatter: return "rs";
    case CommOp::kReduce: return "red";
    case CommOp::kAllgather: return "ag";
    case CommOp::kBroadcast: return "bc";
    case CommOp::kAlltoall: return "a2a";
    case CommOp::kGather: return "ga";
    case CommOp::kPush: return "push";
    case CommOp::kPull: return "pull";
    case CommOp::kZenBalanced: return "zen.bp";
    case CommOp::kZenCentralized: return "zen.hc";
  }
  return "?";
}

// The operation a first (divisible) step must be followed by.
bool isFirstStep(CommOp op) {
  return op == CommOp::kReduceScatter || op == CommOp::kReduce || op == CommOp::kAlltoall ||
         op == CommOp::kGather || op == CommOp::kPush;
}
CommOp pairOf(CommOp first) {
  switch (first) {
    case CommOp::kReduceScatter:
    case CommOp::kAlltoall: return CommOp::kAllgather;
    case CommOp::kReduce:
    case CommOp::kGather: return CommOp::kBroadcast;
    default: return CommOp::kPull;
  }
}
bool sums(CommOp op) {
  return op == CommOp::kAllreduce || op == CommOp::kReduceScatter || op == CommOp::kReduce;
}

// Walks an option's steps with the state a worker's data would have.
class Validator {
 public:
  Validator(const TensorOption& o, std::string_view tensor) : o_(o), tensor_(tensor) {}

  void run() {
    CORTADO_ENFORCE(!o_.steps.empty(), ErrorCode::kInvalidArgument,
                    "plan for tensor '{}': no steps", tensor_);
    for (size_t i = 0; i < o_.steps.size(); ++i)
      if (o_.steps[i].kind == StepKind::kComm && isZen(o_.steps[i].op)) return zen(i);
    codecSteps();
    if (!o_.hierarchical) {
      stage(Scope::kFlat, /*indivisibleOk=*/true);
    } else {
      CommOp first = firstStep(Scope::kIntra, "hierarchical option must start with a divisible "
                                              "intra-machine step");
      codecSteps();
      stage(Scope::kInter, /*indivisibleOk=*/true);
      secondStep(Scope::kIntra, first);
      codecSteps();
    }
    if (i_ < o_.steps.size()) fail(i_, "unexpected step after the last communication step");
    if (compressed_) fail(o_.steps.size() - 1, "data is still compressed after the last step (decode missing)");
    const bool anyCompressed = o_.compressed();
    if (anyCompressed && o_.codec.empty()) fail(0, "compressed option without a codec spec");
    if (!anyCompressed && !o_.codec.empty())
      fail(0, fmt::format("codec '{}' given but no step is compressed", o_.codec));
  }

 private:
  // A Zen step: the raw tensor in, its sum out, over the world group. Not
  // through the servers: their Zen keys are the worker engine's
  // (Worker::pushPullSparse), which the plan executor does not run.
  // Flat: the option's only step. Hierarchical: between an intra-machine
  // reduce-scatter and allgather (the spec's data path: dense within a
  // machine, sparse across machines, each local rank's shard over the
  // inter-machine group).
  void zen(size_t at) {
    const Step& s = o_.steps[at];
    const Scope want = o_.hierarchical ? Scope::kInter : Scope::kFlat;
    if (s.scope != want)
      fail(at, "Zen runs over a collective group (core/zen_collective), not through the CPU "
               "servers (the executor does not run the servers' Zen keys): use 'F: zen.bp' "
               "(one flat step) or 'H: i.rs x.zen.bp i.ag' (the same for zen_hc)");
    if (s.compressed)
      fail(at, "a Zen step carries the raw tensor (it finds the non-zeros itself)");
    if (o_.hierarchical) {
      const bool ok = o_.steps.size() == 3 && at == 1 &&
                      o_.steps[0] == Step::comm(Scope::kIntra, CommOp::kReduceScatter, false) &&
                      o_.steps[2] == Step::comm(Scope::kIntra, CommOp::kAllgather, false);
      if (!ok)
        fail(at, "a hierarchical Zen option is exactly 'intra reduce_scatter, inter zen, intra "
                 "allgather', all raw");
    } else if (o_.steps.size() != 1) {
      fail(at == 0 ? 1 : 0, "a Zen option has exactly one step, the Zen step");
    }
    if (!o_.codec.empty())
      fail(0, fmt::format("codec '{}' given, but a Zen option compresses nothing", o_.codec));
  }

  [[noreturn]] void fail(size_t at, std::string_view why) const {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("plan for tensor '{}', step {} ({}): {}", tensor_, at,
                            at < o_.steps.size() ? describeStep(o_.steps[at]) : "end", why));
  }

  static std::string describeStep(const Step& s) {
    if (s.kind == StepKind::kEncode) return fmt::format("encode on {}", toString(s.device));
    if (s.kind == StepKind::kDecode) return fmt::format("decode on {}", toString(s.device));
    return fmt::format("{} {}{}", toString(s.scope), toString(s.op),
                       s.compressed ? " compressed" : "");
  }

  // Encodes and decodes between communication steps. An encode directly
  // followed by a decode does nothing useful and is rejected.
  void codecSteps() {
    bool lastWasEncode = false;
    while (i_ < o_.steps.size() && o_.steps[i_].kind != StepKind::kComm) {
      const Step& s = o_.steps[i_];
      if (s.kind == StepKind::kEncode) {
        if (compressed_) fail(i_, "encode of data that is already compressed");
        compressed_ = true;
        lastWasEncode = true;
      } else {
        if (!compressed_) fail(i_, "decode of data that is not compressed");
        if (lastWasEncode) fail(i_, "decode right after encode, with no communication between");
        compressed_ = false;
        lastWasEncode = false;
      }
      ++i_;
    }
  }

  const Step& comm(Scope scope, const char* expected) {
    if (i_ >= o_.steps.size()) fail(i_, fmt::format("missing {}", expected));
    const Step& s = o_.steps[i_];
    if (s.kind != StepKind::kComm) fail(i_, fmt::format("expected {}", expected));
    if (s.scope != scope)
      fail(i_, fmt::format("expected a {} step ({})", toString(scope), expected));
    if (s.compressed != compressed_)
      fail(i_, compressed_ ? "the data is compressed here but the step says raw"
                           : "the data is raw here but the step says compressed");
    if (s.compressed && sums(s.op))
      fail(i_, fmt::format("compressed payloads cannot be summed by {}; use allgather, "
                           "alltoall or gather",
                           toString(s.op)));
    return s;
  }

  CommOp firstStep(Scope scope, const char* expected) {
    const Step& s = comm(scope, expected);
    if (!isFirstStep(s.op)) fail(i_, expected);
    if (!s.compressed && (s.op == CommOp::kAlltoall || s.op == CommOp::kGather))
      fail(i_, "raw data is reduced with reduce_scatter or reduce, not alltoall or gather");
    if (s.op == CommOp::kPush && scope != Scope::kInter)
      fail(i_, "push and pull go through the CPU servers: inter-machine steps only");
    ++i_;
    return s.op;
  }

  void secondStep(Scope scope, CommOp first) {
    CommOp want = pairOf(first);
    const Step& s = comm(scope, "the second step of a divisible pair");
    if (s.op != want)
      fail(i_, fmt::format("{} pairs with {}, not {}", toString(first), toString(want),
                           toString(s.op)));
    ++i_;
  }

  // One collective stage: an indivisible step, or a first step, codec steps,
  // and its second step. Push and pull are adjacent: the servers do the
  // decoding, summing and re-encoding between them.
  void stage(Scope scope, bool indivisibleOk) {
    if (i_ >= o_.steps.size()) fail(i_, "missing communication step");
    const Step& s = comm(scope, "a communication step");
    if (!isFirstStep(s.op)) {
      if (!indivisibleOk) fail(i_, "expected a divisible first step");
      if (s.op == CommOp::kAllreduce || (s.op == CommOp::kAllgather && s.compressed)) {
        if (s.op == CommOp::kAllgather) compressed_ = true;  // pieces stay compressed
        ++i_;
        codecSteps();
        return;
      }
      fail(i_, s.compressed ? "a compressed tensor's indivisible step is allgather"
                            : "a raw tensor's indivisible step is allreduce");
    }
    CommOp first = firstStep(scope, "a first step");
    if (first == CommOp::kPush) {
      if (i_ >= o_.steps.size() || o_.steps[i_].kind != StepKind::kComm)
        fail(i_, "push must be followed directly by pull");
      compressed_ = o_.steps[i_].compressed;  // the servers decode or re-encode as needed
    } else {
      codecSteps();
    }
    secondStep(scope, first);
    codecSteps();
  }

  const TensorOption& o_;
  std::string_view tensor_;
  size_t i_ = 0;
  bool compressed_ = false;
};

}  // namespace

bool Step::operator==(const Step& o) const {
  if (kind != o.kind) return false;
  if (kind == StepKind::kComm) return scope == o.scope && op == o.op && compressed == o.compressed;
  return device == o.device;
}

bool TensorOption::compressed() const {
  // A pull from the servers can be compressed without a worker-side encode.
  for (const Step& s : steps)
    if (s.kind == StepKind::kEncode || (s.kind == StepKind::kComm && s.compressed)) return true;
  return false;
}

bool isZen(CommOp op) { return op == CommOp::kZenBalanced || op == CommOp::kZenCentralized; }

bool TensorOption::fusible() const {
  if (!codec.empty() || compressed()) return false;
  for (const Step& s : steps)
    if (s.kind != StepKind::kComm || s.op == CommOp::kPush || s.op == CommOp::kPull || isZen(s.op))
      return false;
  return !steps.empty();
}

bool TensorOption::zen() const {
  for (const Step& s : steps)
    if (s.kind == StepKind::kComm && isZen(s.op)) return true;
  return false;
}

std::string TensorOption::describe() const {
  std::string out = hierarchical ? "H:" : "F:";
  for (const Step& s : steps) {
    out += ' ';
    if (s.kind == StepKind::kEncode) {
      out += s.device == Device::kGpu ? "E(g)" : "E(c)";
    } else if (s.kind == StepKind::kDecode) {
      out += s.device == Device::kGpu ? "D(g)" : "D(c)";
    } else {
      if (hierarchical) out += s.scope == Scope::kIntra ? "i." : "x.";
      out += shortOp(s.op);
      if (s.compressed) out += '*';
    }
  }
  return out;
}

void validate(const TensorOption& option, std::string_view tensor) {
  Validator(option, tensor).run();
}

void validate(const Plan& plan) {
  for (const auto& [name, option] : plan.tensors) validate(option, name);
  std::map<std::string_view, size_t> seen;  // tensor -> its group
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const auto& members = plan.groups[g];
    CORTADO_ENFORCE(members.size() >= 2, ErrorCode::kInvalidArgument,
                    "plan group {} has {} member(s): a group fuses two or more tensors (leave a "
                    "lone tensor out of the groups)",
                    g, members.size());
    for (const std::string& m : members) {
      auto it = plan.tensors.find(m);
      CORTADO_ENFORCE(it != plan.tensors.end(), ErrorCode::kInvalidArgument,
                      "plan group {} names tensor '{}', which has no option in the plan", g, m);
      auto [at, fresh] = seen.emplace(it->first, g);
      CORTADO_ENFORCE(fresh, ErrorCode::kInvalidArgument,
                      "tensor '{}' is in plan group {} and again in group {}: a tensor belongs "
                      "to one group at most",
                      m, at->second, g);
      const TensorOption& first = plan.tensors.at(members.front());
      CORTADO_ENFORCE(
          it->second == first, ErrorCode::kInvalidArgument,
          "plan group {}: tensor '{}' has option {} but '{}' has {}: a group's "
          "tensors share one option",
          g, m, it->second.describe() + (it->second.codec.empty() ? "" : " " + it->second.codec),
          members.front(), first.describe() + (first.codec.empty() ? "" : " " + first.codec));
    }
    CORTADO_ENFORCE(!plan.tensors.at(members.front()).zen(), ErrorCode::kInvalidArgument,
                    "plan group {} ('{}'...) is on a Zen option: Zen sums each sparse tensor on "
                    "its own (leave its tensors out of the groups)",
                    g, members.front());
    const std::string& codec = plan.tensors.at(members.front()).codec;
    CORTADO_ENFORCE(codec.rfind("powersgd", 0) != 0, ErrorCode::kInvalidArgument,
                    "plan group {} ('{}' ..): codec '{}' needs each tensor's matrix shape and "
                    "cannot encode a concatenation; leave its tensors out of the groups",
                    g, members.front(), codec);
  }
}

int Plan::groupOf(std::string_view tensor) const {
  for (size_t g = 0; g < groups.size(); ++g)
    for (const std::string& m : groups[g])
      if (m == tensor) return int(g);
  return -1;
}

std::string_view toString(Device d) { return nameOf(kDevices, d); }
std::string_view toString(Scope s) { return nameOf(kScopes, s); }
std::string_view toString(CommOp op) { return nameOf(kOps, op); }
Device deviceFromString(std::string_view s) { return parseName(kDevices, s, "device"); }
Scope scopeFromString(std::string_view s) { return parseName(kScopes, s, "scope"); }
CommOp commOpFromString(std::string_view s) { return parseName(kOps, s, "operation"); }

json toJson(const TensorOption& option) {
  json steps = json::array();
  for (const Step& s : option.steps) {
    if (s.kind == StepKind::kComm) {
      steps.push_back({{"op", toString(s.op)}, {"scope", toString(s.scope)},
                       {"compressed", s.compressed}});
    } else {
      steps.push_back({{"op", s.kind == StepKind::kEncode ? "encode" : "decode"},
                       {"device", toString(s.device)}});
    }
  }
  json j{{"scheme", option.hierarchical ? "hierarchical" : "flat"}, {"steps", std::move(steps)}};
  if (!option.codec.empty()) j["codec"] = option.codec;
  return j;
}

json toJson(const Plan& plan) {
  json tensors = json::object();
  for (const auto& [name, option] : plan.tensors) tensors[name] = toJson(option);
  json j{{"format", "cortado-plan"}, {"version", plan.version}, {"tensors", std::move(tensors)}};
  if (!plan.groups.empty()) j["groups"] = plan.groups;
  return j;
}

TensorOption optionFromJson(const json& j, std::string_view tensor) {
  try {
    TensorOption o;
    std::string scheme = j.at("scheme").get<std::string>();
    CORTADO_ENFORCE(scheme == "flat" || scheme == "hierarchical", ErrorCode::kInvalidArgument,
                    "unknown scheme '{}' (valid: flat, hierarchical)", scheme);
    o.hierarchical = scheme == "hierarchical";
    if (j.contains("codec")) o.codec = j.at("codec").get<std::string>();
    for (const json& s : j.at("steps")) {
      std::string op = s.at("op").get<std::string>();
      if (op == "encode" || op == "decode") {
        Device d = deviceFromString(s.at("device").get<std::string>());
        o.steps.push_back(op == "encode" ? Step::encode(d) : Step::decode(d));
      } else {
        o.steps.push_back(Step::comm(scopeFromString(s.at("scope").get<std::string>()),
                                     commOpFromString(op), s.value("compressed", false)));
      }
    }
    validate(o, tensor);
    return o;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("plan for tensor '{}': malformed JSON: {}", tensor, e.what()));
  }
}

Plan planFromJson(const json& j) {
  try {
    CORTADO_ENFORCE(j.value("format", "") == "cortado-plan", ErrorCode::kInvalidArgument,
                    "not a cortado plan (\"format\" must be \"cortado-plan\")");
    Plan p;
    p.version = j.at("version").get<uint64_t>();
    for (const auto& [name, option] : j.at("tensors").items())
      p.tensors.emplace(name, optionFromJson(option, name));
    if (j.contains("groups"))
      p.groups = j.at("groups").get<std::vector<std::vector<std::string>>>();
    validate(p);
    return p;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("malformed plan JSON: {}", e.what()));
  }
}

std::string toJsonString(const Plan& plan, int indent) { return toJson(plan).dump(indent); }

Plan planFromJsonString(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("plan is not valid JSON: {}", e.what()));
  }
  return planFromJson(j);
}

}  // namespace cortado::plan
