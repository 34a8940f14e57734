#include "server/log_text.h"

#include <cstdio>

namespace mxserve::server {

std::string sanitize_for_log(std::string_view text, size_t max_bytes) {
  std::string out;
  const bool cut = text.size() > max_bytes;
  if (cut) text = text.substr(0, max_bytes);
  out.reserve(text.size() + 8);
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (cut) out += "...";
  return out;
}

}  // namespace mxserve::server
