// The verifier on its own (runtime/spec/verifier.h): greedy walks of chains and trees, recursive rejection
// sampling preserves the target distribution (chi-square), the penalty state of draft position j counts the
// drafts accepted before j, seeded requests accept exactly the tokens plain sampling would draw, KV
// compaction moves, emitted rows, and a NaN / fully masked target row is an error.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "runtime/sampler.h"
#include "runtime/spec/verifier.h"

namespace mxserve::runtime {
namespace {

// Logit rows whose softmax at temperature 1 is `probs` (one row per entry).
std::vector<float> rows_of(const std::vector<std::vector<double>>& probs) {
  std::vector<float> out;
  for (const auto& p : probs)
    for (double x : p) out.push_back(x > 0 ? static_cast<float>(std::log(x)) : -INFINITY);
  return out;
}

TokenDistribution dist(std::vector<double> probs) {
  TokenDistribution d;
  for (size_t i = 0; i < probs.size(); ++i) {
    d.ids.push_back(static_cast<int32_t>(i));
    d.probs.push_back(probs[i]);
  }
  return d;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi = 0;
  for (size_t t = 0; t < probs.size(); ++t) {
    const double e = n * probs[t];
    chi += (counts[t] - e) * (counts[t] - e) / e;
  }
  return chi;
}

struct Case {
  std::vector<int32_t> drafts, parents;
  std::vector<TokenDistribution> proposals;
  std::vector<float> logits;  // [M + 1, V]
  int64_t V = 3;
  SamplingParams sp;
  std::vector<int32_t> prompt = {0}, generated;
  uint64_t seed = 1;
  Result<Verdict> run() const {
    VerifyInput in;
    in.drafts = drafts;
    in.parents = parents;
    in.proposals = proposals;
    in.sampling = &sp;
    in.context = {prompt, generated};
    in.seed = seed;
    TargetRows t;
    t.vocab = V;
    t.logits = logits;
    return verify_drafts(in, t);
  }
};

TEST(Verifier, GreedyChainAcceptsTheMatchingPrefixThenCorrects) {
  Case c;
  c.sp.temperature = 0;
  c.logits = rows_of({{0.1, 0.7, 0.2}, {0.6, 0.3, 0.1}, {0.2, 0.2, 0.6}, {0.1, 0.1, 0.8}});
  c.drafts = {1, 0, 1};  // argmaxes 1, 0, 2 -> accept 2, correct with 2
  auto v = c.run();
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->path, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(v->rows, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(v->depth, 3);
  EXPECT_TRUE(v->kv_moves.empty());
  c.drafts = {1, 0, 2};  // all accepted -> bonus from the last row
  v = c.run();
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{1, 0, 2, 2}));
  c.drafts = {0, 0, 2};
  v = c.run();
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{1}));
  EXPECT_EQ(v->rows, (std::vector<int32_t>{0}));
}

TEST(Verifier, GreedyNeedsOnlyTheDeviceArgmaxWithoutProcessing) {
  SamplingParams sp;
  sp.temperature = 0;
  const std::vector<int32_t> drafts = {4, 7}, argmax = {4, 9, 1};
  VerifyInput in;
  in.drafts = drafts;
  in.sampling = &sp;
  TargetRows t;
  t.vocab = 16;
  t.argmax = argmax;
  auto v = verify_drafts(in, t);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{4, 9}));
  sp.presence_penalty = 1;  // penalties change the argmax: the host logits are needed, and their absence is an error
  EXPECT_FALSE(verify_drafts(in, t).is_ok());
}

