#include "server/request_schema.h"

#include "server/structured_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace mxserve::server {
namespace {

constexpr int kMaxN = 64;
constexpr int kMaxStops = 16;
constexpr int kMaxTopLogprobs = 1024;  // a sanity ceiling; the server's --max-logprobs (20) is checked by the handler
// Unknown field names are kept (for a once-per-name log line) cut to this length, and at most this many:
// a hostile body cannot make the server hold megabyte-long names.
constexpr size_t kMaxIgnoredFieldName = 64;
constexpr size_t kMaxIgnoredFields = 32;
constexpr size_t kMaxLogitBias = 1024;   // entries per request (OpenAI allows 300)
constexpr double kLogitBiasLimit = 100;  // biases are clamped to [-100, 100] (OpenAI / vLLM)

// logit_bias: {"TOKEN_ID": bias}; ids are decimal strings (JSON keys), biases numbers, clamped.
std::optional<ApiError> parse_logit_bias(const OrderedJson& v, std::vector<std::pair<int32_t, float>>* out) {
  if (!v.is_object())
    return bad_request("'logit_bias' must be an object mapping token ids (as strings) to numbers", "logit_bias");
  if (v.size() > kMaxLogitBias)
    return bad_request("'logit_bias' has " + std::to_string(v.size()) + " entries; at most " +
                           std::to_string(kMaxLogitBias),
                       "logit_bias");
  for (const auto& [key, bias] : v.items()) {
    const std::string where = "logit_bias." + key.substr(0, 32);
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits = digits && c >= '0' && c <= '9';
    const int64_t id = digits ? std::stoll(key) : -1;
    if (!digits || id > std::numeric_limits<int32_t>::max())
      return bad_request("'logit_bias' key " + dump_json(OrderedJson(key.substr(0, 32))) +
                             " is not a token id (a non-negative integer as a string)",
                         "logit_bias");
    if (!bias.is_number() || !std::isfinite(bias.get<double>()))
      return bad_request("'" + where + "' must be a number, got " + json_type_name(bias), where);
    const double b = std::clamp(bias.get<double>(), -kLogitBiasLimit, kLogitBiasLimit);
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return std::nullopt;
}

// Reads typed fields of one JSON object; the first error wins.
class Fields {
 public:
  explicit Fields(const OrderedJson& obj, std::string prefix = "") : obj_(obj), prefix_(std::move(prefix)) {}

  // The field, or nullptr when absent or null.
  const OrderedJson* find(const std::string& name) const {
    auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string path(const std::string& name) const { return prefix_ + name; }

  std::optional<ApiError> get_bool(const std::string& name, bool* out) const {
    const OrderedJson* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return type_error(name, "a boolean", *v);
    *out = v->get<bool>();
    return std::nullopt;
  }

  std::optional<ApiError> get_int(const std::string& name, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    const OrderedJson* v = find(name);
    if (!v) return std::nullopt;
    double d;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return range_error(name, lo, hi);
      const int64_t x = v->get<int64_t>();
      if (x < lo || x > hi) return range_error(name, lo, hi);
      *out = x;
      return std::nullopt;
    }
    if (!v->is_number_float()) return type_error(name, "an integer", *v);
    d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return type_error(name, "an integer", *v);
    // 2^63 itself compares equal to (double)INT64_MAX: keep doubles strictly inside the int64 range.
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi) || std::fabs(d) >= 9.2233720368547758e18)
      return range_error(name, lo, hi);
    *out = static_cast<int64_t>(d);
    return std::nullopt;
  }

