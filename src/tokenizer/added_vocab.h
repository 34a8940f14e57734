// AddedVocab: the "added_tokens" of tokenizer.json -- special or not, lstrip / rstrip /
// single_word / normalized. Owns finding them in text (leftmost-longest, like HF's Aho-Corasick
// pass): tokens with normalized=false are matched in the raw input, normalized=true ones in the
// normalized text of the segments in between.
// Invariant: a match never overlaps another; stripped whitespace is absorbed into the match.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A piece of input: either plain text to normalize / pre-tokenize, or an added token's id.
struct Segment {
  std::string_view text;  // empty for a token
  int32_t token_id = -1;  // >= 0 for an added token
};

class AddedVocab {
 public:
  Status load(const nlohmann::json& added_tokens);
  // Splits `text` on tokens of the given class (normalized or not); appends segments.
  void split(std::string_view text, bool normalized_class, std::vector<Segment>& out) const;
  bool has_normalized_tokens() const { return !tries_[1].nodes.empty() && tries_[1].nodes.size() > 1; }

  std::optional<int32_t> token_to_id(std::string_view s) const;
  const AddedToken* by_id(int32_t id) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Byte trie per class; node 0 is the root.
  struct Trie {
    struct Node {
      std::unordered_map<unsigned char, int32_t> next;
      int32_t token = -1;  // index into tokens_
    };
    std::vector<Node> nodes;
    bool first_byte[256] = {};
  };
  void insert(Trie& t, int32_t index);
  bool word_char_before(std::string_view text, size_t pos) const;
  bool word_char_after(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  Trie tries_[2];  // [0] normalized=false, [1] normalized=true
};

}  // namespace mxserve::tokenizer