TEST(Verifier, GreedyTreeFollowsTheLongestMatchingPathAndCompactsIt) {
  // Root children: node0 = 0, node1 = 1; node1's children: node2 = 0, node3 = 2; node3's child node4 = 1.
  Case c;
  c.sp.temperature = 0;
  c.drafts = {0, 1, 0, 2, 1};
  c.parents = {-1, -1, 1, 1, 3};
  c.logits = rows_of({{0.1, 0.7, 0.2}, {0.6, 0.3, 0.1}, {0.2, 0.2, 0.6}, {0.9, 0.05, 0.05}, {0.1, 0.8, 0.1},
                      {0.1, 0.1, 0.8}});
  // argmax root = 1 -> node1; at node1 (row 2) = 2 -> node3; at node3 (row 4) = 1 -> node4; bonus row 5 = 2.
  auto v = c.run();
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->path, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{1, 2, 1, 2}));
  EXPECT_EQ(v->rows, (std::vector<int32_t>{0, 2, 4, 5}));
  EXPECT_EQ(v->depth, 3);
  // Node n's KV sits at offset 1 + n: nodes 1, 3, 4 move to offsets 1, 2, 3.
  EXPECT_EQ(v->kv_moves, (std::vector<std::pair<int32_t, int32_t>>{{2, 1}, {4, 2}, {5, 3}}));
}

// Frequency penalty 2 at every position; the penalty of draft position j counts the drafts accepted before j.
TEST(Verifier, PenaltiesCountTheAcceptedDraftsBeforeEachPosition) {
  Case c;
  c.sp.temperature = 0;
  c.sp.frequency_penalty = 2.0f;
  c.V = 4;
  // Raw argmax is token 1 at every row (logit 3 vs 2 for token 2). Penalized: token 1 once generated drops
  // to 1 < 2, so the chain 1, 1 must be cut after the first draft even though each row's raw argmax is 1.
  c.logits = {0, 3, 2, 0, 0, 3, 2, 0, 0, 3, 2, 0};
  c.drafts = {1, 1};
  auto v = c.run();
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{1, 2}));
  // With token 1 already generated before the step the very first position prefers 2.
  c.generated = {1};
  c.drafts = {2, 1};
  v = c.run();
  // 2 (1 vs 2); then 1 (1 vs 2 - 2 = 0); then token 1 is at 3 - 4 < 0 and 2 at 0: the first zero, token 0.
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{2, 1, 0}));
}

TEST(Verifier, SeededAcceptsExactlyTheTokensPlainSamplingDraws) {
  // Plain sampling of this request at output index s draws pick_token(row, sp, seed, s); the verifier must
  // accept a draft iff it is that token, and emit that token at the first mismatch.
  const std::vector<double> p = {0.3, 0.3, 0.4};
  Case c;
  c.sp.temperature = 1;
  c.sp.seed = 77;
  c.seed = 77;
  c.generated = {2, 2, 1};  // output index 3 is the root's next token
  c.logits = rows_of({p, p, p, p});
  const std::vector<float> row(c.logits.begin(), c.logits.begin() + 3);
  std::vector<int32_t> plain;
  for (uint64_t s = 3; s < 7; ++s) plain.push_back(*pick_token(row, c.sp, 77, s));
  c.drafts = {plain[0], plain[1], plain[2]};
  auto v = c.run();
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v->tokens, plain);
  c.drafts = {plain[0], (plain[1] + 1) % 3, plain[2]};
  v = c.run();
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{plain[0], plain[1]}));
}

TEST(Verifier, RejectionSamplingPreservesTheChainTargetDistribution) {
  const std::vector<double> p0 = {0.35, 0.25, 0.2, 0.15, 0.05}, q0 = {0.05, 0.1, 0.5, 0.3, 0.05};
  const std::vector<double> p1 = {0.1, 0.4, 0.1, 0.3, 0.1}, q1 = {0.2, 0.2, 0.2, 0.2, 0.2};
  const std::vector<double> p2 = {0.2, 0.2, 0.2, 0.2, 0.2};
  Case c;
  c.V = 5;
  c.sp.temperature = 1;
  c.logits = rows_of({p0, p1, p2});
  c.proposals = {dist(q0), dist(q1)};
  const int n = 100000;
  std::vector<int> first(5, 0), second_given_2(5, 0);
  int n_first_2 = 0;
  for (int it = 0; it < n; ++it) {
    c.seed = static_cast<uint64_t>(it);
    c.drafts = {c.proposals[0].draw(counter_uniform(7, 2 * it)), c.proposals[1].draw(counter_uniform(7, 2 * it + 1))};
    auto v = c.run();
    ASSERT_TRUE(v.is_ok());
    ++first[v->tokens[0]];
    if (v->tokens[0] == 2 && v->tokens.size() >= 2) {
      ++n_first_2;
      ++second_given_2[v->tokens[1]];
    }
  }
  EXPECT_LT(chi_square(first, p0, n), 18.47) << "first token differs from the target (4 dof, 99.9%)";
  EXPECT_GT(n_first_2, 5000);
  EXPECT_LT(chi_square(second_given_2, p1, n_first_2), 18.47) << "second token after an accepted 2 differs";
}

