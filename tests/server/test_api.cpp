// Server API tests over real HTTP: chat and completions, streaming and not, usage = tokenizer counts,
// stop strings across token boundaries, n > 1, seeded determinism, logprobs, models, health, metrics.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "server_fixture.h"
#include "tokenizer/chat_template.h"

namespace mxserve::server::testing {
namespace {

using json = nlohmann::json;

json chat_body(int max_tokens, json extra = json::object()) {
  json b = {{"model", "tiny"},
            {"messages", {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Tell me the news."}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"ignore_eos", true}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

int64_t chat_prompt_tokens(const TestServer& s, const json& messages) {
  auto tmpl = tokenizer::ChatTemplate::parse(s.tokenizer().chat_template());
  EXPECT_TRUE(tmpl.is_ok());
  tokenizer::ChatInputs in;
  in.messages = tokenizer::OrderedJson::parse(messages.dump());
  in.add_generation_prompt = true;
  auto text = tmpl->render_chat(in, s.tokenizer().config());
  EXPECT_TRUE(text.is_ok());
  return static_cast<int64_t>(s.tokenizer().encode(*text, false)->size());
}

// Concatenated content of a chat SSE stream; checks the chunk protocol along the way.
std::string collect_stream(const SseResult& r, const std::string& object, json* usage = nullptr,
                           std::string* finish = nullptr) {
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(r.events.empty());
  EXPECT_EQ(r.events.back(), "[DONE]");
  std::string text;
  bool first = true;
  for (size_t i = 0; i + 1 < r.events.size(); ++i) {
    json c = json::parse(r.events[i]);
    EXPECT_EQ(c["object"], object);
    if (c["choices"].empty()) {
      EXPECT_TRUE(c.contains("usage"));
      if (usage) *usage = c["usage"];
      continue;
    }
    const json& ch = c["choices"][0];
    if (object == "chat.completion.chunk") {
      if (first) {
        EXPECT_EQ(ch["delta"]["role"], "assistant") << "the first chunk carries the role";
      } else {
        EXPECT_FALSE(ch["delta"].contains("role"));
      }
      if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    } else {
      text += ch["text"].get<std::string>();
    }
    if (!ch["finish_reason"].is_null() && finish) *finish = ch["finish_reason"];
    first = false;
  }
  return text;
}

TEST(ServerApi, HealthModelsMetrics) {
  TestServer s;
  EXPECT_EQ(s.get("/health").status, 200);
  auto m = s.get("/v1/models");
  ASSERT_EQ(m.status, 200);
  json j = json::parse(m.body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["max_model_len"], 512);
  auto metrics = s.get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  for (const char* name : {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                           "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                           "vllm:generation_tokens_total", "vllm:request_success_total", "vllm:num_preemptions_total",
                           "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                           "vllm:e2e_request_latency_seconds_bucket"})
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  // The ITL policy (docs/scheduling.md): serve's default target, and its cost model fed by every step
  // (stats are published just after a step's events: poll).
  EXPECT_EQ(s.metric("mxserve:itl_target_seconds"), 0.05);
  ASSERT_EQ(s.post("/v1/completions", R"({"prompt":"x","max_tokens":2})").status, 200);
  for (int i = 0; i < 500 && s.metric("mxserve:step_cost_samples_total") < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(s.metric("mxserve:step_cost_samples_total"), 2);
  EXPECT_GE(s.metric("mxserve:step_cost_coefficient_seconds{model_name=\"tiny\",term=\"base\"}"), 0);
}

TEST(ServerApi, ChatNonStreamingUsageMatchesTokenizer) {
  TestServer s;
  json body = chat_body(12);
  auto r = s.post_json("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], chat_prompt_tokens(s, body["messages"]));
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 12);
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  // The same prompt again is served (partly) from the prefix cache.
  auto r2 = s.post_json("/v1/chat/completions", body);
  json j2 = json::parse(r2.body);
  EXPECT_GT(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  EXPECT_EQ(j2["choices"][0]["message"]["content"], j["choices"][0]["message"]["content"]) << "greedy is deterministic";
}

TEST(ServerApi, ChatStreamingMatchesNonStreaming) {
  TestServer s;
  auto full = json::parse(s.post_json("/v1/chat/completions", chat_body(10)).body);
  json usage;
  std::string finish;
  auto r = s.stream("/v1/chat/completions",
                    chat_body(10, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  const std::string text = collect_stream(r, "chat.completion.chunk", &usage, &finish);
  EXPECT_EQ(text, full["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 10);
  EXPECT_EQ(usage["prompt_tokens"], full["usage"]["prompt_tokens"]);
  EXPECT_TRUE(usage["prompt_tokens_details"].contains("cached_tokens"));
  // Without include_usage there is no usage chunk.
  auto r2 = s.stream("/v1/chat/completions", chat_body(3, {{"stream", true}}));
  for (const auto& e : r2.events) {
    if (e != "[DONE]") {
      EXPECT_FALSE(json::parse(e)["choices"].empty());
    }
  }
}

TEST(ServerApi, CompletionsPromptForms) {
  TestServer s;
  const std::string prompt = "the weather in the north is";
  auto ids = *s.tokenizer().encode(prompt, true);
  auto a = s.post_json("/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(a.status, 200) << a.body;
  json ja = json::parse(a.body);
  EXPECT_EQ(ja["object"], "text_completion");
  EXPECT_EQ(ja["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(ja["usage"]["completion_tokens"], 5);
  auto b = s.post_json("/v1/completions", {{"prompt", ids}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}});
  json jb = json::parse(b.body);
  EXPECT_EQ(jb["choices"][0]["text"], ja["choices"][0]["text"]) << "token ids and text give the same completion";
  auto c = s.post_json("/v1/completions",
                       {{"prompt", {prompt, "another prompt"}}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}});
  json jc = json::parse(c.body);
  ASSERT_EQ(jc["choices"].size(), 2u);
  EXPECT_EQ(jc["choices"][0]["text"], ja["choices"][0]["text"].get<std::string>().substr(0, jc["choices"][0]["text"].get<std::string>().size()));
  EXPECT_EQ(jc["usage"]["prompt_tokens"], ids.size() + s.tokenizer().encode("another prompt", true)->size());
  EXPECT_EQ(jc["usage"]["completion_tokens"], 8);
  // Default max_tokens for completions is 16.
  auto d = s.post_json("/v1/completions", {{"prompt", prompt}, {"ignore_eos", true}});
  EXPECT_EQ(json::parse(d.body)["usage"]["completion_tokens"], 16);
  // Streaming completions.
  auto r = s.stream("/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true},
                                        {"stream", true}});
  EXPECT_EQ(collect_stream(r, "text_completion"), ja["choices"][0]["text"]);
}

// logit_bias (vLLM / OpenAI: token ids as strings, clamped to [-100, 100]) and repetition_penalty (> 0)
// reach the sampler: a +100 bias makes greedy decoding pick that token every step; a huge repetition
// penalty changes a greedy continuation that repeats tokens.
TEST(ServerApi, LogitBiasAndRepetitionPenalty) {
  TestServer s;
  const std::string prompt = "the weather in the north is";
  const int32_t the = s.tokenizer().encode(" the", false)->at(0);
  const std::string the_text = s.tokenizer().decode(std::vector<int32_t>{the}, false);
  json base = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
  json biased = base;
  biased["logit_bias"] = {{std::to_string(the), 1000}};  // clamped to 100
  auto r = s.post_json("/v1/completions", biased);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string six;
  for (int i = 0; i < 6; ++i) six += the_text;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], six);

  json long_base = base;
  long_base["max_tokens"] = 32;
  auto plain = s.post_json("/v1/completions", long_base);
  ASSERT_EQ(plain.status, 200) << plain.body;
  json penalized = long_base;
  penalized["repetition_penalty"] = 1e6;
  auto pen = s.post_json("/v1/completions", penalized);
  ASSERT_EQ(pen.status, 200) << pen.body;
  EXPECT_NE(json::parse(pen.body)["choices"][0]["text"], json::parse(plain.body)["choices"][0]["text"]);
  penalized["repetition_penalty"] = 1.0;
  EXPECT_EQ(json::parse(s.post_json("/v1/completions", penalized).body)["choices"][0]["text"],
            json::parse(plain.body)["choices"][0]["text"]) << "1.0 is off";
}

TEST(ServerApi, StopStringAcrossTokenBoundary) {
  TestServer s;
  const json base = {{"prompt", "the other one"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 0}};
  json full = json::parse(s.post_json("/v1/completions", base).body);
  const std::string text = full["choices"][0]["text"];
  const json tokens = full["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 24u);
  // A stop string made of the last byte of one token and the first of the next (so it spans a boundary).
  auto plain = [](const std::string& t) {
    if (t.empty() || t.rfind("<|", 0) == 0) return false;
    for (unsigned char c : t)
      if (c < 0x20 || c > 0x7e) return false;
    return true;
  };
  int at = -1;
  for (int i = 0; i + 1 < 24 && at < 0; ++i)
    if (plain(tokens[i]) && plain(tokens[i + 1])) at = i;
  ASSERT_GE(at, 0) << "no two adjacent plain tokens in " << tokens.dump();
  const std::string ta = tokens[at], tb = tokens[at + 1];
  const std::string stop = ta.substr(ta.size() - 1) + tb.substr(0, 1);
  const size_t first = text.find(stop);
  ASSERT_NE(first, std::string::npos);
  json with_stop = base;
  with_stop["stop"] = stop;
  json j = json::parse(s.post_json("/v1/completions", with_stop).body);
  EXPECT_EQ(j["choices"][0]["text"], text.substr(0, first));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 24);
  // Streaming gives the same text, and never emits the stop string.
  json st = with_stop;
  st["stream"] = true;
  st.erase("logprobs");
  std::string finish;
  EXPECT_EQ(collect_stream(s.stream("/v1/completions", st), "text_completion", nullptr, &finish), text.substr(0, first));
  EXPECT_EQ(finish, "stop");
  // include_stop_str_in_output keeps it.
  with_stop["include_stop_str_in_output"] = true;
  j = json::parse(s.post_json("/v1/completions", with_stop).body);
  EXPECT_EQ(j["choices"][0]["text"], text.substr(0, first) + stop);
}

TEST(ServerApi, MultipleChoicesAndSeededDeterminism) {
  TestServer s;
  json body = chat_body(8, {{"n", 3}, {"temperature", 1.0}, {"seed", 1234}});
  auto a = json::parse(s.post_json("/v1/chat/completions", body).body);
  ASSERT_EQ(a["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a["choices"][i]["index"], i);
  EXPECT_EQ(a["usage"]["completion_tokens"], 24);
  auto b = json::parse(s.post_json("/v1/chat/completions", body).body);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a["choices"][i]["message"]["content"], b["choices"][i]["message"]["content"]);
  EXPECT_FALSE(a["choices"][0]["message"]["content"] == a["choices"][1]["message"]["content"] &&
               a["choices"][1]["message"]["content"] == a["choices"][2]["message"]["content"])
      << "choices of one request use different seeds";
  // Streaming n = 2: both indexes appear, each with its own role chunk.
  auto r = s.stream("/v1/chat/completions", chat_body(4, {{"n", 2}, {"stream", true}}));
  int roles = 0;
  for (const auto& e : r.events)
    if (e != "[DONE]") {
      const json c = json::parse(e);
      if (!c["choices"].empty() && c["choices"][0]["delta"].contains("role")) ++roles;
    }
  EXPECT_EQ(roles, 2);
}

TEST(ServerApi, LogprobsToolsAndIgnoredFields) {
  TestServer s;
  auto r = s.post_json("/v1/chat/completions", chat_body(4, {{"logprobs", true}, {"top_logprobs", 3}}));
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = json::parse(r.body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 3u);
  EXPECT_LE(lp[0]["logprob"].get<double>(), 0.0);
  json tools = json::array({{{"type", "function"},
                             {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  auto t = s.post_json("/v1/chat/completions", chat_body(2, {{"tools", tools}, {"tool_choice", "auto"}}));
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_GT(json::parse(t.body)["usage"]["prompt_tokens"].get<int>(),
            json::parse(s.post_json("/v1/chat/completions", chat_body(2)).body)["usage"]["prompt_tokens"].get<int>())
      << "tools are rendered into the prompt";
  auto u = s.post_json("/v1/chat/completions", chat_body(2, {{"some_future_field", 1}, {"user", "me"}}));
  EXPECT_EQ(u.status, 200) << "harmless unknown fields are accepted";
}

}  // namespace
}  // namespace mxserve::server::testing
