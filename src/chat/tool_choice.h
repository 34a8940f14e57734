// ToolChoice: the request's `tool_choice`, validated against its tools, and what it changes.
//   auto (default with tools): tools rendered, calls parsed.
//   none: vLLM's behaviour -- tools are still rendered into the prompt, the output is not parsed for calls
//         (any tool-call text stays content).
//   required / {"type":"function","function":{"name":N}}: the assistant turn is pre-filled with the start of a
//         call ("<tool_call>" or "<tool_call>N"), so the model continues a call instead of choosing whether
//         to make one. Thinking is off for such turns (the pre-fill follows a closed think block). This is a
//         prompt constraint, not a grammar: the model may still write a malformed call, which comes back as
//         content (and is counted), never as an invented call.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/tool_call_parser.h"
#include "chat/tool_set.h"

namespace mxserve::chat {

enum class ToolChoiceMode { kAuto, kNone, kRequired, kFunction };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string function;  // kFunction: the function the call must use
  bool forces_call() const { return mode == ToolChoiceMode::kRequired || mode == ToolChoiceMode::kFunction; }
};

// Parses `tool_choice` (null/absent = auto). Errors name the field: "tool_choice" or
// "tool_choice.function.name" (a function the request's tools do not define).
std::optional<FieldError> parse_tool_choice(const nlohmann::ordered_json* value, const ToolSet& tools, ToolChoice* out);

// The text appended after the generation prompt (rendered with thinking off) to force a call; empty
// unless choice.forces_call(). The layout follows what each template renders after a closed think block.
std::string tool_call_prefill(ToolCallFormat format, const ToolChoice& choice);

}  // namespace mxserve::chat
