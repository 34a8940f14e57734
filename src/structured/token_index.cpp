// TokenIndex (token_index.h): trie construction over the sorted token byte strings and the plain-string
// classification.
#include "structured/token_index.h"

#include <algorithm>
#include <numeric>

#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

namespace mxserve::structured {

std::shared_ptr<const TokenIndex> TokenIndex::from_tokenizer(const tokenizer::Tokenizer& tok, int64_t vocab_size) {
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(std::min<int64_t>(tok.vocab_size(), vocab_size)));
  for (size_t id = 0; id < bytes.size(); ++id) bytes[id] = tok.token_bytes(static_cast<int32_t>(id));
  return build(bytes, vocab_size);
}

std::shared_ptr<const TokenIndex> TokenIndex::build(const std::vector<std::optional<std::string>>& bytes,
                                                    int64_t vocab_size) {
  auto ix = std::shared_ptr<TokenIndex>(new TokenIndex());
  ix->vocab_size_ = vocab_size;
  ix->bytes_ = bytes;
  ix->bytes_.resize(std::min<size_t>(bytes.size(), static_cast<size_t>(vocab_size)));
  for (auto& b : ix->bytes_)
    if (b && b->empty()) b.reset();
  const size_t n_ids = ix->bytes_.size();
  ix->plain_.assign(kModes, std::vector<uint32_t>(static_cast<size_t>(ix->words()), 0));
  ix->token_nonplain_.assign(n_ids, 0);
  std::vector<int32_t> order;
  for (size_t id = 0; id < n_ids; ++id) {
    if (!ix->bytes_[id]) continue;
    order.push_back(static_cast<int32_t>(id));
    const std::string& s = *ix->bytes_[id];
    ix->max_len_ = std::max(ix->max_len_, s.size());
    for (int u = 0; u < kUtf8States; ++u) {
      int c = u;
      for (char ch : s) {
        c = string_lexer::next(c, static_cast<uint8_t>(ch));
        if (c < 0 || c >= kUtf8States) break;
      }
      const bool has_lt = s.find('<') != std::string::npos;
      if (c >= 0 && c < kUtf8States) ix->plain_[u][id >> 5] |= 1u << (id & 31);
      else ix->token_nonplain_[id] |= 1u << u;
      if (c >= 0 && c < kUtf8States && !has_lt) ix->plain_[2 * kUtf8States + u][id >> 5] |= 1u << (id & 31);
      else ix->token_nonplain_[id] |= 1u << (2 * kUtf8States + u);
      int r = u;
      for (char ch : s) {
        r = ch == '<' ? -1 : raw_lexer::next(r, static_cast<uint8_t>(ch));
        if (r < 0) break;
      }
      if (r >= 0) ix->plain_[kUtf8States + u][id >> 5] |= 1u << (id & 31);
      else ix->token_nonplain_[id] |= 1u << (kUtf8States + u);
    }
  }
  ix->n_tokens_ = static_cast<int64_t>(order.size());
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return *ix->bytes_[a] < *ix->bytes_[b] || (*ix->bytes_[a] == *ix->bytes_[b] && a < b);
  });
  ix->nodes_.reserve(order.size() * 2);
  ix->build_node(order, 0, order.size(), 0);
  return ix;
}

// Node for the ids order[lo, hi), which share their first `depth` bytes. Returns its index; its
// children's edges are contiguous.
int32_t TokenIndex::build_node(const std::vector<int32_t>& order, size_t lo, size_t hi, size_t depth) {
  const int32_t me = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(TrieNode{});
  size_t i = lo;
  nodes_[me].first_token = static_cast<int32_t>(token_ids_.size());
  uint32_t nonplain = 0;
  for (; i < hi && bytes_[order[i]]->size() == depth; ++i) {
    token_ids_.push_back(order[i]);
    nonplain |= token_nonplain_[order[i]];
  }
  nodes_[me].n_tokens = static_cast<int32_t>(token_ids_.size()) - nodes_[me].first_token;
  std::vector<std::pair<size_t, size_t>> groups;
  while (i < hi) {
    const char b = (*bytes_[order[i]])[depth];
    size_t j = i;
    while (j < hi && (*bytes_[order[j]])[depth] == b) ++j;
    groups.emplace_back(i, j);
    i = j;
  }
  const int32_t first_edge = static_cast<int32_t>(edge_byte_.size());
  nodes_[me].first_edge = first_edge;
  nodes_[me].n_edges = static_cast<int32_t>(groups.size());
  edge_byte_.resize(edge_byte_.size() + groups.size());
  edge_child_.resize(edge_child_.size() + groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto [glo, ghi] = groups[g];
    edge_byte_[first_edge + g] = static_cast<uint8_t>((*bytes_[order[glo]])[depth]);
    const int32_t child = build_node(order, glo, ghi, depth + 1);
    edge_child_[first_edge + g] = child;
    nonplain |= nodes_[child].nonplain;
  }
  nodes_[me].nonplain = nonplain;
  return me;
}

}  // namespace mxserve::structured
