// StepCostModel: predicts one engine step's wall time from the step's shape, fitted online from the
// engine's measured step times; PrefillBudget turns it into the prefill tokens a step may carry under an
// inter-token-latency (ITL) target. docs/scheduling.md has the derivation and the guarantees.
//
//   seconds ~ base + per_prefill_token * prefill_tokens + per_prefill_pair * prefill_pairs
//                  + per_decode_row * decode_rows + per_decode_kv_token * decode_kv_tokens
//
// prefill_pairs = sum over prefill chunks of the (query, key) pairs their causal attention scores,
// n * (start + (n + 1) / 2) for a chunk of n tokens after `start` cached ones; decode_kv_tokens = the KV
// tokens decode rows read. Fit: exponentially weighted least squares over two windows of recent samples
// (decode-only steps and steps with prefill, so a long decode-only stretch cannot wash out what the model
// knows about prefill), ridge-regularised toward a prior (weak: it only settles directions the data leave
// open), Huber-reweighted against outliers, every
// coefficient clamped >= 0. Key invariant: until ready(), nothing trusts the model (PrefillBudget is
// unlimited and the scheduler's hard caps alone apply).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace mxserve::runtime {

// What one step computes, in the model's features.
struct StepShape {
  double prefill_tokens = 0;
  double prefill_pairs = 0;     // causal attention (query, key) pairs of the prefill chunks
  double decode_rows = 0;       // query rows of decode chunks (1 + drafts each)
  double decode_kv_tokens = 0;  // KV tokens read by decode chunks (their kv_len)
  // A chunk of n_rows rows starting at token `start`, of which the last n_drafts are drafts: a decode when it
  // computes one real token, else a prefill chunk.
  void add_chunk(int64_t start, int64_t n_rows, int64_t n_drafts);
  static bool is_decode(int64_t n_rows, int64_t n_drafts) { return n_rows - n_drafts == 1; }
};

struct StepCostCoefficients {  // seconds, per unit of each feature
  double base = 0;
  double per_prefill_token = 0;
  double per_prefill_pair = 0;
  double per_decode_row = 0;
  double per_decode_kv_token = 0;
};

struct StepCostOptions {
  // Prior: a GLM-4.5-Air-class MoE on one H200 (docs/scheduling.md derives it). Only directions the data
  // do not pin down stay near it; the model is not used before ready().
  StepCostCoefficients prior{3e-3, 5e-5, 5e-9, 2e-4, 5e-8};
  // Ridge toward the prior, as a Bayesian prior: each coefficient is believed within prior_spread x itself
  // (one sigma) and a step's time is measured within timing_noise x the median step time; the ridge weight
  // of coefficient j is then (timing_noise * median_step / (prior_spread * prior_j))^2 (scaled features).
  double prior_spread = 1.0;
  double timing_noise = 0.02;
  double decay = 0.99;      // weight of a sample relative to the next newer one of its window
  int window = 128;         // samples kept per window (decode-only steps; steps with prefill)
  int min_samples = 16;     // ready() after this many steps, of which at least min_prefill_samples with prefill
  int min_prefill_samples = 4;
};

class StepCostModel {
 public:
  explicit StepCostModel(StepCostOptions options = {});

  // Records a measured step (non-finite or non-positive times are ignored) and refits.
  void observe(const StepShape& shape, double seconds);
  // Every step into its window in order, then one refit: a batch fit in O(n) (a step log; with a window of at
  // least steps.size() and decay 1 every step weighs alike). It differs from observe() one by one only in where
  // the refit's first Huber pass starts: the fit before the batch, not the fit before the last step.
  void observe_all(const std::vector<std::pair<StepShape, double>>& steps);
  double predict(const StepShape& shape) const;
  bool ready() const;
  const StepCostCoefficients& coefficients() const { return coef_; }
  int64_t n_observed() const { return n_observed_; }
  // Mean |measured - predicted| / measured over the samples held, with the current coefficients.
  double mean_relative_error() const;

  // The most tokens a prefill chunk starting at token `start` may have for its own cost to stay within
  // `seconds` (0 when seconds <= 0).
  int64_t max_prefill_tokens(int64_t start, double seconds) const;
  // The cost of such a chunk of n tokens (per_prefill_token and per_prefill_pair terms).
  double prefill_chunk_seconds(int64_t start, int64_t n) const;

 private:
  static constexpr int kFeatures = 5;
  using Vec = std::array<double, kFeatures>;
  struct Sample {
    Vec x;  // scaled features (scales in step_cost_model.cpp)
    double seconds;
  };
  bool push(const StepShape& shape, double seconds);  // into its window; false: the time is ignored
  void refit();

  StepCostOptions options_;
  std::deque<Sample> decode_only_, with_prefill_;  // newest at the back, at most options_.window each
  StepCostCoefficients coef_;
  int64_t n_observed_ = 0;
};

// The prefill tokens one step may still take so that its predicted time stays within the ITL target.
// Limited only when the model is ready, the target is set and the step has decode rows; then the step's
// prefill chunks get at least min_chunk tokens in all whatever the prediction (TTFT always progresses;
// several short prompts can share the floor), and chunks shorter than what they asked for are rounded
// down to a multiple of `align` (no fragment shorter than a block is scheduled, save under the floor).
class PrefillBudget {
 public:
  PrefillBudget(const StepCostModel* model, double target_seconds, int64_t min_chunk, int64_t align,
                const StepShape& decodes);
  // Tokens granted to a chunk starting at token `start` that wants `wanted` (already within the hard caps).
  int64_t grant(int64_t start, int64_t wanted);
  // All of `wanted`, past the target (a TTFT deadline that only an unbounded chunk meets); counted, so the chunks
  // granted after it in the step see the step already at or over the target.
  int64_t grant_past_target(int64_t start, int64_t wanted);
  int64_t past_target_chunks() const { return past_target_; }
  bool limited() const { return limited_; }
  // The decode rows alone are predicted over the target (only min_chunk prefill goes with them).
  bool decodes_over_target() const { return limited_ && decode_seconds_ > target_; }
  double predicted_seconds() const { return predicted_; }  // decodes + chunks granted so far (0: not limited)

 private:
  const StepCostModel* model_;
  bool limited_ = false;
  double target_ = 0, decode_seconds_ = 0, predicted_ = 0;
  int64_t min_chunk_ = 0, align_ = 1;
  int64_t granted_ = 0;  // prefill tokens granted so far this step
  int64_t past_target_ = 0;
};

}  // namespace mxserve::runtime
