#include "scheduler/planner/cost_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/common/error.h"

#ifndef CORTADO_PLANNER_DATA_DIR
#define CORTADO_PLANNER_DATA_DIR "scheduler/planner"
#endif
#ifndef CORTADO_PLANNER_INSTALL_REL
#define CORTADO_PLANNER_INSTALL_REL "share/cortado/planner"
#endif
#ifndef CORTADO_PLANNER_INSTALL_DIR
#define CORTADO_PLANNER_INSTALL_DIR ""
#endif

namespace cortado::planner {
namespace {

using nlohmann::json;
using plan::CommOp;

json readJsonFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  CORTADO_ENFORCE(in.good(), ErrorCode::kInvalidArgument, "cannot open {} file '{}'", what, path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} file '{}' is not valid JSON: {}", what, path, e.what()));
  }
}

AlphaBeta alphaBetaFromJson(const json& j, const std::string& where) {
  AlphaBeta ab;
  ab.alphaUs = j.at("alpha_us").get<double>();
  ab.gbps = j.at("gbps").get<double>();
  CORTADO_ENFORCE(ab.alphaUs >= 0 && ab.gbps > 0, ErrorCode::kInvalidArgument,
                  "{}: alpha_us must be >= 0 and gbps > 0 (got {}, {})", where, ab.alphaUs,
                  ab.gbps);
  return ab;
}

LinearCost linearFromJson(const json& j) {
  LinearCost c;
  c.fixedUs = j.value("fixed_us", 0.0);
  c.nsPerElement = j.value("ns_per_element", 0.0);
  c.nsPerSelected = j.value("ns_per_selected", 0.0);
  return c;
}

int ceilLog2(int p) {
  int r = 0;
  while ((1 << r) < p) ++r;
  return r;
}

template <typename Map>
std::string joinKeys(const Map& m) {
  std::string s;
  for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace

const AlphaBeta& LinkCost::forOp(CommOp op, bool compressed) const {
  if (compressed) {
    auto c = perOpCompressed.find(op);
    if (c != perOpCompressed.end()) return c->second;
  }
  auto it = perOp.find(op);
  return it == perOp.end() ? base : it->second;
}

void MeasuredCurve::add(double bytes, double us) {
  if (!points.empty() && bytes <= points.back().first) {
    // No size twice (the slope beyond needs two sizes): the two times' mean,
    // not below the point before.
    const double floor = points.size() > 1 ? points[points.size() - 2].second : 0;
    points.back().second = std::max(floor, (points.back().second + us) / 2);
    return;
  }
  if (!points.empty()) us = std::max(us, points.back().second);
  points.emplace_back(bytes, us);
}

MeasuredCurve MeasuredCurve::monotone(const std::vector<std::array<double, 3>>& xyw, int p) {
  struct Block {
    double y, w;
    size_t n;
  };
  std::vector<Block> b;
  for (const auto& [x, y, w] : xyw) {
    b.push_back({y, std::max(w, 1e-12), 1});
    while (b.size() > 1 && b[b.size() - 2].y > b.back().y) {
      const Block top = b.back();
      b.pop_back();
      Block& prev = b.back();
      prev.y = (prev.y * prev.w + top.y * top.w) / (prev.w + top.w);
      prev.w += top.w;
      prev.n += top.n;
    }
  }
  MeasuredCurve c;
  c.p = p;
  size_t i = 0;
  for (const Block& k : b)
    for (size_t j = 0; j < k.n; ++j, ++i) c.add(xyw[i][0], k.y);
  return c;
}

double MeasuredCurve::us(double bytes) const {
  if (points.empty()) return 0;
  if (points.size() == 1 || bytes <= points.front().first) return points.front().second;
  size_t i = 1;
  while (i + 1 < points.size() && points[i].first < bytes) ++i;
  const auto& [b0, t0] = points[i - 1];
  const auto& [b1, t1] = points[i];
  const double slope = b1 > b0 ? (t1 - t0) / (b1 - b0) : 0;
  return t0 + slope * (bytes - b0);
}

double commTimeUs(const LinkCost& link, CommOp op, int p, double bytes, bool compressed) {
  if (p <= 1) return 0;
  auto curve = [&](const std::map<CommOp, MeasuredCurve>& m) -> const MeasuredCurve* {
    auto it = m.find(op);
    return it != m.end() && it->second.p == p && !it->second.points.empty() ? &it->second : nullptr;
  };
  if (compressed) {
    if (const MeasuredCurve* c = curve(link.curvesCompressed)) return c->us(bytes);
    if (link.perOpCompressed.count(op) == 0)
      if (const MeasuredCurve* c = curve(link.curves)) return c->us(bytes);
  } else if (const MeasuredCurve* c = curve(link.curves)) {
    return c->us(bytes);
  }
  const AlphaBeta& ab = link.forOp(op, compressed);
  const double a = ab.alphaUs, b = ab.betaUsPerByte();
  const double frac = double(p - 1) / p;
  switch (op) {
    case CommOp::kAllreduce: return 2 * (p - 1) * a + 2 * frac * bytes * b;
    case CommOp::kReduceScatter:
    case CommOp::kAlltoall: return (p - 1) * a + frac * bytes * b;
    case CommOp::kAllgather: return (p - 1) * (a + bytes * b);
    case CommOp::kGather: return (p - 1) * a + (p - 1) * bytes * b;
    case CommOp::kReduce:
    case CommOp::kBroadcast: return ceilLog2(p) * a + bytes * b;
    case CommOp::kPush:
    case CommOp::kPull: return a + frac * bytes * b;
    case CommOp::kZenBalanced:
    case CommOp::kZenCentralized:
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: a Zen step is priced by zenCost (zen_cost.h), which needs the "
                              "tensor's density, not by one link formula",
                              plan::toString(op)));
  }
  return 0;
}

