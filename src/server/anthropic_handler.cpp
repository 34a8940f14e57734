#include "server/anthropic_handler.h"

#include <chrono>
#include <mutex>
#include <set>

#include "core/logging.h"
#include "server/anthropic_format.h"
#include "server/anthropic_request.h"
#include "server/api_key.h"
#include "server/chat_output.h"
#include "server/generation_session.h"
#include "server/log_text.h"

namespace mxserve::server {
namespace {

using OJ = nlohmann::ordered_json;
constexpr auto kPollInterval = std::chrono::milliseconds(100);  // an idle stream re-checks its socket this often
constexpr auto kPingInterval = std::chrono::seconds(10);         // a ping event when nothing else was sent

// Each ignored field name logged once per process (bounded, as the OpenAI handlers do).
void log_ignored_fields(const std::vector<std::string>& names) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& n : names) {
    if (seen.size() >= 256 || !seen.insert(n).second) continue;
    MX_LOG(kWarn) << "/v1/messages field '" << sanitize_for_log(n, 64) << "' is not used by mxserve and was ignored";
  }
}

// A request ready to run: the gen options, the parse plan and the prompt tokens.
struct Prepared {
  GenerationOptions gen;
  ChatOutputPlan plan;
  std::vector<int32_t> prompt;
};

std::optional<ApiError> prepare(ServerContext& ctx, const http::Request& req, bool count_only, Prepared* p) {
  if (ctx.draining) return overloaded("the server is shutting down");
  if (!ctx.ready) return overloaded("the model is still loading; retry when GET /health returns 200");
  std::string perr;
  auto body = parse_body(req.body, ctx.options.max_json_depth, &perr);
  if (!body) return bad_request(perr);
  OJ patched;
  if (count_only && body->is_object() && !body->contains("max_tokens")) {  // count_tokens takes no max_tokens
    patched = *body;
    patched["max_tokens"] = 1;
    body = std::move(patched);
  }
  AnthropicRequest a;
  if (auto e = parse_anthropic_request(*body, &a)) return e;
  log_ignored_fields(a.chat.gen.ignored_fields);
  if (!a.chat.gen.model.empty() && a.chat.gen.model != ctx.options.served_model_name)
    return model_not_found(a.chat.gen.model);
  if (!ctx.model.chat_template)
    return bad_request("this model has no chat template (tokenizer_config.json); use /v1/completions", "messages");
  if (auto e = plan_chat_output(ctx.model.output_formats, a.openai_body, &a.chat.inputs, &p->plan))
    return anthropic_field_names(std::move(*e));
  auto text = ctx.model.chat_template->render_chat(a.chat.inputs, ctx.model.tokenizer->config());
  if (!text.is_ok()) return bad_request("the chat template rejected these messages: " + text.status().message(), "messages");
  if (auto e = apply_prompt(&p->plan, *text, &a.chat.gen)) return anthropic_field_names(std::move(*e));
  auto ids = ctx.model.tokenizer->encode(*text, /*add_special_tokens=*/false);
  if (!ids.is_ok()) return from_status(ids.status(), "messages");
  if (ids->empty()) return bad_request("the rendered prompt is empty", "messages");
  p->prompt = std::move(*ids);
  p->gen = std::move(a.chat.gen);
  if (count_only) return std::nullopt;
  const int64_t limit = ctx.model.max_model_len, n = static_cast<int64_t>(p->prompt.size());
  if (n + *p->gen.max_tokens > limit) return context_length_exceeded(limit, n, *p->gen.max_tokens, "max_tokens");
  return std::nullopt;
}

// A generation that ended with no finish reason was aborted by the server (shutdown), not by the model.
ApiError aborted_error(const ServerContext& ctx) {
  return ctx.stopping ? overloaded("the server is shutting down; the generation was aborted")
                      : internal("the generation ended without a finish reason");
}

bool write_sse(http::StreamWriter& sink, const OJ& event, std::chrono::steady_clock::time_point* last) {
  const std::string s = sse_event(event);
  *last = std::chrono::steady_clock::now();
  return sink.write(s.data(), s.size());
}

