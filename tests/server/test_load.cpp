// Load and lifecycle: 64 concurrent streaming clients all complete; a client that hangs up mid-stream
// (or mid non-streaming request) has its request aborted and its KV blocks freed at once (/metrics).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "server_fixture.h"

namespace mxserve::server::testing {
namespace {

using json = nlohmann::json;

// Polls the condition pred() until it holds or the (generous) timeout passes; returns pred()'s last value.
template <typename F>
bool eventually(F pred, double timeout_s = 60) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// Sends one POST over a plain TCP connection to the test server and returns the socket without reading
// the answer (-1 when the connection fails); closing it is the client hanging up.
int send_raw_request(const TestServer& s, const std::string& path, const std::string& body) {
  const std::string base = s.url("");  // http://127.0.0.1:PORT
  const int port = std::atoi(base.c_str() + base.rfind(':') + 1);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Authorization: Bearer test-key\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\n\r\n" + body;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
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
  // The client hangs up once the server is generating for it (not after a fixed delay, which raced the
  // model's speed): a raw connection, closed when /metrics shows the request's first tokens.
  const std::string body = R"({"prompt":"a story that never ends","max_tokens":480,"ignore_eos":true,"n":64})";
  const int fd = send_raw_request(s, "/v1/completions", body);
  ASSERT_GE(fd, 0) << "cannot connect to " << s.url("/");
  ASSERT_TRUE(eventually([&] { return s.metric("vllm:generation_tokens_total") > 0; }, 120))
      << s.get("/metrics").body;
  ::close(fd);
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
