// GrammarConstraint: runtime::LogitConstraint over a Grammar -- a Matcher (the request's state) plus the
// shared TokenIndex. fill_allowed() walks the token trie from the current state, pruning a subtree at
// the first byte no stack accepts; inside a free JSON string (or raw text) the tokens made of plain bytes are
// taken whole from a precomputed bitset and only the rest of the trie is walked.
// Also the structured-output front door: StructuredOutputs builds the TokenIndex once per model and
// makes a constraint per request choice.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "runtime/logit_constraint.h"
#include "structured/grammar.h"
#include "structured/matcher.h"
#include "structured/token_index.h"

namespace mxserve::structured {

// Budget closing (grammars with close_within_budget: tool calls): with max_tokens known, once the
// tokens left reach the token cost of the shortest completion plus kReserveTokens, the constraint commits
// to that completion and allows only tokens that spell a prefix of it whose remainder still fits, so the
// output always completes within max_tokens when it can at all.
class GrammarConstraint final : public runtime::LogitConstraint {
 public:
  static constexpr int64_t kReserveTokens = 8;
  // max_tokens: the request's output budget; <= 0 or a grammar without close_within_budget: no closing.
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index,
                    int64_t max_tokens = 0);
  void fill_allowed(std::span<uint32_t> mask) override;
  bool complete() override { return matcher_.can_end(); }
  bool accept(int32_t token) override;
  std::unique_ptr<runtime::LogitConstraint> clone() const override;
  Matcher& matcher() { return matcher_; }
  bool closing() const { return committed_; }
  // The fewest tokens that spell `text` (tokens whose bytes are consecutive pieces of it); -1 if none.
  static int64_t token_cost(const TokenIndex& index, std::string_view text);

 private:
  void walk(int32_t node, size_t depth, int u, std::span<uint32_t> mask);
  bool maybe_commit();               // true when committed (now or before)
  void fill_closing(std::span<uint32_t> mask);

  int64_t budget_ = 0;      // max_tokens when closing applies, else 0
  int64_t accepted_ = 0;    // tokens accepted so far
  bool committed_ = false;
  std::string closing_;     // committed: the rest of the completion still to write

  std::shared_ptr<const TokenIndex> index_;
  Matcher matcher_;
  std::vector<std::vector<int32_t>> levels_;  // [depth] stacks after the first depth bytes of the walk
};

// Per model: the token index (built on first use; ~0.3 s at a 150k vocabulary) and constraint factory.
class StructuredOutputs {
 public:
  StructuredOutputs(const tokenizer::Tokenizer& tok, int64_t vocab_size) : tok_(tok), vocab_size_(vocab_size) {}
  std::shared_ptr<const TokenIndex> index();
  // max_tokens: the output budget (budget closing, GrammarConstraint); 0: none.
  std::shared_ptr<runtime::LogitConstraint> make(std::shared_ptr<const Grammar> grammar, int64_t max_tokens = 0);

 private:
  const tokenizer::Tokenizer& tok_;
  int64_t vocab_size_;
  std::once_flag once_;
  std::shared_ptr<const TokenIndex> index_;
};

}  // namespace mxserve::structured
