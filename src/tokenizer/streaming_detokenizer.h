// StreamingDetokenizer: per-request incremental decoding of generated ids into text.
// Owns: the ids of one request, a small decode window, and text held back because it may begin
// a stop string. push(id) returns only newly complete UTF-8 text; text is never emitted and then
// retracted: an incomplete UTF-8 sequence waits for its next bytes, and any tail that is a
// prefix of a stop string waits until it is ruled out (then emitted) or completed (generation
// stops, and neither the stop string nor anything after it is emitted).
// Works with any decoder chain: it diffs decode(window) against decode(window minus new ids).
// Not thread-safe (one per request); the Tokenizer it references must outlive it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace mxserve::tokenizer {

class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, std::vector<std::string> stop_strings = {},
                       bool skip_special_tokens = true);

  // Feeds one generated id; returns the text that became final (possibly empty).
  std::string push(int32_t id);
  // End of generation: returns everything still held (incomplete UTF-8 becomes U+FFFD).
  std::string finish();

  bool stopped() const { return matched_stop_.has_value(); }
  const std::optional<std::string>& matched_stop() const { return matched_stop_; }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::string release(bool final);

  const Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // window start (context for decoders that look at neighbours)
  size_t read_offset_ = 0;    // ids before this are already reflected in emitted/pending text
  std::string pending_;       // decoded text not yet emitted (stop-string candidates)
  std::optional<std::string> matched_stop_;
};

}  // namespace mxserve::tokenizer
