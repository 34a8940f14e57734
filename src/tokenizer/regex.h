// Regex: a compiled PCRE2 pattern in UTF + UCP mode, JIT-compiled when the platform allows.
// Owns the pcre2 code handle. Matching is const and thread-safe (per-thread match data / JIT
// stack). Patterns are HF tokenizer.json regexes (written for Oniguruma/Rust): `\s` / `\S`
// outside and `\s` inside character classes are rewritten to Unicode White_Space, which is what
// those engines mean by `\s` (PCRE2's UCP `\s` also matches U+180E).
// NOTE: PCRE2 rather than Oniguruma for speed: Oniguruma 6.9 mallocs and copies its initial
// backtrack stack on every search call, which dominated encode time (see docs/perf/tokenizer.md).
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
  // `text` must be valid UTF-8. Fails (instead of silently stopping) when the engine gives up,
  // e.g. on its match limit.
  Status find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

  // The pattern as handed to PCRE2 (after the \s rewrite); exposed for tests.
  static std::string translate(std::string_view pattern);

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
  std::string pattern_;
};

}  // namespace mxserve::tokenizer
