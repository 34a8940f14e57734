// Helpers for the structured-output tests: a small byte-level vocabulary (every byte plus multi-byte
// fragments, some of them partial UTF-8) and the brute-force mask (every token tried on a copy).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "structured/grammar_constraint.h"

namespace mxserve::structured::testing {

inline std::vector<std::optional<std::string>> fragment_vocab() {
  std::vector<std::optional<std::string>> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* f : {"{\"", "\":", "\": ", "\", \"", "\",\"", "\"}", "\"]", "true", "false", "null", "}, {\"",
                        "[]", "{}", "[{\"", "12", "345", "-0.", "e+", "E-", "name", " \"", "abc", "\\n", "\\u00",
                        "\\u", "\"a\":", "\"b\"", ", ", ",\n", "\n", "  ", "0", "007", "1.5", "\xC3\xA9", "\xC3",
                        "\xA9", "\xE2\x82", "\xAC", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xED\xA0\x80", "\xC0\xAF",
                        "red", "green", "\"red\"", "\"green\"", "blue\"", "x\"}", "1}", "2]", "]}", "}]", "}}"})
    v.push_back(std::string(f));
  v.push_back(std::nullopt);  // a special token (EOS in the tests): never a grammar token
  return v;
}

// The allowed set by trying every token on a fresh copy of the matcher.
inline std::vector<uint32_t> brute_force_mask(const Matcher& m, const TokenIndex& ix) {
  std::vector<uint32_t> mask(static_cast<size_t>(ix.words()), 0);
  for (int32_t id = 0; id < ix.vocab_size(); ++id) {
    const std::string* b = ix.bytes(id);
    if (!b) continue;
    Matcher copy = m;
    if (copy.accept(*b)) mask[id >> 5] |= 1u << (id & 31);
  }
  return mask;
}

}  // namespace mxserve::structured::testing
