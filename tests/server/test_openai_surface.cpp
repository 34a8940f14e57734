// The OpenAI / vLLM surface beyond generation (issues 34 and 35): completions echo + logprobs and prompt_logprobs
// in lm-eval-harness's request shape, checked against the model's teacher-forced log-softmax; the developer role;
// /v1/models/{id}; /version; CORS; /tokenize and /detokenize.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "eval/logit_metrics.h"
#include "launch/launch.h"
#include "server/cors.h"
#include "server/serving_model.h"
#include "server_fixture.h"
#include "tokenizer/chat_template.h"

namespace mxserve::server::testing {
namespace {

using json = nlohmann::json;

std::vector<int32_t> encode(const TestServer& s, const std::string& text) {
  auto ids = s.tokenizer().encode(text, false);
  EXPECT_TRUE(ids.is_ok());
  return *ids;
}

// Teacher-forced log-softmax rows of the fixture model (a second copy, outside the server).
std::vector<std::vector<double>> reference_logsoftmax(const std::vector<int32_t>& ids) {
  static std::unique_ptr<launch::LaunchedModel> lm = [] {
    ServingConfig sc;
    sc.model_path = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";
    auto r = launch::launch_model(sc.launch_config());
    if (!r.is_ok()) throw std::runtime_error(r.status().to_string());
    return std::move(*r);
  }();
  auto logits = eval::all_logits(lm->model(), lm->backend(), ids);
  EXPECT_TRUE(logits.is_ok()) << logits.status().to_string();
  const int64_t T = logits->dim(0), V = logits->dim(1);
  std::vector<std::vector<double>> out;
  for (int64_t t = 0; t < T; ++t) out.push_back(eval::log_softmax(logits->data<float>() + t * V, V));
  return out;
}

// lm-eval-harness's local-completions loglikelihood: prompt = context + continuation ids, echo, logprobs 1,
// max_tokens 1, temperature 0; the continuation's logprobs are token_logprobs[ctxlen:-1], greedy when each equals
// the top-1 alternative's value.
struct Loglikelihood {
  double logprob = 0;
  bool is_greedy = true;
};
Loglikelihood harness_parse(const json& choice, size_t ctxlen) {
  Loglikelihood r;
  const json& lp = choice["logprobs"];
  const size_t n = lp["token_logprobs"].size();
  for (size_t i = ctxlen; i + 1 < n; ++i) {
    const double tok = lp["token_logprobs"][i].get<double>();
    r.logprob += tok;
    double best = -1e300;
    for (auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    if (tok != best) r.is_greedy = false;
  }
  return r;
}

TEST(ServerOpenAISurface, EchoLogprobsEqualTeacherForcedLogSoftmax) {
  TestServer s;
  const std::vector<int32_t> ctx = encode(s, "The quick brown fox jumps over the");
  const std::vector<std::string> options = {" lazy dog", " moon", " fence and runs", " the"};
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& o : options) {
    std::vector<int32_t> p = ctx;
    const auto cont = encode(s, o);
    p.insert(p.end(), cont.begin(), cont.end());
    prompts.push_back(p);
  }
  auto r = s.post_json("/v1/completions", {{"model", "tiny"}, {"prompt", prompts}, {"echo", true}, {"logprobs", 1},
                                           {"max_tokens", 1}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), options.size());
  int best_server = -1, best_ref = -1;
  double best_server_lp = -1e300, best_ref_lp = -1e300;
  for (size_t k = 0; k < prompts.size(); ++k) {
    const json& c = j["choices"][k];
    const auto& ids = prompts[k];
    const json& lp = c["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), ids.size() + 1) << "every prompt token, then the generated one";
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    // The echoed text: the ids' text, then the generated token's.
    const std::string prompt_text = s.tokenizer().decode(ids, false);
    EXPECT_EQ(c["text"].get<std::string>().rfind(prompt_text, 0), 0u);
    EXPECT_EQ(lp["text_offset"][0], 0);
    const auto ref = reference_logsoftmax(ids);
    for (size_t i = 1; i < ids.size(); ++i) {
      const double want = ref[i - 1][ids[i]];
      EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), want, 2e-4) << "prompt " << k << " position " << i;
      // top-1 alternative = the teacher-forced argmax
      int32_t arg = 0;
      for (size_t v = 1; v < ref[i - 1].size(); ++v)
        if (ref[i - 1][v] > ref[i - 1][arg]) arg = static_cast<int32_t>(v);
      ASSERT_EQ(lp["top_logprobs"][i].size(), 1u);
      EXPECT_NEAR(lp["top_logprobs"][i].begin().value().get<double>(), ref[i - 1][arg], 2e-4);
    }
    const Loglikelihood ll = harness_parse(c, ctx.size());
    double ref_ll = 0;
    bool ref_greedy = true;
    for (size_t i = ctx.size(); i < ids.size(); ++i) {
      ref_ll += ref[i - 1][ids[i]];
      for (double x : ref[i - 1]) ref_greedy = ref_greedy && x <= ref[i - 1][ids[i]];
    }
    EXPECT_NEAR(ll.logprob, ref_ll, 1e-3) << "option " << k;
    EXPECT_EQ(ll.is_greedy, ref_greedy) << "option " << k;
    if (ll.logprob > best_server_lp) best_server_lp = ll.logprob, best_server = static_cast<int>(k);
    if (ref_ll > best_ref_lp) best_ref_lp = ref_ll, best_ref = static_cast<int>(k);
  }
  EXPECT_EQ(best_server, best_ref) << "the multiple-choice pick";
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(),
            prompts[0].size() + prompts[1].size() + prompts[2].size() + prompts[3].size());
}

