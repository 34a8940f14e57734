// End to end through the HTTP server, engine, detokenizer and chat output parsers, with the EchoServer
// (echo_server.h: the model writes back the last user message, so each test chooses the model's output):
// reasoning_content and tool_calls in chat responses, streaming == non-streaming, no tag text in content,
// tool_choice none / required / named (a tool-call grammar: a model that wants free text or an invalid call
// is forced into a valid one), thinking on/off, a turn cut inside <think>, malformed
// calls returned as content and counted in /metrics, and the 400s for bad tools / tool_choice.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "echo_server.h"
#include "http_client.h"

namespace mxserve::server::testing {
namespace {

using json = nlohmann::ordered_json;

const json& weather_tools() {
  static const json t = json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}])");
  return t;
}

json chat_body(const std::string& echo, json extra = json::object()) {
  json b = {{"model", "echo"}, {"messages", json::array({{{"role", "user"}, {"content", echo}}})}, {"max_tokens", 400}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

HttpResult post(const EchoServer& s, const json& body) {
  return http_request("POST", s.url("/v1/chat/completions"), body.dump(), {"Content-Type: application/json"});
}

// The assembled message of a streamed choice 0, in the non-streaming message's shape.
struct Streamed {
  json message = json::object();
  std::string finish_reason;
  std::vector<std::string> content_pieces;
};

Streamed stream(const EchoServer& s, json body) {
  body["stream"] = true;
  SseResult r = http_stream(s.url("/v1/chat/completions"), body.dump(), {"Content-Type: application/json"});
  EXPECT_EQ(r.status, 200) << r.raw;
  Streamed out;
  std::string content, reasoning;
  json calls = json::array();
  for (const std::string& e : r.events) {
    if (e == "[DONE]") break;
    json c = json::parse(e);
    if (c["choices"].empty()) continue;
    const json& ch = c["choices"][0];
    const json& d = ch["delta"];
    if (d.contains("content") && d["content"].is_string()) {
      content += d["content"].get<std::string>();
      out.content_pieces.push_back(d["content"].get<std::string>());
    }
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const json& tc : d["tool_calls"]) {
        const size_t i = tc["index"].get<size_t>();
        if (calls.size() <= i) calls.push_back({{"id", tc["id"]}, {"type", tc["type"]},
                                                {"function", {{"name", ""}, {"arguments", ""}}}});
        json& f = calls[i]["function"];
        if (tc["function"].contains("name")) f["name"] = f["name"].get<std::string>() + tc["function"]["name"].get<std::string>();
        if (tc["function"].contains("arguments"))
          f["arguments"] = f["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
      }
    }
    if (!ch["finish_reason"].is_null()) out.finish_reason = ch["finish_reason"];
  }
  out.message["content"] = content.empty() ? json() : json(content);
  if (!reasoning.empty()) out.message["reasoning_content"] = reasoning;
  if (!calls.empty()) out.message["tool_calls"] = calls;
  return out;
}

// Checks streaming against non-streaming (ids aside) and returns the non-streaming choice.
json both_ways(const EchoServer& s, const json& body) {
  HttpResult r = post(s, body);
  EXPECT_EQ(r.status, 200) << r.body;
  json choice = json::parse(r.body)["choices"][0];
  Streamed st = stream(s, body);
  json a = choice["message"], b = st.message;
  a.erase("role");
  for (json* m : {&a, &b})
    if (m->contains("tool_calls"))
      for (json& c : (*m)["tool_calls"]) {
        EXPECT_TRUE(c["id"].get<std::string>().starts_with("call_")) << c.dump();
        c.erase("id");
      }
  EXPECT_EQ(a, b) << "non-streaming " << choice.dump() << "\nstreaming " << st.message.dump();
  EXPECT_EQ(choice["finish_reason"], st.finish_reason);
  for (const std::string& piece : st.content_pieces) {
    for (const char* tag : {"<think>", "</think>", "<tool_call>", "<arg_key>"}) {
      const bool in_final_content = choice["message"]["content"].is_string() &&
                                    choice["message"]["content"].get<std::string>().find(tag) != std::string::npos;
      if (!in_final_content) {  // tags only appear in content when the final content has them (malformed calls)
        EXPECT_EQ(piece.find(tag), std::string::npos) << "tag text leaked into a streamed content delta: " << piece;
      }
    }
  }
  return choice;
}

EchoServerOptions echo_options(const std::string& template_name) {
  EchoServerOptions o;
  o.template_name = template_name;
  return o;
}

double metric(const EchoServer& s, const std::string& series) {
  HttpResult r = http_request("GET", s.url("/metrics"), "", {});
  const size_t at = r.body.find("\n" + series);
  if (at == std::string::npos) return -1;
  const size_t sp = r.body.find(' ', at + 1);
  return std::stod(r.body.substr(sp + 1, r.body.find('\n', sp) - sp - 1));
}

TEST(ToolCallsE2E, Glm45ReasoningContentAndCall) {
  EchoServer s(echo_options("GLM-4.5-Air"));
  const std::string out =
      "<think>The user wants the weather.</think>\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
  json c = both_ways(s, chat_body(out, {{"tools", weather_tools()}}));
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["reasoning_content"], "The user wants the weather.");
  EXPECT_EQ(c["message"]["content"], "Let me check.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << c.dump();
  EXPECT_EQ(c["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris","days":2})");
}

TEST(ToolCallsE2E, Glm51StartsInsideThinkAndMakesTwoCalls) {
  EchoServer s(echo_options("GLM-5.1"));
  const std::string out =
      "<think>Two calls.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
      "<tool_call>get_time</tool_call>";
  json c = both_ways(s, chat_body(out, {{"tools", weather_tools()}}));
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["reasoning_content"], "Two calls.");
  EXPECT_TRUE(c["message"]["content"].is_null()) << c.dump();
  ASSERT_EQ(c["message"]["tool_calls"].size(), 2u) << c.dump();
  EXPECT_EQ(c["message"]["tool_calls"][1]["function"]["name"], "get_time");
  EXPECT_EQ(c["message"]["tool_calls"][1]["function"]["arguments"], "{}");
  EXPECT_NE(c["message"]["tool_calls"][0]["id"], c["message"]["tool_calls"][1]["id"]);
}

