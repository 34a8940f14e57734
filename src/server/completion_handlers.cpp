#include "server/completion_handlers.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "core/logging.h"
#include "server/chat_output.h"
#include "server/generation_session.h"
#include "server/log_text.h"
#include "server/openai_format.h"
#include "server/request_schema.h"

namespace mxserve::server {
namespace {

using OJ = nlohmann::ordered_json;
constexpr auto kPollInterval = std::chrono::milliseconds(100);  // an idle stream re-checks its socket this often

// Logs each ignored field name once (bounded, so hostile clients cannot grow the set forever).
void log_ignored_fields(const std::vector<std::string>& names) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& n : names) {
    if (seen.size() >= 256 || seen.count(n)) continue;
    seen.insert(n);  // names arrive cut to kMaxIgnoredFieldName bytes (request_schema)
    MX_LOG(kWarn) << "request field '" << sanitize_for_log(n, 64) << "' is not used by mxserve and was ignored";
  }
}

std::optional<ApiError> check_common(ServerContext& ctx, const GenerationOptions& gen) {
  log_ignored_fields(gen.ignored_fields);
  if (!gen.model.empty() && gen.model != ctx.options.served_model_name) return model_not_found(gen.model);
  const int32_t vocab = ctx.model.tokenizer ? ctx.model.tokenizer->vocab_size() : 0;
  for (const auto& [token, bias] : gen.sampling.logit_bias)
    if (token >= vocab)
      return bad_request("'logit_bias' token id " + std::to_string(token) + " is outside the vocabulary (" +
                             std::to_string(vocab) + " tokens)",
                         "logit_bias");
  return std::nullopt;
}

std::optional<ApiError> check_serving(ServerContext& ctx) {
  if (ctx.draining) return overloaded("the server is shutting down");
  if (!ctx.ready) return overloaded("the model is still loading; retry when GET /health returns 200");
  return std::nullopt;
}

// Every prompt token inside the model's vocabulary, named by the request field that carried it (token-id prompts,
// or a tokenizer whose ids reach past the model's: the engine would refuse them without naming the field).
std::optional<ApiError> check_prompt_vocab(ServerContext& ctx, const std::vector<ChoiceInput>& inputs,
                                           const std::string& param) {
  if (!ctx.model.engine) return std::nullopt;
  const int64_t vocab = ctx.model.engine->vocab_size();
  for (const auto& in : inputs)
    for (size_t i = 0; i < in.prompt.size(); ++i)
      if (in.prompt[i] < 0 || in.prompt[i] >= vocab)
        return bad_request("prompt token " + std::to_string(i) + " = " + std::to_string(in.prompt[i]) +
                               " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")",
                           param);
  return std::nullopt;
}

// Chooses max_tokens and checks every prompt against the context length.
std::optional<ApiError> plan_max_tokens(ServerContext& ctx, const std::vector<ChoiceInput>& inputs,
                                        std::optional<int64_t> requested, const std::string& param, int64_t* out) {
  const int64_t limit = ctx.model.max_model_len;
  int64_t longest = 0;
  for (const auto& in : inputs) longest = std::max<int64_t>(longest, static_cast<int64_t>(in.prompt.size()));
  const int64_t max_tokens = requested ? *requested : std::max<int64_t>(limit - longest, 1);
  if (longest + max_tokens > limit) return context_length_exceeded(limit, longest, max_tokens, param);
  *out = max_tokens;
  return std::nullopt;
}

struct Prepared {
  ApiKind kind;
  GenerationOptions gen;
  std::vector<ChoiceInput> inputs;
  std::string prompt_param;
  std::optional<ChatOutputPlan> output;  // chat: reasoning / tool-call parsing of each choice
};

