// ChatOutput: the glue between the chat output parsers (src/chat) and the OpenAI chat responses. Per
// request a ChatOutputPlan (which parsers run, the tool set, tool_choice) and, for tool_choice "required"
// or a named function, the tool-call grammar that constrains decoding (built from the parser's own rules,
// so what the grammar accepts parses into valid calls); per choice a
// ChoiceOutput that turns generated text into content / reasoning_content / tool_calls deltas, numbers
// the calls (index, id "call_<random>"), maps finish_reason "stop" to "tool_calls" when calls were made,
// and counts calls and malformed call texts in the metrics. A parsed call is returned only when its
// arguments pass the request's call grammar (the schema rules of forced calls; a failing one becomes
// content, counted malformed); a call cut by the end of the turn is dropped (finish_reason stays "length"). Streaming and non-streaming both go through
// ChoiceOutput (non-streaming = one chunk), so they agree. The handlers only make thin calls into here.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/output_parser.h"
#include "chat/tool_choice.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/request_schema.h"
#include "structured/grammar.h"
#include "tokenizer/chat_template.h"

namespace mxserve::server {

struct ChatOutputPlan {
  bool active = false;           // false: text is returned as content untouched
  chat::OutputParserConfig config;
  chat::ToolChoice tool_choice;
  bool parallel_tool_calls = true;  // false: a forced turn has exactly one call
  // One call of any of the request's tools, checked against each parsed call (tool_choice auto too): a
  // call whose arguments the grammar rejects is not returned as a call (apply_prompt builds it).
  std::shared_ptr<const structured::Grammar> call_validator;
};

// Validates tools / tool_choice of a chat request against the server's formats and fills the plan
// (chat_template_kwargs.thinking is normalized to enable_thinking). Errors are 400s naming the field.
std::optional<ApiError> plan_chat_output(const chat::OutputFormats& formats, const nlohmann::ordered_json& body,
                                         tokenizer::ChatInputs* inputs, ChatOutputPlan* plan);
// After rendering: the parser's start state from the prompt's tail and, when tool_choice forces a call,
// gen->grammar = the tool-call grammar (400 when the request also asks for structured output or
// ignore_eos, or a tool schema cannot be compiled).
std::optional<ApiError> apply_prompt(ChatOutputPlan* plan, const std::string& prompt, GenerationOptions* gen);

// The tool-call grammar of a forced turn (exposed for tests): the format's literal layout, the request's
// tools (only tool_choice.function when named), the reasoning prefix the rendered prompt implies.
Result<std::shared_ptr<const structured::Grammar>> tool_call_grammar(const ChatOutputPlan& plan,
                                                                     chat::ToolCallFormat format,
                                                                     std::string_view prompt);

class ChoiceOutput {
 public:
  ChoiceOutput(const ChatOutputPlan& plan, Metrics* metrics);
  struct Delta {
    std::string content;
    std::string reasoning;
    nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();  // streaming form (with "index")
    bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
    void append(Delta&& o);
  };
  Delta feed(const std::string& text);
  Delta finish();
  std::string finish_reason(const std::string& engine_reason) const;
  // Adds reasoning_content / tool_calls of `d` to a streaming delta object.
  static void add_to_stream_delta(const Delta& d, nlohmann::ordered_json* delta);
  // Non-streaming message fields from the accumulated deltas (content null when empty).
  static void fill_message(const std::string& content, const std::string& reasoning,
                           const nlohmann::ordered_json& tool_calls, nlohmann::ordered_json* message);

 private:
  Delta convert(chat::ParsedDelta p);

  bool valid_call(const chat::ToolCall& c, std::string* canonical) const;

  chat::OutputParser parser_;
  Metrics* metrics_;
  std::shared_ptr<const structured::Grammar> validator_;
  chat::ToolCallFormat format_;
  std::shared_ptr<const chat::ToolSet> tools_;
  int n_calls_ = 0;
  bool text_after_calls_ = false;  // content after the last call, or a call cut by the end of the turn
};

// "call_" + 24 random alphanumerics.
std::string make_tool_call_id();

// The server-wide formats: from --tool-call-parser / --reasoning-parser when given ("" = detect from the
// chat template). Logs what was chosen and why. Unknown names are errors.
Result<chat::OutputFormats> resolve_output_formats(const std::string& tool_call_parser,
                                                   const std::string& reasoning_parser,
                                                   const std::string& chat_template_source);

}  // namespace mxserve::server
