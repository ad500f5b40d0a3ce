#include "core/common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/common/error.h"

namespace cortado {

void setupLogging(const std::string& who, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("unknown log level '{}': valid are trace, debug, info, warn, error, off",
                            level));
  }
  spdlog::drop("cortado:" + who);
  auto logger = spdlog::stderr_color_mt("cortado:" + who);
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [{}] [%^%l%$] %v", who));
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace cortado