void stream(ServerContext& ctx, Prepared& p, GenerationSession& session, const std::string& id, http::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  http::StreamWriter& sink = res.stream("text/event-stream");
  auto last = std::chrono::steady_clock::now();
  const std::string& model = ctx.options.served_model_name;
  bool ok = write_sse(sink, message_start_event(id, model, session.usage()), &last) &&
            write_sse(sink, OJ{{"type", "ping"}}, &last);
  std::unique_ptr<ChoiceOutput> out;
  if (p.plan.active) out = std::make_unique<ChoiceOutput>(p.plan, &ctx.metrics);
  AnthropicContent content;
  std::vector<ChoiceDelta> deltas;
  while (ok && !res.client_gone()) {
    deltas.clear();
    const bool more = session.poll(&deltas, kPollInterval);
    for (ChoiceDelta& d : deltas) {
      ChoiceOutput::Delta parsed;
      std::string finish = d.finish_reason;
      if (out) {
        parsed = out->feed(d.text);
        if (!finish.empty()) {
          parsed.append(out->finish());
          finish = out->finish_reason(finish);
        }
      } else {
        parsed.content = d.text;
      }
      for (const OJ& e : content.add(parsed)) ok = ok && write_sse(sink, e, &last);
      if (finish.empty()) continue;
      if (finish == "error") {
        ok = ok && write_sse(sink, anthropic_error_json(from_engine_error(d.error)), &last);
      } else {
        for (const OJ& e : content.close()) ok = ok && write_sse(sink, e, &last);
        ok = ok && write_sse(sink, message_delta_event(anthropic_stop(finish, d.stop_str), session.usage()), &last) &&
             write_sse(sink, OJ{{"type", "message_stop"}}, &last);
      }
      if (ok) sink.done();
      return;
    }
    if (!more || session.done()) break;  // aborted without a final delta (the server is stopping)
    if (std::chrono::steady_clock::now() - last > kPingInterval) ok = write_sse(sink, OJ{{"type", "ping"}}, &last);
  }
  if (ok && !res.client_gone()) {
    write_sse(sink, anthropic_error_json(aborted_error(ctx)), &last);
    sink.done();
  }
  // Otherwise the client is gone: the session's destructor aborts the generation.
}

}  // namespace

void write_anthropic_error(const ApiError& e, http::Response& res) {
  res.status = anthropic_status(e);
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(dump_json(anthropic_error_json(e)), "application/json");
}

bool x_api_key_matches(const std::string* raw_value, std::string_view key) {
  return raw_value && !raw_value->empty() && constant_time_equals(*raw_value, key);
}

ApiError anthropic_unauthorized() {
  ApiError e = unauthorized();
  e.message = "Incorrect or missing API key: send it as 'x-api-key: <key>' or 'Authorization: Bearer <key>'.";
  return e;
}

void handle_count_tokens(ServerContext& ctx, const http::Request& req, http::Response& res) {
  Prepared p;
  if (auto e = prepare(ctx, req, /*count_only=*/true, &p)) return write_anthropic_error(*e, res);
  res.status = 200;
  res.set_content(dump_json(OJ{{"input_tokens", static_cast<int64_t>(p.prompt.size())}}), "application/json");
}

void handle_messages(ServerContext& ctx, const http::Request& req, http::Response& res) {
  Prepared p;
  if (auto e = prepare(ctx, req, /*count_only=*/false, &p)) return write_anthropic_error(*e, res);
  GenerationSession session(ctx, p.gen);
  if (auto e = session.submit({ChoiceInput{p.prompt, 0}}, *p.gen.max_tokens)) return write_anthropic_error(*e, res);
  const std::string id = make_message_id();
  if (p.gen.stream) return stream(ctx, p, session, id, res);

  std::string text, finish, stop_str, error;
  std::vector<ChoiceDelta> deltas;
  while (session.poll(&deltas, kPollInterval)) {
    for (ChoiceDelta& d : deltas) {
      text += d.text;
      if (!d.finish_reason.empty()) finish = d.finish_reason;
      if (!d.stop_str.empty()) stop_str = d.stop_str;
      if (!d.error.empty()) error = d.error;
    }
    deltas.clear();
    if (session.done()) break;
    if (res.client_gone()) {
      session.abort_all();
      res.status = 499;  // nobody reads it; counted as a client disconnect
      return;
    }
  }
  if (!error.empty()) return write_anthropic_error(from_engine_error(error), res);
  if (finish.empty()) return write_anthropic_error(aborted_error(ctx), res);
  ChoiceOutput::Delta parsed;
  if (p.plan.active) {  // one chunk through the same parser as streaming
    ChoiceOutput parser(p.plan, &ctx.metrics);
    parsed = parser.feed(text);
    parsed.append(parser.finish());
    finish = parser.finish_reason(finish);
  } else {
    parsed.content = std::move(text);
  }
  AnthropicContent content;
  content.add(parsed);
  res.status = 200;
  res.set_content(dump_json(anthropic_message(id, ctx.options.served_model_name, content.blocks(),
                                              anthropic_stop(finish, stop_str), session.usage())),
                  "application/json");
}

}  // namespace mxserve::server