  std::optional<ApiError> get_number(const std::string& name, double lo, double hi, bool lo_open, float* out) const {
    const OrderedJson* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) return type_error(name, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo))
      return bad_request("'" + path(name) + "' = " + dump_json(*v) + " must be in " + (lo_open ? "(" : "[") +
                             fmt(lo) + ", " + fmt(hi) + "]",
                         path(name));
    *out = static_cast<float>(d);
    return std::nullopt;
  }

  ApiError type_error(const std::string& name, const std::string& expected, const OrderedJson& v) const {
    return bad_request("'" + path(name) + "' must be " + expected + ", got " + json_type_name(v), path(name));
  }
  ApiError range_error(const std::string& name, int64_t lo, int64_t hi) const {
    return bad_request("'" + path(name) + "' must be an integer in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]",
                       path(name));
  }

 private:
  static std::string fmt(double x) {
    if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
    return std::to_string(x);
  }
  const OrderedJson& obj_;
  std::string prefix_;
};

#define MX_TRY(expr)                                     \
  do {                                                   \
    if (auto mx_err_ = (expr)) return std::move(*mx_err_); \
  } while (0)

// Fields that would change what the client gets, which this server does not implement.
std::optional<ApiError> check_unsupported(const Fields& f, bool chat) {
  if (const OrderedJson* v = f.find("best_of"))
    if (!(v->is_number_integer() && v->get<int64_t>() == 1)) return unsupported_field("best_of", "only best_of = 1");
  if (chat) {  // /v1/completions implements both (parse_common)
    if (const OrderedJson* v = f.find("echo"))
      if (!(v->is_boolean() && !v->get<bool>()))
        return unsupported_field("echo", "echo is implemented on /v1/completions, not on chat");
    if (f.find("prompt_logprobs"))
      return unsupported_field("prompt_logprobs", "prompt logprobs are implemented on /v1/completions, not on chat");
  }
  if (f.find("suffix")) return unsupported_field("suffix", "insertion (suffix) is not implemented");
  if (f.find("functions") || f.find("function_call"))
    return unsupported_field(f.find("functions") ? "functions" : "function_call",
                             "the legacy functions API is not implemented; use tools");
  if (const OrderedJson* v = f.find("min_tokens"))
    if (!(v->is_number_integer() && v->get<int64_t>() == 0)) return unsupported_field("min_tokens", "only min_tokens = 0");
  if (const OrderedJson* v = f.find("continue_final_message"))
    if (!(v->is_boolean() && !v->get<bool>())) return unsupported_field("continue_final_message", "not implemented");
  if (f.find("audio")) return unsupported_field("audio", "this is a text-only model");
  if (const OrderedJson* v = f.find("modalities")) {
    if (!v->is_array()) return bad_request("'modalities' must be an array", "modalities");
    for (const auto& m : *v)
      if (m != "text") return unsupported_field("modalities", "only [\"text\"]");
  }
  return std::nullopt;
}

const std::set<std::string>& known_fields(bool chat) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "stream",
      "stream_options", "logprobs", "ignore_eos", "presence_penalty", "frequency_penalty", "user",
      "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output", "response_format", "logit_bias",
      "best_of", "echo", "suffix", "prompt_logprobs", "functions", "function_call", "min_tokens",
      "repetition_penalty", "continue_final_message", "audio", "modalities", "no_stop_trim"};
  // Not here, so they are accepted with the same once-per-name warning as unknown fields (mxserve does not
  // act on them): metadata, store, service_tier, request_id, priority (and parallel_tool_calls on completions).
  // parallel_tool_calls is honoured on chat (false: at most one call per turn, server/chat_output.cpp).
  static const std::set<std::string> chat_only = {"messages", "max_completion_tokens", "top_logprobs", "tools",
                                                  "tool_choice", "chat_template_kwargs", "add_generation_prompt",
                                                  "parallel_tool_calls"};
  static const std::set<std::string> completion_only = {"prompt"};
  static const std::set<std::string> chat_set = [] {
    std::set<std::string> s = common;
    s.insert(structured_output_fields().begin(), structured_output_fields().end());
    s.insert(chat_only.begin(), chat_only.end());
    return s;
  }();
  static const std::set<std::string> completion_set = [] {
    std::set<std::string> s = common;
    s.insert(structured_output_fields().begin(), structured_output_fields().end());
    s.insert(completion_only.begin(), completion_only.end());
    return s;
  }();
  return chat ? chat_set : completion_set;
}

