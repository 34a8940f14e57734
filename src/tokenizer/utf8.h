// UTF-8 helpers and the GPT-2 byte<->unicode table used by byte-level BPE.
// Owns: validation, code point decode/encode, the 256-entry byte-level alphabet.
// Invariant: decode_utf8 is only called on text that passed validate_utf8.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace mxserve::tokenizer {

// Returns the byte offset of the first invalid sequence, or npos when `s` is valid UTF-8
// (no overlongs, no surrogates, nothing above U+10FFFF).
size_t find_invalid_utf8(std::string_view s);
inline bool is_valid_utf8(std::string_view s) { return find_invalid_utf8(s) == std::string_view::npos; }

// Length of the UTF-8 sequence introduced by lead byte `b` (1 for continuation/invalid bytes).
inline size_t utf8_seq_len(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at `pos` and advances `pos`. Text must be valid UTF-8.
char32_t decode_utf8(std::string_view s, size_t& pos);
void append_utf8(std::string& out, char32_t cp);

// Length of the longest prefix of `s` that ends on a complete UTF-8 character boundary
// (an incomplete trailing sequence is excluded; invalid bytes count as complete).
size_t complete_utf8_prefix(std::string_view s);

// Replaces invalid sequences with U+FFFD (like Rust's String::from_utf8_lossy).
std::string utf8_lossy(std::string_view s);

// Unicode White_Space (what Rust's char::is_whitespace uses).
bool is_unicode_whitespace(char32_t cp);

// GPT-2 byte-level alphabet: byte -> UTF-8 string of its stand-in code point, and the inverse.
const std::array<std::string, 256>& byte_to_unicode();
// Returns -1 when `cp` is not a byte-level stand-in.
int unicode_to_byte(char32_t cp);

}  // namespace mxserve::tokenizer
