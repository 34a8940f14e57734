// Metric math on hand-made records: every expected value below is computed by hand in comments.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "bench/knee.h"
#include "bench/metrics.h"

namespace mxserve::bench {
namespace {

TEST(Percentile, LinearInterpolationLikeNumpy) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 50), 5.5);   // pos 4.5
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 95), 9.55);  // pos 8.55
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 99), 9.91);  // pos 8.91
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile_sorted({3.0}, 99), 3.0);
  const Dist d = summarize({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.p50, 2.5);
  EXPECT_DOUBLE_EQ(d.max, 4);
}

RequestRecord ok_record(int64_t i, double sent, double ttft, double gap, int64_t tokens) {
  RequestRecord r;
  r.index = i;
  r.scheduled_s = sent;
  r.sent_s = sent;
  r.first_token_s = sent + ttft;
  r.token_chunks = tokens;
  for (int64_t k = 1; k < tokens; ++k) r.itl_s.push_back(static_cast<float>(gap));
  r.last_token_s = r.first_token_s + gap * static_cast<double>(tokens - 1);
  r.end_s = r.last_token_s;
  r.output_tokens = tokens;
  r.prompt_tokens = 100;
  r.intended_input = 100;
  r.ok = true;
  return r;
}

TEST(RateMetrics, HandComputedScript) {
  // 4 measured ok requests sent at 0,1,2,3 s; TTFT 0.1,0.2,0.3,0.4 s; 11 tokens, gap 0.05 s.
  // One warm-up (excluded), one failure.
  std::vector<RequestRecord> rs;
  RequestRecord w = ok_record(0, -1.0, 9.0, 0.05, 11);
  w.warmup = true;
  rs.push_back(w);
  for (int i = 0; i < 4; ++i) {
    RequestRecord r = ok_record(i + 1, i, 0.1 * (i + 1), 0.05, 11);
    r.cached_tokens = 60;
    rs.push_back(r);
  }
  RequestRecord f;
  f.index = 5;
  f.sent_s = 3.5;
  f.scheduled_s = 3.5;
  f.end_s = 3.6;
  f.error = "http 503: overloaded";
  rs.push_back(f);
  const RateMetrics m = compute_rate_metrics(rs, 1.0, 0);
  EXPECT_EQ(m.warmup, 1);
  EXPECT_EQ(m.sent, 5);
  EXPECT_EQ(m.completed, 4);
  EXPECT_EQ(m.failed, 1);
  EXPECT_DOUBLE_EQ(m.success_rate, 0.8);
  // duration: first send 0 -> last end 3 + 0.4 + 0.5 = 3.9
  EXPECT_NEAR(m.duration_s, 3.9, 1e-12);
  EXPECT_NEAR(m.request_throughput, 4 / 3.9, 1e-12);
  EXPECT_EQ(m.output_tokens, 44);
  EXPECT_EQ(m.input_tokens, 400);
  EXPECT_NEAR(m.output_tps, 44 / 3.9, 1e-9);
  EXPECT_NEAR(m.total_tps, 444 / 3.9, 1e-9);
  EXPECT_NEAR(m.prefill_computed_tps, 160 / 3.9, 1e-9);
  EXPECT_DOUBLE_EQ(m.cached_fraction, 0.6);
  // TTFT {0.1,0.2,0.3,0.4}: p50 0.25, p95 pos 2.85 -> 0.385, p99 pos 2.97 -> 0.397
  EXPECT_NEAR(m.ttft.p50, 0.25, 1e-12);
  EXPECT_NEAR(m.ttft.p95, 0.385, 1e-12);
  EXPECT_NEAR(m.ttft.p99, 0.397, 1e-12);
  EXPECT_NEAR(m.ttft.mean, 0.25, 1e-12);
  // TPOT = (E2E - TTFT)/(11-1) = 0.5/10 = 0.05 for all
  EXPECT_NEAR(m.tpot.p50, 0.05, 1e-12);
  EXPECT_NEAR(m.tpot.p95, 0.05, 1e-12);
  EXPECT_EQ(m.itl.count, 40);
  EXPECT_NEAR(m.itl.p99, 0.05, 1e-7);
  // E2E = TTFT + 0.5
  EXPECT_NEAR(m.e2e.p50, 0.75, 1e-12);
  EXPECT_NEAR(m.e2e.p95, 0.885, 1e-12);
  EXPECT_NEAR(m.tokens_per_chunk, 1.0, 1e-12);
  // output speed (11-1)/0.5 = 20 tok/s
  EXPECT_NEAR(m.output_speed.p50, 20, 1e-9);
  // quarters of 4 ok requests: first {0.1}, last {0.4}
  EXPECT_NEAR(m.ttft_first_quarter_p50, 0.1, 1e-12);
  EXPECT_NEAR(m.ttft_last_quarter_p50, 0.4, 1e-12);
  EXPECT_EQ(m.errors.at("http 503"), 1);
  // Token times: request i emits at i+0.1(i+1) + 0.05k, k = 0..10. Bin [0,1): req 0 (0.1..0.6)
  // 11; bin [1,2): req 1 (1.2..1.7) 11; ... each request falls in its own bin -> peak 11.
  EXPECT_DOUBLE_EQ(m.peak_output_tps, 11);
  // avg concurrency = sum E2E / duration = (0.6+0.7+0.8+0.9)/3.9
  EXPECT_NEAR(m.avg_concurrency, 3.0 / 3.9, 1e-12);
}

