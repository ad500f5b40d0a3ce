#include "launcher/trace_command.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/common/error.h"
#include "core/common/trace.h"

namespace cortado::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json readTrace(const fs::path& path) {
  std::ifstream f(path);
  CORTADO_ENFORCE(f.good(), ErrorCode::kInvalidArgument, "cannot read the trace {}", path.string());
  json doc = json::parse(f, nullptr, /*allow_exceptions=*/false);
  CORTADO_ENFORCE(!doc.is_discarded(), ErrorCode::kInvalidArgument,
                  "{} is not JSON (a trace-event file from --trace or `cortado plan --trace` is)",
                  path.string());
  if (doc.is_array()) doc = json{{"traceEvents", doc}};
  CORTADO_ENFORCE(doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array(),
                  ErrorCode::kInvalidArgument, "{} has no traceEvents array", path.string());
  return doc;
}

// One complete ("X") event, as the comparison sees it.
struct Span {
  int pid;
  std::string stage;
  int64_t iteration;  // -1: the file is one iteration (the planner's)
  double start, end;
  double waitUs = 0;   // the planner's "skew_wait_us": the skew it charges before this step
  std::string tensor;  // args.tensor, where given
};

std::string stageOf(const json& e) {
  if (e.contains("cat") && e["cat"].is_string() && !e["cat"].get<std::string>().empty())
    return e["cat"].get<std::string>();
  std::string name = e.value("name", "");
  if (e.contains("args") && e["args"].contains("tensor") && e["args"]["tensor"].is_string()) {
    const std::string tensor = " " + e["args"]["tensor"].get<std::string>();
    if (name.size() > tensor.size() && name.compare(name.size() - tensor.size(), tensor.size(), tensor) == 0)
      name.resize(name.size() - tensor.size());
  }
  return name;
}

// Reads the complete events and the process names of one document.
void collect(const json& doc, int pidBase, std::vector<Span>& spans, std::map<int, std::string>& processes) {
  for (const json& e : doc["traceEvents"]) {
    if (!e.is_object()) continue;
    const int pid = pidBase + e.value("pid", 0);
    const std::string ph = e.value("ph", "");
    if (ph == "M" && e.value("name", "") == "process_name" && e.contains("args"))
      processes[pid] = e["args"].value("name", "");
    if (ph != "X" || !e.contains("ts")) continue;
    int64_t it = -1;
    if (e.contains("args") && e["args"].contains("iteration") && e["args"]["iteration"].is_number_integer())
      it = e["args"]["iteration"].get<int64_t>();
    const double ts = e["ts"].get<double>();
    Span span{pid, stageOf(e), it, ts, ts + e.value("dur", 0.0), 0, {}};
    if (e.contains("args") && e["args"].is_object()) {
      const json& a = e["args"];
      if (a.contains("skew_wait_us") && a["skew_wait_us"].is_number())
        span.waitUs = a["skew_wait_us"].get<double>();
      if (a.contains("tensor") && a["tensor"].is_string())
        span.tensor = a["tensor"].get<std::string>();
    }
    spans.push_back(std::move(span));
  }
}

bool isServer(const std::string& process) { return process.rfind("server", 0) == 0; }

}  // namespace

