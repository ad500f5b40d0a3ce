#include "core/common/trace.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/common/env.h"
#include "core/common/error.h"
#include "core/common/logging.h"

namespace cortado {
namespace {

int64_t parseIteration(const std::string& s, const std::string& whole, const std::string& name) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  CORTADO_ENFORCE(used == s.size() && v >= 0, ErrorCode::kInvalidArgument,
                  "{}='{}' is not a range of iterations: use FIRST:LAST (e.g. 10:19), FIRST: (from "
                  "FIRST on) or all",
                  name, whole);
  return v;
}

}  // namespace

std::optional<std::pair<int64_t, int64_t>> parseIterationRange(const std::string& range,
                                                               const std::string& name) {
  if (range == "all" || range.empty()) return std::nullopt;
  const auto colon = range.find(':');
  CORTADO_ENFORCE(colon != std::string::npos, ErrorCode::kInvalidArgument,
                  "{}='{}' is not a range of iterations: use FIRST:LAST (e.g. 10:19), FIRST: (from "
                  "FIRST on) or all",
                  name, range);
  const int64_t first = parseIteration(range.substr(0, colon), range, name);
  const std::string lastText = range.substr(colon + 1);
  const int64_t last = lastText.empty() ? -1 : parseIteration(lastText, range, name);
  CORTADO_ENFORCE(lastText.empty() || last >= first, ErrorCode::kInvalidArgument,
                  "{}='{}': the last iteration is before the first", name, range);
  return std::pair{first, last};
}

TraceOptions TraceOptions::fromEnv(std::string process) {
  TraceOptions o;
  o.process = std::move(process);
  if (auto d = getEnv({"CORTADO_TRACE_DIR"})) o.dir = d->value;
  const auto r = getEnv({"CORTADO_TRACE_ITERATIONS"});
  if (auto range = parseIterationRange(r ? r->value : "all", "CORTADO_TRACE_ITERATIONS"))
    std::tie(o.first, o.last) = *range;
  return o;
}

Tracer::Tracer(TraceOptions opts) : opts_(std::move(opts)) {}

Tracer::~Tracer() {
  bool dirty;
  {
    std::lock_guard<std::mutex> lk(mu_);
    dirty = dirty_;
  }
  if (opts_.dir.empty() || !dirty) return;
  try {
    flush();
  } catch (const std::exception& e) {  // a destructor must not throw
    CORTADO_LOG_WARN("trace of {} not written: {}", opts_.process, e.what());
  }
}

double Tracer::now() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Tracer::record(const std::string& stage, const std::string& tensor, int64_t iteration,
                    const std::string& lane, double startUs, double endUs) {
  if (!wants(iteration)) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (events_.size() >= opts_.maxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(Event{stage, tensor, lane, iteration, startUs, std::max(0.0, endUs - startUs)});
  dirty_ = true;
}

size_t Tracer::events() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_.size();
}

size_t Tracer::dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return dropped_;
}

std::vector<Tracer::Event> Tracer::recorded() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_;
}

std::string Tracer::flush() {
  CORTADO_ENFORCE(!opts_.dir.empty(), ErrorCode::kInvalidArgument,
                  "flush(): no trace directory (tracing is off, or kept in memory only)");
  std::string file = opts_.process.empty() ? "process" : opts_.process;
  for (char& c : file)
    if (c == ' ' || c == '/') c = '-';
  const std::filesystem::path path = std::filesystem::path(opts_.dir) / (file + ".json");
  using nlohmann::json;
  json out = json::array();
  std::lock_guard<std::mutex> lk(mu_);
  out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", opts_.process}}}});
  std::map<std::string, int> lanes;
  for (const Event& e : events_) {
    auto [it, added] = lanes.emplace(e.lane, static_cast<int>(lanes.size()) + 1);
    if (added) {
      out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", it->second},
                     {"args", {{"name", e.lane}}}});
    }
    out.push_back({{"name", e.stage + " " + e.tensor},
                   {"cat", e.stage},
                   {"ph", "X"},
                   {"pid", 1},
                   {"tid", it->second},
                   {"ts", e.start},
                   {"dur", e.dur},
                   {"args", {{"tensor", e.tensor}, {"iteration", e.iteration}}}});
  }
  json doc{{"traceEvents", std::move(out)},
           {"displayTimeUnit", "ms"},
           {"otherData", {{"process", opts_.process}, {"dropped", dropped_}}}};
  std::error_code ec;
  std::filesystem::create_directories(opts_.dir, ec);
  std::ofstream f(path);
  f << doc.dump();
  f.close();
  CORTADO_ENFORCE(!ec && f.good(), ErrorCode::kUnavailable, "cannot write the trace {}: {}", path.string(),
                  ec ? ec.message() : "write failed (is the directory writable and the disk not full?)");
  if (dropped_ > 0) {
    CORTADO_LOG_WARN("trace of {}: {} events beyond the limit of {} were not kept; trace fewer "
                     "iterations (CORTADO_TRACE_ITERATIONS)",
                     opts_.process, dropped_, opts_.maxEvents);
  }
  dirty_ = false;
  return path.string();
}

}  // namespace cortado
