// TokenIndex: the vocabulary as the grammar sees it -- each token id's bytes (the tokenizer's raw decode
// of that one token: byte-level BPE tokens may hold part of a UTF-8 character), a byte trie over them for
// the mask walk, and per-mode "plain" bitsets (Matcher::string_mode): mode u < 8, the tokens made only
// of bytes that a free JSON string accepts from UTF-8 decoder state u without leaving it (no quote,
// backslash or control byte); mode 8 + u, the tokens that raw text accepts from state u with no '<' (so
// no delimiter can start inside them); mode 16 + u, the JSON-plain tokens with no '<' (tag-safe strings).
// Built once per tokenizer and shared, read-only, by every request.
// Invariant: special tokens and tokens with no bytes are in no trie node and no bitset (never allowed).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mxserve::tokenizer {
class Tokenizer;
}

namespace mxserve::structured {

class TokenIndex {
 public:
  static constexpr int kUtf8States = 8;
  static constexpr int kModes = 24;  // [0, 8): JSON string; [8, 16): raw text; [16, 24): tag-safe JSON string
  // bytes[id]: nullopt for ids a grammar never allows. vocab_size >= bytes.size() (model rows beyond the
  // tokenizer's vocabulary are never allowed).
  static std::shared_ptr<const TokenIndex> build(const std::vector<std::optional<std::string>>& bytes, int64_t vocab_size);
  static std::shared_ptr<const TokenIndex> from_tokenizer(const tokenizer::Tokenizer& tok, int64_t vocab_size);

  int64_t vocab_size() const { return vocab_size_; }
  int64_t words() const { return (vocab_size_ + 31) / 32; }
  const std::string* bytes(int32_t id) const {
    return id >= 0 && id < static_cast<int32_t>(bytes_.size()) && bytes_[id] ? &*bytes_[id] : nullptr;
  }
  int64_t n_tokens() const { return n_tokens_; }      // ids that can be allowed
  int64_t n_trie_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  size_t max_token_bytes() const { return max_len_; }

  struct TrieNode {
    int32_t first_edge = 0, n_edges = 0;   // children: edge_byte / edge_child [first_edge, +n_edges), by byte
    int32_t first_token = 0, n_tokens = 0;  // ids whose bytes end here: token_ids [first_token, +n_tokens)
    uint32_t nonplain = 0;                  // bit m: the subtree holds a token that is not plain in mode m
  };
  const TrieNode& node(int32_t i) const { return nodes_[i]; }
  uint8_t edge_byte(int32_t e) const { return edge_byte_[e]; }
  int32_t edge_child(int32_t e) const { return edge_child_[e]; }
  int32_t token_id(int32_t i) const { return token_ids_[i]; }
  std::span<const uint32_t> plain(int u) const { return plain_[u]; }

 private:
  int32_t build_node(const std::vector<int32_t>& order, size_t lo, size_t hi, size_t depth);

  int64_t vocab_size_ = 0;
  int64_t n_tokens_ = 0;
  size_t max_len_ = 0;
  std::vector<std::optional<std::string>> bytes_;
  std::vector<TrieNode> nodes_;
  std::vector<uint8_t> edge_byte_;
  std::vector<int32_t> edge_child_;
  std::vector<int32_t> token_ids_;
  std::vector<std::vector<uint32_t>> plain_;  // [kModes][words]
  std::vector<uint32_t> token_nonplain_;      // [ids] bit m: not plain in mode m
};

}  // namespace mxserve::structured