// Per-request memory bounds on logprobs: top alternatives per token (--max-logprobs), and for a
// non-streaming response, which holds every choice's logprobs until the end, the total entry count.
std::optional<ApiError> check_logprob_bounds(const ServerContext& ctx, const Prepared& p, int64_t max_tokens) {
  const GenerationOptions& g = p.gen;
  if (g.prompt_logprobs > ctx.options.max_logprobs)
    return bad_request("'prompt_logprobs' = " + std::to_string(g.prompt_logprobs) +
                           " is above the server's limit of " + std::to_string(ctx.options.max_logprobs) +
                           " (--max-logprobs)",
                       "prompt_logprobs");
  {  // echo with logprobs / prompt_logprobs: every prompt token's entries are held until the response
    const int prompt_top = std::max(g.prompt_logprobs, g.echo ? g.logprobs : -1);
    int64_t entries = 0;
    for (const auto& in : p.inputs) entries += static_cast<int64_t>(in.prompt.size()) * g.n * (prompt_top + 1);
    if (prompt_top >= 0 && entries > ctx.options.max_logprob_entries)
      return bad_request("prompt tokens x choices x (top alternatives + 1) = " + std::to_string(entries) +
                             " prompt logprob entries is above the server's limit of " +
                             std::to_string(ctx.options.max_logprob_entries) +
                             " (--max-logprob-entries): send shorter or fewer prompts",
                         g.prompt_logprobs >= 0 ? "prompt_logprobs" : "echo");
  }
  if (g.logprobs < 0) return std::nullopt;
  const std::string field = p.kind == ApiKind::kChat ? "top_logprobs" : "logprobs";
  if (g.logprobs > ctx.options.max_logprobs)
    return bad_request("'" + field + "' = " + std::to_string(g.logprobs) + " is above the server's limit of " +
                           std::to_string(ctx.options.max_logprobs) + " (--max-logprobs)",
                       field);
  if (g.stream) return std::nullopt;
  const int64_t choices = static_cast<int64_t>(p.inputs.size()) * g.n;
  const int64_t entries = choices * max_tokens * (g.logprobs + 1);
  if (entries > ctx.options.max_logprob_entries)
    return bad_request("choices (" + std::to_string(choices) + ") x max_tokens (" + std::to_string(max_tokens) + ") x (" +
                           field + " + 1) (" + std::to_string(g.logprobs + 1) + ") = " + std::to_string(entries) +
                           " logprob entries is above the server's limit of " +
                           std::to_string(ctx.options.max_logprob_entries) +
                           " for a non-streaming response (--max-logprob-entries): lower n, max_tokens or " + field +
                           ", or set \"stream\": true",
                       "max_tokens");
  return std::nullopt;
}

void run(ServerContext& ctx, Prepared p, http::Response& res);

}  // namespace

void map_developer_role(const ServerContext& ctx, tokenizer::ChatInputs* in) {
  if (ctx.model.tokenizer->chat_template().find("developer") != std::string::npos) return;
  for (auto& m : in->messages)
    if (m.is_object() && m.contains("role") && m["role"] == "developer") m["role"] = "system";
}

void write_error(ServerContext& ctx, const ApiError& e, http::Response& res) {
  res.status = e.http_status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(e.body(), "application/json");
  (void)ctx;
}

void handle_chat_completions(ServerContext& ctx, const http::Request& req, http::Response& res) {
  if (auto e = check_serving(ctx)) return write_error(ctx, *e, res);
  std::string perr;
  auto body = parse_body(req.body, ctx.options.max_json_depth, &perr);
  if (!body) return write_error(ctx, bad_request(perr), res);
  ChatRequest chat;
  if (auto e = parse_chat_request(*body, &chat)) return write_error(ctx, *e, res);
  if (auto e = check_common(ctx, chat.gen)) return write_error(ctx, *e, res);
  if (!ctx.model.chat_template)
    return write_error(ctx, bad_request("this model has no chat template (tokenizer_config.json); use /v1/completions",
                                        "messages"),
                       res);
  map_developer_role(ctx, &chat.inputs);
  ChatOutputPlan plan;
  if (auto e = plan_chat_output(ctx.model.output_formats, *body, &chat.inputs, &plan)) return write_error(ctx, *e, res);
  auto text = ctx.model.chat_template->render_chat(chat.inputs, ctx.model.tokenizer->config());
  if (!text.is_ok())
    return write_error(ctx, bad_request("the chat template rejected these messages: " + text.status().message(), "messages"),
                       res);
  if (auto e = apply_prompt(&plan, *text, &chat.gen)) return write_error(ctx, *e, res);
  auto ids = ctx.model.tokenizer->encode(*text, /*add_special_tokens=*/false);
  if (!ids.is_ok()) return write_error(ctx, from_status(ids.status(), "messages"), res);
  if (ids->empty()) return write_error(ctx, bad_request("the rendered prompt is empty", "messages"), res);
  Prepared p{ApiKind::kChat, std::move(chat.gen), {}, "messages", std::nullopt};
  p.inputs.push_back(ChoiceInput{std::move(*ids), 0, {}});
  if (plan.active) p.output = std::move(plan);
  run(ctx, std::move(p), res);
}

