// StepCostModel and PrefillBudget against a scripted cost function: the fit converges to the scripted
// coefficients (noise, outliers, long decode-only stretches, a change of regime), the token bound is exact,
// and the budget's guarantees (hard caps until ready, min chunk, alignment) hold.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/step_cost_model.h"

namespace mxserve::runtime {
namespace {

// The scripted truth: 2 ms + 6 us/prefill token + 0.2 ns/attention pair + 100 us/decode row + 40 ns/KV token.
constexpr StepCostCoefficients kTruth{2e-3, 6e-6, 2e-10, 1e-4, 4e-8};

double scripted_seconds(const StepShape& s, const StepCostCoefficients& c = kTruth) {
  return c.base + c.per_prefill_token * s.prefill_tokens + c.per_prefill_pair * s.prefill_pairs +
         c.per_decode_row * s.decode_rows + c.per_decode_kv_token * s.decode_kv_tokens;
}

// A random step as a busy server makes them: 0-64 decodes at 100-8000 tokens of context, and (half the
// time) up to two prefill chunks of 16-4096 tokens at 0-16000 tokens of cached prefix.
StepShape random_shape(std::mt19937& rng, bool allow_prefill = true) {
  StepShape s;
  const int decodes = static_cast<int>(rng() % 65);
  for (int i = 0; i < decodes; ++i) s.add_chunk(100 + rng() % 7900, 1, 0);
  if (allow_prefill && (decodes == 0 || rng() % 2 == 0)) {
    const int chunks = 1 + static_cast<int>(rng() % 2);
    for (int i = 0; i < chunks; ++i) s.add_chunk(rng() % 16000, 16 + rng() % 4081, 0);
  }
  return s;
}

void expect_near_rel(double got, double want, double rel, const char* what) {
  EXPECT_NEAR(got, want, rel * want) << what;
}

void expect_converged(const StepCostCoefficients& c, const StepCostCoefficients& truth, double rel) {
  expect_near_rel(c.base, truth.base, rel, "base");
  expect_near_rel(c.per_prefill_token, truth.per_prefill_token, rel, "per_prefill_token");
  expect_near_rel(c.per_prefill_pair, truth.per_prefill_pair, rel, "per_prefill_pair");
  expect_near_rel(c.per_decode_row, truth.per_decode_row, rel, "per_decode_row");
  expect_near_rel(c.per_decode_kv_token, truth.per_decode_kv_token, rel, "per_decode_kv_token");
}

TEST(StepCostModel, ConvergesToScriptedCoefficients) {
  StepCostModel model;
  std::mt19937 rng(3);
  EXPECT_FALSE(model.ready());
  for (int i = 0; i < 300; ++i) {
    const StepShape s = random_shape(rng);
    model.observe(s, scripted_seconds(s));
  }
  ASSERT_TRUE(model.ready());
  expect_converged(model.coefficients(), kTruth, 0.01);
  EXPECT_LT(model.mean_relative_error(), 0.01);
}

TEST(StepCostModel, RobustToNoiseAndOutliers) {
  StepCostModel model;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> noise(-0.03, 0.03);
  for (int i = 0; i < 400; ++i) {
    const StepShape s = random_shape(rng);
    double t = scripted_seconds(s) * (1 + noise(rng));
    if (i % 25 == 7) t *= 8;  // a stall (allocator, page fault, host hiccup) every 25 steps
    model.observe(s, t);
  }
  const StepCostCoefficients& c = model.coefficients();
  expect_near_rel(c.base, kTruth.base, 0.15, "base");
  expect_near_rel(c.per_prefill_token, kTruth.per_prefill_token, 0.03, "per_prefill_token");
  expect_near_rel(c.per_prefill_pair, kTruth.per_prefill_pair, 0.10, "per_prefill_pair");
  // Decode rows and their KV tokens grow together, so the split between c and d is loose under noise;
  // the decode part of a step, which the policy uses, is not.
  StepShape decodes;
  for (int i = 0; i < 32; ++i) decodes.add_chunk(4000, 1, 0);
  const double decode_part = scripted_seconds(decodes) - kTruth.base;
  EXPECT_NEAR(model.predict(decodes) - c.base, decode_part, 0.05 * decode_part);
  // What the policy needs: fresh steps of 10 ms and more (where the target bites) predicted within a few %.
  double worst = 0, sum = 0;
  int n = 0;
  for (int i = 0; i < 400; ++i) {
    const StepShape s = random_shape(rng);
    if (scripted_seconds(s) < 0.010) continue;
    const double err = std::fabs(model.predict(s) / scripted_seconds(s) - 1);
    worst = std::max(worst, err);
    sum += err;
    ++n;
  }
  EXPECT_LT(sum / n, 0.02);
  EXPECT_LT(worst, 0.06);
}

// The seed workload's regime at --max-itl-ms 0 (docs/perf/seed-workload.md, session 13's H200 fit as the truth):
// decode-only steps of 10-16 rows at ~20k context (~30-45 ms) and, one step in 15, an 8k-token chunk over a 12k
// prefix riding with them (~1.2 s), 3% relative timing noise. Both kinds are predicted within a few % when the
// steps follow the model's features: the fit itself (absolute least squares, a median-based outlier scale from the
// many short steps) does not lose the few long ones. So the 55-220% mean error the engine logged on the real seed
// runs (session 13) comes from what the features leave out, not from the fitting (docs/scheduling.md).
TEST(StepCostModel, FitsShortDecodeAndLongPrefillStepsAlike) {
  const StepCostCoefficients truth{24.8e-3, 68.2e-6, 4.79e-9, 340e-6, 39e-9};
  StepCostModel model;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> noise(-0.03, 0.03);
  auto step = [&](int i) {
    StepShape s;
    const int decodes = 10 + static_cast<int>(rng() % 7);
    for (int d = 0; d < decodes; ++d) s.add_chunk(19000 + rng() % 2000, 1, 0);
    if (i % 15 == 0) s.add_chunk(12000, 8000, 0);
    return s;
  };
  for (int i = 0; i < 400; ++i) {
    const StepShape s = step(i);
    model.observe(s, scripted_seconds(s, truth) * (1 + noise(rng)));
  }
  ASSERT_TRUE(model.ready());
  double worst_decode = 0, worst_prefill = 0;
  for (int i = 0; i < 60; ++i) {
    const StepShape s = step(i);
    const double err = std::fabs(model.predict(s) / scripted_seconds(s, truth) - 1);
    (i % 15 == 0 ? worst_prefill : worst_decode) = std::max(i % 15 == 0 ? worst_prefill : worst_decode, err);
  }
  EXPECT_LT(worst_decode, 0.06) << "decode-only steps";
  EXPECT_LT(worst_prefill, 0.06) << "steps with an 8k prefill chunk";
  EXPECT_LT(model.mean_relative_error(), 0.05);
}

TEST(StepCostModel, StalledFirstStepsDoNotPoisonTheFit) {
  StepCostModel model;  // e.g. lazy initialisation, or a CUDA-graph capture, in the first steps
  std::mt19937 rng(19);
  for (int i = 0; i < 40; ++i) {
    const StepShape s = random_shape(rng);
    model.observe(s, i < 2 ? 5.0 : scripted_seconds(s));
  }
  double worst = 0;
  for (int i = 0; i < 200; ++i) {
    const StepShape s = random_shape(rng);
    if (scripted_seconds(s) >= 0.010) worst = std::max(worst, std::fabs(model.predict(s) / scripted_seconds(s) - 1));
  }
  EXPECT_LT(worst, 0.03);
}

TEST(StepCostModel, DecodeOnlyStretchKeepsPrefillKnowledge) {
  StepCostModel model;
  std::mt19937 rng(9);
  for (int i = 0; i < 200; ++i) {
    const StepShape s = random_shape(rng);
    model.observe(s, scripted_seconds(s));
  }
  for (int i = 0; i < 5000; ++i) {  // minutes of pure decoding
    const StepShape s = random_shape(rng, /*allow_prefill=*/false);
    model.observe(s, scripted_seconds(s));
  }
  expect_converged(model.coefficients(), kTruth, 0.01);
}

TEST(StepCostModel, TracksAChangeOfRegime) {
  StepCostModel model;
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    const StepShape s = random_shape(rng);
    model.observe(s, scripted_seconds(s));
  }
  // Everything 1.5x slower from now on (e.g. clocks throttled); the windows turn over.
  const StepCostCoefficients slower{3e-3, 9e-6, 3e-10, 1.5e-4, 6e-8};
  for (int i = 0; i < 600; ++i) {
    const StepShape s = random_shape(rng);
    model.observe(s, scripted_seconds(s, slower));
  }
  expect_converged(model.coefficients(), slower, 0.02);
}

TEST(StepCostModel, IgnoresBadTimes) {
  StepCostModel model;
  StepShape s;
  s.add_chunk(10, 1, 0);
  model.observe(s, -1);
  model.observe(s, NAN);
  model.observe(s, INFINITY);
  EXPECT_EQ(model.n_observed(), 0);
}

// observe_all (the step log's batch fit): the same windows, counts and readiness as observe() one by one, bad times
// ignored alike, and the same fit up to where the last refit's Huber passes start.
TEST(StepCostModel, ObserveAllFitsLikeObserveOneByOne) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<double> noise(-0.03, 0.03);
  std::vector<std::pair<StepShape, double>> steps;
  for (int i = 0; i < 300; ++i) {
    const StepShape s = random_shape(rng);
    steps.emplace_back(s, scripted_seconds(s) * (1 + noise(rng)));
  }
  steps.emplace_back(steps.front().first, -1.0);  // ignored by both
  StepCostOptions all;
  all.window = 512;
  all.decay = 1;
  StepCostModel one_by_one(all), batch(all);
  for (const auto& [s, t] : steps) one_by_one.observe(s, t);
  EXPECT_FALSE(batch.ready());
  batch.observe_all(steps);
  EXPECT_EQ(batch.n_observed(), 300);
  EXPECT_EQ(batch.n_observed(), one_by_one.n_observed());
  EXPECT_TRUE(batch.ready());
  expect_converged(batch.coefficients(), one_by_one.coefficients(), 0.02);
  EXPECT_NEAR(batch.mean_relative_error(), one_by_one.mean_relative_error(), 0.002);
  StepCostModel empty;
  empty.observe_all({});
  EXPECT_EQ(empty.n_observed(), 0);
  EXPECT_EQ(empty.coefficients().base, StepCostOptions{}.prior.base) << "nothing observed: no refit";
}

