// The GLM output parsers on hand-written model outputs: reasoning split, tool-call formats, schema-driven
// value conversion, malformed calls, tool_choice validation and pre-fill, and streaming at every chunk
// size 1..16 giving the one-shot result.
#include <gtest/gtest.h>

#include "chat/output_parser.h"
#include "chat/tool_choice.h"

namespace mxserve::chat {
namespace {

using OJ = nlohmann::ordered_json;

std::shared_ptr<const ToolSet> weather_tools() {
  const OJ tools = OJ::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
       "city":{"type":"string"},"days":{"type":"integer"},"units":{"type":["string","null"]},
       "detail":{"type":"object"},"flags":{"type":"array"},"exact":{"type":"boolean"}}}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}},
    {"type":"function","function":{"name":"search.web-v2"}}
  ])");
  auto set = std::make_shared<ToolSet>();
  auto e = ToolSet::from_openai(tools, set.get());
  EXPECT_FALSE(e.has_value()) << e->message;
  return set;
}

OutputParserConfig glm(ToolCallFormat f, bool starts_in_reasoning = false) {
  OutputParserConfig c;
  c.reasoning = ReasoningFormat::kGlm45;
  c.starts_in_reasoning = starts_in_reasoning;
  c.tool_calls = f;
  c.tools = weather_tools();
  return c;
}

std::string dump(const ParsedOutput& p) {
  OJ calls = OJ::array();
  for (const auto& c : p.tool_calls) calls.push_back(OJ{{"name", c.name}, {"arguments", c.arguments}});
  return OJ{{"content", p.content ? OJ(*p.content) : OJ()},
            {"reasoning", p.reasoning ? OJ(*p.reasoning) : OJ()},
            {"calls", calls},
            {"malformed", p.malformed_tool_calls},
            {"truncated", p.truncated_tool_calls}}
      .dump();
}

// Parses one-shot and at every chunk size 1..16; all must agree. Returns the one-shot result.
ParsedOutput parse_all_ways(const OutputParserConfig& c, const std::string& text) {
  ParsedOutput one = parse_output(c, text);
  for (size_t n = 1; n <= 16; ++n) EXPECT_EQ(dump(parse_output(c, text, n)), dump(one)) << "chunk size " << n << ": " << text;
  return one;
}

TEST(OutputParser, Glm45ReasoningContentAndCalls) {
  const std::string text =
      "\n<think>The user wants weather.\nCall the tool.</think>\nLet me check.\n"
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>";
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm45), text);
  ASSERT_TRUE(p.reasoning && p.content);
  EXPECT_EQ(*p.reasoning, "The user wants weather.\nCall the tool.");
  EXPECT_EQ(*p.content, "Let me check.");
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"city":"Paris","days":3})");
  EXPECT_EQ(p.tool_calls[1].name, "get_time");
  EXPECT_EQ(p.tool_calls[1].arguments, "{}");
  EXPECT_EQ(p.malformed_tool_calls, 0);
}

TEST(OutputParser, Glm47StartsInsideThink) {
  const std::string text =
      "Need weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>New York</arg_value>"
      "<arg_key>units</arg_key><arg_value>metric</arg_value></tool_call>";
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm47, /*starts_in_reasoning=*/true), text);
  EXPECT_EQ(p.reasoning.value_or("<none>"), "Need weather.");
  EXPECT_FALSE(p.content.has_value());
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"city":"New York","units":"metric"})");
}

TEST(OutputParser, ValuesFollowTheSchema) {
  const std::string text =
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>123</arg_value><arg_key>days</arg_key>"
      "<arg_value>soon</arg_value><arg_key>detail</arg_key><arg_value>{\"a\": [1, 2]}</arg_value>"
      "<arg_key>flags</arg_key><arg_value>[\"x\"]</arg_value><arg_key>exact</arg_key><arg_value>true</arg_value>"
      "<arg_key>extra</arg_key><arg_value>4.5</arg_value><arg_key>note</arg_key><arg_value>hi <b>there</b>\n"
      "</arg_value></tool_call>";
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm47), text);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  // string param keeps "123"; unparsable integer stays a string; unknown params: JSON when it parses.
  EXPECT_EQ(p.tool_calls[0].arguments,
            R"({"city":"123","days":"soon","detail":{"a":[1,2]},"flags":["x"],"exact":true,"extra":4.5,"note":"hi <b>there</b>\n"})");
  EXPECT_FALSE(p.content.has_value());
}

