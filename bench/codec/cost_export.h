// Measures encode and decode cost per codec and size and writes the fits the
// planner's compression cost model reads (scheduler/planner).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cortado {
class ThreadPool;
}

namespace cortado::bench {

// One codec at one size: seconds per call (medians) and the payload's size.
struct CostPoint {
  std::string spec;  // the codec's canonical spec
  size_t payloadBytes = 0;
  double encode = 0, decode = 0, decompressAdd = 0;
};
// Measures `spec` on `elements` fp32 elements with `reps` repetitions.
using CostMeasure = std::function<CostPoint(const std::string& spec, size_t elements, int reps)>;

struct CostExportOptions {
  std::string path;                 // JSON output
  std::vector<std::string> specs;   // codec specs to measure
  size_t maxElements = 1 << 24;     // largest size, in fp32 elements
  int reps = 20;                    // repetitions per size (median kept)
  ThreadPool* pool = nullptr;       // CPU codecs: nullptr = one thread
  std::string device = "cpu";       // "cpu" or "gpu", as the planner reads it
  std::string machine;              // empty: this host's kernel and cores
  CostMeasure measure;              // empty: the CPU codecs, on `pool`
};

// Returns a process exit code. JSON layout (schema "cortado.codec_costs.v1"):
// {"schema", "date", "machine", "threads", "model": "seconds = alpha + beta * input_bytes",
//  "entries": [{"codec": spec, "device": "cpu" | "gpu", "op": "encode" | "decode" | "decompress_add",
//               "alpha": s, "beta": s per byte,
//               "points": [{"elements", "input_bytes", "payload_bytes", "seconds"}]}]}
int runCostExport(const CostExportOptions& options);

// Removes `name=VALUE` from argv (a benchmark's own flags, before Google
// Benchmark parses the rest) and returns true with VALUE when it was there.
bool takeFlag(int& argc, char** argv, const std::string& name, std::string* value);

// Takes --threads=N from argv: the codec threads (at least 1), by default
// the machine's hardware threads.
size_t takeThreadsFlag(int& argc, char** argv);

// Takes --cost_max_elements=N, --cost_reps=R and --cost_codecs='a;b;...'
// from argv into `o`; the codecs are `defaultSpecs` when the flag is absent.
void takeCostFlags(int& argc, char** argv, CostExportOptions& o, std::vector<std::string> defaultSpecs);

// The median of `reps` runs of fn (after one warm-up run), in seconds as fn
// reports them (fn returns its own time: host clock or device events).
double medianOf(int reps, const std::function<double()>& fn);

}  // namespace cortado::bench
