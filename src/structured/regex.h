// Regex: a regular-expression subset (JSON Schema `pattern`, and the `format` shapes) compiled to a byte
// DFA that the matcher walks inside a string value. Full-match semantics on the string's characters: a
// pattern without a leading '^' may have any text before its match, one without a trailing '$' any text
// after it (JSON Schema patterns are unanchored).
// Supported: literals (UTF-8 included), '.', classes [...] / [^...] with ASCII members and ranges, the
// escapes \d \w \s \D \W \S \n \r \t \f \v \xHH \uHHHH and escaped punctuation, groups (...) (?:...)
// (?<name>...), alternation, quantifiers * + ? {n} {n,} {n,m} (m <= 1000; a lazy '?' suffix is accepted:
// under full-match semantics it changes nothing), '^' at the start and '$' at the end. Anything else --
// backreferences, lookaround, \b, \p{...}, inline flags, non-ASCII class members, possessive quantifiers,
// anchors inside the pattern -- is an error naming the construct and its offset.
// The DFA is built with the string's writing rules: in a JSON string only bytes that need no escape
// (no '"', '\', control bytes: a pattern needing them cannot be matched), in raw text no control byte but
// tab / newline / CR; optionally no "</" (tool-call values), and a character count bound (minLength /
// maxLength) as a product. Dead states are pruned: every state the DFA can be in can still reach an
// accepting state (the matcher's "alive" invariant).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mxserve::structured {

struct ByteDfa {
  int32_t n_states = 0;          // state 0 is the start
  std::vector<int32_t> next;     // [state * 256 + byte]: the next state, -1 none (or dead)
  std::vector<uint8_t> accept;   // [state]
  std::vector<int32_t> dist;     // [state]: fewest bytes to an accepting state
  int32_t step(int32_t s, uint8_t b) const { return next[static_cast<size_t>(s) * 256 + b]; }
};

struct RegexOptions {
  enum class Text { kJsonString, kRawText } text = Text::kJsonString;
  bool no_close_tag = false;  // never "</" (tool-call values)
  int64_t min_chars = 0;      // minLength
  int64_t max_chars = -1;     // maxLength; -1: unbounded
  int32_t max_states = 8192;
};

// Errors (kInvalidArgument) read "pattern \"...\": <what> at offset N" or name the size limit.
Result<std::shared_ptr<const ByteDfa>> compile_regex(std::string_view pattern, const RegexOptions& options);

// The anchored patterns used for `format` (date-time, date, time, uuid, email); empty when unknown.
std::string format_pattern(std::string_view format);

}  // namespace mxserve::structured
