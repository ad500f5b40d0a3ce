// Run-time traces (core/common/trace.h) and `cortado trace merge/compare`
// (launcher/trace_command.h): the files are read back as JSON and every
// number is checked against a hand computation.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/common/trace.h"
#include "launcher/trace_command.h"

namespace cortado::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/cortado-trace-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

json load(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

ErrorCode codeOf(const std::function<void()>& f, std::string* msg = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

TEST(Tracer, KeepsTheIterationRangeAndWritesChromeEvents) {
  TempDir d;
  Tracer t({.dir = (d.path / "run").string(), .process = "worker 3", .first = 2, .last = 3});
  EXPECT_FALSE(t.wants(1));
  EXPECT_TRUE(t.wants(2));
  EXPECT_TRUE(t.wants(3));
  EXPECT_FALSE(t.wants(4));
  for (int it = 0; it < 6; ++it) t.record("encode", "fc.weight", it, "cpu", 100.0 * it, 100.0 * it + 40);
  t.record("inter allgather*", "fc.weight", 3, "network", 350, 390);
  EXPECT_EQ(t.events(), 3u);
  const std::string path = t.flush();
  EXPECT_EQ(path, (d.path / "run" / "worker-3.json").string());
  json doc = load(path);
  int complete = 0;
  std::set<std::string> lanes;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") lanes.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] == "M" && e["name"] == "process_name") {
      EXPECT_EQ(e["args"]["name"], "worker 3");
    }
    if (e["ph"] != "X") continue;
    ++complete;
    const int64_t it = e["args"]["iteration"];
    EXPECT_TRUE(it == 2 || it == 3);
    EXPECT_EQ(e["args"]["tensor"], "fc.weight");
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 40.0);
    EXPECT_EQ(e["name"], e["cat"].get<std::string>() + " fc.weight");
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(lanes, (std::set<std::string>{"cpu", "network"}));

  // Off: nothing is kept, and flush says why.
  Tracer off({});
  EXPECT_FALSE(off.wants(0));
  off.record("encode", "x", 0, "cpu", 0, 1);
  EXPECT_EQ(off.events(), 0u);
  EXPECT_EQ(codeOf([&] { off.flush(); }), ErrorCode::kInvalidArgument);

  // The bound: events beyond maxEvents are counted, not kept.
  Tracer small({.dir = d.path.string(), .process = "server 0", .maxEvents = 2});
  for (int i = 0; i < 5; ++i) small.record("server", "t", i, "cpu", i, i + 1);
  EXPECT_EQ(small.events(), 2u);
  EXPECT_EQ(small.dropped(), 3u);
}

// In memory only: the range applies, recorded() gives the events back in
// order, and nothing is written, by flush() (refused, saying why) or at the
// end.
TEST(Tracer, InMemoryKeepsTheEventsAndWritesNothing) {
  TempDir d;
  const fs::path cwd = fs::current_path();
  fs::current_path(d.path);
  {
    Tracer t({.inMemory = true, .process = "worker 1", .first = 1});
    EXPECT_TRUE(t.enabled());
    EXPECT_FALSE(t.wants(0));
    t.record("encode", "a", 0, "cpu", 0, 5);
    t.record("encode", "a", 1, "cpu", 10, 15);
    t.record("flat allgather*", "a", 1, "network", 15, 45);
    const auto ev = t.recorded();
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(ev[0].stage, "encode");
    EXPECT_EQ(ev[0].iteration, 1);
    EXPECT_DOUBLE_EQ(ev[0].start, 10);
    EXPECT_DOUBLE_EQ(ev[0].dur, 5);
    EXPECT_EQ(ev[1].stage, "flat allgather*");
    EXPECT_EQ(ev[1].lane, "network");
    EXPECT_DOUBLE_EQ(ev[1].dur, 30);
    std::string msg;
    EXPECT_EQ(codeOf([&] { t.flush(); }, &msg), ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("kept in memory only"), std::string::npos) << msg;
  }
  fs::current_path(cwd);
  EXPECT_TRUE(fs::is_empty(d.path));
}

