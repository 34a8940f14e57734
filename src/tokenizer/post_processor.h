// Post-processors from tokenizer.json: TemplateProcessing, ByteLevel (ids unchanged),
// BertProcessing, RobertaProcessing, Sequence. Owns adding special tokens around one sequence
// when encode(..., add_special_tokens=true). Pairs are not supported (mxserve encodes one text).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
  static Result<std::unique_ptr<PostProcessor>> from_json(const nlohmann::json& j);
};

}  // namespace mxserve::tokenizer
