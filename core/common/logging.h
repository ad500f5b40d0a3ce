// Logging: spdlog with one process-wide sink configured once by the role's
// main (or the bindings). Objects put their own id in their lines, e.g.
// "[server 1] key 12 round 3 complete". Levels: trace < debug < info < warn < error.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace cortado {

// Sets up the default logger: level from `level` ("info", "debug", ...), and
// every line prefixed with `who` (e.g. "worker 3"). Safe to call again.
void setupLogging(const std::string& who, const std::string& level);

}  // namespace cortado

#define CORTADO_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define CORTADO_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define CORTADO_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define CORTADO_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define CORTADO_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
