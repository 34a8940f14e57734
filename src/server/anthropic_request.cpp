#include "server/anthropic_request.h"

#include <limits>
#include <set>

namespace mxserve::server {
namespace {

using OJ = OrderedJson;

constexpr size_t kMaxIgnoredFieldName = 64;  // as request_schema.cpp: hostile bodies cannot grow the log set
constexpr size_t kMaxIgnoredFields = 32;

#define MX_TRY(expr)                                       \
  do {                                                     \
    if (auto mx_err_ = (expr)) return std::move(*mx_err_); \
  } while (0)

std::string quote(const OJ& v) { return dump_json(v).substr(0, 64); }

// "where" must be a string; the error names it.
std::optional<ApiError> need_string(const OJ& obj, const std::string& key, const std::string& where, std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string())
    return bad_request("'" + where + "." + key + "' must be a string" +
                           (it == obj.end() ? " (it is missing)" : ", got " + json_type_name(*it)),
                       where + "." + key);
  *out = it->get<std::string>();
  return std::nullopt;
}

// A list of {"type":"text","text":...} blocks, or a string (when allowed): the texts joined with "\n".
std::optional<ApiError> text_of(const OJ& v, const std::string& where, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return bad_request("'" + where + "' must be a string or a list of text blocks", where);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const OJ& b = v[i];
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return bad_request("'" + w + "' must be a content block with a string 'type'", w);
    if (b["type"] != "text")
      return unsupported_field(w + ".type", "block type " + quote(b["type"]) + " is not supported here (only text)");
    std::string t;
    MX_TRY(need_string(b, "text", w, &t));
    if (!text.empty()) text += "\n";
    text += t;
  }
  *out = std::move(text);
  return std::nullopt;
}

// One Anthropic message -> one or more OpenAI messages (a user turn with tool_result blocks becomes its
// tool messages, then the user text if any).
std::optional<ApiError> translate_message(const OJ& m, size_t i, bool last, OJ* out) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return bad_request("'" + where + "' must be an object", where);
  auto r = m.find("role");
  if (r == m.end() || !r->is_string() || (*r != "user" && *r != "assistant"))
    return bad_request("'" + where + ".role' must be \"user\" or \"assistant\"" +
                           (r == m.end() ? std::string(" (it is missing)") : ", got " + quote(*r)) +
                           "; the system prompt goes in the top-level 'system' field",
                       where + ".role");
  const bool user = *r == "user";
  auto c = m.find("content");
  const std::string cw = where + ".content";
  if (c == m.end() || c->is_null()) return bad_request("'" + cw + "' is required", cw);
  if (!user && last)
    return unsupported_field(where, "a final assistant message (prefill, continuing the assistant's turn) is not "
                                    "implemented; end the list with a user message");
  if (c->is_string()) {
    out->push_back(OJ{{"role", *r}, {"content", *c}});
    return std::nullopt;
  }
  if (!c->is_array()) return bad_request("'" + cw + "' must be a string or a list of content blocks", cw);
  std::string text, reasoning;
  bool has_text = false;
  OJ tool_calls = OJ::array();
  std::vector<OJ> tool_msgs;
  for (size_t k = 0; k < c->size(); ++k) {
    const OJ& b = (*c)[k];
    const std::string bw = cw + "[" + std::to_string(k) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return bad_request("'" + bw + "' must be a content block with a string 'type'", bw);
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      std::string t;
      MX_TRY(need_string(b, "text", bw, &t));
      if (has_text) text += "\n";
      text += t;
      has_text = true;
    } else if (type == "tool_result" && user) {
      std::string id, body;
      MX_TRY(need_string(b, "tool_use_id", bw, &id));
      if (auto tc = b.find("content"); tc != b.end() && !tc->is_null()) MX_TRY(text_of(*tc, bw + ".content", &body));
      if (auto e = b.find("is_error"); e != b.end() && !e->is_null() && !e->is_boolean())
        return bad_request("'" + bw + ".is_error' must be a boolean", bw + ".is_error");
      if (has_text)
        return bad_request("'" + bw + "': tool_result blocks must come before any text in a user message", bw);
      tool_msgs.push_back(OJ{{"role", "tool"}, {"tool_call_id", id}, {"content", body}});
    } else if (type == "tool_use" && !user) {
      std::string id, name;
      MX_TRY(need_string(b, "id", bw, &id));
      MX_TRY(need_string(b, "name", bw, &name));
      auto in = b.find("input");
      if (in == b.end() || !in->is_object()) return bad_request("'" + bw + ".input' must be an object", bw + ".input");
      tool_calls.push_back(OJ{{"id", id}, {"type", "function"}, {"function", OJ{{"name", name}, {"arguments", *in}}}});
    } else if (type == "thinking" && !user) {
      std::string t;
      MX_TRY(need_string(b, "thinking", bw, &t));  // the signature is accepted and not checked
      if (!reasoning.empty()) reasoning += "\n";
      reasoning += t;
    } else if (type == "redacted_thinking" && !user) {
      // Encrypted reasoning of another provider's model: nothing to render; dropped.
    } else if (type == "tool_use" || type == "tool_result" || type == "thinking" || type == "redacted_thinking") {
      return bad_request("'" + bw + ".type' = \"" + type + "\" is not allowed in a" + (user ? " user" : "n assistant") +
                             " message",
                         bw + ".type");
    } else {
      return unsupported_field(bw + ".type", "content block type " + quote(b["type"]) +
                                                 " is not supported (text-only model: text, tool_use, tool_result, "
                                                 "thinking)");
    }
  }
  if (user) {
    for (OJ& t : tool_msgs) out->push_back(std::move(t));
    if (has_text || tool_msgs.empty()) out->push_back(OJ{{"role", "user"}, {"content", text}});
    return std::nullopt;
  }
  OJ msg{{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) msg["tool_calls"] = std::move(tool_calls);
  out->push_back(std::move(msg));
  return std::nullopt;
}

