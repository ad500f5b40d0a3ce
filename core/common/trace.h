// Run-time tracing: what every worker and server did, stage by stage, for a
// range of iterations, written as Chrome trace-event JSON (viewable in
// Perfetto or chrome://tracing) so that it can be laid beside the planner's
// predicted timeline (`cortado plan --trace`) and compared with it
// (`cortado trace compare`).
//
// An event is one stage of one tensor in one iteration: its stage names the
// kind of work the way the planner's simulator names it ("encode", "decode",
// "copy d2h", "server", "<scope> <op>[*]" such as "inter allgather*", where
// "*" marks compressed data), its lane names the resource it ran on ("cpu",
// "network", ...). Only iterations in [first, last] are kept, so a long run
// can be traced for a window without growing without bound; at most
// `maxEvents` are kept in any case (the rest are counted and reported).
//
//   Tracer t({.dir = "/tmp/tr", .process = "worker 0", .first = 10, .last = 19});
//   auto s = Tracer::now();
//   ... encode ...
//   t.record("encode", "fc1.weight", 12, "cpu", s, Tracer::now());
//   t.flush();  // writes /tmp/tr/worker-0.json
//
// Thread-safe. record() is cheap when the tracer is off or the iteration is
// out of range (one branch); flush() may be called again to rewrite the file.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cortado {

// An iteration range as CORTADO_TRACE_ITERATIONS and `cortado trace compare
// --iterations` take it: "FIRST:LAST", "FIRST:" (last -1: from FIRST on), or
// "all" and "" (nullopt). Throws Error(kInvalidArgument) naming `name` and
// the expected form when it does not parse, or LAST is before FIRST.
std::optional<std::pair<int64_t, int64_t>> parseIterationRange(const std::string& range,
                                                               const std::string& name);

struct TraceOptions {
  std::string dir;       // empty: no file (tracing off unless inMemory)
  // Keep the events in memory only (recorded()), for a process that reads
  // its own stages back; nothing is written.
  bool inMemory = false;
  std::string process;   // e.g. "worker 3": the process name shown, and the file name (worker-3.json)
  int64_t first = 0;     // first iteration kept
  int64_t last = -1;     // last iteration kept; < first: every iteration
  size_t maxEvents = 1 << 20;

  // CORTADO_TRACE_DIR and CORTADO_TRACE_ITERATIONS ("10:19", "5:" or "all")
  // over the defaults; throws Error(kInvalidArgument) naming the variable
  // and the expected form when the range does not parse.
  static TraceOptions fromEnv(std::string process);
};

class Tracer {
 public:
  explicit Tracer(TraceOptions opts);
  ~Tracer();  // flushes if anything was recorded since the last flush (with a dir)
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  bool enabled() const { return !opts_.dir.empty() || opts_.inMemory; }
  bool wants(int64_t iteration) const {
    return enabled() && iteration >= opts_.first && (opts_.last < opts_.first || iteration <= opts_.last);
  }
  // Microseconds on a steady clock shared by the processes of one machine.
  static double now();

  void record(const std::string& stage, const std::string& tensor, int64_t iteration,
              const std::string& lane, double startUs, double endUs);

  // Writes <dir>/<process with spaces as dashes>.json (creating dir).
  // Returns the path; throws Error(kUnavailable) naming it when it cannot.
  std::string flush();
  size_t events() const;
  size_t dropped() const;

  struct Event {
    std::string stage, tensor, lane;
    int64_t iteration;
    double start, dur;  // microseconds (now()'s clock)
  };
  // A copy of the events kept so far, in the order recorded.
  std::vector<Event> recorded() const;

 private:
  TraceOptions opts_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  size_t dropped_ = 0;
  bool dirty_ = false;
};

}  // namespace cortado
