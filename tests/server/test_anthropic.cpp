// The Anthropic Messages translation and response building, in process (no server): Anthropic request ->
// the internal chat request (system, content blocks, tools, tool_choice, thinking, stop_sequences, the
// errors and the fields they name), and GLM output -> content blocks, stop reasons, usage, the SSE event
// sequence (the same blocks whether the text arrives in one piece or in pieces of any size), error bodies.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/anthropic_format.h"
#include "server/anthropic_request.h"
#include "server/chat_output.h"

namespace mxserve::server {
namespace {

using OJ = OrderedJson;

OJ weather_tool() {
  return OJ::parse(R"({"name":"get_weather","description":"Weather","input_schema":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}})");
}

AnthropicRequest parse_ok(const OJ& body) {
  AnthropicRequest r;
  auto e = parse_anthropic_request(body, &r);
  EXPECT_FALSE(e) << (e ? e->message : "");
  return r;
}

ApiError parse_err(const OJ& body) {
  AnthropicRequest r;
  auto e = parse_anthropic_request(body, &r);
  EXPECT_TRUE(e) << body.dump();
  return e ? *e : ApiError{};
}

TEST(AnthropicRequest, SamplingStopAndSystem) {
  const OJ body = OJ::parse(R"({"model":"m","max_tokens":64,"temperature":0.5,"top_p":0.9,"top_k":20,
    "stop_sequences":["END","\n\n"],"stream":true,"metadata":{"user_id":"u"},
    "system":[{"type":"text","text":"Be brief."},{"type":"text","text":"Be kind.","cache_control":{"type":"ephemeral"}}],
    "messages":[{"role":"user","content":"hi"}]})");
  AnthropicRequest r = parse_ok(body);
  const GenerationOptions& g = r.chat.gen;
  EXPECT_EQ(g.model, "m");
  ASSERT_TRUE(g.max_tokens);
  EXPECT_EQ(*g.max_tokens, 64);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.9f);
  EXPECT_EQ(g.sampling.top_k, 20);
  EXPECT_EQ(g.stop, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.ignored_fields.empty()) << "metadata is accepted silently";
  const OJ& m = r.chat.inputs.messages;
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], OJ::parse(R"({"role":"system","content":"Be brief.\nBe kind."})"));
  EXPECT_EQ(m[1], OJ::parse(R"({"role":"user","content":"hi"})"));
  EXPECT_TRUE(r.chat.inputs.add_generation_prompt);
  EXPECT_TRUE(r.chat.inputs.tools.is_null());
}

TEST(AnthropicRequest, ToolUseToolResultAndThinking) {
  OJ body = OJ::parse(R"({"max_tokens":8,"messages":[
    {"role":"user","content":[{"type":"text","text":"Weather in Paris?"}]},
    {"role":"assistant","content":[{"type":"thinking","thinking":"call it","signature":"s"},
      {"type":"redacted_thinking","data":"xx"},{"type":"text","text":"Checking."},
      {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}},
      {"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"Rome","days":2}}]},
    {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},
      {"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"rain"}],"is_error":false},
      {"type":"text","text":"And tomorrow?"}]}]})");
  body["tools"] = OJ::array({weather_tool()});
  AnthropicRequest r = parse_ok(body);
  const OJ& m = r.chat.inputs.messages;
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[0]["content"], "Weather in Paris?");
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["content"], "Checking.");
  EXPECT_EQ(m[1]["reasoning_content"], "call it");
  ASSERT_EQ(m[1]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[1]["tool_calls"][0], OJ::parse(R"({"id":"toolu_1","type":"function","function":{"name":"get_weather",
    "arguments":{"city":"Paris"}}})"));  // arguments stay an object: the GLM templates iterate them
  EXPECT_EQ(m[2], OJ::parse(R"({"role":"tool","tool_call_id":"toolu_1","content":"sunny"})"));
  EXPECT_EQ(m[3], OJ::parse(R"({"role":"tool","tool_call_id":"toolu_2","content":"rain"})"));
  EXPECT_EQ(m[4], OJ::parse(R"({"role":"user","content":"And tomorrow?"})"));
  ASSERT_TRUE(r.chat.inputs.tools.is_array());
  EXPECT_EQ(r.chat.inputs.tools[0], OJ::parse(R"({"type":"function","function":{"name":"get_weather",
    "description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"},
    "days":{"type":"integer"}},"required":["city"]}}})"));
}

