// Speculative decoding's configuration and its adaptive draft-length policy (the maths, independent of the
// model). Verification lives in verifier.h, drafting in drafter.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/request.h"

namespace mxserve::runtime {

struct SpecConfig {
  int32_t num_steps = 0;                      // N: drafted tokens per step (0 = off)
  bool adaptive = true;                       // lower N (down to 0) when speculation does not pay
  std::optional<double> simulate_acceptance;  // benchmark mode: mean accepted length (incl. bonus)
  bool self_test = true;                      // post-load acceptance self-test (runtime/spec/self_test.h)
  // Tree mode (topk > 1; docs/speculative.md "Tree mode"): num_steps is the tree depth, topk the children
  // expanded per frontier node per step, num_draft_tokens sglang's count: draft nodes kept + 1 (the
  // verified token). 0 in chain mode.
  int32_t topk = 1;
  int32_t num_draft_tokens = 0;
  static constexpr int32_t kMaxTreeNodes = 64;  // one u64 ancestor mask per row
  bool tree() const { return topk > 1; }
  // Most nodes a depth-n tree can hold: topk at depth 1, topk^2 below each later frontier of topk nodes.
  int32_t tree_capacity(int32_t n) const { return n <= 0 ? 0 : topk + (n - 1) * topk * topk; }
  // Draft rows verified per sequence when depth / draft length n is chosen.
  int32_t draft_rows(int32_t n) const {
    return tree() ? std::min(num_draft_tokens - 1, tree_capacity(n)) : n;
  }
};

// Adaptive, cost-aware draft-length policy (docs/speculative.md, "Never slower").
// Inputs: per-position conditional acceptance EMAs alpha_i (chain: P(draft i accepted | draft i-1 was)),
// and an EMA of the measured decode step wall time t(N, b) per draft length N in [0, num_steps] and
// batch-size bucket b = floor(log2(decoding sequences)). Each step it picks the N maximizing the expected
// decode throughput B * (1 + E[accepted | N]) / t(N, b), E[accepted | N] = sum_{i<=N} prod_{j<=i} alpha_j;
// N = 0 (plain decoding, the MTP layer still keeps its KV caught up) is always a candidate. Unmeasured
// (N, b) cells are explored first (kMinSamples steady steps each); afterwards one candidate is re-measured
// every kExploreEvery steps of a bucket (the stalest), so the choice follows changing acceptance and load.
class SpecPolicy {
 public:
  static constexpr int kMaxBuckets = 16;
  static constexpr int64_t kMinSamples = 3;     // steady steps measured before a cell is trusted
  static constexpr int64_t kExploreEvery = 64;  // steps of a bucket between re-measurements
  static constexpr int64_t kExploreTimeout = 16;  // steps an exploration may wait for a steady sample
  static constexpr double kTimeEma = 0.2;       // weight of a new step time
  static constexpr double kAcceptEma = 0.05;    // weight of a new per-position acceptance outcome (after warm-up)
  static constexpr double kUselessAlpha = 0.05;  // first-draft acceptance below which N > 0 is not explored
  static constexpr int64_t kMinAcceptObs = 8;    // ... once this many first drafts were judged

  explicit SpecPolicy(const SpecConfig& cfg);
  // Drafts to propose for the next step given the number of decoding sequences and the step token budget.
  int32_t steps_for(int64_t n_decoding, int64_t token_budget);
  // One verified sequence: `drafted` drafts, the first `accepted` of them accepted.
  void record(int32_t drafted, int32_t accepted);
  // One decode step's wall time (no prefill in it) that verified `n_verified` drafts per sequence for
  // `n_decoding` sequences. Counted only when the step also drafted the same N (a steady step).
  // extend_seconds: the part of the step spent on an MTP extend that only kept the draft KV current
  // (N = 0 steps); subtracted, so the N = 0 cell holds the cost of plain decoding without the MTP layer.
  void record_step(int32_t n_verified, int64_t n_decoding, double seconds, double extend_seconds = 0);
  // Whether the latest steps_for() choice is a (re-)measurement rather than the policy's best choice.
  bool exploring() const { return exploring_[last_bucket_] >= 0; }

  double acceptance_rate() const { return rate_; }  // EMA of accepted / drafted
  double expected_accepted(int32_t n) const;        // E[accepted | N = n] from the alpha_i
  // Estimated decode throughput of the best measured N over plain decoding (N = 0), from the latest batch
  // bucket where N = 0 is measured; 1 until then (and with a fixed N, which never measures N = 0).
  double estimated_gain() const { return gain_; }
  // Mean measured step time of (n, bucket of n_decoding), or a negative value when unmeasured (tests).
  double step_time(int32_t n, int64_t n_decoding) const;

 private:
  struct Cell {
    double t = 0;          // EMA of seconds per step
    int64_t samples = 0;
    int64_t last_step = -1;  // bucket step counter at the latest sample
  };
  static int bucket_of(int64_t n_decoding);

  SpecConfig cfg_;
  double rate_ = 0.7;          // EMA of accepted / drafted (reported)
  std::vector<double> alpha_;  // [num_steps] conditional acceptance per draft position
  std::vector<int64_t> alpha_obs_;  // [num_steps] outcomes observed per position
  std::vector<std::vector<Cell>> cells_;  // [bucket][N]
  std::vector<int64_t> bucket_steps_;     // steps_for calls per bucket
  std::vector<int32_t> exploring_;        // per bucket: the N being (re)measured, -1 none
  std::vector<int64_t> explore_start_;    // per bucket: step the exploration began
  std::vector<int64_t> defer_until_;      // per bucket: no exploration of unmeasured cells before this step
  int32_t last_choice_ = -1;
  int last_bucket_ = 0;
  double gain_ = 1.0;
};

}  // namespace mxserve::runtime