std::optional<ApiError> parse_common(const OrderedJson& body, bool chat, GenerationOptions* g) {
  if (!body.is_object()) return bad_request("the request body must be a JSON object, got " + json_type_name(body));
  Fields f(body);
  MX_TRY(check_unsupported(f, chat));
  MX_TRY(parse_structured_output(body, &g->grammar));
  for (const auto& [key, value] : body.items())
    if (!known_fields(chat).count(key) && g->ignored_fields.size() < kMaxIgnoredFields)
      g->ignored_fields.push_back(key.substr(0, kMaxIgnoredFieldName));

  if (const OrderedJson* v = f.find("model")) {
    if (!v->is_string()) return f.type_error("model", "a string", *v);
    g->model = v->get<std::string>();
  }
  const int64_t kMaxTok = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens, max_completion_tokens;
  if (!chat) MX_TRY(f.get_bool("echo", &g->echo));
  // max_tokens 0 asks for the echoed prompt (and its logprobs) only, as OpenAI's legacy completions allow.
  MX_TRY(f.get_int("max_tokens", g->echo ? 0 : 1, kMaxTok, &max_tokens));
  if (chat) MX_TRY(f.get_int("max_completion_tokens", 1, kMaxTok, &max_completion_tokens));
  g->max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;

  auto& s = g->sampling;
  MX_TRY(f.get_number("temperature", 0, 1e6, false, &s.temperature));
  MX_TRY(f.get_number("top_p", 0, 1, true, &s.top_p));
  MX_TRY(f.get_number("min_p", 0, 1, false, &s.min_p));
  MX_TRY(f.get_number("presence_penalty", -2, 2, false, &s.presence_penalty));
  MX_TRY(f.get_number("frequency_penalty", -2, 2, false, &s.frequency_penalty));
  MX_TRY(f.get_number("repetition_penalty", 0, 1e9, true, &s.repetition_penalty));  // vLLM: > 0
  if (const OrderedJson* v = f.find("logit_bias")) MX_TRY(parse_logit_bias(*v, &s.logit_bias));
  std::optional<int64_t> top_k, seed, n;
  MX_TRY(f.get_int("top_k", -1, kMaxTok, &top_k));
  if (top_k) s.top_k = *top_k < 0 ? 0 : static_cast<int32_t>(*top_k);  // -1 (SGLang) and 0 (vLLM) mean off
  MX_TRY(f.get_int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed));
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  MX_TRY(f.get_int("n", 1, kMaxN, &n));
  if (n) g->n = static_cast<int>(*n);
  MX_TRY(f.get_bool("ignore_eos", &s.ignore_eos));
  MX_TRY(f.get_bool("stream", &g->stream));
  MX_TRY(f.get_bool("skip_special_tokens", &g->skip_special_tokens));
  MX_TRY(f.get_bool("include_stop_str_in_output", &g->include_stop_str_in_output));
  bool no_stop_trim = false;
  MX_TRY(f.get_bool("no_stop_trim", &no_stop_trim));
  g->include_stop_str_in_output |= no_stop_trim;

  if (const OrderedJson* v = f.find("stop")) {
    if (v->is_string()) {
      g->stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > kMaxStops) return bad_request("'stop' has more than " + std::to_string(kMaxStops) + " entries", "stop");
      for (const auto& x : *v) {
        if (!x.is_string()) return bad_request("'stop' must be a string or a list of strings", "stop");
        g->stop.push_back(x.get<std::string>());
      }
    } else {
      return f.type_error("stop", "a string or a list of strings", *v);
    }
    std::erase_if(g->stop, [](const std::string& x) { return x.empty(); });
  }
  if (const OrderedJson* v = f.find("stop_token_ids")) {
    if (!v->is_array()) return f.type_error("stop_token_ids", "a list of integers", *v);
    for (const auto& x : *v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > kMaxTok)
        return bad_request("'stop_token_ids' must be a list of non-negative integers", "stop_token_ids");
      s.stop_token_ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
  }
  if (const OrderedJson* v = f.find("stream_options")) {
    if (!v->is_object()) return f.type_error("stream_options", "an object", *v);
    if (!g->stream) return bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    Fields so(*v, "stream_options.");
    MX_TRY(so.get_bool("include_usage", &g->include_usage));
    MX_TRY(so.get_bool("continuous_usage_stats", &g->continuous_usage));
  }
  if (const OrderedJson* v = f.find("user"); v && !v->is_string()) return f.type_error("user", "a string", *v);
  if (g->grammar && s.ignore_eos)
    return bad_request("'ignore_eos' cannot be combined with structured output: the output ends where the grammar "
                       "completes", "ignore_eos");

  // logprobs: chat = bool + top_logprobs; completions = int (number of alternatives).
  if (chat) {
    bool lp = false;
    std::optional<int64_t> top;
    MX_TRY(f.get_bool("logprobs", &lp));
    MX_TRY(f.get_int("top_logprobs", 0, kMaxTopLogprobs, &top));
    if (top && *top > 0 && !lp) return bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
    if (lp) g->logprobs = top ? static_cast<int>(*top) : 0;
  } else {
    std::optional<int64_t> lp, plp;
    MX_TRY(f.get_int("logprobs", 0, kMaxTopLogprobs, &lp));
    if (lp) g->logprobs = static_cast<int>(*lp);
    MX_TRY(f.get_int("prompt_logprobs", 0, kMaxTopLogprobs, &plp));
    if (plp) g->prompt_logprobs = static_cast<int>(*plp);
    if (plp && g->stream)
      return bad_request("'prompt_logprobs' is not available with \"stream\": true (use echo with logprobs)",
                         "prompt_logprobs");
  }
  return std::nullopt;
}

