// `cortado trace merge` and `cortado trace compare`: the run-time traces
// that workers and servers write (--trace DIR, core/common/trace.h), put
// together for Perfetto, and laid beside the planner's predicted timeline
// (`cortado plan --trace`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cortado::launcher {

// One stage's time per iteration, predicted and measured.
struct StageGap {
  std::string stage;  // "encode", "inter allgather*", "server", ...
  double predictedUs = 0;
  // The workers' skew the prediction charges just before the stage's steps
  // (communication steps; the planner's "skew_wait_us"). It holds no lane in
  // the prediction, while a measured step's span holds the worker's wait for
  // the slowest one, so the step compares with predictedUs + predictedWaitUs.
  double predictedWaitUs = 0;
  double measuredUs = 0;
  double predictedWithWaitUs() const { return predictedUs + predictedWaitUs; }
};

struct TraceComparison {
  double predictedIterationUs = 0;
  double measuredIterationUs = 0;  // mean over the measured iterations
  int iterations = 0;              // measured iterations found
  int workers = 0;                 // worker traces read
  std::vector<StageGap> stages;  // every stage, largest |measured - predicted with the wait| first
};

// Reads a predicted trace (a file from `cortado plan --trace`) and a measured
// one (a directory of per-process traces, or one merged file), and compares:
// - iteration time: from the first event's start to the last event's end of
//   an iteration (predicted: the whole file; measured: each iteration of
//   each worker, then the mean);
// - per stage: the summed duration of the stage's events in one iteration,
//   per worker (measured: summed over every process, divided by the number
//   of workers and iterations; the servers' "server" events count too;
//   predicted: a step drawn on two lanes counts once, and the skew charged
//   before each step is summed apart, StageGap::predictedWaitUs).
// A stage is an event's "cat", or for the planner's events its name without
// the tensor name. Throws Error(kInvalidArgument) naming the file when a
// trace is missing, not JSON, or holds no events.
// `first`..`last` (inclusive): only the measured events of those iterations
// (one strategy's of a `cortado bench model --trace` run, say); the default
// takes every event.
TraceComparison compareTraces(const std::string& predicted, const std::string& measured,
                              int64_t first = -1, int64_t last = -1);

// Every *.json trace under `dir` in one trace-event file, one process each
// (sorted by file name). Returns the number of processes merged.
int mergeTraces(const std::string& dir, const std::string& out);

// Registers `trace` with `merge` and `compare` under `app`.
void addTraceCommand(CLI::App& app);

}  // namespace cortado::launcher
