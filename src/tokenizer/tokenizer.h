// Tokenizer: a Hugging Face tokenizer.json (BPE family) loaded natively.
// Owns the encode pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor)
// and decode (ids -> token strings -> decoder chain -> UTF-8). With load_dir it also holds what
// tokenizer_config.json says (chat template, bos/eos). Thread-safe: all methods are const.
// Invariant: encode accepts only valid UTF-8 (an invalid byte is an InvalidArgument naming its
// offset); decode always returns valid UTF-8 (invalid byte runs become U+FFFD).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

class Normalizer;
class PreTokenizer;
class BpeModel;
class AddedVocab;
class PostProcessor;
class Decoder;

class Tokenizer {
 public:
  // Inputs above this size are rejected with InvalidArgument rather than tokenized.
  static constexpr size_t kMaxInputBytes = size_t{64} << 20;

  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path);
  // Loads tokenizer.json + tokenizer_config.json (chat template, bos/eos, added tokens) from a
  // directory; a chat_template.jinja file there is used when the config has no template.
  static Result<std::unique_ptr<Tokenizer>> load_dir(const std::string& dir);
  // Builds from tokenizer.json text (and optionally tokenizer_config.json text).
  static Result<std::unique_ptr<Tokenizer>> from_json_text(std::string_view tokenizer_json,
                                                           std::string_view config_json = {});
  ~Tokenizer();

  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  int32_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The raw bytes one token decodes to on its own (no UTF-8 repair: a byte-level token may hold part of
  // a character); nullopt for special tokens and unknown ids. Used by structured output's token index.
  // NOTE: decoders that look at position (Metaspace's leading-space strip) treat the token as the first.
  std::optional<std::string> token_bytes(int32_t id) const;

  // From tokenizer_config.json (empty / nullopt when absent).
  const std::string& chat_template() const { return chat_template_; }
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  const nlohmann::json& config() const { return config_; }

  // Disables the per-word BPE cache (benchmarks measure both).
  void set_cache_enabled(bool on);

 private:
  Tokenizer();
  static Result<std::unique_ptr<Tokenizer>> from_json_text_unchecked(std::string_view tokenizer_json,
                                                                     std::string_view config_json);
  Status apply_config(const nlohmann::json& config);
  Status encode_section(std::string_view text, bool first_section, std::vector<int32_t>& out) const;
  Status encode_normalized(std::string_view text, bool first_section, std::vector<int32_t>& out) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<AddedVocab> added_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  int32_t vocab_size_ = 0;

  nlohmann::json config_;
  std::string chat_template_;
  std::optional<std::string> bos_token_, eos_token_;
};

}  // namespace mxserve::tokenizer