TEST(StepCostModel, MaxPrefillTokensIsTheExactBoundary) {
  StepCostModel model;
  std::mt19937 rng(13);
  for (int i = 0; i < 200; ++i) {
    const StepShape s = random_shape(rng);
    model.observe(s, scripted_seconds(s));
  }
  for (int64_t start : {0, 1000, 20000, 120000}) {
    for (double budget : {1e-4, 5e-3, 3e-2, 0.2}) {
      const int64_t n = model.max_prefill_tokens(start, budget);
      EXPECT_LE(model.prefill_chunk_seconds(start, n), budget) << start << " " << budget;
      EXPECT_GT(model.prefill_chunk_seconds(start, n + 1), budget) << start << " " << budget;
    }
  }
  EXPECT_EQ(model.max_prefill_tokens(0, 0), 0);
  EXPECT_EQ(model.max_prefill_tokens(0, -1), 0);
}

StepCostModel fitted_model() {
  StepCostModel model;
  std::mt19937 rng(17);
  for (int i = 0; i < 200; ++i) {
    const StepShape s = random_shape(rng);
    model.observe(s, scripted_seconds(s));
  }
  return model;
}

TEST(PrefillBudget, HardCapsOnlyUntilReadyWithoutDecodesOrTarget) {
  StepShape decodes;
  for (int i = 0; i < 16; ++i) decodes.add_chunk(2000, 1, 0);
  StepCostModel cold;
  EXPECT_FALSE(PrefillBudget(&cold, 0.02, 64, 16, decodes).limited());
  EXPECT_EQ(PrefillBudget(&cold, 0.02, 64, 16, decodes).grant(0, 4096), 4096);
  const StepCostModel model = fitted_model();
  EXPECT_FALSE(PrefillBudget(&model, 0.02, 64, 16, StepShape{}).limited()) << "no decodes: prefill at the cap";
  EXPECT_FALSE(PrefillBudget(&model, 0, 64, 16, decodes).limited()) << "target off";
  EXPECT_FALSE(PrefillBudget(nullptr, 0.02, 64, 16, decodes).limited());
}

