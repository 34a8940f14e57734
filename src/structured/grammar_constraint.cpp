// GrammarConstraint (grammar_constraint.h): the token-mask walk and the per-token advance.
#include "structured/grammar_constraint.h"

#include <algorithm>
#include <chrono>

#include "core/logging.h"

namespace mxserve::structured {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index)
    : index_(std::move(index)), matcher_(std::move(grammar)) {}

bool GrammarConstraint::accept(int32_t token) {
  const std::string* b = index_->bytes(token);
  return b != nullptr && matcher_.accept(*b);
}

std::unique_ptr<runtime::LogitConstraint> GrammarConstraint::clone() const {
  auto c = std::make_unique<GrammarConstraint>(*this);
  return c;
}

void GrammarConstraint::fill_allowed(std::span<uint32_t> mask) {
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

std::shared_ptr<runtime::LogitConstraint> StructuredOutputs::make(std::shared_ptr<const Grammar> grammar) {
  return std::make_shared<GrammarConstraint>(std::move(grammar), index());
}

}  // namespace mxserve::structured