TEST(ToolCallsE2E, ThinkingOffAndCutInsideThink) {
  EchoServer s(echo_options("GLM-5.1"));
  for (const char* key : {"enable_thinking", "thinking"}) {
    json c = both_ways(s, chat_body("</think>Just an answer.", {{"chat_template_kwargs", {{key, false}}}}));
    EXPECT_EQ(c["message"]["content"], "Just an answer.") << key;
    EXPECT_FALSE(c["message"].contains("reasoning_content")) << c.dump();
    EXPECT_EQ(c["finish_reason"], "stop");
  }
  json cut = both_ways(s, chat_body("<think>a long chain of thought that goes on</think>answer", {{"max_tokens", 4}}));
  EXPECT_EQ(cut["finish_reason"], "length");
  EXPECT_TRUE(cut["message"]["content"].is_null()) << cut.dump();
  ASSERT_TRUE(cut["message"].contains("reasoning_content")) << cut.dump();
  EXPECT_TRUE(std::string("a long chain of thought").starts_with(cut["message"]["reasoning_content"].get<std::string>()));
}

// "" when the message is only tool calls, each naming a request tool with arguments that satisfy its
// schema (the schemas here use only type / required / enum, checked by hand); else what is wrong.
std::string call_problem(const json& message, const json& tools) {
  if (!message["content"].is_null()) return "content " + message["content"].dump();
  if (!message.contains("tool_calls") || message["tool_calls"].empty()) return "no tool_calls";
  for (const json& c : message["tool_calls"]) {
    const json* params = nullptr;
    for (const json& t : tools)
      if (t["function"]["name"] == c["function"]["name"]) params = &t["function"]["parameters"];
    if (!params) return "unknown function in " + c.dump();
    const json args = json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
    if (!args.is_object()) return "arguments not an object: " + c.dump();
    for (const json& r : params->value("required", json::array()))
      if (!args.contains(r)) return "missing " + r.dump() + " in " + c.dump();
    for (const auto& [k, v] : args.items()) {
      if (!(*params)["properties"].contains(k)) return "unknown key " + k + " in " + c.dump();
      const json& sc = (*params)["properties"][k];
      if ((sc["type"] == "string" && !v.is_string()) || (sc["type"] == "integer" && !v.is_number_integer()))
        return "ill-typed " + k + " in " + c.dump();
    }
  }
  return "";
}