std::optional<ApiError> translate_tools(const OJ& tools, OJ* out) {
  if (!tools.is_array()) return bad_request("'tools' must be a list", "tools");
  *out = OJ::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const OJ& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad_request("'" + where + "' must be an object", where);
    if (auto ty = t.find("type"); ty != t.end() && !ty->is_null() && *ty != "custom")
      return unsupported_field(where + ".type", "tool type " + quote(*ty) +
                                                    " (an Anthropic server tool) is not implemented; define the tool "
                                                    "with name, description and input_schema");
    std::string name;
    MX_TRY(need_string(t, "name", where, &name));
    auto schema = t.find("input_schema");
    if (schema == t.end() || !schema->is_object())
      return bad_request("'" + where + ".input_schema' must be a JSON-schema object", where + ".input_schema");
    OJ fn{{"name", name}};
    if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
      if (!d->is_string()) return bad_request("'" + where + ".description' must be a string", where + ".description");
      fn["description"] = *d;
    }
    fn["parameters"] = *schema;
    out->push_back(OJ{{"type", "function"}, {"function", std::move(fn)}});
  }
  return std::nullopt;
}

std::optional<ApiError> translate_tool_choice(const OJ& tc, bool have_tools, OJ* body) {
  if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
    return bad_request("'tool_choice' must be an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                       "tool_choice");
  const std::string type = tc["type"].get<std::string>();
  if (type == "auto") (*body)["tool_choice"] = "auto";
  else if (type == "none") (*body)["tool_choice"] = "none";
  else if (type == "any") (*body)["tool_choice"] = "required";
  else if (type == "tool") {
    std::string name;
    MX_TRY(need_string(tc, "name", "tool_choice", &name));
    (*body)["tool_choice"] = OJ{{"type", "function"}, {"function", OJ{{"name", name}}}};
  } else {
    return bad_request("'tool_choice.type' = " + quote(tc["type"]) + " is not one of auto, any, tool, none",
                       "tool_choice.type");
  }
  if ((type == "any" || type == "tool") && !have_tools)
    return bad_request("'tool_choice' {\"type\": \"" + type + "\"} needs a non-empty 'tools' list", "tool_choice");
  if (auto d = tc.find("disable_parallel_tool_use"); d != tc.end() && !d->is_null()) {
    if (!d->is_boolean())
      return bad_request("'tool_choice.disable_parallel_tool_use' must be a boolean",
                         "tool_choice.disable_parallel_tool_use");
    (*body)["parallel_tool_calls"] = !d->get<bool>();
  }
  return std::nullopt;
}

std::optional<ApiError> translate_thinking(const OJ& th, OJ* body, std::vector<std::string>* ignored) {
  if (!th.is_object() || !th.contains("type") || !th["type"].is_string())
    return bad_request("'thinking' must be an object {\"type\": \"enabled\" | \"disabled\", ...}", "thinking");
  const std::string type = th["type"].get<std::string>();
  bool enable;
  if (type == "enabled" || type == "adaptive") enable = true;
  else if (type == "disabled") enable = false;
  else return bad_request("'thinking.type' = " + quote(th["type"]) + " is not one of enabled, adaptive, disabled",
                          "thinking.type");
  if (auto b = th.find("budget_tokens"); b != th.end() && !b->is_null()) {
    if (!b->is_number_integer() || b->get<int64_t>() < 1)
      return bad_request("'thinking.budget_tokens' must be a positive integer", "thinking.budget_tokens");
    ignored->push_back("thinking.budget_tokens");  // thinking ends where the model ends it; max_tokens bounds all
  }
  (*body)["chat_template_kwargs"] = OJ{{"enable_thinking", enable}};
  return std::nullopt;
}

void replace_all(std::string* s, const std::string& from, const std::string& to) {
  for (size_t p = s->find(from); p != std::string::npos; p = s->find(from, p + to.size())) s->replace(p, from.size(), to);
}

}  // namespace

