// GrammarConstraint: runtime::LogitConstraint over a Grammar -- a Matcher (the request's state) plus the
// shared TokenIndex. fill_allowed() walks the token trie from the current state, pruning a subtree at
// the first byte no stack accepts; inside a free JSON string (or raw text) the tokens made of plain bytes are
// taken whole from a precomputed bitset and only the rest of the trie is walked.
// Also the structured-output front door: StructuredOutputs builds the TokenIndex once per model and
// makes a constraint per request choice.
#pragma once

#include <memory>
#include <mutex>

#include "runtime/logit_constraint.h"
#include "structured/grammar.h"
#include "structured/matcher.h"
#include "structured/token_index.h"

namespace mxserve::structured {

class GrammarConstraint final : public runtime::LogitConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenIndex> index);
  void fill_allowed(std::span<uint32_t> mask) override;
  bool complete() override { return matcher_.can_end(); }
  bool accept(int32_t token) override;
  std::unique_ptr<runtime::LogitConstraint> clone() const override;
  Matcher& matcher() { return matcher_; }

 private:
  void walk(int32_t node, size_t depth, int u, std::span<uint32_t> mask);

  std::shared_ptr<const TokenIndex> index_;
  Matcher matcher_;
  std::vector<std::vector<int32_t>> levels_;  // [depth] stacks after the first depth bytes of the walk
};

// Per model: the token index (built on first use; ~0.3 s at a 150k vocabulary) and constraint factory.
class StructuredOutputs {
 public:
  StructuredOutputs(const tokenizer::Tokenizer& tok, int64_t vocab_size) : tok_(tok), vocab_size_(vocab_size) {}
  std::shared_ptr<const TokenIndex> index();
  std::shared_ptr<runtime::LogitConstraint> make(std::shared_ptr<const Grammar> grammar);

 private:
  const tokenizer::Tokenizer& tok_;
  int64_t vocab_size_;
  std::once_flag once_;
  std::shared_ptr<const TokenIndex> index_;
};

}  // namespace mxserve::structured
