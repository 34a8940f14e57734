#include "cli/args.h"

#include <cerrno>
#include <cstdlib>

namespace mxserve::cli {

Result<Args> Args::parse(int argc, char** argv, const std::set<std::string>& value_flags,
                         const std::set<std::string>& bool_flags) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      a.positional_.push_back(arg);
      continue;
    }
    std::string value;
    bool inline_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    if (bool_flags.count(arg)) {
      if (inline_value) return invalid_argument("flag " + arg + " takes no value");
      a.bools_.insert(arg);
    } else if (value_flags.count(arg)) {
      if (!inline_value) {
        if (i + 1 >= argc) return invalid_argument("flag " + arg + " needs a value");
        value = argv[++i];
      }
      a.values_[arg] = value;
    } else {
      std::string known;
      for (const auto& f : value_flags) known += " " + f;
      for (const auto& f : bool_flags) known += " " + f;
      return invalid_argument("unknown flag " + arg + " (known:" + known + ")");
    }
  }
  return a;
}

Result<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return invalid_argument("missing required flag " + flag);
  return it->second;
}

std::string Args::get_or(const std::string& flag, const std::string& fallback) const {
  auto it = values_.find(flag);
  return it == values_.end() ? fallback : it->second;
}

Result<int64_t> Args::get_int(const std::string& flag, int64_t fallback) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (errno != 0 || end == it->second.c_str() || *end != '\0')
    return invalid_argument("flag " + flag + ": '" + it->second + "' is not an integer");
  return static_cast<int64_t>(v);
}

Result<double> Args::get_double(const std::string& flag, double fallback) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (errno != 0 || end == it->second.c_str() || *end != '\0')
    return invalid_argument("flag " + flag + ": '" + it->second + "' is not a number");
  return v;
}

Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || errno != 0 || *end != '\0' || v < 0 || v > INT32_MAX)
      return invalid_argument("flag " + flag + ": '" + item + "' is not a token id (a non-negative integer)");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

}  // namespace mxserve::cli
