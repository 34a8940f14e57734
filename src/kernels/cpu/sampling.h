// CPU sampling: the executable spec of kernels/sampling_params.h, shared by runtime/sampler (the host path:
// structured output, speculative verification, drafting) and the CPU backend's sample_rows, so both see the
// same numbers. The CUDA kernels (kernels/cuda/sampling/) are tested against these functions.
// Invariants: weights e_i = exp((l_i - max) / T) in double (no overflow for T >= kGreedyTemperature;
// -inf -> 0; when some logits are +inf they alone share the mass); the draw walks the kept tokens in id
// order; NaN or all -inf rows are errors, never a token.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/sampling_params.h"

namespace mxserve::kernels::cpu {

// A uniform double in [0, 1) from (seed, counter): splitmix64 of the pair. Stateless by design.
double counter_uniform(uint64_t seed, uint64_t counter);

// kSampleOk, or the error of a processed row (*culprit: the first NaN id).
int32_t check_row(std::span<const float> logits, int32_t* culprit);
// The error a SampleErrorCode stands for, naming the culprit (vocab: the row length).
Status sample_error_status(int32_t code, int32_t culprit, int64_t vocab);
// Argmax (ties: the lowest id).
int32_t argmax_of(std::span<const float> logits);

// The distribution a sampled row draws from (temperature, top-k, top-p, min-p applied), sparse.
struct TokenDistribution {
  std::vector<int32_t> ids;   // sorted
  std::vector<double> probs;  // sums to 1
  double prob_of(int32_t token) const;
  int32_t argmax() const;
  int32_t draw(double u) const;  // u uniform in [0, 1)
};
// Of a processed, checked row (greedy: a point mass on the argmax).
TokenDistribution sampling_distribution(std::span<const float> logits, float temperature, int32_t top_k, float top_p,
                                        float min_p);

// In place: logit_bias entries in order, then the penalties of the row's distinct seen tokens.
void apply_bias_and_penalties(std::span<float> logits, const SampleRowParams& p, std::span<const SampleBias> biases,
                              std::span<const SamplePenaltyToken> penalties);

// The raw log-softmax of `token` and, for n_top > 0, the n_top most likely tokens (ties: lower id first).
void raw_logprobs(std::span<const float> raw, int32_t token, int32_t n_top, float* logprob,
                  std::vector<std::pair<int32_t, float>>* top);

// The reference Backend::sample_rows: logits host f32 [R, V] (row-major), one SampledRow per in.rows.
std::vector<SampledRow> sample_rows_f32(const float* logits, int64_t n_rows, int64_t vocab, const SampleRowsInput& in);

}  // namespace mxserve::kernels::cpu