void SyncSkew::check(const std::string& what) const {
  CORTADO_ENFORCE(std::isfinite(us) && us >= 0, ErrorCode::kInvalidArgument,
                  "{}: the skew's constant is {} us; it must be a number of microseconds >= 0 "
                  "(0: no skew)",
                  what, us);
  CORTADO_ENFORCE(std::isfinite(fraction) && fraction >= 0 && fraction <= kMaxFraction,
                  ErrorCode::kInvalidArgument,
                  "{}: the skew's fraction of the CPU work is {}; it must be in [0, {}] (0.5: the "
                  "last worker arrives half the work's duration after the timeline's)",
                  what, fraction, kMaxFraction);
  double last = 0;
  for (const auto& [work, wait] : curve.points) {
    CORTADO_ENFORCE(std::isfinite(work) && work > last && std::isfinite(wait) && wait >= 0,
                    ErrorCode::kInvalidArgument,
                    "{}: the skew curve's point ({}, {}) is not a work in us above the previous "
                    "point's ({}) with a wait in us >= 0; give [[work_us, wait_us], ...] by "
                    "increasing work",
                    what, work, wait, last);
    last = work;
  }
}

std::string SyncSkew::describe() const {
  if (curve.points.empty()) return fmt::format("{:.0f} us + {:.3f} x the work", us, fraction);
  std::string out = "by work:wait";
  for (const auto& [work, wait] : curve.points) out += fmt::format(" {:.0f}:{:.0f}us", work, wait);
  return out;
}

