// Speculative decoding maths, independent of the model: the processed sampling distribution, chain
// verification (greedy match or lossless rejection sampling) and the adaptive draft-length policy.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "runtime/request.h"

namespace mxserve::runtime {

struct SpecConfig {
  int32_t num_steps = 0;                      // N: drafted tokens per step (0 = off)
  bool adaptive = true;                       // lower N (down to 0) when speculation does not pay
  std::optional<double> simulate_acceptance;  // benchmark mode: mean accepted length (incl. bonus)
};

// The distribution sample_token draws from (temperature, top-k, top-p, min-p applied), sparse.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<double> probs;  // sums to 1
  double prob_of(int32_t token) const;
  int32_t argmax() const;
  int32_t draw(double u) const;  // u uniform in [0, 1)
};
TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingParams& p);

struct ChainVerdict {
  int32_t n_accepted = 0;  // drafts accepted, in order
  int32_t next_token = -1; // the bonus token (all accepted) or the correction at the first rejection
};

// Verifies drafts d_1..d_N against target rows p_0..p_N (p_i predicts the token after d_i; p_0 the one
// after the last verified token). Greedy: accept while d_{i+1} == argmax p_i. Sampling: accept d_{i+1}
// with probability min(1, p_i(d)/q_i(d)); at the first rejection draw from norm(max(0, p_i - q_i));
// if all are accepted draw the bonus from p_N. This preserves the target distribution exactly.
// uniforms(i) must return independent U[0,1) draws.
template <typename Uniform>
ChainVerdict verify_chain(std::span<const int32_t> drafts, const std::vector<TokenDistribution>& q,
                          const std::vector<TokenDistribution>& p, bool greedy, Uniform&& uniforms);

// Adaptive policy: tracks acceptance and decides N for the next step (see docs/speculative.md).
class SpecPolicy {
 public:
  explicit SpecPolicy(const SpecConfig& cfg) : cfg_(cfg) {}
  // Drafts to propose this step given the number of decoding sequences and the step token budget.
  int32_t steps_for(int64_t n_decoding, int64_t token_budget);
  void record(int32_t drafted, int32_t accepted);
  double acceptance_rate() const { return rate_; }  // EMA of accepted / drafted

 private:
  SpecConfig cfg_;
  double rate_ = 0.7;        // optimistic start: probe before judging
  int64_t cooldown_ = 0;     // steps left with speculation paused
  int64_t observed_ = 0;
};

ChainVerdict verify_chain_impl(std::span<const int32_t> drafts, const std::vector<TokenDistribution>& q,
                               const std::vector<TokenDistribution>& p, bool greedy,
                               const std::vector<double>& uniforms);

template <typename Uniform>
ChainVerdict verify_chain(std::span<const int32_t> drafts, const std::vector<TokenDistribution>& q,
                          const std::vector<TokenDistribution>& p, bool greedy, Uniform&& uniforms) {
  std::vector<double> u(2 * drafts.size() + 2);
  for (size_t i = 0; i < u.size(); ++i) u[i] = uniforms(i);
  return verify_chain_impl(drafts, q, p, greedy, u);
}

}  // namespace mxserve::runtime
