// UTF-8 helpers and the byte-level alphabet (see utf8.h).
#include "tokenizer/utf8.h"

#include <vector>

namespace mxserve::tokenizer {

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    char32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

char32_t decode_utf8(std::string_view s, size_t& pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned char c = p[pos];
  size_t len = utf8_seq_len(c);
  if (pos + len > s.size()) len = 1;
  char32_t cp;
  switch (len) {
    case 1: cp = c; break;
    case 2: cp = ((c & 0x1F) << 6) | (p[pos + 1] & 0x3F); break;
    case 3: cp = ((c & 0x0F) << 12) | ((p[pos + 1] & 0x3F) << 6) | (p[pos + 2] & 0x3F); break;
    default:
      cp = ((c & 0x07) << 18) | ((p[pos + 1] & 0x3F) << 12) | ((p[pos + 2] & 0x3F) << 6) |
           (p[pos + 3] & 0x3F);
  }
  pos += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t complete_utf8_prefix(std::string_view s) {
  // Look back at most 3 bytes for an unfinished lead byte.
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t len = utf8_seq_len(c);
    if (c >= 0x80 && (c & 0xC0) == 0xC0 && len > back) return n - back;  // incomplete
    return n;
  }
  return n;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    size_t bad = find_invalid_utf8(s.substr(i));
    if (bad == std::string_view::npos) {
      out.append(s.substr(i));
      break;
    }
    out.append(s.substr(i, bad));
    out.append("\xEF\xBF\xBD");
    // Skip the maximal subpart of the ill-formed sequence (Unicode "substitution of maximal subparts").
    size_t j = i + bad;
    unsigned char lead = p[j];
    size_t len = (lead >= 0xC2 && lead <= 0xF4) ? utf8_seq_len(lead) : 1;
    size_t k = 1;
    while (k < len && j + k < n) {
      unsigned char c = p[j + k];
      unsigned char lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (lead == 0xE0) lo = 0xA0;
        if (lead == 0xED) hi = 0x9F;
        if (lead == 0xF0) lo = 0x90;
        if (lead == 0xF4) hi = 0x8F;
      }
      if (c < lo || c > hi) break;
      ++k;
    }
    i = j + k;
  }
  return out;
}

bool is_unicode_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {
struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::vector<int> to_byte;  // indexed by code point, -1 when absent
  ByteTables() : to_byte(0x200, -1) {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(to_unicode[b], cp);
      to_byte[cp] = b;
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return tables().to_unicode; }

int unicode_to_byte(char32_t cp) {
  const auto& t = tables().to_byte;
  return cp < t.size() ? t[cp] : -1;
}

}  // namespace mxserve::tokenizer