TEST(RateMetrics, FallsBackToChunkCountWithoutUsage) {
  RequestRecord r = ok_record(0, 0, 0.1, 0.01, 5);
  r.output_tokens = -1;
  r.prompt_tokens = -1;
  r.intended_input = 42;
  const RateMetrics m = compute_rate_metrics({r}, 1, 0);
  EXPECT_EQ(m.output_tokens, 5);
  EXPECT_EQ(m.input_tokens, 42);
  EXPECT_LT(m.cached_fraction, 0);
}

// One request a second for n seconds, request i living e2e(i) seconds (first token 0.5 s after its send, so
// the TTFT checks pass whatever the queue does: a scheduler that admits prefills first).
std::vector<RequestRecord> open_loop(int64_t n, const std::function<double(int64_t)>& e2e) {
  std::vector<RequestRecord> rs;
  for (int64_t i = 0; i < n; ++i) rs.push_back(ok_record(i, static_cast<double>(i), 0.5, (e2e(i) - 0.5) / 10, 11));
  return rs;
}

Verdict judged_at_one_per_second(const RateMetrics& m) {
  KneeCriteria c;
  return judge(m, c);
}

TEST(InflightTrend, AStableQueueSettlesAfterTheRamp) {
  // Every request lives 5 s: at each arrival 5 are in flight (itself and the 4 before it), once 5 s have passed.
  const RateMetrics m = compute_rate_metrics(open_loop(40, [](int64_t) { return 5.0; }), 1.0, 0);
  EXPECT_TRUE(m.inflight.judged);
  EXPECT_NEAR(m.inflight.ramp_s, 5.0, 1e-9);
  EXPECT_EQ(m.inflight.window_requests, 35);  // arrivals at 5..39 s
  EXPECT_NEAR(m.inflight.early_mean, 5.0, 1e-9);
  EXPECT_NEAR(m.inflight.late_mean, 5.0, 1e-9);
  EXPECT_NEAR(m.inflight.growth_per_s, 0.0, 1e-9);
  EXPECT_EQ(m.inflight.requests_to_judge, 10);  // max(2 x 1 x 5, 1 x 5 + 4)
  const Verdict v = judged_at_one_per_second(m);
  EXPECT_TRUE(v.pass) << v.reason;
}

