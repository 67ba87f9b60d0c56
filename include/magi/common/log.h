// Logging for the C++ core. One level for C++ and Python, read from MAGI_LOGGING_LEVEL
// (trace, debug, info, warning, error, off; default warning) and settable from Python.
//
// This header is deliberately free of spdlog and fmt: torch ships fmt headers of its own,
// and a translation unit must never see two fmt versions. Messages are streamed into a
// string here; src/common/log.cpp hands them to spdlog, the only file that includes it.
#pragma once

#include <string_view>

#include "magi/common/error.h"

namespace magi::log {

enum class Level { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

/// The current level (initialised from MAGI_LOGGING_LEVEL on first use).
Level level();
void set_level(Level level);
inline bool enabled(Level l) { return l >= level() && l != Level::kOff; }
/// Parses "debug", "INFO", "warning", "warn", ...; throws UserError naming the variable.
Level parse_level(std::string_view text);
void write(Level level, std::string_view message);

}  // namespace magi::log

#define MAGI_LOG_AT(lvl, ...)                                                                     \
  do {                                                                                            \
    if (::magi::log::enabled(lvl)) ::magi::log::write(lvl, ::magi::detail::str_cat(__VA_ARGS__)); \
  } while (0)
#define MAGI_LOG_TRACE(...) MAGI_LOG_AT(::magi::log::Level::kTrace, __VA_ARGS__)
#define MAGI_LOG_DEBUG(...) MAGI_LOG_AT(::magi::log::Level::kDebug, __VA_ARGS__)
#define MAGI_LOG_INFO(...) MAGI_LOG_AT(::magi::log::Level::kInfo, __VA_ARGS__)
#define MAGI_LOG_WARN(...) MAGI_LOG_AT(::magi::log::Level::kWarn, __VA_ARGS__)
#define MAGI_LOG_ERROR(...) MAGI_LOG_AT(::magi::log::Level::kError, __VA_ARGS__)
