// PCRE2 wrapper (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

namespace {

constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<char*>(buf);
}

// Per-thread match data and JIT stack, shared by every Regex (only group 0 is read).
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(64, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(ctx, nullptr, jit_stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

std::string Regex::translate(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        if (in_class) out.append(kWhiteSpace);
        else out.append("[").append(kWhiteSpace).append("]");
      } else if (n == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpace).append("]");
      } else {
        out.push_back(c);
        out.push_back(n);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size();
      out.push_back(c);
      // A ']' right after '[' or '[^' is literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  (void)class_start;
  return out;
}

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern) {
  if (!is_valid_utf8(pattern)) return invalid_argument("regex pattern is not valid UTF-8");
  std::string translated = translate(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (code == nullptr)
    return invalid_argument("invalid regex '" + std::string(pattern) + "': " + pcre2_message(err) + " at offset " +
                            std::to_string(offset));
  std::shared_ptr<Regex> out(new Regex());
  out->code_ = code;
  out->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  out->pattern_ = std::string(pattern);
  return std::shared_ptr<const Regex>(std::move(out));
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Status Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  while (pos <= n) {
    int rc = jit_ ? pcre2_jit_match(code, subject, n, pos, 0, st.data, st.ctx)
                  : pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, st.data, st.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return internal_error("regex engine failed on input: " + pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t s = ov[0], e = ov[1];
    out.emplace_back(s, e);
    if (e > s) {
      pos = e;
    } else {
      if (e >= n) break;
      pos = e + utf8_seq_len(static_cast<unsigned char>(text[e]));
    }
  }
  return Status::ok();
}

}  // namespace mxserve::tokenizer
