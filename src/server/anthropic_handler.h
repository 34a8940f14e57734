// Handlers of POST /v1/messages (the Anthropic Messages API) and POST /v1/messages/count_tokens: body ->
// AnthropicRequest (anthropic_request.h) -> the chat pipeline of /v1/chat/completions (plan_chat_output,
// the model's chat template, apply_prompt, the tokenizer, GenerationSession, ChoiceOutput) -> one message
// object or its SSE event stream (anthropic_format.h). Every failure is written in Anthropic's error shape.
#pragma once

#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/http/message.h"
#include "server/server_context.h"

namespace mxserve::server {

void handle_messages(ServerContext& ctx, const http::Request& req, http::Response& res);
void handle_count_tokens(ServerContext& ctx, const http::Request& req, http::Response& res);

// Writes {"type":"error","error":{...}} with Anthropic's status for e (and Retry-After when e has one).
void write_anthropic_error(const ApiError& e, http::Response& res);

// Anthropic clients send the key as `x-api-key: KEY`: the value (as received, trailing whitespace kept)
// must equal the key byte for byte, compared in constant time. raw_value: nullptr when absent.
bool x_api_key_matches(const std::string* raw_value, std::string_view key);
// The 401 of the Anthropic routes (names both accepted headers).
ApiError anthropic_unauthorized();

}  // namespace mxserve::server
