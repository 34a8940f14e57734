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

TEST(VerifyTree, GreedyFollowsTheLongestMatchingPath) {
  // Root children: node0 = 0, node1 = 1; node1's children: node2 = 0, node3 = 2; node3's child node4 = 1.
  DraftTree t;
  t.tokens = {0, 1, 0, 2, 1};
  t.parents = {-1, -1, 1, 1, 3};
  auto none = [](size_t) { return 0.5; };
  std::vector<TokenDistribution> p = {dist({0.1, 0.7, 0.2}), dist({0.6, 0.3, 0.1}), dist({0.2, 0.2, 0.6}),
                                      dist({0.9, 0.05, 0.05}), dist({0.1, 0.8, 0.1}), dist({0.1, 0.1, 0.8})};
  // argmax root = 1 -> node1; argmax at node1 (p[2]) = 2 -> node3; argmax at node3 (p[4]) = 1 -> node4;
  // node4 has no children: bonus = argmax p[5] = 2.
  TreeVerdict v = verify_tree(t, {}, p, true, none);
  EXPECT_EQ(v.path, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(v.next_token, 2);
  p[0] = dist({0.1, 0.2, 0.7});  // no root child matches: nothing accepted, correction 2
  v = verify_tree(t, {}, p, true, none);
  EXPECT_TRUE(v.path.empty());
  EXPECT_EQ(v.next_token, 2);
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi = 0;
  for (size_t t = 0; t < probs.size(); ++t) {
    const double e = n * probs[t];
    chi += (counts[t] - e) * (counts[t] - e) / e;
  }
  return chi;
}

TEST(VerifyTree, RecursiveRejectionPreservesTheTargetDistribution) {
  // A top-k tree (deterministic candidates): root children tokens 2, 3; node0 (2) has children 1, 4.
  const std::vector<double> p0 = {0.35, 0.25, 0.2, 0.15, 0.05}, pn0 = {0.1, 0.4, 0.1, 0.3, 0.1};
  const std::vector<double> flat = {0.2, 0.2, 0.2, 0.2, 0.2};
  DraftTree t;
  t.tokens = {2, 3, 1, 4};
  t.parents = {-1, -1, 0, 0};
  std::vector<TokenDistribution> P = {dist(p0), dist(pn0), dist(flat), dist(flat), dist(flat)};
  const int n = 200000;
  std::vector<int> first(5, 0), second_given_2(5, 0);
  int n_first_2 = 0;
  for (int it = 0; it < n; ++it) {
    const uint64_t base = static_cast<uint64_t>(it) * 16;
    TreeVerdict v = verify_tree(t, {}, P, false, [&](size_t i) { return counter_uniform(5, base + i); });
    std::vector<int32_t> out;
    for (int32_t node : v.path) out.push_back(t.tokens[node]);
    out.push_back(v.next_token);
    ++first[out[0]];
    if (out[0] == 2) {
      ++n_first_2;
      ++second_given_2[out[1]];
    }
  }
  EXPECT_LT(chi_square(first, p0, n), 18.47) << "first token differs from the target (4 dof, 99.9%)";
  EXPECT_GT(n_first_2, 30000);
  EXPECT_LT(chi_square(second_given_2, pn0, n_first_2), 18.47) << "second token after node0 differs from the target";

  // Sampled proposals: two root children drawn i.i.d. from q (duplicates allowed), SpecInfer's setting.
  const std::vector<double> q0 = {0.05, 0.1, 0.5, 0.3, 0.05};
  std::vector<TokenDistribution> Q = {dist(q0)};
  std::vector<TokenDistribution> P2 = {dist(p0), dist(flat), dist(flat)};
  std::vector<int> first2(5, 0);
  for (int it = 0; it < n; ++it) {
    const uint64_t base = static_cast<uint64_t>(it) * 16;
    DraftTree s;
    s.tokens = {Q[0].draw(counter_uniform(11, base)), Q[0].draw(counter_uniform(11, base + 1))};
    s.parents = {-1, -1};
    s.proposal = {0, 0};
    TreeVerdict v = verify_tree(s, Q, P2, false, [&](size_t i) { return counter_uniform(13, base + i); });
    ++first2[v.path.empty() ? v.next_token : s.tokens[v.path[0]]];
  }
  EXPECT_LT(chi_square(first2, p0, n), 18.47) << "i.i.d. sampled siblings: first token differs from the target";
}

// Drives the policy like the engine does (verify -> choose N -> record the step's time) against a
// scripted cost model t(N, B) and a Bernoulli chain acceptance alpha; returns how often each N was chosen
// over the last `tail` steps.
std::vector<int> drive_policy(SpecPolicy& policy, int64_t batch, double alpha, double (*cost)(int32_t, int64_t),
                              int steps = 600, int tail = 300, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int> chosen(8, 0);
  int32_t prev = -1;
  for (int s = 0; s < steps; ++s) {
    if (prev > 0)
      for (int64_t b = 0; b < batch; ++b) {
        int32_t acc = 0;
        while (acc < prev && u(rng) < alpha) ++acc;
        policy.record(prev, acc);
      }
    const int32_t n = policy.steps_for(batch, 1 << 20);
    if (prev >= 0) policy.record_step(prev, batch, cost(prev, batch));
    if (s >= steps - tail) ++chosen[n];
    prev = n;
  }
  return chosen;
}

// Verify cost grows with (N + 1) * B rows; at batch 64 a step is compute bound and each draft row costs
// as much as a token; at small batches steps are weight-bandwidth bound and drafts are nearly free.
double scripted_cost(int32_t n, int64_t batch) {
  const double per_row = batch >= 32 ? 1.0 / batch : 0.002;
  return 1.0 + per_row * batch * n + 0.01 * n;  // + the N-1 draft steps
}

TEST(SpecPolicy, SpeculatesWhenVerifyIsCheapAndAcceptanceGood) {
  SpecConfig cfg;
  cfg.num_steps = 3;
  SpecPolicy policy(cfg);
  auto chosen = drive_policy(policy, 8, 0.8, scripted_cost);
  EXPECT_GE(chosen[3], 280) << "cheap verify, alpha 0.8: N = 3 maximizes tokens/s";
  EXPECT_GT(policy.estimated_gain(), 1.5);
  EXPECT_NEAR(policy.expected_accepted(3), 0.8 + 0.64 + 0.512, 0.3);
}

TEST(SpecPolicy, StopsSpeculatingWhenVerifyIsExpensiveAtLargeBatch) {
  SpecConfig cfg;
  cfg.num_steps = 3;
  SpecPolicy policy(cfg);
  auto chosen = drive_policy(policy, 64, 0.8, scripted_cost);
  EXPECT_GE(chosen[0], 280) << "compute-bound verify at batch 64: (1 + E[acc]) / t(N) is best at N = 0";
  // The same policy object keeps a separate cost table per batch bucket: batch 8 still speculates.
  auto small = drive_policy(policy, 8, 0.8, scripted_cost, 600, 300, 2);
  EXPECT_GE(small[3], 280);
}

TEST(SpecPolicy, StopsSpeculatingWhenNothingIsAccepted) {
  SpecConfig cfg;
  cfg.num_steps = 3;
  SpecPolicy policy(cfg);
  auto chosen = drive_policy(policy, 1, 0.0, scripted_cost);
  EXPECT_GE(chosen[0], 280) << "never slower: speculation pauses when it does not pay";
  EXPECT_LT(policy.acceptance_rate(), 0.15);
  EXPECT_LT(policy.expected_accepted(3), 0.05);
}

TEST(SpecPolicy, MeasuresStepTimesPerBucketAndRespectsTheBudget) {
  SpecConfig cfg;
  cfg.num_steps = 3;
  SpecPolicy policy(cfg);
  EXPECT_LE(policy.steps_for(4000, 8192), 1);  // (N+1) * decodes must fit the step budget
  SpecConfig fixed_cfg = cfg;
  fixed_cfg.adaptive = false;
  SpecPolicy fixed(fixed_cfg);
  for (int i = 0; i < 100; ++i) fixed.record(3, 0);
  EXPECT_EQ(fixed.steps_for(1, 8192), 3) << "--no-speculative-adaptive keeps N fixed";
  EXPECT_EQ(fixed.steps_for(4000, 8192), 1) << "but never beyond the step budget";
  // A step that verified one N but drafted another is not steady: not recorded.
  SpecPolicy p(cfg);
  const int32_t n = p.steps_for(4, 8192);
  p.record_step(n == 3 ? 2 : 3, 4, 0.5);
  EXPECT_LT(p.step_time(n == 3 ? 2 : 3, 4), 0);
  p.record_step(n, 4, 0.5);
  EXPECT_DOUBLE_EQ(p.step_time(n, 4), 0.5);
  EXPECT_DOUBLE_EQ(p.step_time(n, 7), 0.5);  // same bucket [4, 8)
  EXPECT_LT(p.step_time(n, 8), 0);
}

}  // namespace
}  // namespace mxserve::runtime