void handle_completions(ServerContext& ctx, const http::Request& req, http::Response& res) {
  if (auto e = check_serving(ctx)) return write_error(ctx, *e, res);
  std::string perr;
  auto body = parse_body(req.body, ctx.options.max_json_depth, &perr);
  if (!body) return write_error(ctx, bad_request(perr), res);
  CompletionRequest cr;
  if (auto e = parse_completion_request(*body, &cr)) return write_error(ctx, *e, res);
  if (auto e = check_common(ctx, cr.gen)) return write_error(ctx, *e, res);
  Prepared p{ApiKind::kCompletion, std::move(cr.gen), {}, "prompt", std::nullopt};
  for (size_t i = 0; i < cr.prompts.size(); ++i) {
    std::vector<int32_t> ids;
    if (auto* s = std::get_if<std::string>(&cr.prompts[i])) {
      auto enc = ctx.model.tokenizer->encode(*s, /*add_special_tokens=*/true);
      if (!enc.is_ok()) return write_error(ctx, from_status(enc.status(), "prompt"), res);
      ids = std::move(*enc);
    } else {
      ids = std::get<std::vector<int32_t>>(cr.prompts[i]);
    }
    if (ids.empty()) return write_error(ctx, bad_request("the prompt must not be empty", "prompt"), res);
    std::string echo_text;
    if (p.gen.echo) {  // the prompt as given: the string, or the ids' text
      if (auto* s = std::get_if<std::string>(&cr.prompts[i])) echo_text = *s;
      else echo_text = ctx.model.tokenizer->decode(ids, /*skip_special_tokens=*/false);
    }
    p.inputs.push_back(ChoiceInput{std::move(ids), static_cast<int>(i), std::move(echo_text)});
  }
  run(ctx, std::move(p), res);
}

