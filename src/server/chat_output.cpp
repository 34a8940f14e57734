#include "server/chat_output.h"

#include <mutex>
#include <random>
#include <set>

#include "core/logging.h"
#include "structured/matcher.h"
#include "structured/tool_call_grammar.h"

namespace mxserve::server {
namespace {

using OJ = nlohmann::ordered_json;

// The literal layout each GLM template renders (tests/data/tokenizer/templates): GLM-4.5/4.6 put every call
// on its own line ("\n<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>") and
// open a think block with "\n<think>"; GLM-4.7/5.x write the same tags with no newlines.
structured::ToolCallSyntax glm_syntax(chat::ToolCallFormat format) {
  const bool glm45 = format == chat::ToolCallFormat::kGlm45;
  const std::string nl = glm45 ? "\n" : "";
  structured::ToolCallSyntax s;
  s.call_open = nl + "<tool_call>";
  s.after_name = nl;
  s.key_open = "<arg_key>";
  s.key_to_value = "</arg_key>" + nl + "<arg_value>";
  s.value_close = "</arg_value>";
  s.after_value = nl;
  s.call_close = "</tool_call>";
  s.think_open = nl + "<think>";
  s.think_close = "</think>";
  return s;
}

bool ends_with_trimmed(std::string_view s, std::string_view suffix) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s.ends_with(suffix);
}

// Logs each ignored tool-schema keyword once per process (bounded).
void warn_ignored_keywords(const std::vector<std::string>& ignored) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  for (const std::string& w : ignored) {
    const std::string keyword = w.substr(0, w.find(" at "));
    if (seen.size() >= 64 || !seen.insert(keyword).second) continue;
    MX_LOG(kWarn) << "tool_choice grammar: " << keyword << " is not enforced during decoding (first seen: " << w
                  << "); the arguments are still parsed";
  }
}

}  // namespace