HardwareModel HardwareModel::fromJson(const json& j) {
  try {
    HardwareModel h;
    h.source = j.value("source", "");
    for (const auto& [name, lj] : j.at("links").items()) {
      LinkCost l;
      l.name = name;
      l.base = alphaBetaFromJson(lj, "link " + name);
      if (lj.contains("ops")) {
        for (const auto& [op, oj] : lj.at("ops").items())
          l.perOp[plan::commOpFromString(op)] = alphaBetaFromJson(oj, "link " + name + " op " + op);
      }
      h.links.emplace(name, std::move(l));
    }
    h.d2h = alphaBetaFromJson(j.at("copies").at("d2h"), "copies.d2h");
    h.h2d = alphaBetaFromJson(j.at("copies").at("h2d"), "copies.h2d");
    h.cpuSumGbps = j.at("cpu").at("sum_gbps").get<double>();
    if (j.at("cpu").contains("zen_ns_per_pair")) {
      h.zenNsPerPair = j.at("cpu").at("zen_ns_per_pair").get<double>();
      CORTADO_ENFORCE(std::isfinite(h.zenNsPerPair) && h.zenNsPerPair >= 0,
                      ErrorCode::kInvalidArgument,
                      "hardware: cpu.zen_ns_per_pair is {}, it must be a number of "
                      "nanoseconds >= 0",
                      h.zenNsPerPair);
    }
    const json& cpu = j.at("cpu");
    if (cpu.contains("fill_gbps")) {
      h.cpuFillGbps = cpu.at("fill_gbps").get<double>();
      CORTADO_ENFORCE(std::isfinite(h.cpuFillGbps) && h.cpuFillGbps >= 0,
                      ErrorCode::kInvalidArgument,
                      "hardware: cpu.fill_gbps is {}, it must be a rate in Gbit/s >= 0 (0: the "
                      "decode's pass over its region is not priced)",
                      h.cpuFillGbps);
    }
    // cpu.<prefix>_us, _fraction and _curve into `s`.
    auto skew = [&](const std::string& prefix, SyncSkew& s) {
      if (cpu.contains(prefix + "_us")) s.us = cpu.at(prefix + "_us").get<double>();
      if (cpu.contains(prefix + "_fraction"))
        s.fraction = cpu.at(prefix + "_fraction").get<double>();
      if (cpu.contains(prefix + "_curve"))
        for (const auto& pt : cpu.at(prefix + "_curve"))
          s.curve.points.emplace_back(pt.at(0).get<double>(), pt.at(1).get<double>());
      s.check(fmt::format("hardware: cpu.{0}_us, cpu.{0}_fraction and cpu.{0}_curve", prefix));
    };
    skew("sync_skew", h.syncSkew);
    skew("push_skew", h.pushSkew);
    return h;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("malformed hardware model: {}", e.what()));
  }
}

HardwareModel HardwareModel::load(const std::string& path) {
  return fromJson(readJsonFile(path, "hardware model"));
}

const LinkCost& HardwareModel::link(const std::string& name) const {
  auto it = links.find(name);
  CORTADO_ENFORCE(it != links.end(), ErrorCode::kInvalidArgument,
                  "unknown link '{}' (valid: {})", name, joinKeys(links));
  return it->second;
}

std::vector<std::string> HardwareModel::linkNames() const {
  std::vector<std::string> v;
  for (const auto& [k, l] : links) v.push_back(k);
  return v;
}

double ResolvedCodec::payloadBytes(double elements) const {
  return cost.headerBytes + elements * cost.bitsPerElement / 8.0 +
         elements * selectedFraction * cost.bytesPerSelected;
}

double ResolvedCodec::encodeUs(plan::Device d, double elements) const {
  if (!encodeCurve[int(d)].points.empty()) return encodeCurve[int(d)].us(elements);
  return cost.encode[int(d)].us(elements, elements * selectedFraction);
}

double Cluster::fillUs(plan::Device d, double elements) const {
  const bool cpu = d == plan::Device::kCpu;
  const MeasuredCurve& curve = cpu ? cpuFillCurve : gpuFillCurve;
  if (!curve.points.empty()) return curve.us(elements);
  return cpu && cpuFillGbps > 0 ? elements * 4 * 8.0 / (cpuFillGbps * 1000.0) : 0;
}

bool ResolvedCodec::decodesFirstApart(plan::Device d) const {
  return !decodeCurve[int(d)].points.empty() && !decodeFirstCurve[int(d)].points.empty();
}

double ResolvedCodec::decodeUs(plan::Device d, double elements, double contributions) const {
  if (!decodeCurve[int(d)].points.empty()) {
    const double each = decodeCurve[int(d)].us(elements);
    if (!decodesFirstApart(d)) return contributions * each;
    const double once = decodeFirstCurve[int(d)].us(elements);
    return contributions <= 1 ? contributions * once : once + (contributions - 1) * each;
  }
  const LinearCost& c = cost.decode[int(d)];
  return c.fixedUs + contributions * (c.us(elements, elements * selectedFraction) - c.fixedUs);
}

double ResolvedCodec::decodeShareUs(plan::Device d, double elements, double contributions,
                                    double calls) const {
  return decodesFirstApart(d) ? decodeUs(d, elements, calls * contributions) / calls
                              : decodeUs(d, elements, contributions);
}

bool ResolvedCodec::listsIndices() const {
  const std::string name = spec.substr(0, spec.find(':'));
  return name == "topk" || name == "dgc";
}

ResolvedCodec ResolvedCodec::zeroCost() const {
  ResolvedCodec z = *this;
  for (int d = 0; d < 2; ++d) {
    z.cost.encode[d] = z.cost.decode[d] = LinearCost{};
    z.encodeCurve[d] = z.decodeCurve[d] = z.decodeFirstCurve[d] = MeasuredCurve{};
  }
  return z;
}