namespace {

struct StreamState {
  ServerContext* ctx = nullptr;
  ResponseMeta meta;
  GenerationOptions gen;
  std::unique_ptr<GenerationSession> session;
  std::vector<bool> first_sent;
  std::vector<size_t> text_offset;
  std::vector<std::unique_ptr<ChoiceOutput>> outputs;  // per choice; empty: no parsing
  bool finished = false;
};

void write_event(http::StreamWriter& sink, const OJ& j, bool* ok) {
  if (!*ok) return;
  const std::string line = "data: " + dump_json(j) + "\n\n";
  *ok = sink.write(line.data(), line.size());
}

// One step of a stream: waits briefly for tokens and writes their chunks.
bool stream_step(StreamState& st, http::StreamWriter& sink) {
  std::vector<ChoiceDelta> deltas;
  const bool more = st.session->poll(&deltas, kPollInterval);
  bool ok = true;
  const auto& tok = *st.ctx->model.tokenizer;
  for (ChoiceDelta& d : deltas) {
    ChoiceOutput::Delta parsed;
    if (!st.outputs.empty()) {
      ChoiceOutput& out = *st.outputs[d.index];
      parsed = out.feed(d.text);
      if (!d.finish_reason.empty()) {
        parsed.append(out.finish());
        d.finish_reason = out.finish_reason(d.finish_reason);
      }
      d.text = parsed.content;
    }
    const bool first = !st.first_sent[d.index];
    if (d.text.empty() && parsed.empty() && d.finish_reason.empty() && !first && d.logprobs.empty()) continue;
    OJ lp = nullptr;
    if (st.gen.logprobs >= 0) lp = logprobs_json(st.meta.kind, d.logprobs, tok, st.text_offset[d.index]);
    st.text_offset[d.index] += d.text.size();
    OJ chunk = stream_chunk(st.meta, d, first && st.meta.kind == ApiKind::kChat, lp);
    ChoiceOutput::add_to_stream_delta(parsed, &chunk["choices"][0]["delta"]);
    if (st.gen.continuous_usage) chunk["usage"] = usage_json(st.session->usage());
    st.first_sent[d.index] = true;
    write_event(sink, chunk, &ok);
    if (d.finish_reason == "error") write_event(sink, from_engine_error(d.error).to_json(), &ok);
  }
  if (!ok) return false;  // client gone: the state's destructor aborts the rest
  if (!more || st.session->done()) {
    if (st.gen.include_usage) write_event(sink, usage_chunk(st.meta, st.session->usage()), &ok);
    const std::string done = "data: [DONE]\n\n";
    if (ok) ok = sink.write(done.data(), done.size());
    st.finished = true;
    if (ok) sink.done();
  }
  return ok;
}

void run(ServerContext& ctx, Prepared p, http::Response& res) {
  int64_t max_tokens = 0;
  if (auto e = plan_max_tokens(ctx, p.inputs, p.gen.max_tokens, p.prompt_param, &max_tokens))
    return write_error(ctx, *e, res);
  if (auto e = check_prompt_vocab(ctx, p.inputs, p.prompt_param)) return write_error(ctx, *e, res);
  if (auto e = check_logprob_bounds(ctx, p, max_tokens)) return write_error(ctx, *e, res);
  auto session = std::make_unique<GenerationSession>(ctx, p.gen);
  if (auto e = session->submit(p.inputs, max_tokens)) return write_error(ctx, *e, res);
  ResponseMeta meta{p.kind, make_response_id(p.kind), static_cast<int64_t>(std::time(nullptr)),
                    ctx.options.served_model_name};

  if (p.gen.stream) {
    auto st = std::make_shared<StreamState>();
    st->ctx = &ctx;
    st->meta = meta;
    st->gen = p.gen;
    st->first_sent.assign(session->num_choices(), false);
    st->text_offset.assign(session->num_choices(), 0);
    if (p.output)
      for (size_t i = 0; i < session->num_choices(); ++i)
        st->outputs.push_back(std::make_unique<ChoiceOutput>(*p.output, &ctx.metrics));
    st->session = std::move(session);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    http::StreamWriter& sink = res.stream("text/event-stream");
    while (!st->finished && !res.client_gone() && stream_step(*st, sink)) {
    }
    return;  // unfinished: the state's session aborts the rest when it goes
  }

  // Non-streaming: collect everything, watching for the client going away.
  const size_t n = session->num_choices();
  std::vector<FinishedChoice> out(n);
  std::vector<std::vector<TokenLogprob>> lps(n);
  std::vector<std::optional<std::vector<runtime::PromptLogprob>>> prompt_lps(n);
  std::string error;
  std::vector<ChoiceDelta> deltas;
  while (session->poll(&deltas, kPollInterval)) {
    for (ChoiceDelta& d : deltas) {
      out[d.index].text += d.text;
      if (!d.finish_reason.empty()) out[d.index].finish_reason = d.finish_reason;
      if (!d.error.empty()) error = d.error;
      for (auto& l : d.logprobs) lps[d.index].push_back(std::move(l));
      if (d.has_prompt_logprobs) prompt_lps[d.index] = std::move(d.prompt_logprobs);
    }
    deltas.clear();
    if (session->done()) break;
    if (res.client_gone()) {
      session->abort_all();
      res.status = 499;  // nobody reads it; counted in the metrics as a client disconnect
      return;
    }
  }
  if (!error.empty()) return write_error(ctx, from_engine_error(error), res);
  for (size_t i = 0; i < n; ++i) {
    out[i].logprobs = p.gen.logprobs >= 0 ? logprobs_json(p.kind, lps[i], *ctx.model.tokenizer, 0) : OJ(nullptr);
    if (p.gen.prompt_logprobs >= 0)
      out[i].prompt_logprobs = prompt_logprobs_json(prompt_lps[i].value_or(std::vector<runtime::PromptLogprob>{}),
                                                    *ctx.model.tokenizer);
    if (p.output) {  // one chunk through the same parser as streaming
      ChoiceOutput parser(*p.output, &ctx.metrics);
      ChoiceOutput::Delta d = parser.feed(out[i].text);
      d.append(parser.finish());
      out[i].finish_reason = parser.finish_reason(out[i].finish_reason);
      out[i].parsed = true;
      out[i].text = std::move(d.content);
      out[i].reasoning_content = std::move(d.reasoning);
      out[i].tool_calls = std::move(d.tool_calls);
    }
  }
  res.status = 200;
  res.set_content(dump_json(full_response(meta, out, session->usage())), "application/json");
}

}  // namespace
}  // namespace mxserve::server