TEST(ToolCallsE2E, ToolChoiceNamedAndRequiredFollowTheModelWhenItIsValid) {
  EchoServer s51(echo_options("GLM-5.1"));  // the prompt opens <think>: the grammar starts inside it
  json named = both_ways(s51, chat_body("<think>Rome.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>",
                                        {{"tools", weather_tools()},
                                         {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}));
  EXPECT_EQ(named["finish_reason"], "tool_calls");
  EXPECT_EQ(named["message"]["reasoning_content"], "Rome.");
  ASSERT_EQ(named["message"]["tool_calls"].size(), 1u) << named.dump();
  EXPECT_EQ(named["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Rome"})");

  EchoServer s45(echo_options("GLM-4.5-Air"));  // thinking on: an optional think block, then calls
  json required = both_ways(s45, chat_body("<think></think>\n<tool_call>get_time\n</tool_call>\n<tool_call>get_weather\n"
                                           "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>city</arg_key>\n"
                                           "<arg_value>Oslo</arg_value>\n</tool_call>",
                                           {{"tools", weather_tools()}, {"tool_choice", "required"}}));
  EXPECT_EQ(required["finish_reason"], "tool_calls");
  ASSERT_EQ(required["message"]["tool_calls"].size(), 2u) << required.dump();
  EXPECT_EQ(required["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(required["message"]["tool_calls"][1]["function"]["arguments"], R"({"days":2,"city":"Oslo"})");
  EXPECT_TRUE(required["message"]["content"].is_null());
  // Thinking off: the template closes the think block; the calls follow.
  json off = both_ways(s45, chat_body("\n<think></think>\n<tool_call>get_time\n</tool_call>", {{"tools", weather_tools()},
                                      {"tool_choice", "required"}, {"chat_template_kwargs", {{"enable_thinking", false}}}}));
  ASSERT_EQ(off["message"]["tool_calls"].size(), 1u) << off.dump();
}

TEST(ToolCallsE2E, ToolChoiceForcesAValidCallOnAModelThatWantsSomethingElse) {
  EchoServer s45(echo_options("GLM-4.5-Air"));
  EchoServer s51(echo_options("GLM-5.1"));
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  struct Case {
    EchoServer* server;
    std::string echo;  // what the model wants to write; with tool_choice auto it is not a clean set of valid calls
    json tool_choice;
    std::string expect_name;
  };
  const std::vector<Case> cases = {
      {&s45, "I'd rather chat about the weather.", "required", ""},
      {&s51, "<think>hm</think>Sure! Let me check.", named, "get_weather"},
      {&s51, "<think>hm</think><tool_call>get_weather<arg_key>town</arg_key><arg_value>Rome</arg_value></tool_call>",
       named, "get_weather"},  // an unknown key
      {&s45, "<think>ok</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n<arg_key>days</arg_key>\n"
             "<arg_value>three</arg_value>\n</tool_call>", "required", "get_weather"},  // an ill-typed value
      {&s51, "<think>x</think><tool_call>get_news</tool_call>", "required", ""},          // an unknown function
      {&s51, "<think>x</think><tool_call>get_time</tool_call>Done, anything else?", "required", "get_time"},
      {&s51, "<think>x</think><tool_call>get_weather</tool_call>", named, "get_weather"},  // a required key missing
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.echo);
    json free = both_ways(*c.server, chat_body(c.echo, {{"tools", weather_tools()}}));
    EXPECT_NE(call_problem(free["message"], weather_tools()), "") << "auto: " << free.dump();
    json r = both_ways(*c.server, chat_body(c.echo, {{"tools", weather_tools()}, {"tool_choice", c.tool_choice}}));
    EXPECT_EQ(r["finish_reason"], "tool_calls") << r.dump();
    EXPECT_EQ(call_problem(r["message"], weather_tools()), "") << r.dump();
    if (!c.expect_name.empty()) EXPECT_EQ(r["message"]["tool_calls"][0]["function"]["name"], c.expect_name) << r.dump();
    if (c.tool_choice.is_object()) EXPECT_EQ(r["message"]["tool_calls"].size(), 1u) << r.dump();
  }
}

TEST(ToolCallsE2E, ToolChoiceGrammarConflictsAre400) {
  EchoServer s(echo_options("GLM-5.1"));
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"tools", weather_tools()}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
       "tool_choice"},
      {{{"tools", weather_tools()}, {"tool_choice", "required"}, {"ignore_eos", true}}, "ignore_eos"},
      {{{"tools", weather_tools()}, {"tool_choice", "required"}, {"parallel_tool_calls", "no"}}, "parallel_tool_calls"},
      {{{"tools", json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
          "properties":{"x":{"type":"integer","allOf":[{},{}]}}}}}])")}, {"tool_choice", "required"}},
       "tools"},
  };
  for (const auto& [extra, param] : cases) {
    HttpResult r = post(s, chat_body("hi", extra));
    EXPECT_EQ(r.status, 400) << extra.dump() << " -> " << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_EQ(e["error"]["param"], param) << r.body;
  }
  // parallel_tool_calls false: exactly one call although the model wants two.
  json one = both_ways(s, chat_body("<think>x</think><tool_call>get_time</tool_call><tool_call>get_time</tool_call>",
                                    {{"tools", weather_tools()}, {"tool_choice", "required"}, {"parallel_tool_calls", false}}));
  EXPECT_EQ(one["message"]["tool_calls"].size(), 1u) << one.dump();
}