CodecModel CodecModel::fromJson(const json& j) {
  try {
    CodecModel m;
    m.source_ = j.value("source", "");
    for (const auto& [name, cj] : j.at("codecs").items()) {
      CodecCost c;
      c.name = name;
      c.summable = cj.value("summable", false);
      const json& p = cj.at("payload");
      c.headerBytes = p.value("header_bytes", 16.0);
      c.bitsPerElement = p.value("bits_per_element", 0.0);
      c.bytesPerSelected = p.value("bytes_per_selected", 0.0);
      if (cj.contains("params"))
        for (const auto& [k, v] : cj.at("params").items()) c.params[k] = v.get<double>();
      for (const char* dev : {"gpu", "cpu"}) {
        int d = int(plan::deviceFromString(dev));
        c.encode[d] = linearFromJson(cj.at(dev).at("encode"));
        c.decode[d] = linearFromJson(cj.at(dev).at("decode"));
      }
      m.codecs_.emplace(name, std::move(c));
    }
    return m;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("malformed codec cost model: {}", e.what()));
  }
}

CodecModel CodecModel::load(const std::string& path) {
  return fromJson(readJsonFile(path, "codec cost"));
}

void CodecModel::loadInto(const std::string& path) {
  json j = readJsonFile(path, "codec cost");
  if (j.is_object() && j.value("schema", "") == "cortado.codec_costs.v1")
    applyMeasured(j, path);
  else
    *this = fromJson(j);
}

namespace {
// "name:k=v,k=v" -> name and numeric parameters (others are ignored).
std::pair<std::string, std::map<std::string, double>> splitSpec(const std::string& spec) {
  std::map<std::string, double> params;
  const auto colon = spec.find(':');
  std::string name = spec.substr(0, colon);
  if (colon != std::string::npos) {
    std::stringstream rest(spec.substr(colon + 1));
    std::string kv;
    while (std::getline(rest, kv, ',')) {
      auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      try {
        params[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
      } catch (const std::exception&) {
      }
    }
  }
  return {name, params};
}
}  // namespace

void CodecModel::applyMeasured(const json& j, const std::string& origin) {
  try {
    const double threads = std::max(1.0, j.value("threads", 1.0));
    const std::string from =
        fmt::format("measured ({}, {}, {} on {}, {} thread{})", origin, j.value("schema", ""),
                    j.value("date", "undated"), j.value("machine", "unknown machine"), threads,
                    threads == 1 ? "" : "s, scaled to one core");
    for (const json& e : j.at("entries")) {
      const std::string spec = e.at("codec").get<std::string>();
      auto [name, params] = splitSpec(spec);
      auto it = codecs_.find(name);
      CORTADO_ENFORCE(it != codecs_.end(), ErrorCode::kInvalidArgument,
                      "measured codec costs '{}': codec '{}' is not in the cost table (valid: "
                      "{}); add it to a codec table first",
                      origin, name, joinKeys(codecs_));
      // Compare only the parameters the table knows, with its defaults.
      std::map<std::string, double> known = it->second.params;
      for (auto& [k, v] : known)
        if (params.count(k)) v = params[k];
      const std::string device = e.at("device").get<std::string>();
      const std::string op = e.at("op").get<std::string>();
      CORTADO_ENFORCE(device == "cpu" || device == "gpu", ErrorCode::kInvalidArgument,
                      "measured codec costs '{}', {}: device must be cpu or gpu, got '{}'", origin,
                      spec, device);
      const double alpha = e.at("alpha").get<double>(), beta = e.at("beta").get<double>();
      CORTADO_ENFORCE(alpha >= 0 && beta >= 0, ErrorCode::kInvalidArgument,
                      "measured codec costs '{}', {} {} {}: alpha and beta must be >= 0", origin,
                      spec, device, op);
      LinearCost c;
      c.fixedUs = alpha * 1e6;
      // beta is seconds per fp32 input byte; one core does `threads` times the work.
      c.nsPerElement = beta * 4.0 * 1e9 * (device == "cpu" ? threads : 1.0);
      Measured* m = nullptr;
      for (auto& x : measured_)
        if (x.spec == name && x.params == known) m = &x;
      if (!m) {
        measured_.push_back(Measured{name, from, known, {}});
        m = &measured_.back();
      }
      // Several files may measure one spec (the CPU's and the GPU's): name each.
      if (m->origin.find(from) == std::string::npos) m->origin += "; " + from;
      m->fits[{int(plan::deviceFromString(device)), op}] = c;
    }
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("malformed measured codec costs '{}': {}", origin, e.what()));
  }
}

