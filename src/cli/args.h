// Args: a strict command-line parser for subcommands. Every flag must be declared; an unknown flag,
// a missing value or a malformed number is an error naming the flag and the value (an unknown flag also names
// the nearest declared one). --help / -h anywhere prints the command's entry of the command table
// (cli/command_table.h) and exits 0; with MXSERVE_HELP_ACCEPTED_FLAGS=1 in the environment it prints the flags this
// parser accepts instead, one a line (tests/cli/test_cli_help.sh compares the two).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::cli {

class Args {
 public:
  // value_flags take a value ("--model DIR" or "--model=DIR"); bool_flags take none.
  // repeated_flags: flags the caller took out of argv before parsing (compare's --model A --model B); named only
  // for --help and the nearest-flag hint.
  static Result<Args> parse(int argc, char** argv, const std::set<std::string>& value_flags,
                            const std::set<std::string>& bool_flags,
                            const std::set<std::string>& repeated_flags = {});
  bool has(const std::string& flag) const { return values_.count(flag) || bools_.count(flag); }
  Result<std::string> get(const std::string& flag) const;  // required
  std::string get_or(const std::string& flag, const std::string& fallback) const;
  Result<int64_t> get_int(const std::string& flag, int64_t fallback) const;
  Result<double> get_double(const std::string& flag, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> bools_;
  std::vector<std::string> positional_;
};

// "1,2,3" -> {1,2,3}; errors name the flag and the bad item.
Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& flag);

}  // namespace mxserve::cli
