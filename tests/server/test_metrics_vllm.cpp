// /metrics with vLLM's names (issues 34 and 35): bucket labels as written, the request-phase histograms, tokens
// per step, cached prompt tokens per tier, request-level speculative counters, and the MTP acceptance collapse
// alarm (unit-tested on synthetic counters, then end to end on a benchmark-mode server whose drafts are never
// accepted).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/metrics.h"
#include "server/spec_alarm.h"
#include "server_fixture.h"

namespace mxserve::server::testing {
namespace {

using json = nlohmann::json;

// The engine publishes a step's stats right after the step's token events, so a client that just got its
// response may scrape a step early: wait (bounded) until `a` equals `b`, then return both.
std::pair<double, double> settled(const TestServer& s, const std::string& a, const std::string& b) {
  double x = 0, y = 0;
  for (int i = 0; i < 250; ++i) {
    x = s.metric(a), y = s.metric(b);
    if (x == y) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return {x, y};
}

TEST(ServerMetricsVllm, NumbersPrintAsWritten) {
  EXPECT_EQ(prometheus_bucket_label(0.3), "0.3");
  EXPECT_EQ(prometheus_bucket_label(0.001), "0.001");
  EXPECT_EQ(prometheus_bucket_label(1.0), "1.0");
  EXPECT_EQ(prometheus_bucket_label(2560), "2560.0");
  EXPECT_EQ(prometheus_bucket_label(100000), "100000.0");
  EXPECT_EQ(prometheus_number(0.3), "0.3");
  EXPECT_EQ(prometheus_number(0.1 + 0.2), "0.30000000000000004");  // not the same double: kept exact
  EXPECT_EQ(prometheus_number(42), "42");
  EXPECT_EQ(prometheus_number(100000), "100000");
  EXPECT_EQ(prometheus_number(1.5e-7), "1.5e-07");
  EXPECT_EQ(prometheus_number(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(prometheus_number(std::nan("")), "NaN");
  Histogram h({0.3, 0.8});
  h.observe(0.5);
  std::string out;
  h.render("x", "a=\"b\"", &out);
  EXPECT_NE(out.find("x_bucket{a=\"b\",le=\"0.3\"} 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{a=\"b\",le=\"0.8\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{a=\"b\",le=\"+Inf\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_sum{a=\"b\"} 0.5\n"), std::string::npos) << out;
}

TEST(ServerMetricsVllm, RequestPhaseHistogramsAndIterationTokens) {
  TestServer s;
  const std::string body = R"({"model":"tiny","prompt":"Once upon a time there was a small model in a big cluster",
                               "max_tokens":5,"ignore_eos":true,"temperature":0})";
  auto r = s.post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json u = json::parse(r.body)["usage"];
  const int64_t prompt = u["prompt_tokens"], gen = u["completion_tokens"];
  ASSERT_EQ(gen, 5);
  const std::string m = "{model_name=\"tiny\"}";
  for (const char* h : {"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                        "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                        "vllm:request_time_per_output_token_seconds"})
    EXPECT_EQ(s.metric(std::string(h) + "_count" + m), 1) << h;
  EXPECT_EQ(s.metric("vllm:time_per_output_token_seconds_count" + m), gen - 1);
  EXPECT_EQ(s.metric("vllm:time_per_output_token_seconds_count" + m), s.metric("vllm:inter_token_latency_seconds_count" + m));
  // decode + prefill = inference (each request's own times)
  EXPECT_NEAR(s.metric("vllm:request_prefill_time_seconds_sum" + m) + s.metric("vllm:request_decode_time_seconds_sum" + m),
              s.metric("vllm:request_inference_time_seconds_sum" + m), 1e-6);
  // Steps: every prompt token computed and every token generated once (one request alone).
  for (int i = 0; i < 250 && s.metric("vllm:iteration_tokens_total_sum" + m) < prompt + gen; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(s.metric("vllm:iteration_tokens_total_sum" + m), prompt + gen);
  const auto [steps_hist, steps] = settled(s, "vllm:iteration_tokens_total_count" + m, "mxserve:engine_steps_total" + m);
  EXPECT_EQ(steps_hist, steps);
  EXPECT_GE(steps, gen) << "one token per step without speculation";
  const std::string text = s.get("/metrics").body;
  EXPECT_NE(text.find("vllm:e2e_request_latency_seconds_bucket{model_name=\"tiny\",le=\"0.3\"}"), std::string::npos);
  EXPECT_NE(text.find("vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"16.0\"}"), std::string::npos);
  EXPECT_EQ(text.find("0.29999999999999999"), std::string::npos);
  EXPECT_FALSE(std::regex_search(text, std::regex(R"(le="[0-9]*\.[0-9]{8,})"))) << "no bound printed as a rounding artefact";
}

TEST(ServerMetricsVllm, CachedTokensPerTier) {
  TestServer s;
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "The same long shared prefix sentence number " + std::to_string(i % 3) + ". ";
  const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
  int64_t cached = 0;
  for (int i = 0; i < 2; ++i) {
    auto r = s.post_json("/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    cached += json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  }
  EXPECT_GT(cached, 0) << "the second request hits the prefix cache";
  EXPECT_EQ(s.metric("mxserve:prompt_tokens_cached_total{model_name=\"tiny\",tier=\"gpu\"}"), cached);
  EXPECT_EQ(s.metric("vllm:prefix_cache_hits_total"), cached);
}

// With the host KV tier: a prompt whose blocks were evicted to host memory by other prompts is served again;
// its response's cached_tokens counts the host-tier hit and /metrics splits the cached tokens by tier (the sum
// of every response's cached_tokens = gpu + host, and host = the engine's host-tier hit counter).
TEST(ServerMetricsVllm, CachedTokensCountHostTierHits) {
  TestServerOptions o;
  o.num_kv_blocks = 24;                 // 16-token blocks: a few prompts fill it
  o.kv_cache_host_memory = 16u << 20;  // far more than the pool
  TestServer s(o);
  auto prompt_of = [](int k) {
    std::string p;
    for (int i = 0; i < 14; ++i) p += "Prompt " + std::to_string(k) + " says thing " + std::to_string(i) + ". ";
    return p;
  };
  int64_t cached = 0, last = 0;
  for (int k : {0, 1, 2, 3, 4, 0}) {
    const json body = {{"model", "tiny"}, {"prompt", prompt_of(k)}, {"max_tokens", 2}, {"temperature", 0}};
    auto r = s.post_json("/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    last = json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    cached += last;
  }
  EXPECT_GT(last, 0) << "the repeated prompt hits the host tier";
  const std::string m = "mxserve:prompt_tokens_cached_total{model_name=\"tiny\",tier=";
  const double host = s.metric(m + "\"host\"}"), gpu = s.metric(m + "\"gpu\"}");
  EXPECT_GT(host, 0) << s.get("/metrics").body;
  EXPECT_LE(host, last);
  EXPECT_EQ(gpu + host, cached);
  const auto [engine_host, counted] =
      settled(s, "mxserve:prefix_cache_hits_tokens_total{model_name=\"tiny\",tier=\"host\"}",
              m + "\"host\"}");
  EXPECT_EQ(engine_host, counted);
}

runtime::SpecStats spec_counters(int64_t drafts, int64_t first_accepted, int n = 2) {
  runtime::SpecStats s;
  s.num_drafts = drafts;
  s.num_draft_tokens = drafts * n;
  s.accepted_per_pos = {first_accepted, first_accepted / 2};
  s.num_accepted_tokens = first_accepted + first_accepted / 2;
  return s;
}

TEST(ServerMetricsVllm, AcceptanceAlarmJudgesFullWindowsOnly) {
  SpecAcceptanceAlarm alarm(SpecAlarmOptions{0.5, 100});
  EXPECT_FALSE(alarm.update(spec_counters(50, 40)).has_value()) << "half a window: not judged";
  EXPECT_FALSE(alarm.state().judged);
  EXPECT_FALSE(alarm.update(spec_counters(150, 120)).has_value()) << "80% accepted: healthy";
  EXPECT_TRUE(alarm.state().judged);
  EXPECT_NEAR(alarm.state().rate_per_pos[0], 0.8, 1e-12);
  EXPECT_NEAR(alarm.state().rate_per_pos[1], 0.4, 1e-12);
  // The next 100 verify steps accept nothing: the window (the last >= 100 steps) collapses.
  auto line = alarm.update(spec_counters(250, 120));
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find("COLLAPSED"), std::string::npos) << *line;
  const SpecAlarmState st = alarm.state();
  EXPECT_TRUE(st.collapsed);
  EXPECT_EQ(st.alarms, 1);
  EXPECT_EQ(st.rate_per_pos[0], 0);
  EXPECT_EQ(st.window_drafts, 100);
  EXPECT_FALSE(alarm.update(spec_counters(360, 120)).has_value()) << "one line per transition";
  EXPECT_TRUE(alarm.state().collapsed);
  // Recovery: 100 steps at 90%.
  auto back = alarm.update(spec_counters(460, 210));
  ASSERT_TRUE(back.has_value());
  EXPECT_NE(back->find("recovered"), std::string::npos);
  EXPECT_FALSE(alarm.state().collapsed);
  // Off: never judges.
  SpecAcceptanceAlarm off(SpecAlarmOptions{0, 100});
  EXPECT_FALSE(off.update(spec_counters(1000, 0)).has_value());
  EXPECT_FALSE(off.state().enabled);
}

TEST(ServerMetricsVllm, AcceptanceAlarmLineNamesTheFlag) {
  SpecAcceptanceAlarm alarm(SpecAlarmOptions{0.3, 10});
  auto line = alarm.update(spec_counters(20, 1));
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find("COLLAPSED"), std::string::npos) << *line;
  EXPECT_NE(line->find("--spec-acceptance-alarm"), std::string::npos) << *line;
}

TEST(ServerMetricsVllm, SpecCountersAndAlarmEndToEnd) {
  TestServerOptions o;
  o.spec.num_steps = 2;
  o.spec.adaptive = false;
  o.spec.self_test = false;
  o.spec.simulate_acceptance = 1.0;  // drafts never accepted: acceptance collapses by construction
  o.benchmark_mode = true;
  o.spec_alarm = SpecAlarmOptions{0.2, 8};
  TestServer s(o);
  for (int i = 0; i < 2; ++i) {
    auto r = s.post("/v1/completions", R"({"prompt":"x","max_tokens":24,"ignore_eos":true})");
    ASSERT_EQ(r.status, 200) << r.body;
  }
  const std::string m = "{model_name=\"tiny\"}";
  // Request-level sums equal the engine's totals once every request finished (and its last step is published).
  const auto [req_drafts, drafts] =
      settled(s, "mxserve:request_spec_decode_num_drafts_total" + m, "vllm:spec_decode_num_drafts_total" + m);
  ASSERT_GE(drafts, 16);
  EXPECT_EQ(req_drafts, drafts);
  const auto [req_tokens, tokens] = settled(s, "mxserve:request_spec_decode_num_draft_tokens_total" + m,
                                            "vllm:spec_decode_num_draft_tokens_total" + m);
  EXPECT_EQ(req_tokens, tokens);
  EXPECT_EQ(tokens, 2 * drafts);
  const auto [req_acc, acc] = settled(s, "mxserve:request_spec_decode_num_accepted_tokens_total" + m,
                                      "vllm:spec_decode_num_accepted_tokens_total" + m);
  EXPECT_EQ(req_acc, acc);
  EXPECT_EQ(s.metric("mxserve:request_spec_decode_acceptance_count" + m), 2);
  // The scrape feeds the alarm: collapsed, counted once, the window's first-position rate below the bound.
  EXPECT_EQ(s.metric("mxserve:spec_decode_acceptance_collapsed" + m), 1);
  EXPECT_EQ(s.metric("mxserve:spec_decode_acceptance_alarms_total" + m), 1);
  EXPECT_LT(s.metric("mxserve:spec_decode_window_acceptance_rate{model_name=\"tiny\",position=\"0\"}"), 0.2);
  EXPECT_EQ(s.metric("mxserve:spec_decode_acceptance_alarm_bound" + m), 0.2);

  // Every series the Grafana dashboard in docs/ reads is served (names taken from its queries).
  std::ifstream f(std::string(MXSERVE_SOURCE_DIR) + "/docs/grafana-mxserve.json");
  ASSERT_TRUE(f.good());
  const json dash = json::parse(f);
  const std::string text = s.get("/metrics").body;
  const std::regex name(R"((vllm|mxserve):[a-z0-9_]+)");
  int checked = 0;
  for (const auto& p : dash["panels"])
    for (const auto& t : p["targets"]) {
      const std::string expr = t["expr"];
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name); it != std::sregex_iterator(); ++it) {
        EXPECT_NE(text.find(it->str() + "{"), std::string::npos) << it->str() << " (panel " << p["title"] << ")";
        ++checked;
      }
    }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace mxserve::server::testing
