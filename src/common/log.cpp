// The one translation unit that includes spdlog (and with it Debian's fmt). It must not
// include anything of torch: torch's bundled fmt and this one may never meet in one file.
#include "magi/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>

namespace magi::log {
namespace {

std::atomic<int> g_level{-1};

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("magi");
    l->set_pattern("[magi %L] %v");
    l->set_level(spdlog::level::trace);  // filtering happens in enabled()
    return l;
  }();
  return *instance;
}

Level level_from_env() {
  const char* env = std::getenv("MAGI_LOGGING_LEVEL");
  if (env == nullptr || *env == '\0') return Level::kWarn;
  return parse_level(env);
}

}  // namespace

Level parse_level(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "trace") return Level::kTrace;
  if (t == "debug") return Level::kDebug;
  if (t == "info") return Level::kInfo;
  if (t == "warn" || t == "warning") return Level::kWarn;
  if (t == "error" || t == "critical") return Level::kError;
  if (t == "off" || t == "none") return Level::kOff;
  MAGI_CHECK(false, "MAGI_LOGGING_LEVEL='", text,
             "' is not a level; use one of trace, debug, info, warning, error, off");
  return Level::kWarn;
}

Level level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    Level parsed = Level::kWarn;
    try {
      parsed = level_from_env();
    } catch (const UserError&) {
      parsed = Level::kWarn;  // Python validates the variable and raises with context
    }
    g_level.store(static_cast<int>(parsed), std::memory_order_relaxed);
    return parsed;
  }
  return static_cast<Level>(l);
}

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }

void write(Level l, std::string_view message) {
  static constexpr spdlog::level::level_enum kMap[] = {spdlog::level::trace, spdlog::level::debug,
                                                       spdlog::level::info,  spdlog::level::warn,
                                                       spdlog::level::err,   spdlog::level::off};
  logger().log(kMap[static_cast<int>(l)], "{}", message);
}

}  // namespace magi::log
