// The re-planner's fits from the workers' reports (replan.h): links, codecs,
// per-operation curves, the running plan, the links' drift and bytes.
#include "scheduler/replan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "core/common/error.h"
#include "scheduler/planner/compile.h"
#include "scheduler/replan_fit.h"

namespace cortado::scheduler {

using plan::CommOp;
using plan::Scope;

namespace detail {

CurvePoint curvePoint(const plan::ProfileReport& r, const plan::CommTiming& c) {
  CurvePoint x{c.groupSize, double(c.bytes), c.totalUs / double(c.calls)};
  if (c.op == CommOp::kPush) {
    x.p = r.machines;
    x.us /= 2;
    const double m = double(r.machines);
    if (c.chunks > 0) x.bytes *= m * std::ceil(double(c.chunks) / m) / double(c.chunks);
  }
  return x;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool usable(const plan::CommTiming& c) {
  return c.calls > 0 && c.totalUs > 0 && std::isfinite(c.totalUs) && c.bytes > 0;
}

}  // namespace detail

using detail::CurvePoint;
using detail::curvePoint;
using detail::median;
using detail::usable;

namespace {

struct Point {
  double a, b, y, w;  // y = alpha * a + beta * b, weight w
};

// Weighted least squares for (alpha >= 0, beta > 0); nullopt without data.
std::optional<planner::AlphaBeta> solve(const std::vector<Point>& pts) {
  double saa = 0, sab = 0, sbb = 0, say = 0, sby = 0;
  for (const Point& p : pts) {
    saa += p.w * p.a * p.a, sab += p.w * p.a * p.b, sbb += p.w * p.b * p.b;
    say += p.w * p.a * p.y, sby += p.w * p.b * p.y;
  }
  if (sbb <= 0) return std::nullopt;
  double alpha = 0, beta = 0;
  const double det = saa * sbb - sab * sab;
  if (det > 1e-12 * saa * sbb) {
    alpha = (say * sbb - sab * sby) / det;
    beta = (saa * sby - sab * say) / det;
  }
  if (!(det > 1e-12 * saa * sbb) || alpha < 0 || beta <= 0) {  // one size, or noise: through the origin
    alpha = 0;
    beta = sby / sbb;
  }
  if (!(beta > 0) || !std::isfinite(beta)) return std::nullopt;
  planner::AlphaBeta ab;
  ab.alphaUs = alpha;
  ab.gbps = 8.0 / (beta * 1000.0);  // beta in us per byte
  return ab;
}

// A step that crossed a link: a push or pull between machines, a collective
// of two or more (a group of one is a local copy, no link's time).
bool onALink(const plan::ProfileReport& r, const plan::CommTiming& c) {
  return usable(c) && (c.op == CommOp::kPush || c.op == CommOp::kPull ? r.machines > 1 : c.groupSize > 1);
}

CommCurves::Key kindOf(const plan::CommTiming& c) {
  return {c.op, c.scope, c.compressed, c.pullCompressed, c.groupSize};
}

}  // namespace

LinkFit OnlineReplanner::fitLink(const std::vector<plan::ProfileReport>& reports, bool intra,
                           const planner::LinkCost& prior) {
  planner::LinkCost unitA, unitB;
  unitA.base = {1.0, std::numeric_limits<double>::infinity()};
  unitB.base = {0.0, 8.0 / 1000.0};  // beta = 1 us per byte
  std::map<CommOp, std::vector<Point>> byOp;
  std::vector<Point> all;
  for (const auto& r : reports) {
    for (const auto& c : r.comms) {
      if ((c.scope == Scope::kIntra) != intra) continue;
      if (c.calls == 0 || !(c.totalUs > 0) || !std::isfinite(c.totalUs)) continue;
      CommOp op = c.op;
      int p = c.groupSize;
      double us = c.totalUs / double(c.calls);
      if (op == CommOp::kPush) {  // a push and its pull, one round trip
        p = r.machines;
        us /= 2;
      }
      if (p <= 1 || c.bytes == 0) continue;
      Point pt{planner::commTimeUs(unitA, op, p, double(c.bytes)),
               planner::commTimeUs(unitB, op, p, double(c.bytes)), us, double(c.calls) / (us * us)};
      byOp[op].push_back(pt);
      if (op == CommOp::kPush) byOp[CommOp::kPull].push_back(pt);
      all.push_back(pt);
    }
  }
  LinkFit f;
  f.link = prior;
  f.points = int(all.size());
  if (auto ab = solve(all)) f.link.base = *ab;
  else f.points = 0;
  f.link.perOp.clear();
  for (const auto& [op, pts] : byOp)
    if (auto ab = solve(pts)) f.link.perOp[op] = *ab;
  return f;
}

std::vector<CodecFit> OnlineReplanner::fitCodecs(const std::vector<plan::ProfileReport>& reports) {
  // Per (spec, direction, elements): each worker's mean call without its
  // slowest one (a worker descheduled for a time slice in one call of
  // hundreds; the collective after it waits for that worker and has the
  // stall in its own time already), then the median over the workers.
  struct Size {
    std::vector<double> perWorker;
    uint64_t calls = 0;
  };
  std::map<std::pair<std::string, bool>, std::map<uint64_t, Size>> bySpec;
  for (const auto& r : reports)
    for (const auto& c : r.codecs) {
      if (c.device != plan::Device::kCpu || c.elements == 0 || c.calls == 0 || !(c.totalUs > 0) ||
          !std::isfinite(c.totalUs))
        continue;
      const double us = c.calls >= 3 && c.maxUs > 0 && c.maxUs <= c.totalUs
                            ? (c.totalUs - c.maxUs) / double(c.calls - 1)
                            : c.totalUs / double(c.calls);
      if (!(us > 0)) continue;
      Size& x = bySpec[{c.codec, c.encode}][c.elements];
      x.perWorker.push_back(us);
      x.calls += c.calls;
    }
  std::vector<CodecFit> out;
  for (auto& [k, sizes] : bySpec) {
    CodecFit f;
    f.codec = k.first;
    f.encode = k.second;
    std::vector<Point> pts;
    std::vector<std::array<double, 3>> xyw;
    for (const auto& [elements, x] : sizes) {
      const double med = median(x.perWorker);
      xyw.push_back({double(elements), med, double(x.calls)});
      pts.push_back({1.0, double(elements), med, double(x.calls) / (med * med)});
    }
    f.curve = planner::MeasuredCurve::monotone(xyw, 0);
    // solve() reads its b coefficient as bytes; here it is elements.
    auto ab = solve(pts);
    if (!ab) continue;
    f.cost.fixedUs = ab->alphaUs;
    f.cost.nsPerElement = ab->betaUsPerByte() * 1000.0;
    f.points = int(pts.size());
    out.push_back(std::move(f));
  }
  return out;
}

double OnlineReplanner::serverUs(const plan::CommTiming& c, const planner::Cluster& cl,
                                 const planner::ResolvedCodec& codec) {
  if (c.op != CommOp::kPush || c.elements == 0) return 0;
  plan::TensorOption o;
  o.hierarchical = true;
  if (c.compressed || c.pullCompressed) o.codec = codec.spec;
  if (c.compressed) o.steps.push_back(plan::Step::encode(plan::Device::kCpu));
  o.steps.push_back(plan::Step::comm(Scope::kInter, CommOp::kPush, c.compressed));
  o.steps.push_back(plan::Step::comm(Scope::kInter, CommOp::kPull, c.pullCompressed));
  if (c.pullCompressed) o.steps.push_back(plan::Step::decode(plan::Device::kCpu));
  // Every worker of the machine that pushed its own shard key.
  planner::Cluster z = cl;
  // Chunks per key as the workers cut it.
  const double perKey =
      planner::serverKeyChunks(cl, codec, double(c.elements), 4, c.compressed || c.pullCompressed);
  z.gpusPerMachine = std::max(1, int(std::lround(double(std::max<uint64_t>(1, c.chunks)) / perKey)));
  double us = 0;
  for (const planner::SimOp& op : planner::compileOption(z, codec, int64_t(c.elements), 4, o).ops)
    if (op.kind == planner::OpKind::kServer) us += planner::opDurationUs(z, op);
  return us;
}

int OnlineReplanner::measuredCurves(const std::vector<plan::ProfileReport>& reports, bool intra,
                                    planner::LinkCost& link, const planner::Cluster* cl,
                                    const planner::ResolvedCodec* codec) {
  // (op, compressed) -> group size -> bytes as commTimeUs takes them -> (calls, us)
  std::map<std::pair<CommOp, bool>, std::map<int, std::map<double, std::pair<double, double>>>> acc;
  for (const auto& r : reports)
    for (const auto& c : r.comms) {
      if ((c.scope == Scope::kIntra) != intra || !usable(c)) continue;
      CurvePoint x = curvePoint(r, c);
      if (c.op == CommOp::kPush) {
        // Half the round trip is the push, half the pull: only when both
        // carry the same kind of data. The servers' work inside it (sum;
        // decode and re-encode of payloads) is the simulator's own to add:
        // taken out as the simulator models it, or the entry is left out.
        if (c.compressed != c.pullCompressed) continue;
        if (c.compressed && !(cl && codec)) continue;
        if (cl && codec) x.us = std::max(0.1 * x.us, x.us - serverUs(c, *cl, *codec) / 2);
        if (x.p > 1 && c.compressed && codec->listsIndices() && c.elements > 0) {
          // A top-k or DGC answer is the union of every machine's payloads,
          // up to M times the push (dense where smaller; compile.cc): the
          // round trip split between the two sizes in proportion to bytes.
          const double ratio =
              std::max(1.0, std::min(double(r.machines), 4.0 * double(c.elements) / double(c.bytes)));
          const double rt = 2 * x.us;
          auto& [pc, pt] = acc[{c.op, c.compressed}][x.p][x.bytes];
          pc += double(c.calls), pt += rt / (1 + ratio) * double(c.calls);
          auto& [qc, qt] = acc[{c.op, c.compressed}][x.p][x.bytes * ratio];
          qc += double(c.calls), qt += rt * ratio / (1 + ratio) * double(c.calls);
          continue;
        }
      }
      if (x.p <= 1) continue;
      auto& [calls, total] = acc[{c.op, c.compressed}][x.p][x.bytes];
      calls += double(c.calls);
      total += x.us * double(c.calls);
    }
  link.curves.clear();
  link.curvesCompressed.clear();
  int n = 0;
  for (const auto& [key, byGroup] : acc) {
    // One curve per operation: the group size with the most calls (flat and
    // inter steps share the inter link and differ in size on hierarchies).
    const std::map<double, std::pair<double, double>>* best = nullptr;
    int bestP = 0;
    double bestCalls = -1;
    for (const auto& [p, sizes] : byGroup) {
      double calls = 0;
      for (const auto& [b, x] : sizes) calls += x.first;
      if (calls > bestCalls) best = &sizes, bestP = p, bestCalls = calls;
    }
    std::vector<std::array<double, 3>> xyw;
    for (const auto& [bytes, x] : *best) xyw.push_back({bytes, x.second / x.first, x.first});
    const planner::MeasuredCurve c = planner::MeasuredCurve::monotone(xyw, bestP);
    const auto [op, compressed] = key;
    auto& curves = compressed ? link.curvesCompressed : link.curves;
    curves[op] = c;
    if (op == CommOp::kPush) curves[CommOp::kPull] = c;
    ++n;
  }
  return n;
}

std::optional<plan::Plan> OnlineReplanner::runningPlan(const std::vector<plan::ProfileReport>& reports) {
  const plan::ProfileReport* with = nullptr;
  for (const auto& r : reports)
    if (!r.options.empty() && (!with || r.rank < with->rank)) with = &r;
  if (!with) return std::nullopt;
  plan::Plan p;
  p.version = with->planVersion;
  for (const auto& t : with->ready) {
    if (t.option < 0 || size_t(t.option) >= with->options.size()) return std::nullopt;
    p.tensors[t.tensor] = with->options[size_t(t.option)];
  }
  // Its groups where they name tensors of the window (groupRanges() keeps
  // those that are runs of the profile's order).
  for (const auto& g : with->groups)
    if (std::all_of(g.begin(), g.end(), [&](const std::string& n) { return p.tensors.count(n) > 0; }))
      p.groups.push_back(g);
  return p;
}

CommCurves OnlineReplanner::commCurves(const std::vector<plan::ProfileReport>& reports) {
  // kind -> bytes -> (calls, total us)
  std::map<CommCurves::Key, std::map<uint64_t, std::pair<double, double>>> acc;
  for (const auto& r : reports)
    for (const auto& c : r.comms) {
      if (!onALink(r, c)) continue;
      auto& [calls, total] = acc[kindOf(c)][c.bytes];
      calls += double(c.calls);
      total += c.totalUs;
    }
  CommCurves out;
  for (const auto& [key, sizes] : acc) {
    std::vector<std::array<double, 3>> xyw;
    for (const auto& [bytes, x] : sizes) xyw.push_back({double(bytes), x.second / x.first, x.first});
    out.curves[key] = planner::MeasuredCurve::monotone(xyw, std::get<4>(key));
  }
  return out;
}

LinkDrift OnlineReplanner::drift(const CommCurves& reference, const std::vector<plan::ProfileReport>& reports,
                                 bool intra) {
  double total = 0, covered = 0, expected = 0;
  for (const auto& r : reports)
    for (const auto& c : r.comms) {
      if ((c.scope == Scope::kIntra) != intra || !onALink(r, c)) continue;
      total += c.totalUs;
      auto it = reference.curves.find(kindOf(c));
      if (it == reference.curves.end() || it->second.points.empty()) continue;
      const auto& pts = it->second.points;
      const double b = double(c.bytes);
      if (b < pts.front().first * (1 - 1e-9) || b > pts.back().first * (1 + 1e-9)) continue;
      covered += c.totalUs;
      expected += double(c.calls) * it->second.us(b);
    }
  LinkDrift d;
  if (total > 0 && expected > 0) {
    d.ratio = covered / expected;
    d.coverage = covered / total;
  }
  return d;
}

double OnlineReplanner::linkBytesPerIteration(const std::vector<plan::ProfileReport>& reports, bool intra) {
  double sum = 0;
  int n = 0;
  for (const auto& r : reports) {
    if (r.endIteration <= r.firstIteration) continue;
    double bytes = 0;
    for (const auto& c : r.comms)
      if ((c.scope == Scope::kIntra) == intra && onALink(r, c)) bytes += double(c.calls) * double(c.bytes);
    sum += bytes / double(r.endIteration - r.firstIteration);
    ++n;
  }
  return n ? sum / n : 0;
}

}  // namespace cortado::scheduler
