// What a worker measured over one profiling window (online re-planning,
// docs/planner.md "Online re-planning"): summaries, not raw events, so that a
// report stays small whatever the window's length.
//  - ready: per tensor, the mean compute time from the iteration's start
//    (Executor::beginIteration) until the caller handed the gradient over,
//    with the time spent inside the executor in that iteration taken out;
//  - codecs: encode and decode calls by codec spec, device that ran them and
//    element count: calls and total microseconds;
//  - comms: communication steps by operation, scope, raw or compressed, group
//    size and bytes: calls and total microseconds. A push and its pull run as
//    one exchange and are reported as one kPush entry (the round trip), with
//    `bytes` = what this worker's machine sends in total, `chunks` = the
//    chunks (one server each) those bytes were cut into, `elements` = the
//    raw elements this worker pushed and `pullCompressed`, so that the
//    servers' work inside the round trip can be told from the link's time;
//  - the plan it ran: the distinct options of the plan in force at the
//    window's end, once each (`options`), and per ready tensor the index of
//    its option, so that the scheduler knows the plan the workers run (also
//    one it did not hand out, e.g. a plan file) at a few hundred bytes,
//    with its fused groups (`groups`, by tensor name);
//  - hostMemory: the buffers are host memory (the plan executor's), so a
//    "gpu" encode or decode ran the CPU codec and no copy was made;
//  - iterationUs: the window's mean wall time per iteration (from its first
//    beginIteration to the one that closed it; 0: not measured), with which
//    the scheduler checks a plan it handed out against the one before.
// Codec entries carry the slowest call (`maxUs`) too, so that one call of a
// descheduled worker can be told from the rest.
// Workers send it to the scheduler as JSON (ControlClient::sendProfile); both
// sides check kMaxProfileBytes and the entry limits, and parsing checks every
// field, so a malformed report is refused with the field that is wrong.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/plan/plan.h"

namespace cortado::plan {

inline constexpr size_t kMaxProfileBytes = 1 << 20;  // serialized report
inline constexpr size_t kMaxProfileEntries = 16384;  // per list

struct ReadyTime {
  std::string tensor;
  uint64_t elements = 0;
  double readyUs = 0;
  int option = -1;  // index into ProfileReport::options; -1: not given
};

struct CodecTiming {
  std::string codec;  // canonical spec
  Device device = Device::kCpu;
  bool encode = true;  // false: decode (decode and add one payload)
  uint64_t elements = 0;
  uint64_t calls = 0;
  double totalUs = 0;
  double maxUs = 0;  // the slowest call
};

struct CommTiming {
  CommOp op = CommOp::kAllreduce;
  Scope scope = Scope::kFlat;
  bool compressed = false;
  int groupSize = 1;
  uint64_t bytes = 0;
  // Push only (0 / false otherwise): the chunks `bytes` went in, the raw
  // elements this rank pushed, and whether the pull brought payloads back.
  uint64_t chunks = 0;
  uint64_t elements = 0;
  bool pullCompressed = false;
  uint64_t calls = 0;
  double totalUs = 0;
};

struct ProfileReport {
  int rank = 0;
  int machines = 1;
  int localSize = 1;
  bool collectives = true;    // the worker has MPI groups (flat and inter collectives)
  bool hostMemory = true;     // buffers in host memory: "gpu" codec steps ran on the CPU, no copies
  uint64_t fusionBytes = 0;   // the fusion threshold of the batches it ran (0: no runBatch, no fusion)
  uint64_t planVersion = 0;   // the plan it ran during the window
  uint64_t window = 0;        // 0, 1, 2, ...
  uint64_t firstIteration = 0;
  uint64_t endIteration = 0;  // exclusive; the iteration at which it was sent
  double iterationUs = 0;     // mean wall time per iteration of the window (0: not measured)
  std::vector<ReadyTime> ready;
  std::vector<CodecTiming> codecs;
  std::vector<CommTiming> comms;
  std::vector<TensorOption> options;  // the plan's distinct options (ReadyTime::option)
  // The plan's fused groups (Plan::groups), by tensor name: with `options`,
  // the plan the workers run. JSON "groups", optional (none: no groups).
  std::vector<std::vector<std::string>> groups;
};

nlohmann::json toJson(const ProfileReport& r);
std::string toJsonString(const ProfileReport& r);
// Throws cortado::Error (kProtocol) naming the field that is missing, has the
// wrong type or is out of range, or the limit that is exceeded.
ProfileReport profileFromJson(const nlohmann::json& j);
ProfileReport profileFromJsonString(std::string_view text);

}  // namespace cortado::plan
