// The sampler: greedy / seeded / truncated sampling, the logit processors (penalties, bias, mask) and the
// numerics (tiny temperatures are greedy, huge logits / T never overflow, NaN is an error, +inf / -inf have
// defined meanings).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

SampleResult sample(std::vector<float> l, const SamplingParams& p, uint64_t seed, uint64_t step,
                    const TokenContext& ctx = {}) {
  auto r = sample_token(l, p, seed, step, ctx);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : SampleResult{};
}

TEST(Sampler, GreedyIsArgmaxAndLogprobsAreLogSoftmax) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  auto r = sample({0.1f, 2.0f, -1.0f, 1.5f}, p, 1, 0);
  EXPECT_EQ(r.token, 1);
  double z = 0;
  for (float v : {0.1f, 2.0f, -1.0f, 1.5f}) z += std::exp(v);
  EXPECT_NEAR(r.logprob, 2.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[1].token, 3);
}

TEST(Sampler, SeededIsReproducibleAndFollowsTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::map<int32_t, int> counts;
  const std::vector<float> l = {0.f, std::log(3.f), -100.f};  // p = 1/4, 3/4, ~0
  for (uint64_t step = 0; step < 20000; ++step) {
    auto a = sample(l, p, 0, step);
    EXPECT_EQ(a.token, sample(l, p, 999, step).token);  // request seed ignored when seed given
    ++counts[a.token];
  }
  EXPECT_NEAR(counts[1] / 20000.0, 0.75, 0.015);
  EXPECT_EQ(counts[2], 0);
}

TEST(Sampler, TopKTopPMinPTruncate) {
  SamplingParams p;
  p.temperature = 1.0f;
  const std::vector<float> base = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  for (uint64_t s = 0; s < 2000; ++s) {
    p.top_k = 2;
    p.top_p = 1;
    p.min_p = 0;
    EXPECT_LT(sample(base, p, s, 0).token, 2);
    p.top_k = 0;
    p.top_p = 0.75f;  // keeps {0.5, 0.3}
    EXPECT_LT(sample(base, p, s, 1).token, 2);
    p.top_p = 1;
    p.min_p = 0.5f;  // keeps p >= 0.25
    EXPECT_LT(sample(base, p, s, 2).token, 2);
  }
}

TEST(Sampler, CounterUniformIsStatelessAndUniform) {
  EXPECT_EQ(counter_uniform(5, 7), counter_uniform(5, 7));
  EXPECT_NE(counter_uniform(5, 7), counter_uniform(5, 8));
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) sum += counter_uniform(1, i);
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

TEST(Sampler, PenaltiesBiasAndMaskProcessTheLogits) {
  const std::vector<int32_t> prompt = {0, 3}, generated = {1, 1, 2};
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<float> l = {1.f, 1.f, 1.f, 1.f};
  process_logits(l, p, {prompt, generated});
  EXPECT_EQ(l, (std::vector<float>{1.f, 1.f - 0.5f - 0.5f, 1.f - 0.5f - 0.25f, 1.f}));  // output tokens only
  SamplingParams r;
  r.repetition_penalty = 2.f;  // prompt and output tokens: positive logits divided, negative multiplied
  l = {2.f, -2.f, 2.f, -2.f, 2.f};
  process_logits(l, r, {prompt, generated});
  EXPECT_EQ(l, (std::vector<float>{1.f, -4.f, 1.f, -4.f, 2.f}));
  SamplingParams b;
  b.logit_bias = {{4, 5.f}, {0, -1.f}};
  l = {1.f, 1.f, 1.f, 1.f, 1.f};
  process_logits(l, b, {});
  EXPECT_EQ(l, (std::vector<float>{0.f, 1.f, 1.f, 1.f, 6.f}));
  struct EvenOnly final : LogitMask {  // allows even tokens while the output is shorter than 3
    void apply(std::span<const int32_t> out, std::span<float> logits) const override {
      if (out.size() >= 3) return;
      for (size_t i = 1; i < logits.size(); i += 2) logits[i] = -std::numeric_limits<float>::infinity();
    }
  };
  SamplingParams m;
  m.temperature = 0;
  m.logit_mask = std::make_shared<EvenOnly>();
  const std::vector<float> odd_best = {0.f, 5.f, 1.f, 6.f};
  const std::vector<int32_t> one = {1};
  EXPECT_EQ(sample(odd_best, m, 0, 0, {prompt, one}).token, 2);
  EXPECT_EQ(sample(odd_best, m, 0, 0, {prompt, generated}).token, 3);
  EXPECT_TRUE(has_logit_processing(m));
  EXPECT_FALSE(has_logit_processing(SamplingParams{}));
}

// vLLM's rule: below 1e-5 a temperature is greedy. A 1e-45 temperature once made 1 / T overflow to inf,
// (l - max) * inf = NaN, and the draw returned the last vocabulary id whatever the logits.
TEST(Sampler, TinyTemperaturesAreGreedy) {
  const std::vector<float> l = {0.3f, 2.5f, 2.4f, -1.f, 0.f};
  for (float t : {0.f, 1e-45f, 1e-30f, 1e-7f, 9.9e-6f}) {
    SamplingParams p;
    p.temperature = t;
    EXPECT_TRUE(is_greedy(p)) << t;
    for (uint64_t s = 0; s < 50; ++s) EXPECT_EQ(sample(l, p, s, s).token, 1) << "temperature " << t;
  }
  SamplingParams p;
  p.temperature = 1e-5f;  // sampled, and peaked: 0.1 / 1e-5 = 1e4 nats between the top two
  EXPECT_FALSE(is_greedy(p));
  for (uint64_t s = 0; s < 200; ++s) EXPECT_EQ(sample(l, p, s, s).token, 1);
}

