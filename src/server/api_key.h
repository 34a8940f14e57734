// API-key check for `Authorization: Bearer KEY` (RFC 6750 / RFC 7235). Owns the exact-match rule: the
// scheme is case-insensitive, one or more spaces separate it from the token, and the token must equal the
// key byte for byte -- no trailing space, tab, NUL or any other junk. The comparison takes time that
// depends on neither the key's content nor where the first difference is.
#pragma once

#include <string>
#include <string_view>

namespace mxserve::server {

// `raw_value`: the Authorization field as received (trailing whitespace kept), or nullptr when absent.
bool bearer_token_matches(const std::string* raw_value, std::string_view key);

// Constant-time equality of two byte strings (time depends only on the lengths).
bool constant_time_equals(std::string_view a, std::string_view b);

}  // namespace mxserve::server