TEST(AnthropicRequest, ToolChoiceAndThinkingMapOntoTheChatPlan) {
  const chat::OutputFormats glm{chat::ToolCallFormat::kGlm45, chat::ReasoningFormat::kGlm45};
  struct Case {
    const char* tool_choice;
    chat::ToolChoiceMode mode;
    bool parallel;
  };
  const Case cases[] = {
      {R"({"type":"auto"})", chat::ToolChoiceMode::kAuto, true},
      {R"({"type":"any","disable_parallel_tool_use":true})", chat::ToolChoiceMode::kRequired, false},
      {R"({"type":"tool","name":"get_weather"})", chat::ToolChoiceMode::kFunction, true},
      {R"({"type":"none"})", chat::ToolChoiceMode::kNone, true},
  };
  for (const Case& c : cases) {
    OJ body = OJ::parse(R"({"max_tokens":8,"messages":[{"role":"user","content":"hi"}],
      "thinking":{"type":"disabled"}})");
    body["tools"] = OJ::array({weather_tool()});
    body["tool_choice"] = OJ::parse(c.tool_choice);
    AnthropicRequest r = parse_ok(body);
    ChatOutputPlan plan;
    auto e = plan_chat_output(glm, r.openai_body, &r.chat.inputs, &plan);
    ASSERT_FALSE(e) << e->message;
    EXPECT_EQ(plan.tool_choice.mode, c.mode) << c.tool_choice;
    EXPECT_EQ(plan.parallel_tool_calls, c.parallel) << c.tool_choice;
    if (c.mode == chat::ToolChoiceMode::kFunction) EXPECT_EQ(plan.tool_choice.function, "get_weather");
    EXPECT_EQ(r.chat.inputs.kwargs["enable_thinking"], false);
  }
  OJ body = OJ::parse(R"({"max_tokens":8,"messages":[{"role":"user","content":"hi"}],
    "thinking":{"type":"enabled","budget_tokens":2048},"service_tier":"auto"})");
  AnthropicRequest r = parse_ok(body);
  EXPECT_EQ(r.chat.inputs.kwargs["enable_thinking"], true);
  EXPECT_EQ(r.chat.gen.ignored_fields, (std::vector<std::string>{"service_tier", "thinking.budget_tokens"}));
}

TEST(AnthropicRequest, ErrorsNameTheAnthropicField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"max_tokens":0,"messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"max_tokens":"8","messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"max_tokens":8})", "messages"},
      {R"({"max_tokens":8,"messages":[]})", "messages"},
      {R"({"max_tokens":8,"messages":[{"role":"system","content":"x"}]})", "messages[0].role"},
      {R"({"max_tokens":8,"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use",
        "id":"a","name":"f","input":"{}"}]},{"role":"user","content":"y"}]})", "messages[1].content[0].input"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result",
        "tool_use_id":"a","content":"r"}]}]})", "messages[0].content[1]"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"pre"}]})",
       "messages[1]"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"system":5})", "system"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"stop_sequences":"END"})", "stop_sequences"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"temperature":-1})", "temperature"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]})", "tools[0].input_schema"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305",
        "name":"web_search"}]})", "tools[0].type"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"any"}})", "tool_choice"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"sometimes"}})",
       "tool_choice.type"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"maybe"}})", "thinking.type"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"mcp_servers":[{}]})", "mcp_servers"},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"json_schema"}}})",
       "output_config.format"},
      {R"([1,2])", ""},
  };
  for (const Case& c : cases) {
    ApiError e = parse_err(OJ::parse(c.body));
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
    EXPECT_EQ(e.message.find("function.parameters"), std::string::npos) << e.message;
  }
  // Errors raised by the shared chat code come back with Anthropic names.
  OJ body = OJ::parse(R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}],
    "tool_choice":{"type":"tool","name":"nope"}})");
  body["tools"] = OJ::array({weather_tool()});
  AnthropicRequest r = parse_ok(body);
  ChatOutputPlan plan;
  auto e = plan_chat_output({chat::ToolCallFormat::kGlm45, chat::ReasoningFormat::kGlm45}, r.openai_body,
                            &r.chat.inputs, &plan);
  ASSERT_TRUE(e);
  const ApiError named = anthropic_field_names(*e);
  EXPECT_EQ(named.param, "tool_choice.name");
  EXPECT_NE(named.message.find("'tool_choice.name'"), std::string::npos) << named.message;
}

TEST(AnthropicRequest, MutatedBodiesNeverThrow) {
  const std::string seed = R"({"model":"m","max_tokens":8,"system":[{"type":"text","text":"s"}],"messages":[
    {"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":[{"type":"tool_use",
    "id":"t","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t",
    "content":"r"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},
    "stop_sequences":["x"],"thinking":{"type":"enabled","budget_tokens":1024}})";
  std::mt19937 rng(7);
  const char* tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "0", "-1", "\"\"", "[]", "{}", "true"};
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = seed;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
      const size_t pos = rng() % s.size();
      if (rng() % 2) s.erase(pos, 1 + rng() % 6);
      else s.insert(pos, tokens[rng() % (sizeof(tokens) / sizeof(tokens[0]))]);
    }
    OJ body = OJ::parse(s, nullptr, false);
    if (body.is_discarded()) continue;
    ++parsed;
    AnthropicRequest r;
    std::optional<ApiError> e;
    ASSERT_NO_THROW(e = parse_anthropic_request(body, &r)) << s;
    if (e) {
      EXPECT_EQ(e->http_status, 400) << s;
      EXPECT_FALSE(e->message.empty()) << s;
    }
  }
  EXPECT_GT(parsed, 100);
}

