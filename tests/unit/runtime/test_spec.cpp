// Speculative maths: chain verification is exact for greedy, and rejection sampling preserves the
// target distribution (chi-square over many seeded draws on a tiny vocabulary).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/sampler.h"
#include "runtime/spec/speculative.h"

namespace mxserve::runtime {
namespace {

TokenDistribution dist(std::vector<double> probs) {
  TokenDistribution d;
  for (size_t i = 0; i < probs.size(); ++i) {
    d.ids.push_back(static_cast<int32_t>(i));
    d.probs.push_back(probs[i]);
  }
  return d;
}

TEST(VerifyChain, GreedyAcceptsTheMatchingPrefixThenCorrects) {
  std::vector<TokenDistribution> p = {dist({0.1, 0.7, 0.2}), dist({0.6, 0.3, 0.1}), dist({0.2, 0.2, 0.6}),
                                      dist({0.1, 0.1, 0.8})};
  auto none = [](size_t) { return 0.5; };
  std::vector<int32_t> drafts = {1, 0, 1};  // argmaxes: 1, 0, 2 -> accept 2, correct with 2
  ChainVerdict v = verify_chain(std::span<const int32_t>(drafts), {}, p, true, none);
  EXPECT_EQ(v.n_accepted, 2);
  EXPECT_EQ(v.next_token, 2);
  drafts = {1, 0, 2};  // all accepted -> bonus from p_3
  v = verify_chain(std::span<const int32_t>(drafts), {}, p, true, none);
  EXPECT_EQ(v.n_accepted, 3);
  EXPECT_EQ(v.next_token, 2);
  drafts = {0, 0, 2};
  v = verify_chain(std::span<const int32_t>(drafts), {}, p, true, none);
  EXPECT_EQ(v.n_accepted, 0);
  EXPECT_EQ(v.next_token, 1);
}

TEST(VerifyChain, RejectionSamplingPreservesTheTargetDistribution) {
  // Target p and a deliberately different draft q over 5 tokens; two draft positions.
  const std::vector<double> p0 = {0.35, 0.25, 0.2, 0.15, 0.05}, q0 = {0.05, 0.1, 0.5, 0.3, 0.05};
  const std::vector<double> p1 = {0.1, 0.4, 0.1, 0.3, 0.1}, q1 = {0.2, 0.2, 0.2, 0.2, 0.2};
  const std::vector<double> p2 = {0.2, 0.2, 0.2, 0.2, 0.2};
  std::vector<TokenDistribution> P = {dist(p0), dist(p1), dist(p2)}, Q = {dist(q0), dist(q1)};
  const int n = 200000;
  std::vector<int> first(5, 0);
  std::vector<int> second_given_2(5, 0);
  int n_first_2 = 0;
  for (int it = 0; it < n; ++it) {
    const uint64_t seed = 99;
    const uint64_t base = static_cast<uint64_t>(it) * 16;
    std::vector<int32_t> drafts = {Q[0].draw(counter_uniform(7, base)), Q[1].draw(counter_uniform(7, base + 1))};
    ChainVerdict v = verify_chain(std::span<const int32_t>(drafts), Q, P, false,
                                  [&](size_t i) { return counter_uniform(seed, base + 2 + i); });
    // The token sequence produced: accepted drafts then next_token.
    std::vector<int32_t> out(drafts.begin(), drafts.begin() + v.n_accepted);
    out.push_back(v.next_token);
    ++first[out[0]];
    if (out[0] == 2 && out.size() >= 2) {
      ++n_first_2;
      ++second_given_2[out[1]];
    }
  }
  // Chi-square against p0 (4 degrees of freedom; 99.9% critical value 18.47).
  double chi = 0;
  for (int t = 0; t < 5; ++t) {
    const double e = n * p0[t];
    chi += (first[t] - e) * (first[t] - e) / e;
  }
  EXPECT_LT(chi, 18.47) << "first-token distribution differs from the target";
  // Given an accepted first draft (token 2), the second follows p1 (draws where the chain continued past token 1).
  double chi2 = 0;
  for (int t = 0; t < 5; ++t) {
    const double e = n_first_2 * p1[t];
    chi2 += (second_given_2[t] - e) * (second_given_2[t] - e) / e;
  }
  EXPECT_GT(n_first_2, 10000);
  EXPECT_LT(chi2, 18.47) << "second-token distribution differs from the target";
}

TEST(SpecPolicy, BacksOffWhenDraftsAreRejectedAndRespectsTheBudget) {
  SpecConfig cfg;
  cfg.num_steps = 3;
  SpecPolicy policy(cfg);
  EXPECT_EQ(policy.steps_for(1, 8192), 3);
  EXPECT_EQ(policy.steps_for(4000, 8192), 1);  // (N+1) * decodes must fit the step budget
  for (int i = 0; i < 100; ++i) policy.record(3, 0);
  EXPECT_LT(policy.acceptance_rate(), 0.15);
  EXPECT_EQ(policy.steps_for(1, 8192), 0) << "never slower: speculation pauses when it does not pay";
  SpecConfig sim = cfg;
  sim.simulate_acceptance = 2.0;
  SpecPolicy fixed(sim);
  for (int i = 0; i < 100; ++i) fixed.record(3, 0);
  EXPECT_EQ(fixed.steps_for(1, 8192), 3) << "benchmark mode keeps N fixed";
}

}  // namespace
}  // namespace mxserve::runtime