ApiError anthropic_field_names(ApiError e) {
  for (std::string* s : {&e.message, &e.param}) {
    replace_all(s, ".function.parameters", ".input_schema");
    replace_all(s, ".function.name", ".name");
    replace_all(s, "'tool_choice' \"required\"", "'tool_choice' {\"type\": \"any\"}");
  }
  return e;
}

std::optional<ApiError> translate_anthropic_request(const OJ& body, OJ* openai_body, std::vector<std::string>* ignored) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object, got " + json_type_name(body));
  // Fields whose meaning mxserve implements (translated below), and fields accepted without effect.
  static const std::set<std::string> known = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream",
                                              "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking",
                                              "metadata"};
  // Features whose absence would change the answer (server-side tools, a schema-shaped output): refused.
  // context_management (server-side clearing of old tool results) and output_config without a format
  // (effort) only change cost, so they fall under the ignored fields.
  static const std::set<std::string> refused = {"mcp_servers", "container", "output_format"};
  OJ out = OJ::object();
  for (const auto& [key, value] : body.items()) {
    if (refused.count(key) && !value.is_null())
      return unsupported_field(key, "this Anthropic feature is not implemented by mxserve");
    if (key == "output_config" && value.is_object() && value.contains("format") && !value["format"].is_null())
      return unsupported_field("output_config.format", "structured output is not implemented on /v1/messages "
                                                       "(use response_format on /v1/chat/completions)");
    if (!known.count(key) && ignored->size() < kMaxIgnoredFields) ignored->push_back(key.substr(0, kMaxIgnoredFieldName));
  }
  for (const char* k : {"model", "temperature", "top_p", "top_k", "stream"})
    if (auto it = body.find(k); it != body.end() && !it->is_null()) out[k] = *it;
  auto mt = body.find("max_tokens");
  if (mt == body.end() || mt->is_null())
    return bad_request("'max_tokens' is required (the Messages API has no default)", "max_tokens");
  out["max_tokens"] = *mt;  // type and range: parse_chat_request
  if (auto md = body.find("metadata"); md != body.end() && !md->is_null() && !md->is_object())
    return bad_request("'metadata' must be an object", "metadata");

  OJ messages = OJ::array();
  if (auto s = body.find("system"); s != body.end() && !s->is_null()) {
    std::string system;
    MX_TRY(text_of(*s, "system", &system));
    messages.push_back(OJ{{"role", "system"}, {"content", system}});
  }
  auto ms = body.find("messages");
  if (ms == body.end() || ms->is_null()) return bad_request("'messages' is required", "messages");
  if (!ms->is_array()) return bad_request("'messages' must be a list, got " + json_type_name(*ms), "messages");
  if (ms->empty()) return bad_request("'messages' must contain at least one message", "messages");
  for (size_t i = 0; i < ms->size(); ++i) MX_TRY(translate_message((*ms)[i], i, i + 1 == ms->size(), &messages));
  out["messages"] = std::move(messages);

  if (auto ss = body.find("stop_sequences"); ss != body.end() && !ss->is_null()) {
    if (!ss->is_array()) return bad_request("'stop_sequences' must be a list of strings", "stop_sequences");
    for (const OJ& x : *ss)
      if (!x.is_string()) return bad_request("'stop_sequences' must be a list of strings", "stop_sequences");
    out["stop"] = *ss;
  }
  bool have_tools = false;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    OJ tools;
    MX_TRY(translate_tools(*t, &tools));
    have_tools = !tools.empty();
    if (have_tools) out["tools"] = std::move(tools);
  }
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null())
    MX_TRY(translate_tool_choice(*tc, have_tools, &out));
  if (auto th = body.find("thinking"); th != body.end() && !th->is_null()) MX_TRY(translate_thinking(*th, &out, ignored));
  *openai_body = std::move(out);
  return std::nullopt;
}

std::optional<ApiError> parse_anthropic_request(const OJ& body, AnthropicRequest* out) {
  std::vector<std::string> ignored;
  MX_TRY(translate_anthropic_request(body, &out->openai_body, &ignored));
  if (auto e = parse_chat_request(out->openai_body, &out->chat)) {
    // Translated message indices differ from the client's (system first, tool results split out): name the
    // list rather than a wrong index.
    if (e->param.rfind("messages[", 0) == 0) e->param = "messages";
    return anthropic_field_names(std::move(*e));
  }
  out->chat.gen.ignored_fields = std::move(ignored);  // the translated body's own fields are all known
  return std::nullopt;
}

}  // namespace mxserve::server
