// Pre-tokenizers from tokenizer.json: Split (regex or literal; Removed / Isolated /
// MergedWithPrevious / MergedWithNext / Contiguous; invert), ByteLevel, Digits, Metaspace,
// Whitespace, WhitespaceSplit, Punctuation, Sequence.
// Owns: cutting normalized text into the words the BPE model sees. Pieces are string_views into
// the caller's text or into `arena` (for rewritten pieces); deque storage keeps them stable.
// Invariant: pieces never overlap and never contain empty strings.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

struct PreTokenizeContext {
  std::deque<std::string>* arena;
  bool first_section;  // the text is the first section of the input (Metaspace prepend "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` with their sub-pieces.
  virtual Status apply(std::vector<std::string_view>& pieces, const PreTokenizeContext& ctx) const = 0;
  // True when this step (or the last step of a Sequence) maps text to the GPT-2 byte alphabet.
  virtual bool ends_with_byte_level() const { return false; }
  // True when a ByteLevel step appears anywhere but last (unsupported combination).
  virtual bool has_inner_byte_level() const { return false; }

  static Result<std::unique_ptr<PreTokenizer>> from_json(const nlohmann::json& j);
};

}  // namespace mxserve::tokenizer
