// simulate_serving (runtime/serving_sim.h, `mxserve simulate`): the scheduler in virtual time against closed forms --
// one request alone (TTFT = its prefill step, TPOT = a one-row decode step), requests that arrive together (one
// prefill step, then batched decode steps), a prefix-cache hit (the prefill covers only the uncached tokens), the
// queue growing past the service rate (the knee criterion fails), the ITL bound holding, and a pool too small
// refused naming the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "runtime/serving_sim.h"

namespace mxserve::runtime {
namespace {

constexpr StepCostCoefficients kCost{10e-3, 40e-6, 1e-9, 1e-3, 0};

SimConfig config() {
  SimConfig c;
  c.scheduler.block_size = 16;
  c.scheduler.max_num_batched_tokens = 8192;
  c.scheduler.chunked_prefill_size = 8192;
  c.scheduler.max_step_seconds = 0;
  c.kv_blocks = 10000;
  c.cost = kCost;
  return c;
}

double max_ttft(const SimResult& r) {
  double m = 0;
  for (const auto& q : r.requests) m = std::max(m, q.first_token - q.arrival);
  return m;
}

double prefill_seconds(double start, double n) {
  return kCost.base + kCost.per_prefill_token * n + kCost.per_prefill_pair * n * (start + (n + 1) / 2);
}

TEST(ServingSim, OneRequestAloneMatchesItsSteps) {
  SimWorkload w;
  w.input_len = 1000, w.output_len = 5, w.cache_hit_rate = 0, w.prefix_groups = 1, w.num_requests = 1, w.warmup = 0;
  w.rate = 1;
  auto r = simulate_serving(config(), w);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE(r->completed);
  ASSERT_EQ(r->requests.size(), 1u);
  const double ttft = prefill_seconds(0, 1000);
  EXPECT_NEAR(max_ttft(*r), ttft, 1e-9);
  EXPECT_NEAR(r->tpot_mean, kCost.base + kCost.per_decode_row, 1e-9);
  EXPECT_NEAR(r->requests[0].finish, ttft + 4 * (kCost.base + kCost.per_decode_row), 1e-9);
  EXPECT_EQ(r->steps, 5);
  EXPECT_EQ(r->max_running, 1);
}

TEST(ServingSim, RequestsArrivingTogetherShareTheirSteps) {
  SimWorkload w;
  w.input_len = 1000, w.output_len = 9, w.cache_hit_rate = 0, w.prefix_groups = 1, w.num_requests = 4, w.warmup = 0;
  w.rate = 1e9;  // request 0 at 0 s, the others a few ns later
  auto r = simulate_serving(config(), w);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // Step 1: request 0's prefill alone (the others arrive during it). Step 2: its decode + the three prefills
  // (3000 tokens <= 8192). Steps 3-9: four decode rows; request 0 finishes at step 9, the others at step 10.
  const double p = prefill_seconds(0, 1000), row = kCost.per_decode_row;
  const double t1 = p, t2 = kCost.base + row + 3 * (p - kCost.base), four = kCost.base + 4 * row;
  EXPECT_NEAR(max_ttft(*r), t1 + t2, 1e-6);
  const double tpot0 = (t2 + 7 * four) / 8, tpot_rest = (7 * four + kCost.base + 3 * row) / 8;
  EXPECT_NEAR(r->tpot_mean, (tpot0 + 3 * tpot_rest) / 4, 1e-9);
  EXPECT_EQ(r->steps, 10);
  EXPECT_EQ(r->max_running, 4);
}

TEST(ServingSim, PrefixHitsPrefillOnlyTheUncachedTokens) {
  SimWorkload w;
  w.input_len = 1000, w.output_len = 2, w.cache_hit_rate = 0.5, w.prefix_groups = 1, w.num_requests = 5, w.warmup = 1;
  w.rate = 0.5;  // each request alone (a request takes ~0.1 s)
  auto r = simulate_serving(config(), w);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const int64_t cached = 496;  // the 500-token prefix's full blocks (31 x 16)
  for (const auto& q : r->requests) EXPECT_EQ(q.cached_tokens, cached);
  EXPECT_NEAR(max_ttft(*r), prefill_seconds(cached, 1000 - cached), 1e-9);
  EXPECT_NEAR(r->cached_share, 0.496, 1e-9);
  EXPECT_EQ(r->preemptions, 0);
}

TEST(ServingSim, QueueGrowsPastTheServiceRate) {
  SimWorkload w;
  w.input_len = 4000, w.output_len = 50, w.cache_hit_rate = 0, w.prefix_groups = 1, w.num_requests = 40, w.warmup = 0;
  // Alone a request takes ~0.18 s of prefill + 49 decode steps: ~0.75 s. Well below 1 / 0.75 req/s it keeps up.
  w.rate = 0.5;
  auto slow = simulate_serving(config(), w);
  ASSERT_TRUE(slow.is_ok());
  EXPECT_NEAR(max_ttft(*slow), prefill_seconds(0, 4000), 1e-9);
  EXPECT_GT(slow->sustained_rate, 0.9 * w.rate);
  // Far above what prefill alone allows (1 / 0.18 s): TTFT climbs with every arrival and the rate falls behind.
  w.rate = 20;
  auto fast = simulate_serving(config(), w);
  ASSERT_TRUE(fast.is_ok());
  EXPECT_TRUE(fast->completed);
  EXPECT_LT(fast->sustained_rate, 0.9 * w.rate);
  const auto& q = fast->requests;
  EXPECT_GT(q.back().first_token - q.back().arrival, 10 * (q.front().first_token - q.front().arrival));
  EXPECT_GT(fast->max_waiting, 10);
}

TEST(ServingSim, TheItlBoundHoldsForDecodes) {
  SimConfig c = config();
  c.scheduler.max_step_seconds = 0.05;
  c.scheduler.min_prefill_chunk = 64;
  SimWorkload w;
  w.input_len = 6000, w.output_len = 60, w.cache_hit_rate = 0, w.prefix_groups = 1, w.num_requests = 12, w.warmup = 0;
  w.rate = 2;
  auto bounded = simulate_serving(c, w);
  ASSERT_TRUE(bounded.is_ok());
  // A step with decodes carries at most the prefill that keeps it within 50 ms, or min_prefill_chunk tokens.
  const double worst = 0.05 + 64 * kCost.per_prefill_token + 64 * kCost.per_prefill_pair * 6000;
  EXPECT_LE(bounded->itl_max, worst + 1e-9);
  c.scheduler.max_step_seconds = 0;
  auto unbounded = simulate_serving(c, w);
  ASSERT_TRUE(unbounded.is_ok());
  EXPECT_GT(unbounded->itl_max, 0.2) << "without the bound a 6000-token prefill step stalls the decodes";
  EXPECT_LT(max_ttft(*unbounded), max_ttft(*bounded)) << "the bound trades TTFT for ITL";
}

TEST(ServingSim, APoolTooSmallIsRefusedNamingTheFlag) {
  SimConfig c = config();
  c.kv_blocks = 10;
  SimWorkload w;
  w.input_len = 1000;
  auto r = simulate_serving(c, w);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--kv-tokens"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace mxserve::runtime
