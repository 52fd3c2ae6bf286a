#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace pdserve {

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("pdserve");
    const char* level = std::getenv("PDSERVE_LOG_LEVEL");
    logger->set_level(level ? spdlog::level::from_str(level) : spdlog::level::warn);
    spdlog::set_default_logger(logger);
  });
}

}  // namespace pdserve
