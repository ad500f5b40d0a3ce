// Measures encode and decode cost per codec and size and writes the fits the
// planner's compression cost model reads (scheduler/planner).
#pragma once

#include <string>
#include <vector>

namespace cortado {
class ThreadPool;
}

namespace cortado::bench {

struct CostExportOptions {
  std::string path;                 // JSON output
  std::vector<std::string> specs;   // codec specs to measure
  size_t maxElements = 1 << 24;     // largest size, in fp32 elements
  int reps = 20;                    // repetitions per size (median kept)
  ThreadPool* pool = nullptr;       // nullptr: one thread
};

// Returns a process exit code. JSON layout (schema "cortado.codec_costs.v1"):
// {"schema", "date", "machine", "threads", "model": "seconds = alpha + beta * input_bytes",
//  "entries": [{"codec": spec, "device": "cpu", "op": "encode" | "decode" | "decompress_add",
//               "alpha": s, "beta": s per byte,
//               "points": [{"elements", "input_bytes", "payload_bytes", "seconds"}]}]}
int runCostExport(const CostExportOptions& options);

}  // namespace cortado::bench
