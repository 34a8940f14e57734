#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

TEST(Sampler, GreedyIsArgmaxAndLogprobsAreLogSoftmax) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.5f};
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  auto r = sample_token(l, p, 1, 0, {});
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
  for (uint64_t step = 0; step < 20000; ++step) {
    std::vector<float> l = {0.f, std::log(3.f), -100.f};  // p = 1/4, 3/4, ~0
    auto a = sample_token(l, p, 0, step, {});
    std::vector<float> l2 = {0.f, std::log(3.f), -100.f};
    EXPECT_EQ(a.token, sample_token(l2, p, 999, step, {}).token);  // request seed ignored when seed given
    ++counts[a.token];
  }
  EXPECT_NEAR(counts[1] / 20000.0, 0.75, 0.015);
  EXPECT_EQ(counts[2], 0);
}

TEST(Sampler, TopKTopPMinPTruncate) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<float> base = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  for (uint64_t s = 0; s < 2000; ++s) {
    std::vector<float> l = base;
    p.top_k = 2;
    p.top_p = 1;
    p.min_p = 0;
    EXPECT_LT(sample_token(l, p, s, 0, {}).token, 2);
    l = base;
    p.top_k = 0;
    p.top_p = 0.75f;  // keeps {0.5, 0.3}
    EXPECT_LT(sample_token(l, p, s, 1, {}).token, 2);
    l = base;
    p.top_p = 1;
    p.min_p = 0.5f;  // keeps p >= 0.25
    EXPECT_LT(sample_token(l, p, s, 2, {}).token, 2);
  }
}

TEST(Sampler, CounterUniformIsStatelessAndUniform) {
  EXPECT_EQ(counter_uniform(5, 7), counter_uniform(5, 7));
  EXPECT_NE(counter_uniform(5, 7), counter_uniform(5, 8));
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) sum += counter_uniform(1, i);
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

}  // namespace
}  // namespace mxserve::runtime
