// Normalizers from tokenizer.json: NFC/NFD/NFKC/NFKD (ICU), Lowercase, Strip, Replace, Prepend,
// Sequence. Owns text rewriting before pre-tokenization. Does not track offsets (mxserve never
// returns offsets). Invariant: input and output are valid UTF-8.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status normalize(std::string& text) const = 0;
  // Builds from the "normalizer" JSON object; null JSON gives nullptr (identity).
  static Result<std::unique_ptr<Normalizer>> from_json(const nlohmann::json& j);
};

}  // namespace mxserve::tokenizer