// Message content: a string, or a list of {"type":"text","text":...} parts (joined with "\n").
std::optional<ApiError> normalize_content(const OrderedJson& msg, size_t i, const std::string& role, OrderedJson* out) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    if (role == "assistant") return std::nullopt;  // tool calls only
    return bad_request("'" + where + "' is required for role '" + role + "'", where);
  }
  if (it->is_string()) return std::nullopt;
  if (!it->is_array()) return bad_request("'" + where + "' must be a string or a list of content parts", where);
  std::string text;
  for (size_t p = 0; p < it->size(); ++p) {
    const auto& part = (*it)[p];
    const std::string pw = where + "[" + std::to_string(p) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return bad_request("'" + pw + "' must be an object with a string 'type'", pw);
    if (part["type"] != "text")
      return unsupported_field(pw + ".type", "content part type " + dump_json(part["type"]) +
                                                 " is not supported (text-only model)");
    if (!part.contains("text") || !part["text"].is_string())
      return bad_request("'" + pw + ".text' must be a string", pw + ".text");
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  (*out)["content"] = text;
  return std::nullopt;
}

// OpenAI clients send an earlier turn's tool_calls[].function.arguments as a JSON string; the GLM templates
// iterate it as a mapping. A string holding a JSON object is replaced by the object (as vLLM does).
void decode_tool_call_arguments(OrderedJson* msg) {
  auto tc = msg->find("tool_calls");
  if (tc == msg->end() || !tc->is_array()) return;
  for (auto& call : *tc) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
    auto args = call["function"].find("arguments");
    if (args == call["function"].end() || !args->is_string()) continue;
    OrderedJson parsed = OrderedJson::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) *args = std::move(parsed);
  }
}

