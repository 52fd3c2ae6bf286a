// Logging for every pdserve process: spdlog to stderr, so that stdout stays free for
// machine-readable output (`pdserve generate --json`). Level from PDSERVE_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

namespace pdserve {
// Sets up the default logger once (stderr, level from PDSERVE_LOG_LEVEL, default "warn").
void init_logging();
}  // namespace pdserve

// A function, not SPDLOG_DEBUG: that macro compiles to nothing below SPDLOG_ACTIVE_LEVEL (info by
// default), so PDSERVE_LOG_LEVEL=debug showed no debug line.
#define PD_LOG_DEBUG(...) spdlog::debug(__VA_ARGS__)
#define PD_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define PD_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define PD_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
