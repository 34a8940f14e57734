// ToolChoice: the request's `tool_choice`, validated against its tools, and what it changes.
//   auto (default with tools): tools rendered, calls parsed.
//   none: vLLM's behaviour -- tools are still rendered into the prompt, the output is not parsed for calls
//         (any tool-call text stays content).
//   required / {"type":"function","function":{"name":N}}: the output is constrained by a tool-call grammar
//         (structured/tool_call_grammar.h, built by server/chat_output): one or more calls of the request's
//         tools (exactly one call of N for a named function), arguments valid for the tool's schema, an
//         optional reasoning block first when the rendered prompt leaves thinking on, nothing after.
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

}  // namespace mxserve::chat
