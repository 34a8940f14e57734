// Streaming detokenizer (see streaming_detokenizer.h).
#include "tokenizer/streaming_detokenizer.h"

#include <algorithm>
#include <span>

namespace mxserve::tokenizer {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
}
}  // namespace

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                                           bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {
  for (auto& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StreamingDetokenizer::push(int32_t id) {
  if (stopped()) return {};
  ids_.push_back(id);
  std::span<const int32_t> all(ids_);
  std::string prefix = tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  std::string text = tokenizer_.decode(all.subspan(prefix_offset_), skip_special_);
  if (text.size() <= prefix.size() || ends_with_replacement(text) || text.compare(0, prefix.size(), prefix) != 0) {
    // Incomplete UTF-8 (or nothing new yet): wait for more ids. A window that no longer extends
    // its prefix (a decoder that rewrites earlier text) is also held, then flushed by finish().
    return {};
  }
  pending_ += text.substr(prefix.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return release(false);
}

std::string StreamingDetokenizer::finish() {
  if (!stopped() && read_offset_ < ids_.size()) {
    std::span<const int32_t> all(ids_);
    std::string prefix = tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
    std::string text = tokenizer_.decode(all.subspan(prefix_offset_), skip_special_);
    if (text.compare(0, prefix.size(), prefix) == 0) pending_ += text.substr(prefix.size());
    else pending_ += tokenizer_.decode(all.subspan(read_offset_), skip_special_);
    prefix_offset_ = read_offset_ = ids_.size();
  }
  return release(true);
}

std::string StreamingDetokenizer::release(bool final) {
  if (stopped()) return {};
  // Earliest complete stop string wins.
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    size_t p = pending_.find(s);
    if (p != std::string::npos && p < best) {
      best = p;
      matched_stop_ = s;
    }
  }
  if (best != std::string::npos) {
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  size_t hold = 0;
  if (!final) {
    // Longest tail of pending_ that is a proper prefix of some stop string.
    for (const std::string& s : stops_) {
      size_t max_len = std::min(s.size() - 1, pending_.size());
      for (size_t len = max_len; len > hold; --len) {
        if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

}  // namespace mxserve::tokenizer