std::string make_tool_call_id() {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

std::optional<ApiError> plan_chat_output(const chat::OutputFormats& formats, const OJ& body,
                                         tokenizer::ChatInputs* inputs, ChatOutputPlan* plan) {
  *plan = ChatOutputPlan{};
  auto tools = std::make_shared<chat::ToolSet>();
  if (auto e = chat::ToolSet::from_openai(inputs->tools, tools.get())) return bad_request(e->message, e->field);
  auto tc = body.find("tool_choice");
  if (auto e = chat::parse_tool_choice(tc == body.end() ? nullptr : &*tc, *tools, &plan->tool_choice))
    return bad_request(e->message, e->field);
  if (plan->tool_choice.forces_call() && formats.tool_calls == chat::ToolCallFormat::kNone)
    return bad_request("'tool_choice' " + tc->dump() + " needs a tool-call parser, and this server has none "
                       "(start it with --tool-call-parser glm45|glm47, or use a GLM chat template)", "tool_choice");
  // chat_template_kwargs.thinking is accepted as a spelling of enable_thinking.
  if (auto th = inputs->kwargs.find("thinking"); th != inputs->kwargs.end() && !inputs->kwargs.contains("enable_thinking")) {
    if (!th->is_boolean())
      return bad_request("'chat_template_kwargs.thinking' must be a boolean", "chat_template_kwargs.thinking");
    inputs->kwargs["enable_thinking"] = *th;
  }
  if (auto et = inputs->kwargs.find("enable_thinking"); et != inputs->kwargs.end() && !et->is_boolean())
    return bad_request("'chat_template_kwargs.enable_thinking' must be a boolean",
                       "chat_template_kwargs.enable_thinking");
  plan->config.reasoning = formats.reasoning;
  if (!tools->empty() && plan->tool_choice.mode != chat::ToolChoiceMode::kNone)
    plan->config.tool_calls = formats.tool_calls;
  plan->config.tools = tools;
  if (auto ptc = body.find("parallel_tool_calls"); ptc != body.end() && !ptc->is_null()) {
    if (!ptc->is_boolean()) return bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    plan->parallel_tool_calls = ptc->get<bool>();
  }
  plan->active = plan->config.reasoning != chat::ReasoningFormat::kNone ||
                 plan->config.tool_calls != chat::ToolCallFormat::kNone;
  return std::nullopt;
}

namespace {

// The grammar request of a plan (the caller sets the reasoning prefix).
structured::ToolCallGrammarRequest plan_request(const ChatOutputPlan& plan) {
  const chat::ToolSet& tools = *plan.config.tools;
  structured::ToolCallGrammarRequest r;
  r.syntax = glm_syntax(plan.config.tool_calls);
  const bool named = plan.tool_choice.mode == chat::ToolChoiceMode::kFunction;
  r.max_calls = named || !plan.parallel_tool_calls ? 1 : -1;
  for (const std::string& name : tools.names()) {
    if (named && name != plan.tool_choice.function) continue;
    const chat::ToolSet::Definition* d = tools.definition(name);
    structured::ToolSpec t;
    t.name = name;
    t.field = "tools[" + std::to_string(d->index) + "].function.parameters";
    t.parameters = d->parameters;
    if (d->parameters.is_object()) {
      std::set<std::string> required;
      if (auto req = d->parameters.find("required"); req != d->parameters.end() && req->is_array())
        for (const OJ& k : *req) required.insert(k.get<std::string>());
      if (auto props = d->parameters.find("properties"); props != d->parameters.end() && props->is_object())
        for (const auto& [key, schema] : props->items())
          t.args.push_back({key, schema, tools.raw_string(name, key), required.count(key) > 0});
    }
    r.tools.push_back(std::move(t));
  }
  return r;
}

}  // namespace

Result<std::shared_ptr<const structured::Grammar>> tool_call_grammar(const ChatOutputPlan& plan,
                                                                     chat::ToolCallFormat format,
                                                                     std::string_view prompt) {
  ChatOutputPlan p = plan;
  p.config.tool_calls = format;
  structured::ToolCallGrammarRequest r = plan_request(p);
  if (plan.config.reasoning == chat::ReasoningFormat::kNone) r.reasoning = structured::ReasoningPrefix::kNone;
  else if (chat::prompt_opens_reasoning(prompt)) r.reasoning = structured::ReasoningPrefix::kOpen;
  else if (ends_with_trimmed(prompt, "</think>")) r.reasoning = structured::ReasoningPrefix::kNone;
  else r.reasoning = structured::ReasoningPrefix::kOptional;
  std::vector<std::string> ignored;
  auto g = structured::compile_tool_calls(r, &ignored);
  if (g.is_ok()) warn_ignored_keywords(ignored);
  return g;
}

// The validator: exactly one call of any tool, no reasoning prefix. Under tool_choice auto a schema the
// grammar cannot compile leaves calls unchecked (said once in the log); forced calls 400 on it anyway.
namespace {
void build_call_validator(ChatOutputPlan* plan) {
  if (plan->config.tool_calls == chat::ToolCallFormat::kNone || !plan->config.tools || plan->config.tools->empty()) return;
  ChatOutputPlan any = *plan;
  any.tool_choice.mode = chat::ToolChoiceMode::kRequired;
  any.parallel_tool_calls = false;
  any.config.reasoning = chat::ReasoningFormat::kNone;
  std::vector<std::string> ignored;
  auto g = structured::compile_tool_calls(plan_request(any), &ignored);
  if (g.is_ok()) {
    plan->call_validator = *g;
    return;
  }
  static std::once_flag once;
  std::call_once(once, [&] {
    MX_LOG(kWarn) << "tool calls: arguments are not checked against the tool schemas of some requests ("
                  << g.status().message() << "); use only the keywords docs/server.md lists to have them checked";
  });
}
}  // namespace

std::optional<ApiError> apply_prompt(ChatOutputPlan* plan, const std::string& prompt, GenerationOptions* gen) {
  plan->config.starts_in_reasoning = chat::prompt_opens_reasoning(prompt);
  build_call_validator(plan);
  if (!plan->tool_choice.forces_call()) return std::nullopt;
  if (gen->grammar)
    return bad_request(std::string("'tool_choice' ") +
                           (plan->tool_choice.mode == chat::ToolChoiceMode::kRequired ? "\"required\"" : "(a named function)") +
                           " constrains the output to tool calls and cannot be combined with structured output "
                           "(response_format / guided_*)",
                       "tool_choice");
  if (gen->sampling.ignore_eos)
    return bad_request("'ignore_eos' cannot be combined with tool_choice \"required\" or a named function: the "
                       "output ends after the last call", "ignore_eos");
  auto g = tool_call_grammar(*plan, plan->config.tool_calls, prompt);
  if (!g.is_ok()) return bad_request("'tools': " + g.status().message(), "tools");
  gen->grammar = *g;
  return std::nullopt;
}

ChoiceOutput::ChoiceOutput(const ChatOutputPlan& plan, Metrics* metrics)
    : parser_(plan.config), metrics_(metrics), validator_(plan.call_validator), format_(plan.config.tool_calls),
      tools_(plan.config.tools) {}

// The call as the grammar's layout writes it (raw text for the parser's raw-string parameters, compact JSON
// with "</" written "<\/" for the others), run through the validator.
bool ChoiceOutput::valid_call(const chat::ToolCall& c, std::string* canonical) const {
  const structured::ToolCallSyntax s = glm_syntax(format_);
  const OJ args = OJ::parse(c.arguments, nullptr, false);
  std::string text = s.call_open + c.name + s.after_name;
  bool parsed = args.is_object();
  if (parsed)
    for (const auto& [k, v] : args.items()) {
      std::string value;
      if (tools_ && tools_->raw_string(c.name, k) && v.is_string()) {
        value = v.get<std::string>();
      } else {
        value = v.dump();
        for (size_t i = value.find("</"); i != std::string::npos; i = value.find("</", i + 3)) value.insert(i + 1, "\\");
      }
      text += s.key_open + k + s.key_to_value + value + s.value_close + s.after_value;
    }
  text += s.call_close;
  *canonical = text;
  if (!parsed) return false;
  structured::Matcher m(validator_);
  return m.accept(text) && m.can_end();
}

ChoiceOutput::Delta ChoiceOutput::convert(chat::ParsedDelta p) {
  Delta d;
  d.content = std::move(p.content);
  d.reasoning = std::move(p.reasoning);
  if (validator_) {  // calls whose arguments break the tools' schemas are not calls
    std::vector<chat::ToolCall> kept;
    for (auto& c : p.tool_calls) {
      std::string canonical;
      if (valid_call(c, &canonical)) {
        kept.push_back(std::move(c));
      } else {
        d.content += canonical;
        ++p.malformed_tool_calls;
        MX_LOG(kDebug) << "tool call " << c.name << ": arguments do not match the tool's schema; returned as content";
      }
    }
    p.tool_calls = std::move(kept);
  }
  if (!p.tool_calls.empty()) text_after_calls_ = false;
  else if (n_calls_ > 0 && !d.content.empty()) text_after_calls_ = true;
  if (p.truncated_tool_calls > 0) text_after_calls_ = true;
  for (auto& c : p.tool_calls) {
    d.tool_calls.push_back(OJ{{"index", n_calls_++},
                              {"id", make_tool_call_id()},
                              {"type", "function"},
                              {"function", OJ{{"name", c.name}, {"arguments", c.arguments}}}});
  }
  if (metrics_) {
    if (!p.tool_calls.empty()) metrics_->add_tool_calls(static_cast<int64_t>(p.tool_calls.size()));
    if (p.truncated_tool_calls > 0) {  // counted with the parse failures; no markup is returned
      metrics_->add_malformed_tool_calls(p.truncated_tool_calls);
      MX_LOG(kDebug) << p.truncated_tool_calls << " tool call(s) cut by the end of the turn dropped";
    }
    if (p.malformed_tool_calls > 0) {
      metrics_->add_malformed_tool_calls(p.malformed_tool_calls);
      MX_LOG(kDebug) << p.malformed_tool_calls << " malformed tool-call text(s) returned as content";
    }
  }
  return d;
}

void ChoiceOutput::Delta::append(Delta&& o) {
  content += o.content;
  reasoning += o.reasoning;
  for (auto& c : o.tool_calls) tool_calls.push_back(std::move(c));
}

ChoiceOutput::Delta ChoiceOutput::feed(const std::string& text) { return convert(parser_.feed(text)); }
ChoiceOutput::Delta ChoiceOutput::finish() { return convert(parser_.finish()); }

std::string ChoiceOutput::finish_reason(const std::string& engine_reason) const {
  // A turn that ends with complete calls is "tool_calls", also when the last call closed on the last token
  // max_tokens allowed (forced calls close within the budget); a call cut short stays "length".
  if (n_calls_ > 0 && (engine_reason == "stop" || (engine_reason == "length" && !text_after_calls_))) return "tool_calls";
  return engine_reason;
}

void ChoiceOutput::add_to_stream_delta(const Delta& d, OJ* delta) {
  if (!d.reasoning.empty()) (*delta)["reasoning_content"] = d.reasoning;
  if (!d.tool_calls.empty()) (*delta)["tool_calls"] = d.tool_calls;
}

void ChoiceOutput::fill_message(const std::string& content, const std::string& reasoning, const OJ& tool_calls,
                                OJ* message) {
  (*message)["content"] = content.empty() ? OJ(nullptr) : OJ(content);
  if (!reasoning.empty()) (*message)["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) {
    OJ calls = OJ::array();
    for (const OJ& c : tool_calls) calls.push_back(OJ{{"id", c["id"]}, {"type", c["type"]}, {"function", c["function"]}});
    (*message)["tool_calls"] = calls;
  }
}

Result<chat::OutputFormats> resolve_output_formats(const std::string& tool_call_parser,
                                                   const std::string& reasoning_parser,
                                                   const std::string& chat_template_source) {
  std::string why;
  chat::OutputFormats f = chat::detect_output_formats(chat_template_source, &why);
  const bool detected_tools = tool_call_parser.empty(), detected_reasoning = reasoning_parser.empty();
  if (!detected_tools) {
    MX_ASSIGN_OR_RETURN(f.tool_calls, chat::parse_tool_call_format(tool_call_parser));
  }
  if (!detected_reasoning) {
    MX_ASSIGN_OR_RETURN(f.reasoning, chat::parse_reasoning_format(reasoning_parser));
  }
  MX_LOG(kInfo) << "output parsers: tool calls " << chat::tool_call_format_name(f.tool_calls)
                << (detected_tools ? " (detected)" : " (--tool-call-parser)") << ", reasoning "
                << chat::reasoning_format_name(f.reasoning)
                << (detected_reasoning ? " (detected)" : " (--reasoning-parser)")
                << (detected_tools || detected_reasoning ? "; detection: " + why : std::string());
  return f;
}

}  // namespace mxserve::server
