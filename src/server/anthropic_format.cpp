#include "server/anthropic_format.h"

#include <random>

#include "server/json_util.h"

namespace mxserve::server {
namespace {

using OJ = nlohmann::ordered_json;

std::string random_alnum(int n) {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s;
  for (int i = 0; i < n; ++i) s += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return s;
}

std::string error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

OJ stop_value(const std::string& s) { return s.empty() ? OJ(nullptr) : OJ(s); }

}  // namespace

OJ anthropic_error_json(const ApiError& e) {
  return OJ{{"type", "error"}, {"error", OJ{{"type", error_type(e.http_status)}, {"message", e.message}}}};
}

int anthropic_status(const ApiError& e) { return e.http_status == 503 ? 529 : e.http_status; }

OJ anthropic_usage(const UsageTotals& u) {
  return OJ{{"input_tokens", u.prompt_tokens - u.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", u.cached_tokens},
            {"output_tokens", u.completion_tokens}};
}

AnthropicStop anthropic_stop(const std::string& finish_reason, const std::string& stop_str) {
  if (finish_reason == "length") return {"max_tokens", ""};
  if (finish_reason == "tool_calls") return {"tool_use", ""};
  if (finish_reason == "stop" && !stop_str.empty()) return {"stop_sequence", stop_str};
  return {"end_turn", ""};  // EOS / a stop token id
}

std::string make_message_id() { return "msg_" + random_alnum(24); }

std::string tool_use_id(const std::string& call_id) {
  return "toolu_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}

void AnthropicContent::open(OJ block, std::vector<OJ>* events) {
  for (OJ& e : close()) events->push_back(std::move(e));
  const int index = static_cast<int>(blocks_.size());
  events->push_back(OJ{{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
  blocks_.push_back(std::move(block));
  open_ = true;
}

void AnthropicContent::extend(const std::string& type, const std::string& text, std::vector<OJ>* events) {
  if (text.empty()) return;
  const char* field = type == "thinking" ? "thinking" : "text";
  if (!open_ || blocks_.back()["type"] != type) {
    OJ block{{"type", type}, {field, ""}};
    if (type == "thinking") block["signature"] = "";  // mxserve does not sign reasoning
    open(std::move(block), events);
  }
  const int index = static_cast<int>(blocks_.size()) - 1;
  blocks_.back()[field] = blocks_.back()[field].get<std::string>() + text;
  events->push_back(OJ{{"type", "content_block_delta"},
                       {"index", index},
                       {"delta", OJ{{"type", type == "thinking" ? "thinking_delta" : "text_delta"}, {field, text}}}});
}

std::vector<OJ> AnthropicContent::add(const ChoiceOutput::Delta& d) {
  std::vector<OJ> events;
  extend("thinking", d.reasoning, &events);
  extend("text", d.content, &events);
  for (const OJ& call : d.tool_calls) {
    const std::string args = call["function"]["arguments"].get<std::string>();
    OJ input = OJ::parse(args, nullptr, /*allow_exceptions=*/false);
    if (!input.is_object()) input = OJ::object();  // the parser only emits objects; never a broken block
    open(OJ{{"type", "tool_use"},
            {"id", tool_use_id(call["id"].get<std::string>())},
            {"name", call["function"]["name"]},
            {"input", OJ::object()}},
         &events);
    ++n_tool_use_;
    const int index = static_cast<int>(blocks_.size()) - 1;
    events.push_back(OJ{{"type", "content_block_delta"},
                        {"index", index},
                        {"delta", OJ{{"type", "input_json_delta"}, {"partial_json", dump_json(input)}}}});
    blocks_.back()["input"] = std::move(input);
  }
  return events;
}

std::vector<OJ> AnthropicContent::close() {
  std::vector<OJ> events;
  if (!open_) return events;
  open_ = false;
  events.push_back(OJ{{"type", "content_block_stop"}, {"index", static_cast<int>(blocks_.size()) - 1}});
  return events;
}

OJ anthropic_message(const std::string& id, const std::string& model, const OJ& content, const AnthropicStop& stop,
                     const UsageTotals& u) {
  OJ m;
  m["id"] = id;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = model;
  m["content"] = content;
  m["stop_reason"] = stop_value(stop.reason);
  m["stop_sequence"] = stop_value(stop.sequence);
  m["usage"] = anthropic_usage(u);
  return m;
}

OJ message_start_event(const std::string& id, const std::string& model, const UsageTotals& u) {
  OJ m = anthropic_message(id, model, OJ::array(), AnthropicStop{}, u);
  return OJ{{"type", "message_start"}, {"message", std::move(m)}};
}

OJ message_delta_event(const AnthropicStop& stop, const UsageTotals& u) {
  return OJ{{"type", "message_delta"},
            {"delta", OJ{{"stop_reason", stop_value(stop.reason)}, {"stop_sequence", stop_value(stop.sequence)}}},
            {"usage", anthropic_usage(u)}};
}

std::string sse_event(const OJ& event) {
  const auto t = event.find("type");
  return "event: " + (t != event.end() && t->is_string() ? t->get<std::string>() : std::string("message")) +
         "\ndata: " + dump_json(event) + "\n\n";
}

}  // namespace mxserve::server
