#include "core/plan/profile_report.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "core/common/error.h"

namespace cortado::plan {

using nlohmann::json;

json toJson(const ProfileReport& r) {
  json j{{"format", "cortado-profile-report"},
         {"rank", r.rank},
         {"machines", r.machines},
         {"localSize", r.localSize},
         {"collectives", r.collectives},
         {"hostMemory", r.hostMemory},
         {"fusionBytes", r.fusionBytes},
         {"planVersion", r.planVersion},
         {"window", r.window},
         {"firstIteration", r.firstIteration},
         {"endIteration", r.endIteration},
         {"iterationUs", r.iterationUs}};
  json ready = json::array(), codecs = json::array(), comms = json::array(), options = json::array();
  for (const auto& t : r.ready) {
    json e{{"tensor", t.tensor}, {"elements", t.elements}, {"readyUs", t.readyUs}};
    if (t.option >= 0) e["option"] = t.option;
    ready.push_back(std::move(e));
  }
  for (const auto& c : r.codecs)
    codecs.push_back({{"codec", c.codec}, {"device", toString(c.device)}, {"encode", c.encode},
                      {"elements", c.elements}, {"calls", c.calls}, {"totalUs", c.totalUs},
                      {"maxUs", c.maxUs}});
  for (const auto& c : r.comms)
    comms.push_back({{"op", toString(c.op)}, {"scope", toString(c.scope)}, {"compressed", c.compressed},
                     {"groupSize", c.groupSize}, {"bytes", c.bytes}, {"chunks", c.chunks},
                     {"elements", c.elements}, {"pullCompressed", c.pullCompressed},
                     {"calls", c.calls}, {"totalUs", c.totalUs}});
  for (const auto& o : r.options) options.push_back(toJson(o));
  j["ready"] = std::move(ready);
  j["codecs"] = std::move(codecs);
  j["comms"] = std::move(comms);
  j["options"] = std::move(options);
  if (!r.groups.empty()) j["groups"] = r.groups;
  return j;
}

std::string toJsonString(const ProfileReport& r) { return toJson(r).dump(); }

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::kProtocol, "profile report: " + what);
}

const json& field(const json& j, const char* name, const std::string& where) {
  if (!j.is_object() || !j.contains(name)) bad(fmt::format("{}: field '{}' is missing", where, name));
  return j.at(name);
}
uint64_t getU(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    bad(fmt::format("{}: field '{}' must be a non-negative integer, got {}", where, name, v.dump()));
  return v.get<uint64_t>();
}
double getD(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_number()) bad(fmt::format("{}: field '{}' must be a number, got {}", where, name, v.dump()));
  double d = v.get<double>();
  if (!std::isfinite(d) || d < 0)
    bad(fmt::format("{}: field '{}' must be finite and >= 0, got {}", where, name, d));
  return d;
}
bool getB(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_boolean()) bad(fmt::format("{}: field '{}' must be true or false", where, name));
  return v.get<bool>();
}
std::string getS(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_string()) bad(fmt::format("{}: field '{}' must be a string", where, name));
  return v.get<std::string>();
}
const json& getList(const json& j, const char* name) {
  const json& v = field(j, name, "report");
  if (!v.is_array()) bad(fmt::format("field '{}' must be a list", name));
  if (v.size() > kMaxProfileEntries)
    bad(fmt::format("'{}' has {} entries, the limit is {}", name, v.size(), kMaxProfileEntries));
  return v;
}
template <typename F>
auto parseEnum(F f, const std::string& s, const std::string& where) {
  try {
    return f(s);
  } catch (const Error& e) {
    bad(fmt::format("{}: {}", where, e.what()));
  }
}

}  // namespace