TEST(ToolCallsE2E, ToolChoiceNoneLeavesCallsAsText) {
  EchoServer s(echo_options("GLM-5.1"));
  json c = both_ways(s, chat_body("<think>r</think>Text <tool_call>get_time</tool_call>",
                                  {{"tools", weather_tools()}, {"tool_choice", "none"}}));
  EXPECT_EQ(c["message"]["reasoning_content"], "r");
  EXPECT_EQ(c["message"]["content"], "Text <tool_call>get_time</tool_call>");
  EXPECT_FALSE(c["message"].contains("tool_calls"));
  EXPECT_EQ(c["finish_reason"], "stop");
}

TEST(ToolCallsE2E, MalformedCallIsContentAndCounted) {
  EchoServer s(echo_options("GLM-5.1"));
  const double before = metric(s, "mxserve:tool_call_parse_failures_total");
  ASSERT_GE(before, 0);
  const std::string bad = "Here: <tool_call>get_weather{\"city\": 1}</tool_call>";
  json c = both_ways(s, chat_body("<think>x</think>" + bad, {{"tools", weather_tools()}}));
  EXPECT_EQ(c["message"]["content"], bad);
  EXPECT_FALSE(c["message"].contains("tool_calls"));
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(metric(s, "mxserve:tool_call_parse_failures_total"), before + 2);  // non-streaming + streaming
  // An unclosed call (cut by max_tokens) is counted too, but dropped: no half call, no markup (issue 34).
  json cut = both_ways(s, chat_body("<think>x</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris and more",
                                    {{"tools", weather_tools()}, {"max_tokens", 16}}));
  EXPECT_EQ(cut["finish_reason"], "length");
  EXPECT_TRUE(cut["message"]["content"].is_null()) << cut.dump();
  EXPECT_FALSE(cut["message"].contains("tool_calls")) << cut.dump();
  EXPECT_EQ(metric(s, "mxserve:tool_call_parse_failures_total"), before + 4);
}

TEST(ToolCallsE2E, EarlierToolCallsWithStringArgumentsRender) {
  EchoServer s(echo_options("GLM-4.5-Air"));
  json body = chat_body("");
  body["messages"] = json::parse(R"([
    {"role":"user","content":"weather?"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":1}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"sunny"},
    {"role":"user","content":"<think>ok</think>\nIt is sunny."}])");
  body["tools"] = weather_tools();
  json c = both_ways(s, body);
  EXPECT_EQ(c["message"]["content"], "It is sunny.");
  EXPECT_EQ(c["message"]["reasoning_content"], "ok");
}

TEST(ToolCallsE2E, BadToolsAndToolChoiceAre400NamingTheField) {
  EchoServer s(echo_options("GLM-5.1"));
  struct Case {
    json extra;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"tools", weather_tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
       "tool_choice.function.name"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", weather_tools()}, {"tool_choice", "sometimes"}}, "tool_choice"},
      {{{"tools", json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
          "properties":{"x":{"type":"text"}}}}}])")}},
       "tools[0].function.parameters.properties.x.type"},
      {{{"tools", json::parse(R"([{"type":"function","function":{"name":"bad name"}}])")}}, "tools[0].function.name"},
      {{{"chat_template_kwargs", {{"enable_thinking", "no"}}}}, "chat_template_kwargs.enable_thinking"},
  };
  for (const Case& c : cases) {
    HttpResult r = post(s, chat_body("hi", c.extra));
    EXPECT_EQ(r.status, 400) << c.extra.dump() << " -> " << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_EQ(e["error"]["param"], c.param) << r.body;
  }
}

}  // namespace
}  // namespace mxserve::server::testing
