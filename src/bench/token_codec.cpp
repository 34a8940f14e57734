// WordCodec and the `--tokenizer` factory (see token_codec.h).
#include "bench/token_codec.h"

#include <mutex>

namespace mxserve::bench {

struct WordCodec::State {
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, int32_t> ids;
  mutable std::vector<std::string> words;
};

WordCodec::WordCodec() : state_(std::make_unique<State>()) {}
WordCodec::~WordCodec() = default;

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  const size_t n = text.size();
  auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; };
  while (i < n) {
    while (i < n && is_space(text[i])) ++i;
    size_t j = i;
    while (j < n && !is_space(text[j])) ++j;
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

Result<std::vector<int32_t>> WordCodec::encode(std::string_view text) const {
  std::vector<int32_t> out;
  std::lock_guard<std::mutex> lock(state_->mu);
  for (std::string_view w : split_words(text)) {
    auto [it, inserted] = state_->ids.try_emplace(std::string(w), static_cast<int32_t>(state_->words.size()));
    if (inserted) state_->words.emplace_back(w);
    out.push_back(it->second);
  }
  return out;
}

std::string WordCodec::decode(std::span<const int32_t> ids) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(' ');
    const int32_t id = ids[i];
    if (id >= 0 && static_cast<size_t>(id) < state_->words.size()) out += state_->words[id];
  }
  return out;
}

Result<std::unique_ptr<TokenCodec>> make_token_codec(const std::string& spec) {
  if (spec == "builtin:words") return std::unique_ptr<TokenCodec>(std::make_unique<WordCodec>());
  if (spec.empty()) return invalid_argument("--tokenizer: empty value (give a tokenizer.json or model directory)");
  auto codec = load_model_token_codec(spec);
  if (!codec.is_ok()) return codec.status().with_context("--tokenizer " + spec);
  return codec;
}

}  // namespace mxserve::bench
