// Decoders from tokenizer.json: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
// BPEDecoder, Sequence. Owns turning token strings (tokenizer.json representation) back into
// text. The result of a chain is raw bytes; Tokenizer::decode makes it valid UTF-8 (U+FFFD).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mxserve::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token list in place (HF decode_chain).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  static Result<std::unique_ptr<Decoder>> from_json(const nlohmann::json& j);
};

}  // namespace mxserve::tokenizer
