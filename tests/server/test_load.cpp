// Load and lifecycle: 64 concurrent streaming clients all complete; a client that hangs up mid-stream
// (or mid non-streaming request) has its request aborted and its KV blocks freed at once (/metrics).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "server_fixture.h"

namespace mxserve::server::testing {
namespace {

using json = nlohmann::json;

// Polls until pred() or the timeout; returns pred()'s last value.
template <typename F>
bool eventually(F pred, double timeout_s = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

TEST(ServerLoad, SixtyFourConcurrentStreams) {
  TestServer s;
  constexpr int kClients = 64;
  std::atomic<int> complete{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      json body = {{"messages", {{{"role", "user"}, {"content", "client " + std::to_string(i) + " says hello"}}}},
                   {"max_tokens", 16}, {"ignore_eos", true}, {"stream", true},
                   {"stream_options", {{"include_usage", true}}}};
      auto r = s.stream("/v1/chat/completions", body);
      if (r.status != 200 || r.events.empty() || r.events.back() != "[DONE]") return;
      const json usage = json::parse(r.events[r.events.size() - 2])["usage"];
      if (usage["completion_tokens"] == 16) ++complete;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(complete.load(), kClients);
  EXPECT_EQ(s.metric("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"}"), kClients);
  EXPECT_EQ(s.metric("vllm:generation_tokens_total"), kClients * 16);
  EXPECT_EQ(s.metric("vllm:time_to_first_token_seconds_count"), kClients);
}

TEST(ServerLoad, StreamingDisconnectAbortsAndFreesBlocks) {
  TestServer s;
  json body = {{"prompt", "a story that never ends"}, {"max_tokens", 480}, {"ignore_eos", true}, {"stream", true}};
  std::atomic<bool> hung_up{false};
  std::thread client([&] {
    auto r = s.stream("/v1/completions", body, /*hang_up_after=*/3);
    hung_up = true;
    EXPECT_EQ(r.events.size(), 3u);
  });
  client.join();
  ASSERT_TRUE(hung_up);
  EXPECT_TRUE(eventually([&] {
    return s.metric("vllm:num_requests_running") == 0 && s.metric("vllm:kv_cache_usage_perc") == 0 &&
           s.metric("mxserve:requests_aborted_total") == 1;
  })) << s.get("/metrics").body;
  EXPECT_LT(s.metric("vllm:generation_tokens_total"), 480) << "generation stopped early";
  EXPECT_EQ(s.metric("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}"), 1);
}

TEST(ServerLoad, NonStreamingDisconnectAbortsAndFreesBlocks) {
  TestServerOptions o;
  o.max_num_seqs = 1;  // the 64 choices run one after another: ~30k steps, however fast the machine
  TestServer s(o);
  // The client gives up after 300 ms, long before the work is done.
  const std::string body = R"({"prompt":"a story that never ends","max_tokens":480,"ignore_eos":true,"n":64})";
  auto r = http_request("POST", s.url("/v1/completions"), body,
                        {"Content-Type: application/json", "Authorization: Bearer test-key"}, /*timeout_ms=*/300);
  EXPECT_EQ(r.status, 0) << "the client timed out before the response";
  // A fast machine may finish the first choices before the hang-up is seen; the rest must be aborted.
  EXPECT_TRUE(eventually([&] {
    // The engine counts an abort when it takes it from its inbox, which may be after the session gave up.
    return s.metric("vllm:num_requests_running") == 0 && s.metric("vllm:kv_cache_usage_perc") == 0 &&
           s.metric("mxserve:requests_aborted_total") >= 1 &&
           s.metric("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}") +
                   s.metric("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"}") ==
               64;
  })) << s.get("/metrics").body;
  EXPECT_GE(s.metric("mxserve:requests_aborted_total"), 1);
  EXPECT_LT(s.metric("vllm:generation_tokens_total"), 64 * 480);
  // The server still serves.
  auto ok = s.post("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(ServerLifecycle, HealthIs503UntilReadyAndWhileDraining) {
  ServerOptions so;
  so.port = 0;
  so.stats_interval_s = 0;
  HttpServer http(so);
  ASSERT_TRUE(http.bind().is_ok());
  http.start();
  const std::string base = "http://127.0.0.1:" + std::to_string(http.port());
  EXPECT_EQ(http_request("GET", base + "/health", "", {}).status, 503);
  auto r = http_request("POST", base + "/v1/completions", R"({"prompt":"x"})", {"Content-Type: application/json"});
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.headers.count("retry-after"), 1u);
  EXPECT_EQ(http_request("GET", base + "/metrics", "", {}).status, 200);
  EXPECT_EQ(http_request("GET", base + "/v1/models", "", {}).status, 200);
  http.begin_drain();
  EXPECT_EQ(http_request("GET", base + "/health", "", {}).status, 503);
  http.stop();
}

TEST(ServerLifecycle, DrainingRejectsNewWorkAndFinishesStreams) {
  TestServer s;
  std::atomic<bool> finished{false};
  std::thread client([&] {
    auto r = s.stream("/v1/completions", {{"prompt", "x"}, {"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}});
    EXPECT_EQ(r.status, 200);
    EXPECT_FALSE(r.events.empty());
    if (!r.events.empty()) EXPECT_EQ(r.events.back(), "[DONE]") << "an in-flight stream completes during the drain";
    finished = true;
  });
  EXPECT_TRUE(eventually([&] { return finished || s.metric("vllm:generation_tokens_total") > 0; }));
  s.http().begin_drain();
  EXPECT_EQ(s.get("/health").status, 503);
  EXPECT_EQ(s.post("/v1/completions", R"({"prompt":"x"})").status, 503);
  s.http().wait_idle(120);
  client.join();
  EXPECT_TRUE(finished);
}

}  // namespace
}  // namespace mxserve::server::testing
