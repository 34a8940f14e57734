// Logging: leveled, thread-safe, to stderr. MX_LOG(kInfo) << "..." ; MX_WARN_ONCE for slow-path notices
// (the "no silent fallbacks" rule: say it once, loudly, with what to do about it).
#pragma once

#include <atomic>
#include <sstream>
#include <string>

namespace mxserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses "debug|info|warn|error"; returns false on an unknown name.
bool parse_log_level(const std::string& name, LogLevel* out);
void log_line(LogLevel level, const char* file, int line, const std::string& text);

namespace detail {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LogMessage() { log_line(level_, file_, line_, os_.str()); }
  std::ostringstream& stream() { return os_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace mxserve

#define MX_LOG(level)                                                       \
  if (::mxserve::LogLevel::level < ::mxserve::log_level()) {                \
  } else                                                                    \
    ::mxserve::detail::LogMessage(::mxserve::LogLevel::level, __FILE__, __LINE__).stream()

// Logs at most once per call site for the process lifetime.
#define MX_WARN_ONCE                                                                           \
  for (static std::atomic<bool> mx_once_{false}; !mx_once_.exchange(true);)                   \
    ::mxserve::detail::LogMessage(::mxserve::LogLevel::kWarn, __FILE__, __LINE__).stream()
