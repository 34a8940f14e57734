// Normalizer implementations (see normalizer.h).
#include "tokenizer/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {
namespace {

using nlohmann::json;

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* n) : norm_(n) {}
  Status normalize(std::string& text) const override {
    UErrorCode err = U_ZERO_ERROR;
    // Fast path: already normalized (the common case for NFC).
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    if (norm_->isNormalized(u, err) && U_SUCCESS(err)) return Status::ok();
    err = U_ZERO_ERROR;
    icu::UnicodeString out = norm_->normalize(u, err);
    if (U_FAILURE(err)) return internal_error(std::string("ICU normalization failed: ") + u_errorName(err));
    text.clear();
    out.toUTF8String(text);
    return Status::ok();
  }

 private:
  const icu::Normalizer2* norm_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  Status normalize(std::string& text) const override {
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    u.toLower(icu::Locale::getRoot());
    text.clear();
    u.toUTF8String(text);
    return Status::ok();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status normalize(std::string& text) const override {
    size_t b = 0, e = text.size();
    if (left_) {
      while (b < e) {
        size_t p = b;
        if (!is_unicode_whitespace(decode_utf8(text, p))) break;
        b = p;
      }
    }
    if (right_) {
      while (e > b) {
        size_t s = e - 1;
        while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        size_t p = s;
        if (!is_unicode_whitespace(decode_utf8(text, p))) break;
        e = s;
      }
    }
    text = text.substr(b, e - b);
    return Status::ok();
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  Status normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend_);
    return Status::ok();
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::shared_ptr<const Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  Status normalize(std::string& text) const override {
    std::vector<std::pair<size_t, size_t>> m;
    if (re_) {
      MX_RETURN_IF_ERROR(re_->find_all(text, m));
    } else if (!literal_.empty()) {
      for (size_t p = text.find(literal_); p != std::string::npos; p = text.find(literal_, p + literal_.size()))
        m.emplace_back(p, p + literal_.size());
    }
    if (m.empty()) return Status::ok();
    std::string out;
    size_t prev = 0;
    for (auto [s, e] : m) {
      out.append(text, prev, s - prev);
      out.append(content_);
      prev = e;
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
    return Status::ok();
  }

 private:
  std::string literal_;
  std::shared_ptr<const Regex> re_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  Status normalize(std::string& text) const override {
    for (const auto& s : steps_) MX_RETURN_IF_ERROR(s->normalize(text));
    return Status::ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

Result<const icu::Normalizer2*> icu_instance(UnicodeForm f) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (f) {
    case UnicodeForm::kNfc: n = icu::Normalizer2::getNFCInstance(err); break;
    case UnicodeForm::kNfd: n = icu::Normalizer2::getNFDInstance(err); break;
    case UnicodeForm::kNfkc: n = icu::Normalizer2::getNFKCInstance(err); break;
    case UnicodeForm::kNfkd: n = icu::Normalizer2::getNFKDInstance(err); break;
  }
  if (U_FAILURE(err) || n == nullptr) return internal_error("ICU normalizer unavailable");
  return n;
}

}  // namespace

// Pattern objects ({"String": s} or {"Regex": r}) are shared with Split and Replace.
Result<std::pair<std::string, std::shared_ptr<const Regex>>> parse_pattern(const json& p);

Result<std::unique_ptr<Normalizer>> Normalizer::from_json(const json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument("normalizer: expected an object with a string 'type'");
  const std::string type = j["type"].get<std::string>();
  auto form = [&](UnicodeForm f) -> Result<std::unique_ptr<Normalizer>> {
    MX_ASSIGN_OR_RETURN(const icu::Normalizer2* n, icu_instance(f));
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(n));
  };
  if (type == "NFC") return form(UnicodeForm::kNfc);
  if (type == "NFD") return form(UnicodeForm::kNfd);
  if (type == "NFKC") return form(UnicodeForm::kNfkc);
  if (type == "NFKD") return form(UnicodeForm::kNfkd);
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip")
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(j.value("strip_left", true), j.value("strip_right", true)));
  if (type == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string())
      return invalid_argument("normalizer Prepend: missing string 'prepend'");
    return std::unique_ptr<Normalizer>(new PrependNormalizer(j["prepend"].get<std::string>()));
  }
  if (type == "Replace") {
    if (!j.contains("pattern") || !j.contains("content") || !j["content"].is_string())
      return invalid_argument("normalizer Replace: needs 'pattern' and string 'content'");
    MX_ASSIGN_OR_RETURN(auto pat, parse_pattern(j["pattern"]));
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(pat.first, pat.second, j["content"].get<std::string>()));
  }
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      return invalid_argument("normalizer Sequence: missing array 'normalizers'");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& s : j["normalizers"]) {
      MX_ASSIGN_OR_RETURN(auto n, Normalizer::from_json(s));
      if (n) steps.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return unsupported("normalizer type '" + type + "' is not supported");
}

}  // namespace mxserve::tokenizer