std::vector<std::string> CodecModel::names() const {
  std::vector<std::string> v;
  for (const auto& [k, c] : codecs_) v.push_back(k);
  return v;
}

ResolvedCodec CodecModel::resolve(const std::string& spec) const {
  std::string name = spec.substr(0, spec.find(':'));
  auto it = codecs_.find(name);
  CORTADO_ENFORCE(it != codecs_.end(), ErrorCode::kInvalidArgument,
                  "unknown codec '{}' in spec '{}' (valid: {})", name, spec, joinKeys(codecs_));
  ResolvedCodec r;
  r.spec = spec;
  r.cost = it->second;
  std::map<std::string, double> params = r.cost.params;
  if (spec.size() > name.size()) {
    std::stringstream rest(spec.substr(name.size() + 1));
    std::string kv;
    while (std::getline(rest, kv, ',')) {
      auto eq = kv.find('=');
      CORTADO_ENFORCE(eq != std::string::npos && eq > 0, ErrorCode::kInvalidArgument,
                      "codec spec '{}': expected key=value, got '{}'", spec, kv);
      std::string key = kv.substr(0, eq);
      CORTADO_ENFORCE(params.count(key), ErrorCode::kInvalidArgument,
                      "codec '{}' has no parameter '{}' (valid: {})", name, key,
                      params.empty() ? std::string("none") : joinKeys(params));
      try {
        size_t used = 0;
        params[key] = std::stod(kv.substr(eq + 1), &used);
        CORTADO_ENFORCE(used == kv.size() - eq - 1, ErrorCode::kInvalidArgument, "trailing text");
      } catch (const std::exception&) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("codec spec '{}': '{}' is not a number", spec, kv.substr(eq + 1)));
      }
    }
  }
  for (const Measured& m : measured_) {
    if (m.spec != name || m.params != params) continue;
    for (int d = 0; d < 2; ++d) {
      auto fit = [&](const char* op) -> const LinearCost* {
        auto f = m.fits.find({d, op});
        return f == m.fits.end() ? nullptr : &f->second;
      };
      if (auto* enc = fit("encode")) r.cost.encode[d] = *enc;
      if (auto* dec = fit("decompress_add") ? fit("decompress_add") : fit("decode"))
        r.cost.decode[d] = *dec;
    }
    r.costSource = m.origin;
  }
  if (params.count("ratio")) {
    double ratio = params["ratio"];
    CORTADO_ENFORCE(ratio > 0 && ratio <= 1, ErrorCode::kInvalidArgument,
                    "codec spec '{}': ratio must be in (0, 1], got {}", spec, ratio);
    r.selectedFraction = ratio;
  }
  if (params.count("levels")) {
    // QSGD-style: a sign bit and ceil(log2(levels + 1)) bits of level.
    double levels = params["levels"];
    CORTADO_ENFORCE(levels >= 1, ErrorCode::kInvalidArgument,
                    "codec spec '{}': levels must be >= 1, got {}", spec, levels);
    r.cost.bitsPerElement = 1 + std::ceil(std::log2(levels + 1));
  }
  return r;
}

std::string defaultDataDir() {
  namespace fs = std::filesystem;
  static const std::string dir = [] {
    std::vector<fs::path> tried;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) tried.push_back(exe.parent_path().parent_path() / CORTADO_PLANNER_INSTALL_REL);
    // Empty in a wheel's build, which compiles in no build-machine path.
    for (const char* d : {CORTADO_PLANNER_DATA_DIR, CORTADO_PLANNER_INSTALL_DIR})
      if (*d) tried.push_back(d);
    for (const auto& d : tried)
      if (fs::exists(d / "costs" / "hardware.json", ec)) return d.lexically_normal().string();
    std::string list;
    for (const auto& d : tried) list += (list.empty() ? "" : ", ") + d.string();
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the planner's data (costs/, profiles/) is not in {}: install cortado "
                            "(pip install . or cmake --install) or point CORTADO_PLANNER_DATA "
                            "(or --data-dir) at a copy of scheduler/planner",
                            list));
  }();
  return dir;
}

}  // namespace cortado::planner
