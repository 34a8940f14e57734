// Jinja lexer (see jinja_lexer.h).
#include "tokenizer/jinja_lexer.h"

#include "tokenizer/utf8.h"

namespace mxserve::tokenizer::jinja {

bool is_js_space(char32_t cp) { return cp == 0xFEFF || (cp != 0x85 && is_unicode_whitespace(cp)); }

namespace {

struct Source {
  std::string text;
  std::vector<int> line;  // line[i] = original line of text[i]
};

// lstrip_blocks + trim_blocks + one trailing newline removed, as transformers configures Jinja.
Source preprocess(std::string_view src) {
  if (!src.empty() && src.back() == '\n') src.remove_suffix(1);
  Source out;
  out.text.reserve(src.size());
  out.line.reserve(src.size());
  int line = 1;
  size_t i = 0;
  bool at_line_start = true;
  while (i < src.size()) {
    if (at_line_start) {
      size_t j = i;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
      if (j + 1 < src.size() && src[j] == '{' && (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) i = j;
      at_line_start = false;
      if (i >= src.size()) break;
    }
    char c = src[i];
    if (c == '}' && i > 0 && i + 1 < src.size() && src[i + 1] == '\n' &&
        (src[i - 1] == '#' || src[i - 1] == '%' || src[i - 1] == '-') && !out.text.empty()) {
      out.text.push_back(c);
      out.line.push_back(line);
      ++line;
      i += 2;
      at_line_start = true;
      continue;
    }
    out.text.push_back(c);
    out.line.push_back(line);
    if (c == '\n') {
      ++line;
      at_line_start = true;
    }
    ++i;
  }
  return out;
}

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

struct Mapping {
  std::string_view seq;
  TokType type;
};
constexpr Mapping kTable[] = {
    {"{%", TokType::kOpenStatement}, {"%}", TokType::kCloseStatement}, {"{{", TokType::kOpenExpression},
    {"}}", TokType::kCloseExpression}, {"(", TokType::kOpenParen}, {")", TokType::kCloseParen},
    {"{", TokType::kOpenCurly}, {"}", TokType::kCloseCurly}, {"[", TokType::kOpenSquare},
    {"]", TokType::kCloseSquare}, {",", TokType::kComma}, {".", TokType::kDot}, {":", TokType::kColon},
    {"|", TokType::kPipe}, {"<=", TokType::kComparison}, {">=", TokType::kComparison},
    {"==", TokType::kComparison}, {"!=", TokType::kComparison}, {"<", TokType::kComparison},
    {">", TokType::kComparison}, {"+", TokType::kAdditive}, {"-", TokType::kAdditive},
    {"~", TokType::kAdditive}, {"**", TokType::kExponent}, {"*", TokType::kMultiplicative},
    {"//", TokType::kMultiplicative}, {"/", TokType::kMultiplicative}, {"%", TokType::kMultiplicative},
    {"=", TokType::kEquals},
};

// Removes trailing JS whitespace from a string.
void js_trim_end(std::string& s) {
  size_t e = s.size();
  while (e > 0) {
    size_t st = e - 1;
    while (st > 0 && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80) --st;
    size_t p = st;
    if (!is_js_space(decode_utf8(s, p))) break;
    e = st;
  }
  s.resize(e);
}

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) {
  if (!is_valid_utf8(source)) return invalid_argument("template is not valid UTF-8");
  Source src = preprocess(source);
  const std::string& s = src.text;
  const size_t n = s.size();
  std::vector<Token> tokens;
  size_t pos = 0;
  int curly_depth = 0;
  auto line_at = [&](size_t p) { return src.line.empty() ? 1 : src.line[std::min(p, src.line.size() - 1)]; };
  auto err = [&](const std::string& m) { return invalid_argument("template syntax error at line " + std::to_string(line_at(pos)) + ": " + m); };
  auto strip_trailing = [&]() {
    if (!tokens.empty() && tokens.back().type == TokType::kText) {
      js_trim_end(tokens.back().value);
      if (tokens.back().value.empty()) tokens.pop_back();
    }
  };
  auto skip_leading = [&]() {
    while (pos < n) {
      size_t p = pos;
      if (!is_js_space(decode_utf8(s, p))) break;
      pos = p;
    }
  };
  auto at = [&](size_t p) { return p < n ? s[p] : '\0'; };

  while (pos < n) {
    TokType last = tokens.empty() ? TokType::kText : tokens.back().type;
    bool text_allowed = tokens.empty() || last == TokType::kCloseStatement || last == TokType::kCloseExpression ||
                        last == TokType::kComment;
    if (text_allowed) {
      size_t start = pos;
      while (pos < n && !(s[pos] == '{' && (at(pos + 1) == '%' || at(pos + 1) == '{' || at(pos + 1) == '#'))) ++pos;
      if (pos > start) {
        tokens.push_back({TokType::kText, s.substr(start, pos - start), line_at(start)});
        continue;
      }
    }
    if (s[pos] == '{' && at(pos + 1) == '#') {
      int line = line_at(pos);
      pos += 2;
      bool strip_before = at(pos) == '-';
      if (strip_before) ++pos;
      size_t start = pos;
      while (!(at(pos) == '#' && at(pos + 1) == '}')) {
        if (pos + 2 >= n) return err("missing end of comment tag");
        ++pos;
      }
      std::string comment = s.substr(start, pos - start);
      bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing();
      tokens.push_back({TokType::kComment, comment, line});
      pos += 2;
      if (strip_after) skip_leading();
      continue;
    }
    if (s.compare(pos, 3, "{%-") == 0) {
      strip_trailing();
      tokens.push_back({TokType::kOpenStatement, "{%", line_at(pos)});
      pos += 3;
      continue;
    }
    if (s.compare(pos, 3, "{{-") == 0) {
      strip_trailing();
      tokens.push_back({TokType::kOpenExpression, "{{", line_at(pos)});
      curly_depth = 0;
      pos += 3;
      continue;
    }
    while (pos < n && is_ascii_space(s[pos])) ++pos;
    if (pos >= n) break;
    if (s.compare(pos, 3, "-%}") == 0) {
      tokens.push_back({TokType::kCloseStatement, "%}", line_at(pos)});
      pos += 3;
      skip_leading();
      continue;
    }
    if (s.compare(pos, 3, "-}}") == 0) {
      tokens.push_back({TokType::kCloseExpression, "}}", line_at(pos)});
      pos += 3;
      skip_leading();
      continue;
    }
    char c = s[pos];
    int line = line_at(pos);
    if (c == '-' || c == '+') {
      if (tokens.empty() || last == TokType::kText) return err(std::string("unexpected character '") + c + "'");
      if (last != TokType::kIdentifier && last != TokType::kNumeric && last != TokType::kString &&
          last != TokType::kCloseParen && last != TokType::kCloseSquare) {
        ++pos;
        std::string num;
        while (pos < n && is_digit(s[pos])) num.push_back(s[pos++]);
        if (!num.empty() && at(pos) == '.' && is_digit(at(pos + 1))) {
          ++pos;
          num.push_back('.');
          while (pos < n && is_digit(s[pos])) num.push_back(s[pos++]);
        }
        tokens.push_back({num.empty() ? TokType::kUnary : TokType::kNumeric, std::string(1, c) + num, line});
        continue;
      }
    }
    bool matched = false;
    for (const Mapping& m : kTable) {
      if (m.seq == "}}" && curly_depth > 0) continue;
      if (s.compare(pos, m.seq.size(), m.seq) == 0) {
        tokens.push_back({m.type, std::string(m.seq), line});
        if (m.type == TokType::kOpenExpression) curly_depth = 0;
        else if (m.type == TokType::kOpenCurly) ++curly_depth;
        else if (m.type == TokType::kCloseCurly) --curly_depth;
        pos += m.seq.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      ++pos;
      std::string str;
      while (true) {
        if (pos >= n) return err("unterminated string literal");
        char d = s[pos];
        if (d == c) break;
        if (d == '\\') {
          ++pos;
          if (pos >= n) return err("unexpected end of input in string escape");
          char e = s[pos++];
          if (e == 'x' || e == 'u') {
            size_t len = e == 'x' ? 2 : 4;
            if (pos + len > n) return err("invalid hexadecimal escape");
            unsigned v = 0;
            for (size_t k = 0; k < len; ++k) {
              char h = s[pos + k];
              int d2 = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
              if (d2 < 0) return err("invalid hexadecimal escape");
              v = v * 16 + static_cast<unsigned>(d2);
            }
            if (v >= 0xD800 && v <= 0xDFFF) return err("surrogate escapes are not supported");
            append_utf8(str, v);
            pos += len;
            continue;
          }
          switch (e) {
            case 'n': str.push_back('\n'); break;
            case 't': str.push_back('\t'); break;
            case 'r': str.push_back('\r'); break;
            case 'b': str.push_back('\b'); break;
            case 'f': str.push_back('\f'); break;
            case 'v': str.push_back('\v'); break;
            case '\'': case '"': case '\\': str.push_back(e); break;
            default: return err(std::string("unexpected escaped character '") + e + "'");
          }
          continue;
        }
        str.push_back(d);
        ++pos;
      }
      ++pos;
      tokens.push_back({TokType::kString, std::move(str), line});
      continue;
    }
    if (is_digit(c)) {
      std::string num;
      while (pos < n && is_digit(s[pos])) num.push_back(s[pos++]);
      bool after_dot = !tokens.empty() && tokens.back().type == TokType::kDot;
      if (!after_dot && at(pos) == '.' && is_digit(at(pos + 1))) {
        ++pos;
        num.push_back('.');
        while (pos < n && is_digit(s[pos])) num.push_back(s[pos++]);
      }
      tokens.push_back({TokType::kNumeric, std::move(num), line});
      continue;
    }
    if (is_word(c)) {
      std::string w;
      while (pos < n && is_word(s[pos])) w.push_back(s[pos++]);
      tokens.push_back({TokType::kIdentifier, std::move(w), line});
      continue;
    }
    return err(std::string("unexpected character '") + c + "'");
  }
  return tokens;
}

}  // namespace mxserve::tokenizer::jinja
