// Mutation fuzz of the request schema, in process: thousands of byte-level mutations of valid chat and
// completion bodies go through parse_body + parse_*_request; none may throw, and every rejection must
// be a 4xx ApiError with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "server/request_schema.h"

namespace mxserve::server {
namespace {

const std::vector<std::string> kSeeds = {
    R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":40,"seed":3,"stop":["\n","END"],"n":2,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto"})",
    R"({"prompt":["a","b"],"max_tokens":4,"logprobs":1,"stop":"x","stop_token_ids":[1,2],"ignore_eos":true,"presence_penalty":0.5})",
    R"({"prompt":[[1,2,3],[4]],"n":3,"min_p":0.1,"frequency_penalty":-1,"response_format":{"type":"text"}})",
};

std::string mutate(std::string s, std::mt19937& rng) {
  const char* tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "1e999", "null", "true", "0", "\\u0000", "\xff",
                          "\"max_tokens\":", "\"n\":", "99999999999999999999", "1.5", "\"\"", "[]", "{}"};
  std::uniform_int_distribution<int> op(0, 3), pick(0, sizeof(tokens) / sizeof(tokens[0]) - 1);
  const int n_ops = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n_ops && !s.empty(); ++i) {
    const size_t pos = rng() % s.size();
    switch (op(rng)) {
      case 0: s.erase(pos, 1 + rng() % 8); break;
      case 1: s.insert(pos, tokens[pick(rng)]); break;
      case 2: s[pos] = static_cast<char>(rng() % 256); break;
      default: s = s.substr(0, pos); break;  // truncation
    }
  }
  return s;
}

TEST(ServerSchemaFuzz, MutatedBodiesNeverThrow) {
  std::mt19937 rng(12345);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    const std::string body = mutate(kSeeds[iter % kSeeds.size()], rng);
    std::string err;
    std::optional<ApiError> e;
    ASSERT_NO_THROW({
      auto parsed = parse_body(body, 64, &err);
      if (!parsed) {
        ++rejected;
        continue;
      }
      if (iter % 3 == 0 || iter % 3 == 1) {
        ChatRequest chat;
        e = parse_chat_request(*parsed, &chat);
      } else {
        CompletionRequest cr;
        e = parse_completion_request(*parsed, &cr);
      }
      if (e) {
        (void)e->body();
      }
    }) << body;
    if (e) {
      EXPECT_GE(e->http_status, 400);
      EXPECT_LT(e->http_status, 500) << body;
      EXPECT_FALSE(e->message.empty());
      ++rejected;
    } else {
      ++accepted;
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

TEST(ServerSchemaFuzz, DepthScanIgnoresBracketsInStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[[[[[","b":[1,[2]]})", 64), 3);
  EXPECT_EQ(json_nesting_depth(R"({"a":"\"[[[["})", 64), 1);
  std::string err;
  EXPECT_FALSE(parse_body(std::string(100000, '['), 64, &err).has_value());
  EXPECT_NE(err.find("deeper"), std::string::npos);
}

// Fields mxserve accepts but does not act on are reported like unknown ones (the server logs each name once),
// never silently dropped; fields it honours are not.
TEST(ServerSchema, AcceptedButUnusedFieldsAreReportedAsIgnored) {
  const char* unused[] = {"priority", "service_tier", "parallel_tool_calls", "store", "metadata", "request_id"};
  for (bool chat : {true, false}) {
    for (const char* name : unused) {
      OrderedJson body = chat ? OrderedJson::parse(R"({"messages":[{"role":"user","content":"hi"}]})")
                              : OrderedJson::parse(R"({"prompt":"hi"})");
      body[name] = std::string(name) == "parallel_tool_calls" || std::string(name) == "store" ? OrderedJson(true)
                                                                                              : OrderedJson("x");
      body["temperature"] = 0.5;
      body["no_such_field"] = 1;
      GenerationOptions* g = nullptr;
      ChatRequest cr;
      CompletionRequest pr;
      std::optional<ApiError> e = chat ? parse_chat_request(body, &cr) : parse_completion_request(body, &pr);
      ASSERT_FALSE(e.has_value()) << name << ": " << e->body();
      g = chat ? &cr.gen : &pr.gen;
      const auto& ig = g->ignored_fields;
      if (chat && std::string(name) == "parallel_tool_calls")  // honoured on chat: not logged as ignored
        EXPECT_EQ(std::find(ig.begin(), ig.end(), name), ig.end()) << "parallel_tool_calls is honoured on chat";
      else
        EXPECT_NE(std::find(ig.begin(), ig.end(), name), ig.end()) << name << " was dropped without a warning";
      EXPECT_NE(std::find(ig.begin(), ig.end(), "no_such_field"), ig.end());
      EXPECT_EQ(std::find(ig.begin(), ig.end(), "temperature"), ig.end()) << "temperature is honoured";
    }
  }
}

}  // namespace
}  // namespace mxserve::server