TraceComparison compareTraces(const std::string& predicted, const std::string& measured, int64_t first,
                              int64_t last) {
  const bool ranged = first >= 0 || last >= 0;
  CORTADO_ENFORCE(!ranged || (first >= 0 && last >= first), ErrorCode::kInvalidArgument,
                  "--iterations {}:{}: give FIRST:LAST with 0 <= FIRST <= LAST", first, last);
  TraceComparison out;
  // Predicted: one file, one iteration, one GPU and its machine.
  std::vector<Span> pred;
  std::map<int, std::string> predProcs;
  collect(readTrace(predicted), 0, pred, predProcs);
  CORTADO_ENFORCE(!pred.empty(), ErrorCode::kInvalidArgument, "the predicted trace {} holds no events",
                  predicted);
  double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
  std::map<std::string, double> predStage, predWait;
  // A step that holds two lanes at once (a flat collective on the intra- and
  // inter-machine links) is drawn on both: it counts once, as a worker's
  // measured step does.
  std::set<std::tuple<std::string, std::string, double, double>> seen;
  for (const Span& s : pred) {
    lo = std::min(lo, s.start);
    hi = std::max(hi, s.end);
    if (!seen.emplace(s.stage, s.tensor, s.start, s.end).second) continue;
    predStage[s.stage] += s.end - s.start;
    predWait[s.stage] += s.waitUs;
  }
  out.predictedIterationUs = hi - lo;

  // Measured: every process's file (or one merged file), pids kept apart.
  std::vector<Span> meas;
  std::map<int, std::string> procs;
  std::vector<fs::path> files;
  if (fs::is_directory(measured)) {
    for (const auto& entry : fs::directory_iterator(measured))
      if (entry.path().extension() == ".json") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    CORTADO_ENFORCE(!files.empty(), ErrorCode::kInvalidArgument,
                    "{} holds no *.json traces (run the job with --trace {})", measured, measured);
  } else {
    files.push_back(measured);
  }
  for (size_t i = 0; i < files.size(); ++i) collect(readTrace(files[i]), static_cast<int>(i) * 1000000, meas, procs);
  CORTADO_ENFORCE(!meas.empty(), ErrorCode::kInvalidArgument,
                  "the measured trace {} holds no events (did the traced iterations run?)", measured);
  // The workers' spans by their iteration: those of the range.
  int64_t lowest = std::numeric_limits<int64_t>::max(), highest = -1;  // what the trace holds
  if (ranged) {
    for (const Span& s : meas)
      if (s.iteration >= 0 && !isServer(procs[s.pid]))
        lowest = std::min(lowest, s.iteration), highest = std::max(highest, s.iteration);
    std::erase_if(meas, [&](const Span& s) {
      return !isServer(procs[s.pid]) && (s.iteration < first || s.iteration > last);
    });
  }

  // Iteration spans per (worker, iteration).
  std::map<std::pair<int, int64_t>, std::pair<double, double>> span;
  for (const Span& s : meas) {
    if (isServer(procs[s.pid])) continue;
    auto [it, added] = span.emplace(std::make_pair(s.pid, s.iteration), std::make_pair(s.start, s.end));
    if (!added) {
      it->second.first = std::min(it->second.first, s.start);
      it->second.second = std::max(it->second.second, s.end);
    }
  }
  if (ranged) {
    CORTADO_ENFORCE(!span.empty(), ErrorCode::kInvalidArgument,
                    "the measured trace {} holds no worker events of iterations {}..{} (it holds {})", measured,
                    first, last == std::numeric_limits<int64_t>::max() ? std::string() : std::to_string(last),
                    highest < 0 ? std::string("none numbered") : fmt::format("{}..{}", lowest, highest));
    // A server numbers the rounds of each key from 0 (a key made for a later
    // plan, or a probe's, starts over), so its spans are kept by time
    // instead: those whose middle falls inside a kept worker iteration, on
    // the one clock the processes of a machine share (Tracer::now).
    std::erase_if(meas, [&](const Span& s) {
      if (!isServer(procs[s.pid])) return false;
      const double mid = (s.start + s.end) / 2;
      for (const auto& [key, w] : span)
        if (mid >= w.first && mid <= w.second) return false;
      return true;
    });
  }
  CORTADO_ENFORCE(!span.empty(), ErrorCode::kInvalidArgument,
                  "the measured trace {} has no worker events (only servers')", measured);

  // Stage sums over every process.
  std::map<int64_t, bool> iterations;
  std::map<int, bool> workers;
  std::map<std::string, double> measStage;
  for (const Span& s : meas) {
    measStage[s.stage] += s.end - s.start;
    if (isServer(procs[s.pid])) continue;
    iterations[s.iteration] = true;
    workers[s.pid] = true;
  }
  double total = 0;
  for (const auto& [key, se] : span) total += se.second - se.first;
  out.measuredIterationUs = total / static_cast<double>(span.size());
  out.iterations = static_cast<int>(iterations.size());
  out.workers = static_cast<int>(workers.size());

  const double per = static_cast<double>(out.workers) * out.iterations;
  std::map<std::string, StageGap> stages;
  for (const auto& [name, us] : predStage) stages[name].predictedUs = us;
  for (const auto& [name, us] : predWait) stages[name].predictedWaitUs = us;
  for (const auto& [name, us] : measStage) stages[name].measuredUs = us / per;
  for (auto& [name, g] : stages) {
    g.stage = name;
    out.stages.push_back(g);
  }
  std::stable_sort(out.stages.begin(), out.stages.end(), [](const StageGap& a, const StageGap& b) {
    return std::abs(a.measuredUs - a.predictedWithWaitUs()) >
           std::abs(b.measuredUs - b.predictedWithWaitUs());
  });
  return out;
}

