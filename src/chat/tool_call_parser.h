// ToolCallParser: finds GLM tool calls in the content stream (after reasoning was split off).
//   glm45 (GLM-4.5/4.6): <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>
//   glm47 (GLM-4.7/5.x): the same without the newlines.
// Both formats accept either layout (whitespace between the elements is ignored), so the two differ only in
// the layout a forced call's grammar enforces (server/chat_output.cpp). A call is emitted whole, once its
// </tool_call> has arrived and it parsed: NAME is a valid function name (one of the request's tools when
// it has any), and the body is a sequence of <arg_key>/<arg_value> pairs. Values are converted by the tool's schema
// (ToolSet::convert); `arguments` is a JSON object text built by concatenation in the model's order.
// A closed call that does not parse -- a body that is not pairs, an unknown name -- is malformed: its raw
// text goes to content, verbatim, and is counted. A call still open when the turn ends (cut by max_tokens
// or a stop string) is dropped whole and counted as truncated: neither a half call nor its markup is
// returned (issue 34); the text before it stays content. Invariant: the result does not depend on how the
// text is chunked.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_set.h"

namespace mxserve::chat {

enum class ToolCallFormat { kNone, kGlm45, kGlm47 };

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ToolCallDelta {
  std::string content;
  std::vector<ToolCall> calls;
  int malformed = 0;  // malformed tool-call texts returned as content in this delta
  int truncated = 0;  // calls the turn never closed (dropped)
};

class ToolCallParser {
 public:
  // tools: the request's functions; empty = accept any valid name (arguments then parsed as JSON when
  // they parse, kept as strings otherwise). Both formats parse alike, so the format is not a parameter.
  explicit ToolCallParser(std::shared_ptr<const ToolSet> tools);
  ToolCallDelta feed(std::string_view content_chunk);
  ToolCallDelta finish();

 private:
  enum class State { kText, kCall };
  bool parse_call(std::string_view body, ToolCall* call) const;

  std::shared_ptr<const ToolSet> tools_;
  State state_ = State::kText;
  std::string pending_;  // kText: a possible partial "<tool_call>"; kCall: the raw call so far, tag included
};

}  // namespace mxserve::chat
