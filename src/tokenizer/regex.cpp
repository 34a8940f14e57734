// Oniguruma wrapper (see regex.h).
#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>

#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

namespace {
void init_onig_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encs[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encs, 1);
  });
}
}  // namespace

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern) {
  init_onig_once();
  OnigRegex reg = nullptr;
  OnigErrorInfo einfo;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  int r = onig_new(&reg, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                   ONIG_SYNTAX_DEFAULT, &einfo);
  if (r != ONIG_NORMAL) {
    OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(buf, r, &einfo);
    return invalid_argument("invalid regex '" + std::string(pattern) +
                            "': " + reinterpret_cast<char*>(buf));
  }
  std::shared_ptr<Regex> out(new Regex());
  out->handle_ = reg;
  out->pattern_ = std::string(pattern);
  return std::shared_ptr<const Regex>(std::move(out));
}

Regex::~Regex() {
  if (handle_ != nullptr) onig_free(static_cast<OnigRegex>(handle_));
}

Status Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto reg = static_cast<OnigRegex>(handle_);
  OnigRegion* region = onig_region_new();
  const auto* base = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = base + text.size();
  size_t pos = 0;
  while (pos <= text.size()) {
    int r = onig_search(reg, base, end, base + pos, end, region, ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) {
      OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(buf, r);
      onig_region_free(region, 1);
      return internal_error(std::string("regex engine failed on input: ") + reinterpret_cast<char*>(buf));
    }
    size_t s = static_cast<size_t>(region->beg[0]);
    size_t e = static_cast<size_t>(region->end[0]);
    out.emplace_back(s, e);
    if (e > s) {
      pos = e;
    } else {
      if (e >= text.size()) break;
      pos = e + utf8_seq_len(static_cast<unsigned char>(text[e]));
    }
  }
  onig_region_free(region, 1);
  return Status::ok();
}

}  // namespace mxserve::tokenizer
