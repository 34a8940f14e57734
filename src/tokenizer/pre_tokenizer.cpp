// Pre-tokenizer implementations (see pre_tokenizer.h).
// NOTE: the BPE model runs directly on raw bytes when the pipeline ends with ByteLevel, so the
// ByteLevel step here only splits (use_regex) and prepends a space; it never rewrites to the GPT-2
// alphabet. This keeps pieces as views into the input and avoids a copy per word.
#include "tokenizer/pre_tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace mxserve::tokenizer {

using nlohmann::json;

Result<std::pair<std::string, std::shared_ptr<const Regex>>> parse_pattern(const json& p) {
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
    MX_ASSIGN_OR_RETURN(auto re, Regex::compile(p["Regex"].get<std::string>()));
    return std::make_pair(std::string(), re);
  }
  if (p.is_object() && p.contains("String") && p["String"].is_string())
    return std::make_pair(p["String"].get<std::string>(), std::shared_ptr<const Regex>());
  return invalid_argument("pattern must be {\"Regex\": str} or {\"String\": str}");
}

namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Result<Behavior> parse_behavior(const json& j) {
  std::string b = j.is_string() ? j.get<std::string>() : "";
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  return invalid_argument("unknown split behavior '" + b + "'");
}

struct Span {
  size_t start, end;
  bool is_match;
};

// Applies HF's SplitDelimiterBehavior to a full cover of `text` by spans; appends views.
void emit_by_behavior(std::string_view text, std::vector<Span>& spans, Behavior behavior,
                      std::vector<std::string_view>& out) {
  std::vector<Span> merged;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Span& s : spans)
        if (!s.is_match) merged.push_back(s);
      break;
    case Behavior::kIsolated:
      merged = spans;
      break;
    case Behavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !prev_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !prev_match && !merged.empty()) {
          merged.back().start = s.start;
        } else {
          merged.push_back(s);
        }
        prev_match = s.is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case Behavior::kContiguous: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.is_match == prev_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        prev_match = s.is_match;
      }
      break;
    }
  }
  for (const Span& s : merged)
    if (s.end > s.start) out.push_back(text.substr(s.start, s.end - s.start));
}

// Turns match ranges into a full cover of `text`.
void cover(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
           std::vector<Span>& spans) {
  spans.clear();
  size_t prev = 0;
  for (auto [s, e] : matches) {
    if (s > prev) spans.push_back({prev, s, invert});
    spans.push_back({s, e, !invert});
    prev = e;
  }
  if (prev < text.size()) spans.push_back({prev, text.size(), invert});
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::string literal, std::shared_ptr<const Regex> re, Behavior b, bool invert)
      : literal_(std::move(literal)), re_(std::move(re)), behavior_(b), invert_(invert) {}

  Status apply(std::vector<std::string_view>& pieces, const PreTokenizeContext&) const override {
    std::vector<std::string_view> out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<Span> spans;
    for (std::string_view piece : pieces) {
      matches.clear();
      if (re_) {
        MX_RETURN_IF_ERROR(re_->find_all(piece, matches));
      } else if (!literal_.empty()) {
        for (size_t p = piece.find(literal_); p != std::string_view::npos;
             p = piece.find(literal_, p + literal_.size()))
          matches.emplace_back(p, p + literal_.size());
      }
      // Fast path for the common Isolated split.
      if (behavior_ == Behavior::kIsolated && !invert_) {
        size_t prev = 0;
        for (auto [s, e] : matches) {
          if (s > prev) out.push_back(piece.substr(prev, s - prev));
          if (e > s) out.push_back(piece.substr(s, e - s));
          prev = e;
        }
        if (prev < piece.size()) out.push_back(piece.substr(prev));
        continue;
      }
      cover(piece, matches, invert_, spans);
      emit_by_behavior(piece, spans, behavior_, out);
    }
    pieces.swap(out);
    return Status::ok();
  }

 private:
  std::string literal_;
  std::shared_ptr<const Regex> re_;
  Behavior behavior_;
  bool invert_;
};

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::shared_ptr<const Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  Status apply(std::vector<std::string_view>& pieces, const PreTokenizeContext& ctx) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (!p.empty() && p[0] != ' ') {
          std::string spaced(1, ' ');
          spaced.append(p);
          ctx.arena->push_back(std::move(spaced));
          p = ctx.arena->back();
        }
      }
    }
    if (re_) {
      SplitPreTokenizer split("", re_, Behavior::kIsolated, false);
      return split.apply(pieces, ctx);
    }
    return Status::ok();
  }
  bool ends_with_byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::shared_ptr<const Regex> re_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  Status apply(std::vector<std::string_view>& pieces, const PreTokenizeContext&) const override {
    std::vector<std::string_view> out;
    for (std::string_view p : pieces) {
      size_t i = 0, run_start = 0;
      int run_kind = -1;  // 1 digit run, 0 other
      while (i < p.size()) {
        size_t q = i;
        char32_t cp = decode_utf8(p, q);
        int kind = u_isdigit(static_cast<UChar32>(cp)) ? 1 : 0;
        if (run_kind != -1 && (kind != run_kind || (kind == 1 && individual_))) {
          out.push_back(p.substr(run_start, i - run_start));
          run_start = i;
        }
        run_kind = kind;
        i = q;
      }
      if (i > run_start) out.push_back(p.substr(run_start, i - run_start));
    }
    pieces.swap(out);
    return Status::ok();
  }

 private:
  bool individual_;
};

