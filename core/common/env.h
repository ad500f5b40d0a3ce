// Reading CORTADO_* environment variables (and their BytePS DMLC_* aliases).
// Only the options readers (core/common/options.cc, per role) call these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cortado {

// The first of `names` that is set, with its value.
struct EnvValue {
  std::string name;
  std::string value;
};
std::optional<EnvValue> getEnv(const std::vector<std::string>& names);

// Typed readers: throw Error naming the variable when its value does not parse.
std::optional<int64_t> getEnvInt(const std::vector<std::string>& names);
std::optional<bool> getEnvBool(const std::vector<std::string>& names);

// Parses sizes such as "4096", "4K", "4KiB", "64M", "1G".
uint64_t parseBytes(const std::string& text);

}  // namespace cortado
