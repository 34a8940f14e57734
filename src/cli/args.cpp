#include "cli/args.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli/command_table.h"

namespace mxserve::cli {

namespace {

// "generate", or "eval perplexity" when a subcommand passes its own argv (argv[0] = "perplexity").
std::string help_key(int argc, char** argv) {
  std::string key = current_command();
  if (argc > 0 && argv[0] != nullptr && key != argv[0] && !key.empty()) key += std::string(" ") + argv[0];
  if (key.empty() && argc > 0 && argv[0] != nullptr) key = argv[0];
  return key;
}

[[noreturn]] void print_help_and_exit(const std::string& key, const std::set<std::string>& value_flags,
                                      const std::set<std::string>& bool_flags,
                                      const std::set<std::string>& repeated_flags) {
  const char* env = std::getenv("MXSERVE_HELP_ACCEPTED_FLAGS");
  if (env != nullptr && std::strcmp(env, "1") == 0) {
    std::set<std::string> all = value_flags;
    all.insert(bool_flags.begin(), bool_flags.end());
    all.insert(repeated_flags.begin(), repeated_flags.end());
    for (const auto& f : all)
      if (f != "--help" && f != "-h") std::printf("%s\n", f.c_str());
    std::exit(0);
  }
  const CommandHelp* c = find_command_help(key);
  if (c == nullptr) {
    std::fprintf(stderr, "mxserve %s: no help entry (a bug: add it to src/cli/command_table.cpp)\n", key.c_str());
    std::exit(1);
  }
  print_command_help(*c, stdout);
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace

Result<Args> Args::parse(int argc, char** argv, const std::set<std::string>& value_flags,
                         const std::set<std::string>& bool_flags, const std::set<std::string>& repeated_flags) {
  // --help first, wherever it is, so `mxserve CMD --bogus --help` still helps.
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h"))
      print_help_and_exit(help_key(argc, argv), value_flags, bool_flags, repeated_flags);
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    // vLLM's short spellings of the parallel sizes, where the command takes the long flag.
    if ((arg == "-tp" || arg.rfind("-tp=", 0) == 0) && value_flags.count("--tensor-parallel-size"))
      arg = "--tensor-parallel-size" + arg.substr(3);
    if ((arg == "-dp" || arg.rfind("-dp=", 0) == 0) && value_flags.count("--data-parallel-size"))
      arg = "--data-parallel-size" + arg.substr(3);
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
      std::set<std::string> known = value_flags;
      known.insert(bool_flags.begin(), bool_flags.end());
      known.insert(repeated_flags.begin(), repeated_flags.end());
      known.erase("--help");
      const std::string near = nearest_name(arg, known);
      const std::string key = help_key(argc, argv);
      std::string msg = "unknown flag " + arg + " (";
      if (!near.empty()) msg += "did you mean " + near + "? ";
      msg += known.empty() ? "`mxserve " + key + "` takes no flags)" : "`mxserve " + key + " --help` lists the flags)";
      return invalid_argument(msg);
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