// ---- responses ----

ChatOutputPlan glm_plan(bool with_tools) {
  OJ body = OJ::parse(R"({"max_tokens":64,"messages":[{"role":"user","content":"hi"}]})");
  if (with_tools) body["tools"] = OJ::array({weather_tool()});
  AnthropicRequest r = parse_ok(body);
  ChatOutputPlan plan;
  EXPECT_FALSE(plan_chat_output({chat::ToolCallFormat::kGlm45, chat::ReasoningFormat::kGlm45}, r.openai_body,
                                &r.chat.inputs, &plan));
  GenerationOptions gen;
  EXPECT_FALSE(apply_prompt(&plan, "<|user|>\nhi<|assistant|>", &gen));
  return plan;
}

const std::string kGlmOutput =
    "\n<think>The user wants weather.</think>\nLet me look that up.\n<tool_call>get_weather\n<arg_key>city</arg_key>"
    "\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";

// Feeds `text` in pieces of `chunk` bytes (0: one piece) and returns the events and the finish reason.
std::vector<OJ> run_output(const ChatOutputPlan& plan, const std::string& text, size_t chunk, AnthropicContent* content,
                           std::string* finish) {
  ChoiceOutput out(plan, nullptr);
  std::vector<OJ> events;
  auto take = [&](const ChoiceOutput::Delta& d) {
    for (OJ& e : content->add(d)) events.push_back(std::move(e));
  };
  if (chunk == 0) chunk = text.size();
  for (size_t i = 0; i < text.size(); i += chunk) take(out.feed(text.substr(i, chunk)));
  take(out.finish());
  for (OJ& e : content->close()) events.push_back(std::move(e));
  *finish = out.finish_reason("stop");
  return events;
}

