// eval/logit_metrics: sliding-window perplexity and logit comparison, checked against transformers' own
// logits in a committed golden fixture (the oracle), and against single-window evaluation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "eval/logit_metrics.h"
#include "model/causal_lm.h"

namespace mxserve {
namespace {

model::LoadOptions no_mtp() {
  model::LoadOptions o;
  o.load_mtp = false;
  return o;
}

const std::string kFixture = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";

struct Loaded {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<model::CausalLM> m;
  std::vector<cli::FixtureCase> cases;
  Loaded() {
    auto r = model::load_causal_lm(kFixture, *be, no_mtp());
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    m = std::move(*r);
    auto c = cli::read_fixture_cases(kFixture, m->config().vocab_size);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    cases = std::move(*c);
  }
};

// The longest fixture case, and transformers' perplexity of it computed from the reference logits.
double reference_perplexity(const cli::FixtureCase& c, int64_t V) {
  double nll = 0;
  const int64_t T = static_cast<int64_t>(c.input_ids.size());
  for (int64_t t = 0; t + 1 < T; ++t) nll -= eval::log_softmax(c.logits.data<float>() + t * V, V)[c.input_ids[t + 1]];
  return std::exp(nll / (T - 1));
}

TEST(EvalMetrics, OneWindowPerplexityEqualsTransformers) {
  Loaded L;
  const int64_t V = L.m->config().vocab_size;
  const auto& c = L.cases.back();
  const int64_t T = static_cast<int64_t>(c.input_ids.size());
  ASSERT_GE(T, 64);
  auto p = eval::sliding_perplexity(*L.m, *L.be, c.input_ids, T, T);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->tokens, T - 1);
  EXPECT_NEAR(p->value(), reference_perplexity(c, V), 1e-4 * reference_perplexity(c, V));
}

TEST(EvalMetrics, SlidingWindowsScoreEachTokenOnceWithItsWindowContext) {
  Loaded L;
  const int64_t V = L.m->config().vocab_size;
  const auto& ids = L.cases.back().input_ids;
  const int64_t N = static_cast<int64_t>(ids.size()), W = 16, S = 8;
  // Oracle: the same windows evaluated one by one, token j scored in the first window that reaches it.
  double nll = 0;
  int64_t n = 0, prev_end = 0;
  for (int64_t b = 0; b < N; b += S) {
    const int64_t e = std::min(b + W, N);
    auto l = eval::all_logits(*L.m, *L.be, std::vector<int32_t>(ids.begin() + b, ids.begin() + e));
    ASSERT_TRUE(l.is_ok());
    for (int64_t j = std::max(prev_end, b + 1); j < e; ++j, ++n)
      nll -= eval::log_softmax(l->data<float>() + (j - b - 1) * V, V)[ids[j]];
    prev_end = e;
    if (e == N) break;
  }
  auto p = eval::sliding_perplexity(*L.m, *L.be, ids, W, S);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->tokens, N - 1);
  EXPECT_EQ(n, N - 1);
  EXPECT_NEAR(p->value(), std::exp(nll / n), 1e-9 * std::exp(nll / n));
  // Shorter contexts predict worse on average than the full window (a sanity bound, not an identity).
  auto full = eval::sliding_perplexity(*L.m, *L.be, ids, N, N);
  ASSERT_TRUE(full.is_ok());
  EXPECT_NE(p->value(), full->value());
}

TEST(EvalMetrics, BadWindowsAreErrors) {
  Loaded L;
  const auto& ids = L.cases.back().input_ids;
  EXPECT_FALSE(eval::sliding_perplexity(*L.m, *L.be, ids, 1, 1).is_ok());
  EXPECT_FALSE(eval::sliding_perplexity(*L.m, *L.be, ids, 8, 9).is_ok());
  EXPECT_FALSE(eval::sliding_perplexity(*L.m, *L.be, {ids[0]}, 8, 4).is_ok());
}

TEST(EvalMetrics, ComparisonOfLogitsWithTransformers) {
  Loaded L;
  const int64_t V = L.m->config().vocab_size;
  const auto& c = L.cases.back();
  auto l = eval::all_logits(*L.m, *L.be, c.input_ids);
  ASSERT_TRUE(l.is_ok());
  eval::LogitComparison same, vs_ref, vs_shifted;
  for (int64_t t = 0; t < static_cast<int64_t>(c.input_ids.size()); ++t) {
    const float* a = c.logits.data<float>() + t * V;
    const float* b = l->data<float>() + t * V;
    same.add_row(a, a, V);
    vs_ref.add_row(a, b, V);
    const float* other = c.logits.data<float>() + ((t + 1) % c.input_ids.size()) * V;  // a different row
    vs_shifted.add_row(a, other, V);
  }
  EXPECT_EQ(same.mean_kl(), 0.0);
  EXPECT_EQ(same.top1(), 1.0);
  EXPECT_EQ(same.rel_l2(), 0.0);
  EXPECT_NEAR(same.mean_cos(), 1.0, 1e-12);
  EXPECT_LT(vs_ref.rel_l2(), 1e-4);
  EXPECT_LT(vs_ref.mean_kl(), 1e-8);
  EXPECT_EQ(vs_ref.top1(), 1.0);
  EXPECT_GT(vs_shifted.mean_kl(), 1e-3);
  EXPECT_GT(vs_shifted.rel_l2(), 0.1);
  EXPECT_LT(vs_shifted.top1(), 1.0);
}

// The KL direction: `eval compare` and the W4A8 gate report KL(A||B) = sum_v p_A(v) (log p_A(v) - log p_B(v)),
// A = the reference (docs/eval.md). A = uniform over 4, B = peaked on token 0: KL(A||B) ~ 6.1 nats, KL(B||A) ~ 1.4
// (computed here by hand from the two distributions), so a swapped direction fails by far.
TEST(EvalMetrics, KlIsTheDocumentedDirectionReferenceFirst) {
  const float a[4] = {0, 0, 0, 0};
  const float b[4] = {10, 0, 0, 0};
  const double z = std::exp(10.0) + 3;  // B's partition function
  const double q[4] = {std::exp(10.0) / z, 1 / z, 1 / z, 1 / z};
  double kl_ab = 0, kl_ba = 0;
  for (int v = 0; v < 4; ++v) {
    kl_ab += 0.25 * (std::log(0.25) - std::log(q[v]));
    kl_ba += q[v] * (std::log(q[v]) - std::log(0.25));
  }
  ASSERT_GT(kl_ab - kl_ba, 4.0) << "the two directions must differ for the test to mean anything";
  eval::LogitComparison ab;
  ab.add_row(a, b, 4);
  EXPECT_NEAR(ab.mean_kl(), kl_ab, 1e-9) << "KL(A||B) with A = the first argument (the reference)";
  EXPECT_NEAR(ab.kl_max, kl_ab, 1e-9);
  eval::LogitComparison ba;
  ba.add_row(b, a, 4);
  EXPECT_NEAR(ba.mean_kl(), kl_ba, 1e-9);
  // The other measures of the same pair: relative L2 is ||b - a|| / ||a|| (a = the reference) and top-1 agrees.
  eval::LogitComparison c;
  const float ref[4] = {3, 4, 0, 0}, cand[4] = {3, 4, 1, 0};
  c.add_row(ref, cand, 4);
  EXPECT_NEAR(c.rel_l2(), 1.0 / 5.0, 1e-12);
  EXPECT_EQ(c.top1_agree, 1);
}

}  // namespace
}  // namespace mxserve