ProfileReport profileFromJson(const json& j) {
  if (!j.is_object()) bad("not a JSON object");
  if (getS(j, "format", "report") != "cortado-profile-report")
    bad("field 'format' must be \"cortado-profile-report\"");
  ProfileReport r;
  const std::string top = "report";
  auto small = [&](const char* name, uint64_t lo, uint64_t hi) {
    uint64_t v = getU(j, name, top);
    if (v < lo || v > hi) bad(fmt::format("field '{}' = {} is out of range {}..{}", name, v, lo, hi));
    return v;
  };
  r.rank = int(small("rank", 0, 1 << 20));
  r.machines = int(small("machines", 1, 1 << 20));
  r.localSize = int(small("localSize", 1, 1 << 16));
  r.collectives = getB(j, "collectives", top);
  r.hostMemory = getB(j, "hostMemory", top);
  r.fusionBytes = getU(j, "fusionBytes", top);
  r.planVersion = getU(j, "planVersion", top);
  r.window = getU(j, "window", top);
  r.firstIteration = getU(j, "firstIteration", top);
  r.endIteration = getU(j, "endIteration", top);
  if (r.endIteration <= r.firstIteration)
    bad(fmt::format("endIteration {} must be after firstIteration {}", r.endIteration, r.firstIteration));
  // Optional (reports of workers before 2026-11-22 have none: not measured).
  if (j.contains("iterationUs")) r.iterationUs = getD(j, "iterationUs", top);
  const json& options = getList(j, "options");
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string w = fmt::format("options[{}]", i);
    try {
      r.options.push_back(optionFromJson(options[i], w));
    } catch (const Error& e) {
      bad(e.what());
    }
  }
  if (j.contains("groups")) {
    const json& groups = getList(j, "groups");
    size_t names = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::string w = fmt::format("groups[{}]", i);
      const json& g = groups[i];
      if (!g.is_array() || g.size() < 2) bad(w + ": a group must be a list of two or more tensor names");
      names += g.size();
      if (names > kMaxProfileEntries)
        bad(fmt::format("'groups' name more than {} tensors", kMaxProfileEntries));
      std::vector<std::string> members;
      for (const json& n : g) {
        if (!n.is_string() || n.get_ref<const std::string&>().empty() ||
            n.get_ref<const std::string&>().size() > 1024)
          bad(w + ": tensor names must be strings of 1 to 1024 bytes");
        members.push_back(n.get<std::string>());
      }
      r.groups.push_back(std::move(members));
    }
  }
  const json& ready = getList(j, "ready");
  for (size_t i = 0; i < ready.size(); ++i) {
    const std::string w = fmt::format("ready[{}]", i);
    ReadyTime t{getS(ready[i], "tensor", w), getU(ready[i], "elements", w), getD(ready[i], "readyUs", w)};
    if (t.tensor.empty() || t.tensor.size() > 1024) bad(w + ": tensor name must be 1 to 1024 bytes");
    if (ready[i].contains("option")) {
      const uint64_t k = getU(ready[i], "option", w);
      if (k >= r.options.size())
        bad(fmt::format("{}: option {} is not in 'options' ({} entries)", w, k, r.options.size()));
      t.option = int(k);
    }
    r.ready.push_back(std::move(t));
  }
  const json& codecs = getList(j, "codecs");
  for (size_t i = 0; i < codecs.size(); ++i) {
    const std::string w = fmt::format("codecs[{}]", i);
    CodecTiming c;
    c.codec = getS(codecs[i], "codec", w);
    if (c.codec.empty() || c.codec.size() > 256) bad(w + ": codec spec must be 1 to 256 bytes");
    c.device = parseEnum(deviceFromString, getS(codecs[i], "device", w), w);
    c.encode = getB(codecs[i], "encode", w);
    c.elements = getU(codecs[i], "elements", w);
    c.calls = getU(codecs[i], "calls", w);
    c.totalUs = getD(codecs[i], "totalUs", w);
    c.maxUs = getD(codecs[i], "maxUs", w);
    if (c.calls == 0) bad(w + ": calls must be at least 1");
    if (c.maxUs > c.totalUs * (1 + 1e-9))
      bad(fmt::format("{}: maxUs {} is more than totalUs {}", w, c.maxUs, c.totalUs));
    r.codecs.push_back(std::move(c));
  }
  const json& comms = getList(j, "comms");
  for (size_t i = 0; i < comms.size(); ++i) {
    const std::string w = fmt::format("comms[{}]", i);
    CommTiming c;
    c.op = parseEnum(commOpFromString, getS(comms[i], "op", w), w);
    c.scope = parseEnum(scopeFromString, getS(comms[i], "scope", w), w);
    c.compressed = getB(comms[i], "compressed", w);
    uint64_t g = getU(comms[i], "groupSize", w);
    if (g < 1 || g > (1 << 20)) bad(fmt::format("{}: groupSize {} is out of range", w, g));
    c.groupSize = int(g);
    c.bytes = getU(comms[i], "bytes", w);
    c.chunks = getU(comms[i], "chunks", w);
    c.elements = getU(comms[i], "elements", w);
    c.pullCompressed = getB(comms[i], "pullCompressed", w);
    c.calls = getU(comms[i], "calls", w);
    c.totalUs = getD(comms[i], "totalUs", w);
    if (c.calls == 0) bad(w + ": calls must be at least 1");
    r.comms.push_back(c);
  }
  return r;
}

ProfileReport profileFromJsonString(std::string_view text) {
  if (text.size() > kMaxProfileBytes)
    bad(fmt::format("{} bytes, the limit is {}", text.size(), kMaxProfileBytes));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) bad("not valid JSON");
  return profileFromJson(j);
}

}  // namespace cortado::plan
