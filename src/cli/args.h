// Args: a strict command-line parser for subcommands. Every flag must be declared; an unknown flag,
// a missing value or a malformed number is an error naming the flag and the value.
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
  static Result<Args> parse(int argc, char** argv, const std::set<std::string>& value_flags,
                            const std::set<std::string>& bool_flags);
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