// Splits on a per-character predicate: kind(cp) returns 0 = whitespace (dropped), 1 = word,
// 2 = punctuation (each char isolated when isolate_punct).
class CharClassPreTokenizer final : public PreTokenizer {
 public:
  enum class Mode { kWhitespace, kWhitespaceSplit, kPunctuation };
  explicit CharClassPreTokenizer(Mode m) : mode_(m) {}
  Status apply(std::vector<std::string_view>& pieces, const PreTokenizeContext&) const override {
    std::vector<std::string_view> out;
    for (std::string_view p : pieces) {
      size_t i = 0, start = 0;
      int prev = -1;
      while (i < p.size()) {
        size_t q = i;
        int k = kind(decode_utf8(p, q));
        if (k != prev || k == 3) {
          if (prev > 0 && i > start) out.push_back(p.substr(start, i - start));
          start = i;
        }
        prev = k;
        i = q;
      }
      if (prev > 0 && i > start) out.push_back(p.substr(start, i - start));
    }
    pieces.swap(out);
    return Status::ok();
  }

 private:
  // 0 whitespace (dropped), 1 word, 2 other run, 3 isolated char.
  int kind(char32_t cp) const {
    bool ws = is_unicode_whitespace(cp);
    bool punct = u_ispunct(static_cast<UChar32>(cp)) || (cp < 128 && std::ispunct(static_cast<int>(cp)));
    switch (mode_) {
      case Mode::kWhitespaceSplit: return ws ? 0 : 1;
      case Mode::kWhitespace: {
        if (ws) return 0;
        bool word = u_isalnum(static_cast<UChar32>(cp)) || cp == '_';
        return word ? 1 : 2;
      }
      case Mode::kPunctuation: return punct ? 3 : 1;
    }
    return 1;
  }
  Mode mode_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, std::string scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(std::move(scheme)), split_(split) {}
  Status apply(std::vector<std::string_view>& pieces, const PreTokenizeContext& ctx) const override {
    std::vector<std::string_view> out;
    for (std::string_view p : pieces) {
      std::string s;
      bool prepend = scheme_ == "always" || (scheme_ == "first" && ctx.first_section);
      if (prepend && p.substr(0, replacement_.size()) != replacement_) s = replacement_;
      for (char c : p) {
        if (c == ' ') s += replacement_;
        else s.push_back(c);
      }
      ctx.arena->push_back(std::move(s));
      std::string_view v = ctx.arena->back();
      if (!split_) {
        out.push_back(v);
        continue;
      }
      // MergedWithNext on the replacement character.
      size_t start = 0;
      for (size_t pos = v.find(replacement_, 1); pos != std::string_view::npos;
           pos = v.find(replacement_, pos + replacement_.size())) {
        if (pos > start) out.push_back(v.substr(start, pos - start));
        start = pos;
      }
      if (start < v.size()) out.push_back(v.substr(start));
    }
    pieces.swap(out);
    return Status::ok();
  }

