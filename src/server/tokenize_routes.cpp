#include "server/tokenize_routes.h"

#include <limits>

#include "server/completion_handlers.h"
#include "server/json_util.h"
#include "server/request_schema.h"

namespace mxserve::server {
namespace {

using OJ = nlohmann::ordered_json;

std::optional<ApiError> check_ready_and_model(ServerContext& ctx, const OJ& body) {
  if (!ctx.ready) return overloaded("the model is still loading; retry when GET /health returns 200");
  if (!body.is_object()) return bad_request("the request body must be a JSON object, got " + json_type_name(body));
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad_request("'model' must be a string, got " + json_type_name(*it), "model");
    if (it->get<std::string>() != ctx.options.served_model_name) return model_not_found(it->get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> get_bool(const OJ& body, const char* name, bool* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad_request(std::string("'") + name + "' must be a boolean, got " + json_type_name(*it), name);
  *out = it->get<bool>();
  return std::nullopt;
}

}  // namespace

void handle_tokenize(ServerContext& ctx, const http::Request& req, http::Response& res) {
  std::string perr;
  auto body = parse_body(req.body, ctx.options.max_json_depth, &perr);
  if (!body) return write_error(ctx, bad_request(perr), res);
  if (auto e = check_ready_and_model(ctx, *body)) return write_error(ctx, *e, res);
  const bool has_prompt = body->contains("prompt") && !(*body)["prompt"].is_null();
  const bool has_messages = body->contains("messages") && !(*body)["messages"].is_null();
  if (has_prompt == has_messages)
    return write_error(ctx, bad_request("give exactly one of 'prompt' (a string) or 'messages' (a chat)", "prompt"), res);
  bool return_strs = false;
  if (auto e = get_bool(*body, "return_token_strs", &return_strs)) return write_error(ctx, *e, res);
  const tokenizer::Tokenizer& tok = *ctx.model.tokenizer;
  std::string text;
  bool add_special = has_prompt;  // vLLM: true for a prompt, false for messages (the template adds them)
  if (auto e = get_bool(*body, "add_special_tokens", &add_special)) return write_error(ctx, *e, res);
  if (has_prompt) {
    const OJ& p = (*body)["prompt"];
    if (!p.is_string()) return write_error(ctx, bad_request("'prompt' must be a string, got " + json_type_name(p), "prompt"), res);
    text = p.get<std::string>();
  } else {
    if (!ctx.model.chat_template)
      return write_error(ctx, bad_request("this model has no chat template (tokenizer_config.json); send 'prompt'", "messages"),
                         res);
    // The chat request's own parser: the same message checks, tools, add_generation_prompt and
    // chat_template_kwargs as /v1/chat/completions (its other fields are not used here).
    ChatRequest chat;
    if (auto e = parse_chat_request(*body, &chat)) return write_error(ctx, *e, res);
    map_developer_role(ctx, &chat.inputs);
    auto rendered = ctx.model.chat_template->render_chat(chat.inputs, tok.config());
    if (!rendered.is_ok())
      return write_error(ctx, bad_request("the chat template rejected these messages: " + rendered.status().message(), "messages"),
                         res);
    text = std::move(*rendered);
  }
  auto ids = tok.encode(text, add_special);
  if (!ids.is_ok()) return write_error(ctx, from_status(ids.status(), has_prompt ? "prompt" : "messages"), res);
  OJ j;
  j["count"] = ids->size();
  j["max_model_len"] = ctx.model.max_model_len;
  j["tokens"] = *ids;
  if (return_strs) {
    OJ strs = OJ::array();
    for (int32_t id : *ids) {
      const int32_t one[1] = {id};
      strs.push_back(tok.decode(std::span<const int32_t>(one, 1), false));
    }
    j["token_strs"] = std::move(strs);
  } else {
    j["token_strs"] = nullptr;
  }
  res.set_content(dump_json(j), "application/json");
}

void handle_detokenize(ServerContext& ctx, const http::Request& req, http::Response& res) {
  std::string perr;
  auto body = parse_body(req.body, ctx.options.max_json_depth, &perr);
  if (!body) return write_error(ctx, bad_request(perr), res);
  if (auto e = check_ready_and_model(ctx, *body)) return write_error(ctx, *e, res);
  auto it = body->find("tokens");
  if (it == body->end() || !it->is_array())
    return write_error(ctx, bad_request("'tokens' must be a list of token ids", "tokens"), res);
  const int64_t vocab = ctx.model.tokenizer->vocab_size();
  std::vector<int32_t> ids;
  ids.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const OJ& x = (*it)[i];
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
      return write_error(ctx,
                         bad_request("'tokens[" + std::to_string(i) + "]' = " + dump_json(x).substr(0, 32) +
                                         " is not a token id in [0, " + std::to_string(vocab) + ")",
                                     "tokens"),
                         res);
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  OJ j;
  j["prompt"] = ctx.model.tokenizer->decode(ids, /*skip_special_tokens=*/false);
  res.set_content(dump_json(j), "application/json");
}

}  // namespace mxserve::server