TEST(InflightTrend, AnOverloadedServerFailsEvenWithFlatTtft) {
  // Served at 0.5 req/s, offered 1: request i ends at 5 + 2i, so the queue grows by 0.5 requests a second.
  const RateMetrics m = compute_rate_metrics(open_loop(40, [](int64_t i) { return 5.0 + i; }), 1.0, 0);
  EXPECT_DOUBLE_EQ(m.ttft_first_quarter_p50, m.ttft_last_quarter_p50);  // the TTFT check cannot see it
  EXPECT_TRUE(m.inflight.judged);
  EXPECT_NEAR(m.inflight.ramp_s, 9.5, 1e-9);  // median E2E of requests 0..9 (5..14 s)
  EXPECT_NEAR(m.inflight.growth_per_s, 0.5, 0.05);
  const Verdict v = judged_at_one_per_second(m);
  EXPECT_TRUE(v.ttft_ok);
  EXPECT_FALSE(v.stationary_ok);
  EXPECT_NE(v.reason.find("requests in flight"), std::string::npos) << v.reason;
}

TEST(InflightTrend, ARunThatEndsBeforeTheRampNamesTheRequestsItNeeds) {
  // 10 arrivals over 9 s, each living 20 s: no arrival after the ramp, so nothing shows the queue settles.
  const RateMetrics m = compute_rate_metrics(open_loop(10, [](int64_t) { return 20.0; }), 1.0, 0);
  EXPECT_FALSE(m.inflight.judged);
  EXPECT_EQ(m.inflight.window_requests, 0);
  EXPECT_EQ(m.inflight.requests_to_judge, 40);  // max(2 x 1 x 20, 20 + 4)
  const Verdict v = judged_at_one_per_second(m);
  EXPECT_FALSE(v.pass);
  EXPECT_NE(v.reason.find("run >= 40 requests (--num-requests)"), std::string::npos) << v.reason;
}

TEST(InflightTrend, WarmUpsOccupyTheServerAndClosedLoopsAreNotJudged) {
  std::vector<RequestRecord> rs = open_loop(40, [](int64_t) { return 5.0; });
  RequestRecord w = ok_record(99, 0.0, 0.5, 100.0, 11);  // a warm-up still streaming through the whole run
  w.warmup = true;
  rs.push_back(w);
  const RateMetrics m = compute_rate_metrics(rs, 1.0, 0);
  EXPECT_NEAR(m.inflight.early_mean, 6.0, 1e-9);  // counted in flight, not as a measured arrival
  EXPECT_EQ(m.inflight.window_requests, 35);
  const RateMetrics closed = compute_rate_metrics(rs, std::numeric_limits<double>::infinity(), 4);
  EXPECT_FALSE(closed.inflight.judged);
  EXPECT_TRUE(judge(closed, KneeCriteria{}).stationary_ok);
}

TEST(Judge, PassRule) {
  RateMetrics m;
  m.ttft.count = 10;
  m.ttft.p95 = 4.9;
  m.success_rate = 0.99;
  m.ttft_first_quarter_p50 = 1.0;
  m.ttft_last_quarter_p50 = 1.5;
  KneeCriteria c;  // 5 s, 99%, 1.5x
  EXPECT_TRUE(judge(m, c).pass);
  m.ttft_last_quarter_p50 = 1.51;
  Verdict v = judge(m, c);
  EXPECT_FALSE(v.pass);
  EXPECT_FALSE(v.stationary_ok);
  EXPECT_NE(v.reason.find("queue growing"), std::string::npos);
  m.ttft_last_quarter_p50 = 1.0;
  m.ttft.p95 = 5.01;
  EXPECT_FALSE(judge(m, c).ttft_ok);
  m.ttft.p95 = 1;
  m.success_rate = 0.985;
  EXPECT_FALSE(judge(m, c).success_ok);
}

}  // namespace
}  // namespace mxserve::bench