 private:
  std::string replacement_, scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> s) : steps_(std::move(s)) {}
  Status apply(std::vector<std::string_view>& pieces, const PreTokenizeContext& ctx) const override {
    for (const auto& s : steps_) MX_RETURN_IF_ERROR(s->apply(pieces, ctx));
    return Status::ok();
  }
  bool ends_with_byte_level() const override {
    return !steps_.empty() && steps_.back()->ends_with_byte_level();
  }
  bool has_inner_byte_level() const override {
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (steps_[i]->has_inner_byte_level()) return true;
      if (i + 1 < steps_.size() && steps_[i]->ends_with_byte_level()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::from_json(const json& j) {
  using Ptr = std::unique_ptr<PreTokenizer>;
  if (j.is_null()) return Ptr();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument("pre_tokenizer: expected an object with a string 'type'");
  const std::string type = j["type"].get<std::string>();
  if (type == "Split") {
    if (!j.contains("pattern")) return invalid_argument("pre_tokenizer Split: missing 'pattern'");
    MX_ASSIGN_OR_RETURN(auto pat, parse_pattern(j["pattern"]));
    MX_ASSIGN_OR_RETURN(Behavior b, parse_behavior(j.value("behavior", json())));
    bool invert = j.contains("invert") && j["invert"].is_boolean() && j["invert"].get<bool>();
    return Ptr(new SplitPreTokenizer(pat.first, pat.second, b, invert));
  }
  if (type == "ByteLevel") {
    bool use_regex = !j.contains("use_regex") || !j["use_regex"].is_boolean() || j["use_regex"].get<bool>();
    bool prefix = j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean() &&
                  j["add_prefix_space"].get<bool>();
    std::shared_ptr<const Regex> re;
    if (use_regex) {
      MX_ASSIGN_OR_RETURN(re, Regex::compile(kGpt2Pattern));
    }
    return Ptr(new ByteLevelPreTokenizer(prefix, re));
  }
  if (type == "Digits") return Ptr(new DigitsPreTokenizer(j.value("individual_digits", false)));
  if (type == "Whitespace")
    return Ptr(new CharClassPreTokenizer(CharClassPreTokenizer::Mode::kWhitespace));
  if (type == "WhitespaceSplit")
    return Ptr(new CharClassPreTokenizer(CharClassPreTokenizer::Mode::kWhitespaceSplit));
  if (type == "Punctuation") {
    if (j.value("behavior", std::string("Isolated")) != "Isolated")
      return unsupported("pre_tokenizer Punctuation: only behavior Isolated is supported");
    return Ptr(new CharClassPreTokenizer(CharClassPreTokenizer::Mode::kPunctuation));
  }
  if (type == "Metaspace") {
    std::string repl = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = "always";
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      scheme = j["prepend_scheme"].get<std::string>();
    } else if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean()) {
      scheme = j["add_prefix_space"].get<bool>() ? "always" : "never";
    }
    if (scheme != "always" && scheme != "first" && scheme != "never")
      return invalid_argument("pre_tokenizer Metaspace: unknown prepend_scheme '" + scheme + "'");
    if (repl.empty()) return invalid_argument("pre_tokenizer Metaspace: empty replacement");
    return Ptr(new MetaspacePreTokenizer(repl, scheme, j.value("split", true)));
  }
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      return invalid_argument("pre_tokenizer Sequence: missing array 'pretokenizers'");
    std::vector<Ptr> steps;
    for (const auto& s : j["pretokenizers"]) {
      MX_ASSIGN_OR_RETURN(auto p, PreTokenizer::from_json(s));
      if (p) steps.push_back(std::move(p));
    }
    return Ptr(new SequencePreTokenizer(std::move(steps)));
  }
  return unsupported("pre_tokenizer type '" + type + "' is not supported");
}

}  // namespace mxserve::tokenizer
