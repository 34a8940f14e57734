// TokenCodec: the one tokenizer interface `mxserve bench` uses to cut prompts of an exact token count.
// Owns: the abstract interface, the built-in WordCodec (for tests and fake servers only) and the
// factory that maps a `--tokenizer` value to a codec.
// Invariant: the product path never approximates silently. `--tokenizer PATH` loads the target
// model's tokenizer through load_model_token_codec() (model_token_codec.cpp, the one-file adapter to
// mxserve::tokenizer) and fails loudly when it is unavailable; the word codec is used only when the
// user asks for it by name (`--tokenizer builtin:words`) and the run is then labelled approximate.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace mxserve::bench {

class TokenCodec {
 public:
  virtual ~TokenCodec() = default;
  // Token ids of `text` as the server will count them for a raw prompt (no special tokens added).
  virtual Result<std::vector<int32_t>> encode(std::string_view text) const = 0;
  // Text of `ids`; decode(a ++ b) starts with decode(a) byte for byte (true for byte-level BPE).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Short description for reports: "tokenizer.json at PATH", "builtin:words (approximate)".
  virtual std::string describe() const = 0;
  // True when token counts match the target model's tokenizer (false for builtin codecs).
  virtual bool exact_for_model() const = 0;
};

// One token per whitespace-separated word; decode joins with single spaces, so
// encode(decode(ids)) == ids. Ids are assigned on first sight (thread-safe only for const use after
// all words were seen; encode() of unseen words is therefore guarded by a mutex).
class WordCodec final : public TokenCodec {
 public:
  WordCodec();
  ~WordCodec() override;
  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string describe() const override { return "builtin:words (1 token = 1 word; approximate)"; }
  bool exact_for_model() const override { return false; }

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Splits on ASCII whitespace; shared by WordCodec and the tests' fake server.
std::vector<std::string_view> split_words(std::string_view text);

// The adapter to the real tokenizer (model_token_codec.cpp). PATH is a tokenizer.json or a model
// directory holding one.
Result<std::unique_ptr<TokenCodec>> load_model_token_codec(const std::string& path);

// `--tokenizer` value -> codec: "builtin:words" -> WordCodec; anything else -> load_model_token_codec.
Result<std::unique_ptr<TokenCodec>> make_token_codec(const std::string& spec);

}  // namespace mxserve::bench
