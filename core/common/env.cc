#include "core/common/env.h"

#include <cctype>
#include <cstdlib>

#include "core/common/error.h"

namespace cortado {

std::optional<EnvValue> getEnv(const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (const char* v = std::getenv(n.c_str()); v != nullptr && *v != '\0') return EnvValue{n, v};
  }
  return std::nullopt;
}

std::optional<int64_t> getEnvInt(const std::vector<std::string>& names) {
  auto v = getEnv(names);
  if (!v) return std::nullopt;
  try {
    size_t pos = 0;
    int64_t x = std::stoll(v->value, &pos);
    if (pos != v->value.size()) throw std::invalid_argument("trailing");
    return x;
  } catch (const std::exception&) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("environment variable {}='{}' is not an integer", v->name, v->value));
  }
}

std::optional<bool> getEnvBool(const std::vector<std::string>& names) {
  auto v = getEnv(names);
  if (!v) return std::nullopt;
  std::string s;
  for (char c : v->value) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("environment variable {}='{}' is not a boolean (use 1/0, true/false)",
                          v->name, v->value));
}

uint64_t parseBytes(const std::string& text) {
  size_t pos = 0;
  uint64_t base = 0;
  try {
    base = std::stoull(text, &pos);
  } catch (const std::exception&) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("'{}' is not a size (examples: 4096, 4K, 64MiB, 1G)", text));
  }
  std::string unit;
  for (size_t i = pos; i < text.size(); ++i)
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  uint64_t mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1ull << 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1ull << 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1ull << 30;
  else
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("'{}' has an unknown size unit '{}' (use K, M or G)", text, unit));
  return base * mult;
}

}  // namespace cortado