TEST(ServerOpenAISurface, EchoMaxTokensZeroAndPromptLogprobs) {
  TestServer s;
  const std::string prompt = "Hello there, general";
  const auto ids_r = s.tokenizer().encode(prompt, true);
  ASSERT_TRUE(ids_r.is_ok());
  const std::vector<int32_t> ids = *ids_r;
  // max_tokens 0: the prompt only (OpenAI's legacy scoring shape).
  auto r = s.post_json("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"echo", true}, {"logprobs", 2},
                                           {"max_tokens", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["text"], prompt);
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["logprobs"]["token_logprobs"].size(), ids.size());
  // Alternatives are keyed by their text (OpenAI's shape): two byte tokens with the same text share a key.
  EXPECT_GE(c["logprobs"]["top_logprobs"][1].size(), 1u);
  EXPECT_LE(c["logprobs"]["top_logprobs"][1].size(), 2u);
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  // max_tokens 0 without echo stays a 400.
  r = s.post_json("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 0}});
  EXPECT_EQ(r.status, 400);

  // vLLM's prompt_logprobs: [null, {id: {logprob, rank, decoded_token}}, ...], the prompt token first.
  r = s.post_json("/v1/completions", {{"model", "tiny"}, {"prompt", ids}, {"prompt_logprobs", 1}, {"max_tokens", 2},
                                      {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  const json& pl = j["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), ids.size());
  EXPECT_TRUE(pl[0].is_null());
  const auto ref = reference_logsoftmax(ids);
  for (size_t i = 1; i < ids.size(); ++i) {
    const std::string key = std::to_string(ids[i]);
    ASSERT_TRUE(pl[i].contains(key)) << i;
    EXPECT_NEAR(pl[i][key]["logprob"].get<double>(), ref[i - 1][ids[i]], 2e-4);
    int rank = 1;
    for (double x : ref[i - 1]) rank += x > ref[i - 1][ids[i]];
    EXPECT_EQ(pl[i][key]["rank"], rank);
    EXPECT_LE(pl[i].size(), 2u);
    bool has_rank1 = false;
    for (auto& [k, v] : pl[i].items()) has_rank1 = has_rank1 || v["rank"] == 1;
    EXPECT_TRUE(has_rank1);
  }
  // Not on chat; bounded by --max-logprobs.
  r = s.post_json("/v1/chat/completions", {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                           {"prompt_logprobs", 1}});
  EXPECT_EQ(r.status, 400);
  r = s.post_json("/v1/completions", {{"model", "tiny"}, {"prompt", "hi"}, {"prompt_logprobs", 21}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("--max-logprobs"), std::string::npos);
}

TEST(ServerOpenAISurface, EchoStreamingMatchesNonStreaming) {
  TestServer s;
  json body = {{"model", "tiny"}, {"prompt", "One two three"}, {"echo", true}, {"max_tokens", 4},
               {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 0}};
  auto r = s.post_json("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json full = json::parse(r.body);
  body["stream"] = true;
  SseResult st = s.stream("/v1/completions", body);
  ASSERT_EQ(st.status, 200);
  std::string text;
  size_t n_lp = 0;
  for (size_t i = 0; i + 1 < st.events.size(); ++i) {
    json c = json::parse(st.events[i]);
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["logprobs"].is_null()) n_lp += c["choices"][0]["logprobs"]["tokens"].size();
  }
  EXPECT_EQ(text, full["choices"][0]["text"]);
  EXPECT_EQ(text.rfind("One two three", 0), 0u);
  EXPECT_EQ(n_lp, full["choices"][0]["logprobs"]["tokens"].size());
}

TEST(ServerOpenAISurface, DeveloperRoleIsASystemTurn) {
  TestServer s;
  auto usage = [&](const json& messages) {
    auto r = s.post_json("/v1/chat/completions", {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 1}});
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["usage"]["prompt_tokens"].get<int64_t>();
  };
  const json user = {{"role", "user"}, {"content", "Tell me the news."}};
  const int64_t plain = usage(json::array({user}));
  const int64_t dev = usage(json::array({{{"role", "developer"}, {"content", "You are terse."}}, user}));
  const int64_t sys = usage(json::array({{{"role", "system"}, {"content", "You are terse."}}, user}));
  EXPECT_GT(dev, plain) << "the developer message reaches the prompt";
  EXPECT_EQ(dev, sys) << "as a system turn (the template has no developer role)";
  // /tokenize renders it the same way.
  auto t = s.post_json("/tokenize", {{"messages", json::array({{{"role", "developer"}, {"content", "You are terse."}}, user})}});
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(json::parse(t.body)["count"], sys);
}

TEST(ServerOpenAISurface, ModelByIdAndVersion) {
  TestServer s;
  auto r = s.get("/v1/models/tiny");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["id"], "tiny");
  EXPECT_EQ(j["object"], "model");
  EXPECT_EQ(j["max_model_len"], 512);
  r = s.get("/v1/models/nope%2Fmodel");
  EXPECT_EQ(r.status, 404);
  j = json::parse(r.body);
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("nope/model"), std::string::npos);
  r = s.get("/version");
  ASSERT_EQ(r.status, 200);
  EXPECT_FALSE(json::parse(r.body)["version"].get<std::string>().empty());
  // /v1/models/{id} needs the API key like every /v1 route.
  r = http_request("GET", s.url("/v1/models/tiny"), "", {});
  EXPECT_EQ(r.status, 401);
}

TEST(ServerOpenAISurface, CorsOffByDefault) {
  TestServer s;
  auto r = http_request("OPTIONS", s.url("/tokenize"), "",
                        {"Origin: http://ui.example", "Access-Control-Request-Method: POST"});
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
  r = http_request("OPTIONS", s.url("/v1/chat/completions"), "",
                   {"Origin: http://ui.example", "Access-Control-Request-Method: POST"});
  EXPECT_EQ(r.status, 401) << "no preflight answer: the API key applies as to any /v1 request";
  r = http_request("GET", s.url("/health"), "", {"Origin: http://ui.example"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
}

TEST(ServerOpenAISurface, CorsAllowedOrigins) {
  TestServerOptions o;
  o.allowed_origins = {"http://ui.example:3000"};
  TestServer s(o);
  // Preflight from the allowed origin: answered before the API key (browsers send none).
  auto r = http_request("OPTIONS", s.url("/v1/chat/completions"), "",
                        {"Origin: http://ui.example:3000", "Access-Control-Request-Method: POST",
                         "Access-Control-Request-Headers: authorization, content-type"});
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.headers["access-control-allow-origin"], "http://ui.example:3000");
  EXPECT_NE(r.headers["access-control-allow-methods"].find("POST"), std::string::npos);
  EXPECT_EQ(r.headers["access-control-allow-headers"], "authorization, content-type");
  // Another origin: refused, no allow header.
  r = http_request("OPTIONS", s.url("/v1/chat/completions"), "",
                   {"Origin: http://evil.example", "Access-Control-Request-Method: POST"});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
  // Ordinary responses (errors too) carry the header for the allowed origin only.
  r = http_request("GET", s.url("/v1/models"), "",
                   {"Origin: http://ui.example:3000", "Authorization: Bearer " + s.api_key()});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["access-control-allow-origin"], "http://ui.example:3000");
  r = http_request("GET", s.url("/v1/models"), "", {"Origin: http://ui.example:3000"});
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.headers["access-control-allow-origin"], "http://ui.example:3000");
  r = http_request("GET", s.url("/v1/models"), "", {"Origin: http://evil.example", "Authorization: Bearer " + s.api_key()});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
  SseResult st = http_stream(s.url("/v1/completions"),
                             json({{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}, {"stream", true}}).dump(),
                             {"Content-Type: application/json", "Authorization: Bearer " + s.api_key(),
                              "Origin: http://ui.example:3000"});
  EXPECT_EQ(st.status, 200);
  EXPECT_NE(st.raw.find("[DONE]"), std::string::npos);
}

TEST(ServerOpenAISurface, ParseAllowedOrigins) {
  auto a = parse_allowed_origins("http://a.example:3000, https://b.example/");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(*a, (std::vector<std::string>{"http://a.example:3000", "https://b.example"}));
  auto b = parse_allowed_origins("[\"*\"]");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(*b, std::vector<std::string>{"*"});
  EXPECT_FALSE(parse_allowed_origins("ui.example").is_ok());
  EXPECT_FALSE(parse_allowed_origins("http://ui.example/app").is_ok());
  EXPECT_FALSE(parse_allowed_origins(" , ").is_ok());
  EXPECT_NE(parse_allowed_origins("ftp://x").status().message().find("--allowed-origins"), std::string::npos);
}

TEST(ServerOpenAISurface, TokenizeDetokenize) {
  TestServer s;
  const std::string text = "Hello world";
  auto r = s.post_json("/tokenize", {{"model", "tiny"}, {"prompt", text}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  const auto want = *s.tokenizer().encode(text, true);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(j["count"], want.size());
  EXPECT_EQ(j["max_model_len"], 512);
  EXPECT_TRUE(j["token_strs"].is_null());
  r = s.post_json("/tokenize", {{"prompt", text}, {"add_special_tokens", false}, {"return_token_strs", true}});
  ASSERT_EQ(r.status, 200);
  j = json::parse(r.body);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), *s.tokenizer().encode(text, false));
  EXPECT_EQ(j["token_strs"].size(), j["tokens"].size());
  // Chat messages: the same count as the chat request's prompt_tokens.
  const json messages = {{{"role", "user"}, {"content", "Tell me the news."}}};
  r = s.post_json("/tokenize", {{"messages", messages}});
  ASSERT_EQ(r.status, 200) << r.body;
  const int64_t count = json::parse(r.body)["count"];
  auto c = s.post_json("/v1/chat/completions", {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 1}});
  ASSERT_EQ(c.status, 200);
  EXPECT_EQ(json::parse(c.body)["usage"]["prompt_tokens"], count);
  // Detokenize round trip.
  r = s.post_json("/detokenize", {{"model", "tiny"}, {"tokens", *s.tokenizer().encode(text, false)}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["prompt"], text);
  // Errors in OpenAI's shape, naming the field.
  r = s.post_json("/detokenize", {{"tokens", {1, 999999}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "tokens");
  r = s.post_json("/tokenize", {{"model", "other"}, {"prompt", "x"}});
  EXPECT_EQ(r.status, 404);
  r = s.post_json("/tokenize", {{"prompt", "x"}, {"messages", messages}});
  EXPECT_EQ(r.status, 400);
  r = s.post_json("/tokenize", {{"prompt", 5}});
  EXPECT_EQ(r.status, 400);
}

}  // namespace
}  // namespace mxserve::server::testing
