// Small text helpers shared by the streaming parsers: partial-tag detection (how much of a buffer's tail
// may still become a tag, so must be held back) and whitespace classes. Header-only, no state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace mxserve::chat {

inline bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest suffix of `text` that is a proper prefix of `tag`: those bytes may still turn
// into the tag when more text arrives.
inline size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  const size_t longest = std::min(text.size(), tag.size() - 1);
  for (size_t n = longest; n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

inline std::string_view trim_spaces(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace mxserve::chat