TEST(Verifier, RecursiveRejectionPreservesTheTreeTargetDistribution) {
  // A top-k tree (deterministic candidates): root children tokens 2, 3; node0 (2) has children 1, 4.
  const std::vector<double> p0 = {0.35, 0.25, 0.2, 0.15, 0.05}, pn0 = {0.1, 0.4, 0.1, 0.3, 0.1};
  const std::vector<double> flat = {0.2, 0.2, 0.2, 0.2, 0.2};
  Case c;
  c.V = 5;
  c.sp.temperature = 1;
  c.drafts = {2, 3, 1, 4};
  c.parents = {-1, -1, 0, 0};
  c.logits = rows_of({p0, pn0, flat, flat, flat});
  const int n = 100000;
  std::vector<int> first(5, 0), second_given_2(5, 0);
  int n_first_2 = 0;
  for (int it = 0; it < n; ++it) {
    c.seed = static_cast<uint64_t>(it);
    auto v = c.run();
    ASSERT_TRUE(v.is_ok());
    ++first[v->tokens[0]];
    if (v->tokens[0] == 2) {
      ++n_first_2;
      ++second_given_2[v->tokens[1]];
    }
  }
  EXPECT_LT(chi_square(first, p0, n), 18.47) << "first token differs from the target (4 dof, 99.9%)";
  EXPECT_GT(n_first_2, 15000);
  EXPECT_LT(chi_square(second_given_2, pn0, n_first_2), 18.47) << "second token after node0 differs from the target";
}

TEST(Verifier, ANanOrFullyMaskedTargetRowIsAnError) {
  Case c;
  c.sp.temperature = 0.7f;
  c.logits = {0.1f, NAN, 0.3f, 0.1f, 0.2f, 0.3f};
  c.drafts = {2};
  auto v = c.run();
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().to_string().find("NaN"), std::string::npos) << v.status().to_string();
  c.sp.temperature = 0;
  c.sp.logit_bias = {{0, -INFINITY}};  // (the engine validates biases; here: a row with nothing allowed)
  c.logits = {0.f, -INFINITY, -INFINITY, 0.1f, 0.2f, 0.3f};
  v = c.run();
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().to_string().find("no token is allowed"), std::string::npos) << v.status().to_string();
}

TEST(Verifier, MalformedInputsAreRefused) {
  Case c;
  c.sp.temperature = 0;
  c.logits = rows_of({{0.5, 0.3, 0.2}, {0.5, 0.3, 0.2}});
  c.drafts = {1};
  c.parents = {0};  // a node cannot be its own parent
  EXPECT_FALSE(c.run().is_ok());
  c.parents.clear();
  c.logits.pop_back();
  EXPECT_FALSE(c.run().is_ok());
}

TEST(Verifier, SimulatedAcceptanceAcceptsThePathOfTheRequestedLength) {
  SamplingParams sp;
  sp.temperature = 0;
  const std::vector<int32_t> drafts = {5, 6, 7, 8, 9}, parents = {-1, -1, 0, 1, 3}, argmax(6, 3);
  VerifyInput in;
  in.drafts = drafts;
  in.parents = parents;
  in.sampling = &sp;
  in.simulate_acceptance = 4.0;  // 3 accepted: the first node at depth 3 is node 4 (path 1, 3, 4)
  TargetRows t;
  t.vocab = 16;
  t.argmax = argmax;
  auto v = verify_drafts(in, t);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->path, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{6, 8, 9, 3}));
}

}  // namespace
}  // namespace mxserve::runtime
