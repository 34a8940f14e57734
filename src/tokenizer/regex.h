// Regex: a compiled Oniguruma pattern (UTF-8, Ruby syntax -- what HF tokenizers uses).
// Owns: the onig_regex_t handle. Matching is const and thread-safe (a region per call).
// Invariant: a Regex object always holds a successfully compiled pattern.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace mxserve::tokenizer {

class Regex {
 public:
  static Result<std::shared_ptr<const Regex>> compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every non-overlapping match [start, end) of `text` (byte offsets), scanning left to
  // right; after an empty match the scan advances one character (like Rust's find_iter).
  // Fails (instead of silently stopping) when the engine gives up, e.g. its retry limit.
  Status find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  void* handle_ = nullptr;  // OnigRegex
  std::string pattern_;
};

}  // namespace mxserve::tokenizer
