// Sampler: turns one row of logits into a token, per request. Greedy when temperature == 0; otherwise
// temperature -> top-k -> top-p -> min-p on the softmax, then a draw from a counter-based RNG keyed on
// (seed, output index), so a seeded request samples the same tokens whatever it is batched with.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/request.h"

namespace mxserve::runtime {

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.f;                   // log-softmax of the raw logits at the token (params.logprobs >= 0)
  std::vector<TopLogprob> top_logprobs;  // the n most likely tokens under the raw logits
};

// logits: [V] raw model logits (modified in place by penalties). output_counts: how many times each
// token was generated so far (for presence/frequency penalties; may be empty). step: output index.
SampleResult sample_token(std::span<float> logits, const SamplingParams& params, uint64_t request_seed,
                          uint64_t step, std::span<const int32_t> generated);

// A uniform double in [0, 1) from (seed, counter): splitmix64 of the pair. Stateless by design.
double counter_uniform(uint64_t seed, uint64_t counter);

}  // namespace mxserve::runtime