std::optional<ApiError> parse_messages(const OrderedJson& body, tokenizer::ChatInputs* in) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return bad_request("'messages' is required", "messages");
  if (!it->is_array()) return bad_request("'messages' must be a list, got " + json_type_name(*it), "messages");
  if (it->empty()) return bad_request("'messages' must contain at least one message", "messages");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  in->messages = OrderedJson::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad_request("'" + where + "' must be an object", where);
    auto r = m.find("role");
    if (r == m.end() || !r->is_string()) return bad_request("'" + where + ".role' must be a string", where + ".role");
    const std::string role = r->get<std::string>();
    if (!roles.count(role))
      return bad_request("'" + where + ".role' = " + dump_json(*r) +
                             " is not one of system, developer, user, assistant, tool",
                         where + ".role");
    OrderedJson copy = m;
    MX_TRY(normalize_content(m, i, role, &copy));
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !tc->is_array())
      return bad_request("'" + where + ".tool_calls' must be a list", where + ".tool_calls");
    decode_tool_call_arguments(&copy);
    in->messages.push_back(std::move(copy));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_tools(const OrderedJson& body, tokenizer::ChatInputs* in) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) return bad_request("'tools' must be a list", "tools");
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& t = (*it)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
        !t["function"].is_object())
      return bad_request("'" + where + "' must be {\"type\": \"function\", \"function\": {...}}", where);
    const auto& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      return bad_request("'" + where + ".function.name' must be a non-empty string", where + ".function.name");
    if (fn.contains("parameters") && !fn["parameters"].is_object() && !fn["parameters"].is_null())
      return bad_request("'" + where + ".function.parameters' must be an object", where + ".function.parameters");
  }
  if (!it->empty()) in->tools = *it;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_chat_request(const OrderedJson& body, ChatRequest* out) {
  MX_TRY(parse_common(body, /*chat=*/true, &out->gen));
  MX_TRY(parse_messages(body, &out->inputs));
  MX_TRY(parse_tools(body, &out->inputs));
  Fields f(body);
  out->inputs.add_generation_prompt = true;
  MX_TRY(f.get_bool("add_generation_prompt", &out->inputs.add_generation_prompt));
  if (const OrderedJson* v = f.find("chat_template_kwargs")) {
    if (!v->is_object()) return f.type_error("chat_template_kwargs", "an object", *v);
    out->inputs.kwargs = *v;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const OrderedJson& body, CompletionRequest* out) {
  MX_TRY(parse_common(body, /*chat=*/false, &out->gen));
  if (!out->gen.max_tokens) out->gen.max_tokens = 16;  // the legacy OpenAI default
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad_request("'prompt' is required", "prompt");
  auto ids_of = [](const OrderedJson& arr, std::vector<int32_t>* ids) {
    for (const auto& x : arr) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int32_t>::max())
        return false;
      ids->push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    return true;
  };
  const std::string kShape = "'prompt' must be a string, a list of strings, a list of token ids or a list of lists "
                             "of token ids";
  if (it->is_string()) {
    out->prompts.emplace_back(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->empty()) return bad_request("'prompt' must not be empty", "prompt");
    const auto& first = (*it)[0];
    if (first.is_number()) {
      std::vector<int32_t> ids;
      if (!ids_of(*it, &ids)) return bad_request(kShape + " (token ids are non-negative integers)", "prompt");
      out->prompts.emplace_back(std::move(ids));
    } else {
      for (const auto& p : *it) {
        if (p.is_string()) {
          out->prompts.emplace_back(p.get<std::string>());
        } else if (p.is_array()) {
          std::vector<int32_t> ids;
          if (!ids_of(p, &ids)) return bad_request(kShape, "prompt");
          out->prompts.emplace_back(std::move(ids));
        } else {
          return bad_request(kShape, "prompt");
        }
      }
    }
  } else {
    return bad_request(kShape + ", got " + json_type_name(*it), "prompt");
  }
  if (out->prompts.size() * static_cast<size_t>(out->gen.n) > kMaxN)
    return bad_request("at most " + std::to_string(kMaxN) + " choices per request (prompts x n)", "n");
  return std::nullopt;
}

}  // namespace mxserve::server