int mergeTraces(const std::string& dir, const std::string& out) {
  CORTADO_ENFORCE(fs::is_directory(dir), ErrorCode::kInvalidArgument, "{} is not a directory of traces", dir);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".json" && fs::absolute(entry.path()) != fs::absolute(out))
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  CORTADO_ENFORCE(!files.empty(), ErrorCode::kInvalidArgument, "{} holds no *.json traces", dir);
  json events = json::array();
  int pid = 0;
  for (const auto& f : files) {
    ++pid;
    json doc = readTrace(f);
    bool named = false;
    for (json e : doc["traceEvents"]) {
      if (!e.is_object()) continue;
      named |= e.value("ph", "") == "M" && e.value("name", "") == "process_name";
      e["pid"] = pid;
      events.push_back(std::move(e));
    }
    if (!named) {
      events.push_back(
          {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", f.stem().string()}}}});
    }
  }
  std::ofstream o(out);
  o << json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
  o.close();
  CORTADO_ENFORCE(o.good(), ErrorCode::kUnavailable, "cannot write {}", out);
  return pid;
}

void addTraceCommand(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "merge run-time traces, compare them with the planner's prediction");
  trace->require_subcommand(1);

  auto* merge = trace->add_subcommand("merge", "put every process's trace of a --trace DIR into one file for Perfetto");
  static std::string mergeDir, mergeOut;
  merge->add_option("dir", mergeDir, "the --trace directory")->required();
  merge->add_option("-o,--output", mergeOut, "the merged trace file")->required();
  merge->callback([] {
    int n = mergeTraces(mergeDir, mergeOut);
    std::cout << fmt::format("merged {} process traces into {}\n", n, mergeOut);
  });

  auto* compare = trace->add_subcommand(
      "compare", "predicted vs measured iteration time and the five largest disagreements by stage");
  static std::string predicted, measured;
  static int top = 5;
  compare->add_option("--predicted", predicted, "trace from `cortado plan --trace`")->required();
  compare->add_option("--measured", measured, "the job's --trace directory (or a merged file)")->required();
  compare->add_option("--top", top, "how many stages to list")->check(CLI::Range(1, 1000));
  static std::string range;
  compare->add_option("--iterations", range,
                      "FIRST:LAST or FIRST:, only these measured iterations (e.g. one strategy's of a "
                      "`cortado bench model --trace` run: docs/tracing.md)");
  compare->callback([] {
    int64_t first = -1, last = -1;
    if (auto r = parseIterationRange(range, "--iterations")) {
      first = r->first;
      last = r->second < 0 ? std::numeric_limits<int64_t>::max() : r->second;  // "FIRST:": from FIRST on
    }
    auto c = compareTraces(predicted, measured, first, last);
    const double ratio = c.predictedIterationUs > 0 ? c.measuredIterationUs / c.predictedIterationUs : 0;
    std::cout << fmt::format("iteration time: predicted {:.3f} ms, measured {:.3f} ms ({} iterations, {} workers): "
                             "measured/predicted {:.2f}x, error {:+.1f}%\n",
                             c.predictedIterationUs / 1000, c.measuredIterationUs / 1000, c.iterations, c.workers,
                             ratio, (ratio - 1) * 100);
    std::cout << "\n| stage | predicted ms | the skew predicted before it ms | measured ms | "
                 "measured - predicted (with the skew) ms |\n|---|---|---|---|---|\n";
    for (size_t i = 0; i < c.stages.size() && i < static_cast<size_t>(top); ++i) {
      const auto& s = c.stages[i];
      std::cout << fmt::format("| {} | {:.3f} | {:.3f} | {:.3f} | {:+.3f} |\n", s.stage,
                               s.predictedUs / 1000, s.predictedWaitUs / 1000, s.measuredUs / 1000,
                               (s.measuredUs - s.predictedWithWaitUs()) / 1000);
    }
  });
}

}  // namespace cortado::launcher