TEST(OutputParser, ToolCallInsideThinkStaysReasoning) {
  const std::string text = "<think>maybe <tool_call>get_time</tool_call> later</think>Fine.";
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm45), text);
  EXPECT_EQ(p.reasoning.value_or(""), "maybe <tool_call>get_time</tool_call> later");
  EXPECT_EQ(p.content.value_or(""), "Fine.");
  EXPECT_TRUE(p.tool_calls.empty());
}

TEST(OutputParser, CutInsideThinkKeepsReasoning) {
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm45), "\n<think>I am still thinking about </th");
  EXPECT_EQ(p.reasoning.value_or(""), "I am still thinking about </th");
  EXPECT_FALSE(p.content.has_value());
  ParsedOutput q = parse_all_ways(glm(ToolCallFormat::kGlm47, true), "half a thought");
  EXPECT_EQ(q.reasoning.value_or(""), "half a thought");
}

TEST(OutputParser, MalformedCallsBecomeContentAndAreCounted) {
  const auto c = glm(ToolCallFormat::kGlm45);
  // JSON-style body (not arg pairs), unknown function, unclosed call at the end.
  ParsedOutput a = parse_all_ways(c, "Sure.\n<tool_call>get_weather\n{\"city\": \"Paris\"}\n</tool_call>");
  EXPECT_EQ(a.content.value_or(""), "Sure.\n<tool_call>get_weather\n{\"city\": \"Paris\"}\n</tool_call>");
  EXPECT_EQ(a.malformed_tool_calls, 1);
  EXPECT_TRUE(a.tool_calls.empty());
  ParsedOutput b = parse_all_ways(c, "<tool_call>launch_rockets\n</tool_call><tool_call>get_time</tool_call>");
  EXPECT_EQ(b.content.value_or(""), "<tool_call>launch_rockets\n</tool_call>");
  EXPECT_EQ(b.malformed_tool_calls, 1);
  ASSERT_EQ(b.tool_calls.size(), 1u);
  EXPECT_EQ(b.tool_calls[0].name, "get_time");
  // A call the turn never closed (max_tokens): dropped whole, no markup in content, counted as truncated.
  ParsedOutput d = parse_all_ways(c, "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par");
  EXPECT_EQ(d.content.value_or(""), "Let me check.");
  EXPECT_EQ(d.malformed_tool_calls, 0);
  EXPECT_EQ(d.truncated_tool_calls, 1);
  EXPECT_TRUE(d.tool_calls.empty());
  ParsedOutput d2 = parse_all_ways(c, "<tool_call>get_weather\n<arg_key>ci");
  EXPECT_FALSE(d2.content.has_value());
  EXPECT_EQ(d2.truncated_tool_calls, 1);
  ParsedOutput e = parse_all_ways(c, "<tool_call>get_weather<arg_key>city</arg_key>no value</tool_call>");
  EXPECT_EQ(e.malformed_tool_calls, 1);
  // A partial opening tag at the end is plain text.
  ParsedOutput f = parse_all_ways(c, "see <tool_ca");
  EXPECT_EQ(f.content.value_or(""), "see <tool_ca");
  EXPECT_EQ(f.malformed_tool_calls, 0);
}

TEST(OutputParser, NamesWithPunctuationAndNoToolsMeansAnyName) {
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm47), "<tool_call>search.web-v2<arg_key>q</arg_key>"
                                                               "<arg_value>a b</arg_value></tool_call>");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].name, "search.web-v2");
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"q":"a b"})");
  OutputParserConfig any = glm(ToolCallFormat::kGlm47);
  any.tools = nullptr;
  ParsedOutput q = parse_all_ways(any, "<tool_call>anything<arg_key>n</arg_key><arg_value>7</arg_value></tool_call>");
  ASSERT_EQ(q.tool_calls.size(), 1u);
  EXPECT_EQ(q.tool_calls[0].arguments, R"({"n":7})");
}

TEST(OutputParser, WithoutParsersEverythingIsContent) {
  OutputParserConfig none;
  const std::string text = "<think>x</think> <tool_call>get_time</tool_call>";
  ParsedOutput p = parse_all_ways(none, text);
  EXPECT_EQ(p.content.value_or(""), text);
  OutputParserConfig reasoning_only = glm(ToolCallFormat::kNone);
  ParsedOutput q = parse_all_ways(reasoning_only, text);
  EXPECT_EQ(q.reasoning.value_or(""), "x");
  EXPECT_EQ(q.content.value_or(""), "<tool_call>get_time</tool_call>");
  EXPECT_EQ(q.malformed_tool_calls, 0);
}

