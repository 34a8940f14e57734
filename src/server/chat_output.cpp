#include "server/chat_output.h"

#include <random>

#include "core/logging.h"

namespace mxserve::server {
namespace {

using OJ = nlohmann::ordered_json;

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
  if (plan->tool_choice.forces_call()) {
    inputs->kwargs["enable_thinking"] = false;  // the pre-filled call follows a closed think block
    plan->prefill = chat::tool_call_prefill(formats.tool_calls, plan->tool_choice);
  }
  plan->active = plan->config.reasoning != chat::ReasoningFormat::kNone ||
                 plan->config.tool_calls != chat::ToolCallFormat::kNone;
  return std::nullopt;
}

void apply_prompt(ChatOutputPlan* plan, std::string* prompt) {
  plan->config.starts_in_reasoning = chat::prompt_opens_reasoning(*prompt);
  *prompt += plan->prefill;
}

ChoiceOutput::ChoiceOutput(const ChatOutputPlan& plan, Metrics* metrics) : parser_(plan.config), metrics_(metrics) {
  parser_.feed(plan.prefill);  // the start of a call (or nothing): it yields no output
}

ChoiceOutput::Delta ChoiceOutput::convert(chat::ParsedDelta p) {
  Delta d;
  d.content = std::move(p.content);
  d.reasoning = std::move(p.reasoning);
  for (auto& c : p.tool_calls) {
    d.tool_calls.push_back(OJ{{"index", n_calls_++},
                              {"id", make_tool_call_id()},
                              {"type", "function"},
                              {"function", OJ{{"name", c.name}, {"arguments", c.arguments}}}});
  }
  if (metrics_) {
    if (!p.tool_calls.empty()) metrics_->add_tool_calls(static_cast<int64_t>(p.tool_calls.size()));
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
  return n_calls_ > 0 && engine_reason == "stop" ? "tool_calls" : engine_reason;
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