TEST(PrefillBudget, FillsTheStepUpToTheTarget) {
  const StepCostModel model = fitted_model();
  StepShape decodes;
  for (int i = 0; i < 16; ++i) decodes.add_chunk(2000, 1, 0);
  PrefillBudget budget(&model, 0.02, 64, 16, decodes);
  ASSERT_TRUE(budget.limited());
  EXPECT_FALSE(budget.decodes_over_target());
  const int64_t a = budget.grant(5000, 100000);
  EXPECT_EQ(a % 16, 0) << a;
  const int64_t b = budget.grant(0, 100000);
  StepShape step = decodes;
  step.add_chunk(5000, a, 0);
  if (b > 0) step.add_chunk(0, b, 0);
  EXPECT_LE(scripted_seconds(step), 0.02 * 1.01);
  EXPECT_NEAR(budget.predicted_seconds(), model.predict(step), 1e-6);
  step.add_chunk(0, 32, 0);  // 32 more tokens would not fit (alignment leaves < 16 tokens' worth unused)
  EXPECT_GT(scripted_seconds(step), 0.02);
  EXPECT_EQ(budget.grant(0, 100000), 0) << "nothing left";
  EXPECT_EQ(budget.grant(0, 0), 0);
}

TEST(PrefillBudget, MinChunkWhenDecodesAloneExceedTheTarget) {
  const StepCostModel model = fitted_model();
  StepShape decodes;
  for (int i = 0; i < 64; ++i) decodes.add_chunk(8000, 1, 0);  // ~29 ms of decoding
  PrefillBudget budget(&model, 0.01, 100, 16, decodes);
  ASSERT_TRUE(budget.limited());
  EXPECT_TRUE(budget.decodes_over_target());
  EXPECT_EQ(budget.grant(0, 4096), 100) << "the step's prefill always gets the minimum";
  EXPECT_EQ(budget.grant(0, 4096), 0) << "beyond it, chunks get what time is left: none";
  PrefillBudget short_prompts(&model, 0.01, 100, 16, decodes);
  EXPECT_EQ(short_prompts.grant(0, 40), 40) << "never more than asked";
  EXPECT_EQ(short_prompts.grant(0, 40), 40) << "short prompts share the floor";
  EXPECT_EQ(short_prompts.grant(0, 40), 20);
  EXPECT_EQ(short_prompts.grant(0, 40), 0);
}

}  // namespace
}  // namespace mxserve::runtime
