// The Anthropic Messages request (POST /v1/messages) -> the internal chat request. An untrusted body is
// checked against Anthropic's schema (max_tokens required, roles user / assistant, the content block types,
// tools with input_schema, tool_choice auto / any / tool / none, thinking) and translated into the OpenAI
// chat body the rest of the server already understands (system blocks -> a system message, tool_result
// blocks -> tool messages, tool_use -> assistant tool_calls, thinking -> reasoning_content), which then goes
// through the same parse_chat_request / plan_chat_output as /v1/chat/completions: one chat pipeline, one
// set of templates and parsers. Invariant: every error names the Anthropic field (messages[1].content[0],
// tools[0].input_schema), never the OpenAI one it was translated to.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/json_util.h"
#include "server/request_schema.h"

namespace mxserve::server {

struct AnthropicRequest {
  ChatRequest chat;         // gen (sampling, stop, stream, max_tokens) and the template inputs
  OrderedJson openai_body;  // the translated body (tools / tool_choice / parallel_tool_calls for plan_chat_output)
};

// Anthropic body -> OpenAI chat body. Unknown top-level fields are appended to *ignored (logged once by the
// handler); metadata and the other fields mxserve accepts without acting on are not.
std::optional<ApiError> translate_anthropic_request(const OrderedJson& body, OrderedJson* openai_body,
                                                    std::vector<std::string>* ignored);

// translate_anthropic_request + parse_chat_request; errors name Anthropic fields.
std::optional<ApiError> parse_anthropic_request(const OrderedJson& body, AnthropicRequest* out);

// Rewrites OpenAI field names in an error from the shared chat code into their Anthropic spelling
// (tools[i].function.parameters -> tools[i].input_schema, tool_choice.function.name -> tool_choice.name).
ApiError anthropic_field_names(ApiError e);

}  // namespace mxserve::server
