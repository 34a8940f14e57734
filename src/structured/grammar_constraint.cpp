// GrammarConstraint (grammar_constraint.h): the token-mask walk and the per-token advance.
#include "structured/grammar_constraint.h"

#include <algorithm>
#include <chrono>

#include "core/logging.h"

namespace mxserve::structured {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index,
                                     int64_t max_tokens)
    : index_(std::move(index)), matcher_(std::move(grammar)) {
  if (max_tokens > 0 && matcher_.grammar().close_within_budget) budget_ = max_tokens;
}

bool GrammarConstraint::accept(int32_t token) {
  const std::string* b = index_->bytes(token);
  if (b == nullptr || !matcher_.accept(*b)) return false;
  ++accepted_;
  if (committed_) {
    if (closing_.compare(0, b->size(), *b) == 0) closing_.erase(0, b->size());
    else committed_ = false, closing_.clear();  // off the committed path (not from our mask): recompute
  }
  return true;
}

int64_t GrammarConstraint::token_cost(const TokenIndex& index, std::string_view text) {
  constexpr int64_t kNone = int64_t{1} << 40;
  std::vector<int64_t> cost(text.size() + 1, kNone);
  cost[text.size()] = 0;
  for (size_t i = text.size(); i-- > 0;) {
    int32_t node = 0;  // the trie root
    for (size_t j = i; j < text.size(); ++j) {
      const TokenIndex::TrieNode& tn = index.node(node);
      int32_t child = -1;
      for (int32_t e = tn.first_edge; e < tn.first_edge + tn.n_edges; ++e)
        if (index.edge_byte(e) == static_cast<uint8_t>(text[j])) child = index.edge_child(e);
      if (child < 0) break;
      node = child;
      if (index.node(node).n_tokens > 0) cost[i] = std::min(cost[i], 1 + cost[j + 1]);
    }
  }
  return cost[0] >= kNone ? -1 : cost[0];
}

bool GrammarConstraint::maybe_commit() {
  if (budget_ <= 0) return false;
  if (committed_) return true;
  const int64_t left = budget_ - accepted_;
  // Token cost <= byte cost: no completion needs work while the bytes fit with the reserve to spare.
  const std::optional<int64_t> bytes = matcher_.min_finish_bytes();
  if (!bytes || *bytes + kReserveTokens < left) return false;
  std::optional<std::string> s = matcher_.shortest_completion();
  if (!s) return false;
  const int64_t tokens = token_cost(*index_, *s);
  if (tokens < 0 || tokens + kReserveTokens < left) return false;
  committed_ = true;
  closing_ = std::move(*s);
  return true;
}

// Tokens spelling a prefix of closing_ whose remainder still fits in the budget.
void GrammarConstraint::fill_closing(std::span<uint32_t> mask) {
  std::fill(mask.begin(), mask.end(), 0u);
  const int64_t left = budget_ - accepted_;
  const int64_t limit = static_cast<int64_t>(mask.size()) * 32;
  int32_t node = 0;
  for (size_t j = 0; j < closing_.size(); ++j) {
    const TokenIndex::TrieNode& tn = index_->node(node);
    int32_t child = -1;
    for (int32_t e = tn.first_edge; e < tn.first_edge + tn.n_edges; ++e)
      if (index_->edge_byte(e) == static_cast<uint8_t>(closing_[j])) child = index_->edge_child(e);
    if (child < 0) return;
    node = child;
    const TokenIndex::TrieNode& cn = index_->node(node);
    if (cn.n_tokens == 0) continue;
    const int64_t rest = token_cost(*index_, std::string_view(closing_).substr(j + 1));
    // Past the budget the shortest path still wins: the request is cut there anyway.
    if (rest >= 0 && (rest <= left - 1 || rest == token_cost(*index_, closing_) - 1))
      for (int32_t t = cn.first_token; t < cn.first_token + cn.n_tokens; ++t) {
        const int32_t id = index_->token_id(t);
        if (id < limit) mask[id >> 5] |= 1u << (id & 31);
      }
  }
}

std::unique_ptr<runtime::LogitConstraint> GrammarConstraint::clone() const {
  auto c = std::make_unique<GrammarConstraint>(*this);
  return c;
}

void GrammarConstraint::fill_allowed(std::span<uint32_t> mask) {
  if (maybe_commit()) return fill_closing(mask);
  std::fill(mask.begin(), mask.end(), 0u);
  if (levels_.size() < index_->max_token_bytes() + 2) levels_.resize(index_->max_token_bytes() + 2);
  levels_[0] = matcher_.tops();
  const int u = matcher_.string_mode(levels_[0]);
  if (u >= 0) {  // inside a free string: every plain token, whole
    std::span<const uint32_t> plain = index_->plain(u);
    const size_t n = std::min(mask.size(), plain.size());
    for (size_t w = 0; w < n; ++w) mask[w] = plain[w];
  }
  walk(0, 0, u, mask);
}

// Visits the children of trie node `node` reached with levels_[depth] as the state. With u >= 0 the
// plain tokens are already set: only subtrees holding a token that is not plain from u are entered.
void GrammarConstraint::walk(int32_t node, size_t depth, int u, std::span<uint32_t> mask) {
  const TokenIndex::TrieNode& tn = index_->node(node);
  const int64_t limit = static_cast<int64_t>(mask.size()) * 32;
  for (int32_t e = tn.first_edge; e < tn.first_edge + tn.n_edges; ++e) {
    const int32_t child = index_->edge_child(e);
    const TokenIndex::TrieNode& cn = index_->node(child);
    if (u >= 0 && !((cn.nonplain >> u) & 1)) continue;
    const size_t mark = matcher_.mark();
    std::vector<int32_t>& next = levels_[depth + 1];
    matcher_.advance(levels_[depth], index_->edge_byte(e), &next);
    if (!next.empty()) {
      for (int32_t t = cn.first_token; t < cn.first_token + cn.n_tokens; ++t) {
        const int32_t id = index_->token_id(t);
        if (id < limit) mask[id >> 5] |= 1u << (id & 31);
      }
      if (cn.n_edges > 0) walk(child, depth + 1, u, mask);
    }
    matcher_.release(mark);
  }
}

std::shared_ptr<const TokenIndex> StructuredOutputs::index() {
  std::call_once(once_, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    index_ = TokenIndex::from_tokenizer(tok_, vocab_size_);
    MX_LOG(kInfo) << "structured output: token index of " << index_->n_tokens() << " tokens, "
                  << index_->n_trie_nodes() << " trie nodes, built in "
                  << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  });
  return index_;
}

std::shared_ptr<runtime::LogitConstraint> StructuredOutputs::make(std::shared_ptr<const Grammar> grammar,
                                                                  int64_t max_tokens) {
  return std::make_shared<GrammarConstraint>(std::move(grammar), index(), max_tokens);
}

}  // namespace mxserve::structured