TEST(Sampler, HugeLogitsAndExtremeTemperaturesStayFinite) {
  SamplingParams p;
  p.temperature = 1e-5f;
  const float big = 3e38f;
  const std::vector<float> huge = {-big, big, big * 0.5f, -big};  // (l - max) / T overflows float, not double
  for (uint64_t s = 0; s < 100; ++s) EXPECT_EQ(sample(huge, p, s, s).token, 1);
  p.temperature = 1e6f;  // nearly uniform over the finite logits
  std::map<int32_t, int> counts;
  for (uint64_t s = 0; s < 4000; ++s) ++counts[sample({0.f, 1.f, 2.f, 3.f}, p, s, s).token];
  for (int32_t t = 0; t < 4; ++t) EXPECT_NEAR(counts[t] / 4000.0, 0.25, 0.04) << t;
  const TokenDistribution d = sampling_distribution(huge, p);
  double sum = 0;
  for (double x : d.probs) {
    EXPECT_TRUE(std::isfinite(x));
    sum += x;
  }
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

TEST(Sampler, InfinitiesHaveDefinedMeanings) {
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.temperature = 0.7f;
  std::map<int32_t, int> counts;
  for (uint64_t s = 0; s < 4000; ++s) ++counts[sample({1.f, inf, 3.f, inf, -inf}, p, s, s).token];
  EXPECT_EQ(counts[1] + counts[3], 4000) << "+inf logits share the mass";
  EXPECT_NEAR(counts[1] / 4000.0, 0.5, 0.04);
  for (uint64_t s = 0; s < 2000; ++s) EXPECT_NE(sample({-inf, 0.f, -inf, 0.f}, p, s, s).token % 2, 0) << "-inf: never";
  std::vector<float> all_masked = {-inf, -inf, -inf};
  auto r = sample_token(all_masked, p, 0, 0, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("no token is allowed"), std::string::npos) << r.status().to_string();
}

TEST(Sampler, NanLogitsAreAnErrorNamingTheToken) {
  for (float t : {0.f, 0.8f}) {
    SamplingParams p;
    p.temperature = t;
    p.logprobs = 1;
    std::vector<float> l = {0.1f, 0.2f, std::nanf(""), 0.3f};
    auto r = sample_token(l, p, 0, 0, {});
    ASSERT_FALSE(r.is_ok()) << "temperature " << t;
    EXPECT_NE(r.status().to_string().find("NaN logit (token id 2"), std::string::npos) << r.status().to_string();
  }
}


// The engine's incremental penalty entries (PenaltyTokens, caught up token by token as a request generates)
// are the set append_row_processing rebuilds from the whole context, for every penalty combination.
TEST(Sampler, IncrementalPenaltyTokensEqualTheRebuiltSet) {
  std::mt19937 rng(5);
  struct Combo {
    float repetition, presence, frequency;
  };
  for (const Combo c : {Combo{1.1f, 0.f, 0.f}, Combo{1.f, 0.5f, 0.f}, Combo{1.f, 0.f, 0.3f}, Combo{1.2f, 0.4f, 0.2f}}) {
    SamplingParams p;
    p.repetition_penalty = c.repetition;
    p.presence_penalty = c.presence;
    p.frequency_penalty = c.frequency;
    p.logit_bias = {{3, 1.5f}, {9, -2.f}};
    std::vector<int32_t> tokens(300);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 97);  // repeats within prompt and output
    const int32_t prompt_len = 200;
    PenaltyTokens seen;
    for (size_t n = prompt_len; n <= tokens.size(); n += 1 + rng() % 7) {  // steps that emit 1..7 tokens
      const std::span<const int32_t> now(tokens.data(), n);
      seen.sync(now, prompt_len, p.repetition_penalty != 1.f);
      kernels::SampleRowsInput want_in, got_in;
      kernels::SampleRowParams want_row, got_row;
      append_row_processing(p, TokenContext{now.first(prompt_len), now.subspan(prompt_len)}, &want_row, &want_in);
      append_row_processing(p, seen, &got_row, &got_in);
      auto key = [](const kernels::SamplePenaltyToken& e) { return std::tuple(e.token, e.output_count, e.in_prompt); };
      std::vector<std::tuple<int32_t, int32_t, int32_t>> want, got;
      for (const auto& e : want_in.penalties) want.push_back(key(e));
      for (const auto& e : got_in.penalties) got.push_back(key(e));
      std::sort(got.begin(), got.end());
      ASSERT_EQ(got, want) << "after " << n << " tokens, repetition " << c.repetition;
      EXPECT_EQ(got_row.penalty_count, want_row.penalty_count);
      EXPECT_EQ(got_row.bias_count, 2);
      ASSERT_EQ(got_in.biases.size(), want_in.biases.size());
    }
  }
}

}  // namespace
}  // namespace mxserve::runtime