TEST(Tracer, RangeFromTheEnvironment) {
  setenv("CORTADO_TRACE_DIR", "/tmp/x", 1);
  setenv("CORTADO_TRACE_ITERATIONS", "10:19", 1);
  auto o = TraceOptions::fromEnv("worker 0");
  EXPECT_EQ(o.dir, "/tmp/x");
  EXPECT_EQ(o.first, 10);
  EXPECT_EQ(o.last, 19);
  setenv("CORTADO_TRACE_ITERATIONS", "5:", 1);
  o = TraceOptions::fromEnv("worker 0");
  EXPECT_EQ(o.first, 5);
  EXPECT_LT(o.last, o.first);  // open-ended
  EXPECT_TRUE(Tracer(o).wants(1000));
  for (const char* bad : {"ten", "3:1", "-1:4", "1-4", "2:x"}) {
    setenv("CORTADO_TRACE_ITERATIONS", bad, 1);
    std::string msg;
    EXPECT_EQ(codeOf([] { TraceOptions::fromEnv("w"); }, &msg), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(msg.find("CORTADO_TRACE_ITERATIONS"), std::string::npos) << msg;
  }
  unsetenv("CORTADO_TRACE_ITERATIONS");
  unsetenv("CORTADO_TRACE_DIR");
  EXPECT_TRUE(TraceOptions::fromEnv("w").dir.empty());
}

// A predicted trace in the planner's format: names "<stage> <tensor>", no cat.
void writePredicted(const fs::path& p) {
  json ev = json::array();
  auto x = [&](const std::string& stage, const std::string& tensor, double ts, double dur) {
    ev.push_back({{"name", stage + " " + tensor}, {"ph", "X"}, {"pid", 1}, {"tid", 1}, {"ts", ts},
                  {"dur", dur}, {"args", {{"tensor", tensor}}}});
  };
  x("backward", "b", 0, 100);
  x("encode", "b", 100, 20);
  x("inter allgather*", "b", 120, 200);
  x("decode", "b", 320, 30);  // iteration: 0 .. 350
  std::ofstream(p) << json{{"traceEvents", ev}}.dump();
}

TEST(TraceCompare, IterationTimesAndStageGapsMatchAHandCount) {
  TempDir d;
  writePredicted(d.path / "pred.json");
  const fs::path run = d.path / "run";
  // Two workers, two iterations each, and one server.
  for (int w = 0; w < 2; ++w) {
    Tracer t({.dir = run.string(), .process = fmt::format("worker {}", w)});
    for (int it = 0; it < 2; ++it) {
      const double base = 1000.0 * it;
      t.record("backward", "b", it, "gpu", base, base + 100);
      t.record("encode", "b", it, "cpu", base + 100, base + 150);               // 50 vs 20
      t.record("inter allgather*", "b", it, "network", base + 150, base + 350);  // 200 vs 200
      t.record("decode", "b", it, "cpu", base + 350, base + 400 + 100 * w);     // 50 / 150 vs 30
    }
    t.flush();
  }
  {
    Tracer s({.dir = run.string(), .process = "server 0"});
    s.record("server", "b", 0, "cpu", 0, 80);
    s.record("server", "b", 1, "cpu", 1000, 1080);
    s.flush();
  }
  auto c = compareTraces((d.path / "pred.json").string(), run.string());
  EXPECT_DOUBLE_EQ(c.predictedIterationUs, 350);
  // Worker 0's iterations span 400 us, worker 1's 500 us: the mean is 450.
  EXPECT_DOUBLE_EQ(c.measuredIterationUs, 450);
  EXPECT_EQ(c.iterations, 2);
  EXPECT_EQ(c.workers, 2);
  std::map<std::string, StageGap> by;
  for (const auto& s : c.stages) by[s.stage] = s;
  EXPECT_DOUBLE_EQ(by["encode"].predictedUs, 20);
  EXPECT_DOUBLE_EQ(by["encode"].measuredUs, 50);
  EXPECT_DOUBLE_EQ(by["decode"].measuredUs, 100);  // (50 + 150) * 2 iterations / 4
  EXPECT_DOUBLE_EQ(by["inter allgather*"].measuredUs, 200);
  EXPECT_DOUBLE_EQ(by["server"].predictedUs, 0);
  EXPECT_DOUBLE_EQ(by["server"].measuredUs, 40);  // 160 over 2 workers x 2 iterations
  // Largest disagreement first: decode (+70), server (+40), encode (+30), ...
  ASSERT_GE(c.stages.size(), 3u);
  EXPECT_EQ(c.stages[0].stage, "decode");
  EXPECT_EQ(c.stages[1].stage, "server");
  EXPECT_EQ(c.stages[2].stage, "encode");

  // Merge: one file, three processes, every event kept.
  const fs::path merged = d.path / "all.json";
  EXPECT_EQ(mergeTraces(run.string(), merged.string()), 3);
  json doc = load(merged);
  std::set<int> pids;
  int complete = 0;
  for (const json& e : doc["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    complete += e["ph"] == "X";
  }
  EXPECT_EQ(pids, (std::set<int>{1, 2, 3}));
  EXPECT_EQ(complete, 18);
  // The merged file compares the same as the directory.
  auto c2 = compareTraces((d.path / "pred.json").string(), merged.string());
  EXPECT_DOUBLE_EQ(c2.measuredIterationUs, c.measuredIterationUs);

  // Iteration 1 alone: worker 0 spans 400 us, worker 1 500 us again; the
  // server's event of iteration 0 is left out (80 us over 2 workers x 1).
  auto c3 = compareTraces((d.path / "pred.json").string(), run.string(), 1, 1);
  EXPECT_EQ(c3.iterations, 1);
  EXPECT_DOUBLE_EQ(c3.measuredIterationUs, 450);
  std::map<std::string, StageGap> by3;
  for (const auto& s : c3.stages) by3[s.stage] = s;
  EXPECT_DOUBLE_EQ(by3["server"].measuredUs, 40);
  EXPECT_DOUBLE_EQ(by3["decode"].measuredUs, 100);  // (50 + 150) / 2 workers
  // A range with no events, and a reversed one, are named.
  std::string msg;
  EXPECT_EQ(codeOf([&] { compareTraces((d.path / "pred.json").string(), run.string(), 5, 9); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("iterations 5..9 (it holds 0..1)"), std::string::npos) << msg;
  EXPECT_EQ(codeOf([&] { compareTraces((d.path / "pred.json").string(), run.string(), 3, 2); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("FIRST:LAST"), std::string::npos) << msg;
}

TEST(TraceCompare, AStepOnTwoLanesCountsOnceAndItsSkewIsComparedWithIt) {
  // The planner draws a flat collective on the intra- and the inter-machine
  // lane, with the skew it charges before it (no lane) as "skew_wait_us".
  TempDir d;
  json ev = json::array();
  auto x = [&](const std::string& stage, int tid, double ts, double dur, double wait) {
    json args = {{"tensor", "b"}};
    if (wait > 0) args["skew_wait_us"] = wait;
    ev.push_back({{"name", stage + " b"},
                  {"ph", "X"},
                  {"pid", 1},
                  {"tid", tid},
                  {"ts", ts},
                  {"dur", dur},
                  {"args", args}});
  };
  x("encode", 7, 0, 100, 0);
  x("flat allgather*", 3, 160, 200, 60);  // after 60 us of skew
  x("flat allgather*", 4, 160, 200, 60);  // the same step, on the other lane
  x("decode", 7, 360, 40, 0);             // iteration: 0 .. 400
  std::ofstream(d.path / "pred.json") << json{{"traceEvents", ev}}.dump();
  const fs::path run = d.path / "run";
  {
    Tracer t({.dir = run.string(), .process = "worker 0"});
    t.record("encode", "b", 0, "cpu", 0, 110);                 // 110 vs 100
    t.record("flat allgather*", "b", 0, "network", 110, 390);  // 280: its wait inside, vs 200 + 60
    t.record("decode", "b", 0, "cpu", 390, 425);               // 35 vs 40
    t.flush();
  }
  auto c = compareTraces((d.path / "pred.json").string(), run.string());
  EXPECT_DOUBLE_EQ(c.predictedIterationUs, 400);
  std::map<std::string, StageGap> by;
  for (const auto& s : c.stages) by[s.stage] = s;
  EXPECT_DOUBLE_EQ(by["flat allgather*"].predictedUs, 200);  // once, not 400
  EXPECT_DOUBLE_EQ(by["flat allgather*"].predictedWaitUs, 60);
  EXPECT_DOUBLE_EQ(by["flat allgather*"].predictedWithWaitUs(), 260);
  EXPECT_DOUBLE_EQ(by["flat allgather*"].measuredUs, 280);
  EXPECT_EQ(by["encode"].predictedWaitUs, 0.0);
  // Ordered by the gap with the skew: allgather (+20), encode (+10), decode (-5).
  ASSERT_EQ(c.stages.size(), 3u);
  EXPECT_EQ(c.stages[0].stage, "flat allgather*");
  EXPECT_EQ(c.stages[1].stage, "encode");
}

TEST(TraceCompare, ARangeTakesTheServerSpansInsideItsIterations) {
  // A server numbers each key's rounds from 0: a probe's key before the
  // timed iterations and a key made for a later plan carry round numbers
  // that say nothing of the workers' iterations. A range takes the server
  // spans by time, those whose middle lies inside a kept iteration.
  TempDir d;
  writePredicted(d.path / "pred.json");
  const fs::path run = d.path / "run";
  for (int w = 0; w < 2; ++w) {
    Tracer t({.dir = run.string(), .process = fmt::format("worker {}", w)});
    for (int it = 5; it < 7; ++it) {  // iterations 5 and 6 at 5000 and 6000
      const double base = 1000.0 * it;
      t.record("backward", "b", it, "gpu", base, base + 100);
      t.record("inter push+pull*", "b", it, "network", base + 100, base + 400);
    }
    t.flush();
  }
  {
    Tracer s({.dir = run.string(), .process = "server 0"});
    s.record("server", "key 1", 5, "cpu", 100, 300);     // a probe's round 5, long before
    s.record("server", "key 2", 6, "cpu", 2000, 2100);   // a probe's round 6
    s.record("server", "plan1", 0, "cpu", 5200, 5260);   // the plan's key, round 0: iteration 5
    s.record("server", "plan1", 1, "cpu", 6200, 6240);   // round 1: iteration 6
    s.record("server", "plan1", 2, "cpu", 6500, 6700);   // after the workers' iteration 6 ended
    s.flush();
  }
  auto five = compareTraces((d.path / "pred.json").string(), run.string(), 5, 5);
  std::map<std::string, StageGap> by;
  for (const auto& g : five.stages) by[g.stage] = g;
  EXPECT_EQ(five.iterations, 1);
  EXPECT_DOUBLE_EQ(by["server"].measuredUs, 30);  // 60 over 2 workers x 1 iteration
  auto both = compareTraces((d.path / "pred.json").string(), run.string(), 5, 6);
  by.clear();
  for (const auto& g : both.stages) by[g.stage] = g;
  EXPECT_EQ(both.iterations, 2);
  EXPECT_DOUBLE_EQ(by["server"].measuredUs, 25);  // (60 + 40) over 2 workers x 2 iterations
  EXPECT_DOUBLE_EQ(by["inter push+pull*"].measuredUs, 300);
  // Without a range every event counts: 200 + 100 + 60 + 40 + 200 over 4.
  auto all = compareTraces((d.path / "pred.json").string(), run.string());
  by.clear();
  for (const auto& g : all.stages) by[g.stage] = g;
  EXPECT_DOUBLE_EQ(by["server"].measuredUs, 150);
}

TEST(TraceCompare, BadInputsAreNamed) {
  TempDir d;
  writePredicted(d.path / "pred.json");
  std::string msg;
  EXPECT_EQ(codeOf([&] { compareTraces((d.path / "none.json").string(), d.path.string()); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("none.json"), std::string::npos) << msg;
  std::ofstream(d.path / "junk.json") << "{not json";
  EXPECT_EQ(codeOf([&] { compareTraces((d.path / "junk.json").string(), d.path.string()); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("is not JSON"), std::string::npos) << msg;
  fs::create_directories(d.path / "empty");
  EXPECT_EQ(codeOf([&] { compareTraces((d.path / "pred.json").string(), (d.path / "empty").string()); }, &msg),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("no *.json traces"), std::string::npos) << msg;
  EXPECT_EQ(codeOf([&] { mergeTraces((d.path / "missing").string(), (d.path / "o.json").string()); }, &msg),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cortado::launcher