TEST(AnthropicResponse, ThinkingTextAndToolUseBlocks) {
  AnthropicContent content;
  std::string finish;
  run_output(glm_plan(true), kGlmOutput, 0, &content, &finish);
  const OJ& b = content.blocks();
  ASSERT_EQ(b.size(), 3u) << b.dump();
  EXPECT_EQ(b[0], OJ::parse(R"({"type":"thinking","thinking":"The user wants weather.","signature":""})"));
  EXPECT_EQ(b[1]["type"], "text");
  EXPECT_EQ(b[1]["text"].get<std::string>().find("Let me look that up."), 0u) << b[1].dump();
  EXPECT_EQ(b[2]["type"], "tool_use");
  EXPECT_EQ(b[2]["name"], "get_weather");
  EXPECT_EQ(b[2]["input"], OJ::parse(R"({"city":"Paris","days":3})"));
  EXPECT_EQ(b[2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_TRUE(content.has_tool_use());
  const AnthropicStop stop = anthropic_stop(finish, "");
  EXPECT_EQ(stop.reason, "tool_use");
  UsageTotals u{100, 20, 64};
  const OJ msg = anthropic_message("msg_x", "m", b, stop, u);
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["stop_reason"], "tool_use");
  EXPECT_TRUE(msg["stop_sequence"].is_null());
  EXPECT_EQ(msg["usage"], OJ::parse(R"({"input_tokens":36,"cache_creation_input_tokens":0,
    "cache_read_input_tokens":64,"output_tokens":20})"));
}

// Replays stream events as a client does (the SDK's accumulation) and returns the content.
OJ accumulate(const std::vector<OJ>& events) {
  OJ blocks = OJ::array();
  std::vector<std::string> json(16);
  int open = -1;
  for (const OJ& e : events) {
    const std::string t = e["type"];
    if (t == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block starts while another is open";
      EXPECT_EQ(e["index"], static_cast<int>(blocks.size()));
      open = e["index"].get<int>();
      blocks.push_back(e["content_block"]);
    } else if (t == "content_block_delta") {
      EXPECT_EQ(e["index"], open);
      OJ& b = blocks[open];
      const OJ& d = e["delta"];
      if (d["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      else if (d["type"] == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      else if (d["type"] == "input_json_delta") json[open] += d["partial_json"].get<std::string>();
      else ADD_FAILURE() << "unknown delta " << d.dump();
    } else if (t == "content_block_stop") {
      EXPECT_EQ(e["index"], open);
      if (blocks[open]["type"] == "tool_use") blocks[open]["input"] = OJ::parse(json[open]);
      open = -1;
    } else {
      ADD_FAILURE() << "unexpected event " << e.dump();
    }
  }
  EXPECT_EQ(open, -1) << "every block is closed";
  return blocks;
}

TEST(AnthropicResponse, StreamedEventsRebuildTheSameBlocksAtEveryChunkSize) {
  const ChatOutputPlan plan = glm_plan(true);
  AnthropicContent whole;
  std::string finish_whole;
  run_output(plan, kGlmOutput, 0, &whole, &finish_whole);
  for (size_t chunk : {1, 2, 3, 5, 7, 16, 64}) {
    AnthropicContent content;
    std::string finish;
    const std::vector<OJ> events = run_output(plan, kGlmOutput, chunk, &content, &finish);
    OJ rebuilt = accumulate(events);
    OJ expected = whole.blocks();
    ASSERT_EQ(rebuilt.size(), expected.size()) << "chunk " << chunk;
    for (size_t i = 0; i < expected.size(); ++i) {
      if (expected[i]["type"] == "tool_use") {  // ids are random per call
        rebuilt[i].erase("id");
        expected[i].erase("id");
      }
      EXPECT_EQ(rebuilt[i], expected[i]) << "chunk " << chunk;
    }
    OJ own = content.blocks();
    own[2].erase("id");
    EXPECT_EQ(own, expected) << "chunk " << chunk;
    EXPECT_EQ(finish, finish_whole);
  }
}

TEST(AnthropicResponse, StopReasonsUsageAndEvents) {
  EXPECT_EQ(anthropic_stop("length", "").reason, "max_tokens");
  EXPECT_EQ(anthropic_stop("stop", "").reason, "end_turn");
  const AnthropicStop s = anthropic_stop("stop", "END");
  EXPECT_EQ(s.reason, "stop_sequence");
  EXPECT_EQ(s.sequence, "END");
  EXPECT_EQ(anthropic_stop("tool_calls", "").reason, "tool_use");

  const UsageTotals u{12, 0, 0};
  const OJ start = message_start_event("msg_1", "m", u);
  EXPECT_EQ(start["type"], "message_start");
  EXPECT_EQ(start["message"]["content"], OJ::array());
  EXPECT_TRUE(start["message"]["stop_reason"].is_null());
  EXPECT_EQ(start["message"]["usage"]["input_tokens"], 12);
  const OJ delta = message_delta_event(s, UsageTotals{12, 5, 4});
  EXPECT_EQ(delta["delta"], OJ::parse(R"({"stop_reason":"stop_sequence","stop_sequence":"END"})"));
  EXPECT_EQ(delta["usage"]["output_tokens"], 5);
  EXPECT_EQ(delta["usage"]["input_tokens"], 8);
  EXPECT_EQ(delta["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(sse_event(OJ{{"type", "ping"}}), "event: ping\ndata: {\"type\":\"ping\"}\n\n");

  // Plain text (no parser): one text block; empty output: no block at all.
  AnthropicContent c;
  ChoiceOutput::Delta d;
  d.content = "Hello";
  auto ev = c.add(d);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0], OJ::parse(R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"));
  EXPECT_EQ(ev[1], OJ::parse(R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}})"));
  d.content = " world";
  ASSERT_EQ(c.add(d).size(), 1u);
  EXPECT_EQ(c.blocks(), OJ::parse(R"([{"type":"text","text":"Hello world"}])"));
  EXPECT_EQ(c.close(), std::vector<OJ>{OJ::parse(R"({"type":"content_block_stop","index":0})")});
  EXPECT_TRUE(c.close().empty());
  AnthropicContent empty;
  EXPECT_TRUE(empty.add(ChoiceOutput::Delta{}).empty());
  EXPECT_TRUE(empty.close().empty());
  EXPECT_EQ(empty.blocks(), OJ::array());
}

TEST(AnthropicResponse, ErrorShapeAndStatus) {
  struct Case {
    ApiError e;
    int status;
    const char* type;
  };
  const Case cases[] = {{bad_request("bad"), 400, "invalid_request_error"},
                        {unauthorized(), 401, "authentication_error"},
                        {model_not_found("x"), 404, "not_found_error"},
                        {payload_too_large(10), 413, "request_too_large"},
                        {overloaded("busy"), 529, "overloaded_error"},
                        {internal("bug"), 500, "api_error"}};
  for (const Case& c : cases) {
    EXPECT_EQ(anthropic_status(c.e), c.status);
    const OJ j = anthropic_error_json(c.e);
    EXPECT_EQ(j["type"], "error");
    EXPECT_EQ(j["error"]["type"], c.type);
    EXPECT_EQ(j["error"]["message"], c.e.message);
    EXPECT_EQ(j.size(), 2u);
  }
}

}  // namespace
}  // namespace mxserve::server
