#include "core/logging.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "core/check.h"

namespace mxserve {
namespace {
std::string& check_context() {
  thread_local std::string context;
  return context;
}

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_mutex;

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarn: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}

const char* base_name(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}
}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

bool parse_log_level(const std::string& name, LogLevel* out) {
  if (name == "debug") *out = LogLevel::kDebug;
  else if (name == "info") *out = LogLevel::kInfo;
  else if (name == "warn" || name == "warning") *out = LogLevel::kWarn;
  else if (name == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

void log_line(LogLevel level, const char* file, int line, const std::string& text) {
  using namespace std::chrono;
  const double t = duration<double>(system_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "[%s %.3f %s:%d] %s\n", level_tag(level), t, base_name(file), line, text.c_str());
}

void set_check_context(std::string context) { check_context() = std::move(context); }

namespace detail {
void check_failed(const char* file, int line, const char* expr, const std::string& detail) {
  const std::string& context = check_context();
  std::fprintf(stderr, "CHECK failed%s%s%s at %s:%d: %s%s%s\n", context.empty() ? "" : " on ", context.c_str(),
               context.empty() ? "" : ",", file, line, expr, detail.empty() ? "" : " -- ", detail.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace mxserve
