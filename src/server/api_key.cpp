#include "server/api_key.h"

#include <cstdint>

namespace mxserve::server {

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Every byte of `b` (the key) is visited whatever `a` holds; a length mismatch only sets a bit.
  uint32_t diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<uint32_t>(x ^ static_cast<unsigned char>(b[i]));
  }
  volatile uint32_t sink = diff;  // keep the loop from being turned into an early exit
  return sink == 0;
}

bool bearer_token_matches(const std::string* raw_value, std::string_view key) {
  if (!raw_value) return false;
  std::string_view v = *raw_value;
  constexpr std::string_view kScheme = "bearer";
  if (v.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    char c = v[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kScheme[i]) return false;
  }
  v.remove_prefix(kScheme.size());
  if (v.front() != ' ') return false;
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  return !v.empty() && constant_time_equals(v, key);
}

}  // namespace mxserve::server
