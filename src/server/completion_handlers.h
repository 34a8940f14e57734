// Handlers of POST /v1/chat/completions and POST /v1/completions: body -> typed request -> prompt
// tokens (chat template + tokenizer, on the HTTP thread) -> GenerationSession -> one JSON response or an
// SSE stream (written by the handler's own thread through res.stream(); a client that leaves aborts
// the generation at once). Every failure is an ApiError written as an OpenAI error object.
#pragma once

#include "server/api_error.h"
#include "server/http/message.h"
#include "server/server_context.h"

namespace mxserve::server {

void handle_chat_completions(ServerContext& ctx, const http::Request& req, http::Response& res);
void handle_completions(ServerContext& ctx, const http::Request& req, http::Response& res);

// OpenAI's `developer` role replaces `system` for newer models; a template that does not name it would drop
// such a message silently, so it becomes a system turn there (a template that knows the role gets it as is).
void map_developer_role(const ServerContext& ctx, tokenizer::ChatInputs* in);

// Writes an OpenAI error object (and Retry-After for 503) into res.
void write_error(ServerContext& ctx, const ApiError& e, http::Response& res);

}  // namespace mxserve::server
