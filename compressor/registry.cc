#include "compressor/registry.h"

#include <cmath>
#include <cstdlib>

#include "core/common/error.h"

namespace cortado::compressor {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string describeParam(const ParamDef& d) {
  if (d.integer && d.min == 0 && d.max == 1)
    return fmt::format("{} (0 or 1, default {}): {}", d.name, d.defaultValue, d.help);
  return fmt::format("{} ({} in [{}, {}], default {}): {}", d.name,
                     d.integer ? "integer" : "number", d.min, d.max, d.defaultValue, d.help);
}

}  // namespace

CodecSpec CodecSpec::parse(std::string_view text) {
  CodecSpec spec;
  text = trim(text);
  size_t colon = text.find(':');
  spec.name = std::string(trim(text.substr(0, colon)));
  CORTADO_ENFORCE(!spec.name.empty(), ErrorCode::kInvalidArgument,
                  "codec spec '{}' has no codec name (expected name[:key=value,...])", text);
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    CORTADO_ENFORCE(eq != std::string_view::npos, ErrorCode::kInvalidArgument,
                    "codec spec '{}': parameter '{}' has no value (expected key=value)", text,
                    item);
    std::string key(trim(item.substr(0, eq)));
    std::string value(trim(item.substr(eq + 1)));
    CORTADO_ENFORCE(!key.empty() && !value.empty(), ErrorCode::kInvalidArgument,
                    "codec spec '{}': empty key or value in '{}'", text, item);
    for (auto& [k, v] : spec.params)
      CORTADO_ENFORCE(k != key, ErrorCode::kInvalidArgument,
                      "codec spec '{}': parameter '{}' given twice", text, key);
    spec.params.emplace_back(std::move(key), std::move(value));
  }
  return spec;
}

double Params::get(const std::string& key) const {
  auto it = values_.find(key);
  CORTADO_ENFORCE(it != values_.end(), ErrorCode::kInternal, "codec '{}' has no parameter '{}'",
                  name_, key);
  return it->second;
}

std::string Params::canonical() const {
  std::string s = name_;
  for (size_t i = 0; i < defs_.size(); ++i) {
    s += i == 0 ? ':' : ',';
    double v = values_.at(defs_[i].name);
    s += defs_[i].integer ? fmt::format("{}={}", defs_[i].name, static_cast<int64_t>(v))
                          : fmt::format("{}={}", defs_[i].name, v);
  }
  return s;
}

void Registry::add(Device device, CodecInfo info, CodecFactory factory) {
  auto key = std::make_pair(device, info.name);
  CORTADO_ENFORCE(!entries_.count(key), ErrorCode::kInvalidArgument,
                  "codec '{}' is already registered for {}", info.name, deviceName(device));
  entries_.emplace(std::move(key), Entry{std::move(info), std::move(factory)});
}

bool Registry::has(std::string_view name, Device device) const {
  return entries_.count(std::make_pair(device, std::string(name))) != 0;
}

std::vector<std::string> Registry::names(Device device) const {
  std::vector<std::string> out;
  for (auto& [key, e] : entries_)
    if (key.first == device) out.push_back(key.second);
  return out;
}

const Registry::Entry& Registry::find(std::string_view name, Device device) const {
  auto it = entries_.find(std::make_pair(device, std::string(name)));
  if (it == entries_.end()) {
    auto valid = names(device);
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("unknown codec '{}' for {}: valid are {}", name, deviceName(device),
                            valid.empty() ? std::string("(none registered)")
                                          : fmt::format("{}", fmt::join(valid, ", "))));
  }
  return it->second;
}

const CodecInfo& Registry::info(std::string_view name, Device device) const {
  return find(name, device).info;
}

Params Registry::parseParams(const Entry& e, const CodecSpec& spec) const {
  std::map<std::string, double> values;
  for (auto& d : e.info.params) values[d.name] = d.defaultValue;
  auto validList = [&] {
    std::vector<std::string> lines;
    for (auto& d : e.info.params) lines.push_back(describeParam(d));
    return lines.empty() ? std::string("it takes no parameters")
                         : fmt::format("valid are: {}", fmt::join(lines, "; "));
  };
  for (auto& [key, text] : spec.params) {
    const ParamDef* def = nullptr;
    for (auto& d : e.info.params)
      if (d.name == key) def = &d;
    CORTADO_ENFORCE(def != nullptr, ErrorCode::kInvalidArgument,
                    "codec '{}' has no parameter '{}': {}", spec.name, key, validList());
    char* end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    CORTADO_ENFORCE(end && *end == '\0' && std::isfinite(v), ErrorCode::kInvalidArgument,
                    "codec '{}': parameter {}='{}' is not a number; {}", spec.name, key, text,
                    describeParam(*def));
    CORTADO_ENFORCE(!def->integer || v == std::floor(v), ErrorCode::kInvalidArgument,
                    "codec '{}': parameter {}={} must be an integer; {}", spec.name, key, text,
                    describeParam(*def));
    CORTADO_ENFORCE(v >= def->min && v <= def->max, ErrorCode::kInvalidArgument,
                    "codec '{}': parameter {}={} is out of range; {}", spec.name, key, text,
                    describeParam(*def));
    values[key] = v;
  }
  return Params(e.info.name, e.info.params, std::move(values));
}

CodecPtr Registry::create(std::string_view specText, Device device) const {
  CodecSpec spec = CodecSpec::parse(specText);
  const Entry& e = find(spec.name, device);
  return CodecPtr(e.factory(parseParams(e, spec)));
}

std::string Registry::canonical(std::string_view specText, Device device) const {
  CodecSpec spec = CodecSpec::parse(specText);
  return parseParams(find(spec.name, device), spec).canonical();
}

std::string Registry::help(Device device) const {
  std::string s;
  for (auto& [key, e] : entries_) {
    if (key.first != device) continue;
    s += fmt::format("{}: {}\n", e.info.name, e.info.help);
    for (auto& d : e.info.params) s += fmt::format("    {}\n", describeParam(d));
  }
  return s;
}

}  // namespace cortado::compressor
