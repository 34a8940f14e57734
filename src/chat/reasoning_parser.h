// ReasoningParser: splits a model's output stream into reasoning (inside <think>...</think>) and content,
// GLM-style (sglang/vLLM name "glm45", used by GLM-4.5 ... GLM-5.x): one think block, at the start of the
// turn. Invariants: the split does not depend on how the text is chunked (a partial tag is held back until
// it is decided); tag text never reaches either output; a turn cut inside <think> (length) keeps its
// reasoning. The turn may start already inside the block: GLM-4.7/5.x templates end the generation prompt
// with "<think>" (see prompt_opens_reasoning).
#pragma once

#include <string>
#include <string_view>

namespace mxserve::chat {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning);
  ReasoningDelta feed(std::string_view chunk);
  ReasoningDelta finish();  // flushes what is held back; call once at the end of the turn

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  std::string pending_;  // text not yet assigned: a possible partial tag (or leading whitespace at kStart)
};

// True when the rendered prompt leaves the assistant turn inside an open think block (it ends with
// "<think>", ignoring trailing whitespace): the model's first tokens are reasoning.
bool prompt_opens_reasoning(std::string_view prompt);

}  // namespace mxserve::chat