TEST(OutputParser, ThinkOnlyCountsAtTheStart) {
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm45), "Answer: use <think> tags.");
  EXPECT_EQ(p.content.value_or(""), "Answer: use <think> tags.");
  EXPECT_FALSE(p.reasoning.has_value());
  ParsedOutput q = parse_all_ways(glm(ToolCallFormat::kGlm45), "  <think></think>\n\nHi");
  EXPECT_FALSE(q.reasoning.has_value());
  EXPECT_EQ(q.content.value_or(""), "Hi");
}

TEST(OutputParser, MultibyteTextSurvivesAnyChunking) {
  ParsedOutput p = parse_all_ways(glm(ToolCallFormat::kGlm47, true),
                                  "思考中…</think>天气：<tool_call>get_weather<arg_key>city</arg_key><arg_value>東京</arg_value></tool_call>");
  EXPECT_EQ(p.reasoning.value_or(""), "思考中…");
  EXPECT_EQ(p.content.value_or(""), "天气：");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"city":"東京"})");
}

TEST(PromptOpensReasoning, FollowsTheTemplateTail) {
  EXPECT_TRUE(prompt_opens_reasoning("<|assistant|><think>"));
  EXPECT_TRUE(prompt_opens_reasoning("<|assistant|><think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|>\n<think></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|>"));
}

TEST(ParserNames, KnownAndUnknown) {
  EXPECT_EQ(*parse_tool_call_format("glm45"), ToolCallFormat::kGlm45);
  EXPECT_EQ(*parse_tool_call_format("glm47"), ToolCallFormat::kGlm47);
  EXPECT_EQ(*parse_reasoning_format("glm45"), ReasoningFormat::kGlm45);
  auto bad = parse_tool_call_format("hermes");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'hermes'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("glm47"), std::string::npos);
  EXPECT_FALSE(parse_reasoning_format("deepseek-r1").is_ok());
}

TEST(ToolSet, InvalidSchemasNameTheField) {
  auto err = [](const char* tools) {
    ToolSet s;
    auto e = ToolSet::from_openai(OJ::parse(tools), &s);
    return e ? e->field : std::string("<ok>");
  };
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"a"}}])"), "<ok>");
  EXPECT_EQ(err(R"({"type":"function"})"), "tools");
  EXPECT_EQ(err(R"([{"type":"retrieval"}])"), "tools[0]");
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"has space"}}])"), "tools[0].function.name");
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}])"),
            "tools[1].function.name");
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"a","parameters":[]}}])"), "tools[0].function.parameters");
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"a","parameters":{"type":"string"}}}])"),
            "tools[0].function.parameters.type");
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"x":{"type":"str"}}}}}])"),
            "tools[0].function.parameters.properties.x.type");
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"a","parameters":{"properties":{"x":{"anyOf":[{"type":7}]}}}}}])"),
            "tools[0].function.parameters.properties.x.anyOf[0].type");
  EXPECT_EQ(err(R"([{"type":"function","function":{"name":"a","parameters":{"required":"x"}}}])"),
            "tools[0].function.parameters.required");
}

TEST(ToolChoice, ParseAndValidate) {
  const auto tools_ptr = weather_tools();
  const ToolSet& tools = *tools_ptr;
  ToolChoice c;
  auto field = [&](const char* j, const ToolSet& t) {
    const OJ v = OJ::parse(j);
    auto e = parse_tool_choice(&v, t, &c);
    return e ? e->field : std::string("<ok>");
  };
  EXPECT_EQ(field(R"("auto")", tools), "<ok>");
  EXPECT_EQ(field(R"("none")", tools), "<ok>");
  EXPECT_EQ(c.mode, ToolChoiceMode::kNone);
  EXPECT_EQ(field(R"("required")", tools), "<ok>");
  EXPECT_TRUE(c.forces_call());
  EXPECT_EQ(field(R"({"type":"function","function":{"name":"get_time"}})", tools), "<ok>");
  EXPECT_EQ(c.function, "get_time");
  EXPECT_EQ(field(R"({"type":"function","function":{"name":"nope"}})", tools), "tool_choice.function.name");
  EXPECT_EQ(field(R"({"type":"function","function":{}})", tools), "tool_choice.function.name");
  EXPECT_EQ(field(R"({"type":"tool"})", tools), "tool_choice.type");
  EXPECT_EQ(field(R"("always")", tools), "tool_choice");
  EXPECT_EQ(field(R"(3)", tools), "tool_choice");
  EXPECT_EQ(field(R"("required")", ToolSet()), "tool_choice");
  EXPECT_EQ(field(R"({"type":"function","function":{"name":"get_time"}})", ToolSet()), "tool_choice.function.name");
}

}  // namespace
}  // namespace mxserve::chat
