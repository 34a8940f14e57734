// Round trip through the real GLM chat templates (tests/data/tokenizer/templates, verbatim zai-org files):
// render an assistant turn with reasoning, content and tool calls through mxserve's own template renderer,
// take the assistant part, feed it back to the parser (one-shot and at every chunk size 1..16), and get
// the same reasoning, content and calls (arguments compared as JSON). Also: the generation prompt's tail
// for thinking on/off decides where the parser starts, and format detection from each template.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat/output_parser.h"
#include "tokenizer/chat_template.h"

namespace mxserve::chat {
namespace {

using OJ = nlohmann::ordered_json;

struct TemplateCase {
  const char* file;
  ToolCallFormat format;
};
const TemplateCase kTemplates[] = {{"GLM-4.5-Air", ToolCallFormat::kGlm45},
                                   {"GLM-4.7-Flash", ToolCallFormat::kGlm47},
                                   {"GLM-5.1", ToolCallFormat::kGlm47}};

std::string read_template(const char* name) {
  std::ifstream in(std::string(MXSERVE_SOURCE_DIR) + "/tests/data/tokenizer/templates/" + name + ".jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const OJ& tools_json() {
  static const OJ t = OJ::parse(R"([
    {"type":"function","function":{"name":"get_weather","description":"Weather for a city","parameters":{
      "type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"zip":{"type":"string"},
      "options":{"type":"object"},"tags":{"type":"array"},"metric":{"type":"boolean"}},"required":["city"]}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}
  ])");
  return t;
}

// The calls of the assistant message: arguments as objects (what the templates iterate).
const OJ& calls_json() {
  static const OJ c = OJ::parse(R"([
    {"type":"function","function":{"name":"get_weather","arguments":{"city":"São Paulo","days":3,"zip":"01000",
      "options":{"hourly":true,"fields":["temp","wind"]},"tags":["a","b"],"metric":false}}},
    {"type":"function","function":{"name":"get_time","arguments":{}}},
    {"type":"function","function":{"name":"get_weather","arguments":{"city":"Line1\nLine2 <b>"}}}
  ])");
  return c;
}

struct Rendered {
  std::string prompt;     // whole rendering
  std::string assistant;  // text after the last <|assistant|>
};

Rendered render(const char* file, const OJ& messages, bool add_generation_prompt, const OJ& kwargs) {
  auto tmpl = tokenizer::ChatTemplate::parse(read_template(file));
  EXPECT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
  tokenizer::ChatInputs in;
  in.messages = messages;
  in.tools = tools_json();
  in.add_generation_prompt = add_generation_prompt;
  in.kwargs = kwargs;
  auto text = tmpl->render_chat(in, nlohmann::json::object());
  EXPECT_TRUE(text.is_ok()) << text.status().to_string();
  Rendered r{*text, ""};
  const size_t at = r.prompt.rfind("<|assistant|>");
  if (at != std::string::npos) r.assistant = r.prompt.substr(at + std::string("<|assistant|>").size());
  return r;
}

std::string summary(const ParsedOutput& p) {
  OJ calls = OJ::array();
  for (const auto& c : p.tool_calls) calls.push_back(OJ{{"name", c.name}, {"arguments", c.arguments}});
  return OJ{{"c", p.content ? OJ(*p.content) : OJ()}, {"r", p.reasoning ? OJ(*p.reasoning) : OJ()}, {"t", calls},
            {"m", p.malformed_tool_calls}}
      .dump();
}

class TemplateRoundTrip : public ::testing::TestWithParam<size_t> {};

TEST_P(TemplateRoundTrip, AssistantTurnParsesBack) {
  const TemplateCase tc = kTemplates[GetParam()];
  OJ messages = OJ::array();
  messages.push_back(OJ{{"role", "user"}, {"content", "Weather in São Paulo, and the time?"}});
  messages.push_back(OJ{{"role", "assistant"},
                        {"reasoning_content", "The user asks two things.\nI will call two tools."},
                        {"content", "Checking both."},
                        {"tool_calls", calls_json()}});
  const Rendered r = render(tc.file, messages, false, OJ::object());
  ASSERT_FALSE(r.assistant.empty()) << r.prompt;
  ASSERT_NE(r.assistant.find("<tool_call>get_weather"), std::string::npos) << r.assistant;

  OutputParserConfig config;
  config.reasoning = ReasoningFormat::kGlm45;
  config.tool_calls = tc.format;
  auto tools = std::make_shared<ToolSet>();
  ASSERT_FALSE(ToolSet::from_openai(tools_json(), tools.get()).has_value());
  config.tools = tools;

  // GLM-4.7/5.x prompts end with "<think>": the model's text then starts inside the block.
  std::string model_text = r.assistant;
  if (model_text.starts_with("<think>")) {
    model_text = model_text.substr(7);
    config.starts_in_reasoning = true;
  }
  const ParsedOutput one = parse_output(config, model_text);
  for (size_t n = 1; n <= 16; ++n)
    EXPECT_EQ(summary(parse_output(config, model_text, n)), summary(one)) << tc.file << " chunk size " << n;

  EXPECT_EQ(one.reasoning.value_or("<none>"), "The user asks two things.\nI will call two tools.") << r.assistant;
  EXPECT_EQ(one.content.value_or("<none>"), "Checking both.") << r.assistant;
  EXPECT_EQ(one.malformed_tool_calls, 0);
  ASSERT_EQ(one.tool_calls.size(), calls_json().size()) << r.assistant;
  for (size_t i = 0; i < one.tool_calls.size(); ++i) {
    EXPECT_EQ(one.tool_calls[i].name, calls_json()[i]["function"]["name"].get<std::string>());
    const OJ got = OJ::parse(one.tool_calls[i].arguments);
    EXPECT_EQ(got, calls_json()[i]["function"]["arguments"]) << tc.file << " call " << i;
  }
}

TEST_P(TemplateRoundTrip, GenerationPromptTailSetsTheStartState) {
  const TemplateCase tc = kTemplates[GetParam()];
  const OJ messages = OJ::parse(R"([{"role":"user","content":"hi"}])");
  const Rendered on = render(tc.file, messages, true, OJ::object());
  const Rendered off = render(tc.file, messages, true, OJ{{"enable_thinking", false}});
  // GLM-4.5 lets the model open <think> itself; GLM-4.7/5.x open it in the prompt. Thinking off closes it.
  EXPECT_EQ(prompt_opens_reasoning(on.prompt), tc.format == ToolCallFormat::kGlm47) << on.prompt;
  EXPECT_FALSE(prompt_opens_reasoning(off.prompt)) << off.prompt;
  // With thinking off the model writes content at once; the parser gives no reasoning.
  OutputParserConfig config;
  config.reasoning = ReasoningFormat::kGlm45;
  config.starts_in_reasoning = prompt_opens_reasoning(off.prompt);
  config.tool_calls = tc.format;
  ParsedOutput p = parse_output(config, tc.format == ToolCallFormat::kGlm45 ? "\nHello there." : "Hello there.");
  EXPECT_FALSE(p.reasoning.has_value());
  EXPECT_EQ(p.content.value_or(""), "Hello there.");
}

TEST_P(TemplateRoundTrip, FormatsAreDetectedFromTheTemplate) {
  const TemplateCase tc = kTemplates[GetParam()];
  std::string why;
  OutputFormats f = detect_output_formats(read_template(tc.file), &why);
  EXPECT_EQ(f.tool_calls, tc.format) << why;
  EXPECT_EQ(f.reasoning, ReasoningFormat::kGlm45) << why;
}

INSTANTIATE_TEST_SUITE_P(Glm, TemplateRoundTrip, ::testing::Range<size_t>(0, std::size(kTemplates)),
                         [](const auto& info) {
                           std::string n = kTemplates[info.param].file;
                           for (char& c : n)
                             if (c == '-' || c == '.') c = '_';
                           return n;
                         });

TEST(DetectFormats, NonGlmTemplateHasNone) {
  std::string why;
  OutputFormats f = detect_output_formats("{% for m in messages %}{{ m.content }}{% endfor %}", &why);
  EXPECT_EQ(f.tool_calls, ToolCallFormat::kNone);
  EXPECT_EQ(f.reasoning, ReasoningFormat::kNone);
}

}  // namespace
}  // namespace mxserve::chat
