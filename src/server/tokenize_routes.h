// vLLM's tokenizer endpoints. POST /tokenize: {model?, prompt, add_special_tokens? (true)} or {model?, messages,
// add_generation_prompt? (true), add_special_tokens? (false), tools?, chat_template_kwargs?, return_token_strs?}
// -> {count, max_model_len, tokens, token_strs}; the messages form renders the chat template exactly as
// /v1/chat/completions does, so `count` is that request's prompt_tokens. POST /detokenize: {model?, tokens} ->
// {prompt}. Like vLLM they sit outside /v1 (no API key). Errors use the OpenAI error shape.
#pragma once

#include "server/http/message.h"
#include "server/server_context.h"

namespace mxserve::server {

void handle_tokenize(ServerContext& ctx, const http::Request& req, http::Response& res);
void handle_detokenize(ServerContext& ctx, const http::Request& req, http::Response& res);

}  // namespace mxserve::server
