// Handlers of POST /v1/chat/completions and POST /v1/completions: body -> typed request -> prompt
// tokens (chat template + tokenizer, on the HTTP thread) -> GenerationSession -> one JSON response or an
// SSE stream. Every failure is an ApiError written as an OpenAI error object.
#pragma once

#include <httplib.h>

#include "server/api_error.h"
#include "server/server_context.h"

namespace mxserve::server {

void handle_chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);

// Writes an OpenAI error object (and Retry-After for 503) into res.
void write_error(ServerContext& ctx, const ApiError& e, httplib::Response& res);

}  // namespace mxserve::server
