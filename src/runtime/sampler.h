// Sampler: turns one row of logits into a token, per request, in two stages shared by plain decoding,
// speculative verification and drafting (so all three see the same distribution):
//   1. process_logits: logit mask (structured output) -> logit bias -> repetition penalty (prompt + output)
//      -> presence / frequency penalties (output), in place, given the tokens before the position;
//   2. pick: greedy (temperature < kGreedyTemperature) = argmax of the processed logits; otherwise
//      temperature -> top-k -> top-p -> min-p on the softmax (sampling_distribution), then a draw from a
//      counter-based RNG keyed on (seed, output index), so a seeded request samples the same tokens whatever
//      it is batched with, and with or without speculation.
// Reported logprobs are the raw log-softmax (before processing), as vLLM's default reports them.
// Numerics: NaN logits or a row with no allowed token are errors naming the culprit; +inf logits share the
// mass equally; -inf logits have probability 0; tiny temperatures are greedy, never an overflow.
// The arithmetic lives in kernels/cpu/sampling.h, shared with Backend::sample_rows (device-side sampling of
// unconstrained, non-speculative rows: the engine's default path), so host and device agree by construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/sampling.h"
#include "kernels/sampling_params.h"
#include "runtime/penalty_tokens.h"
#include "runtime/request.h"

namespace mxserve::runtime {

// Temperatures below this are greedy (vLLM's rule): logits / T would overflow or underflow.
inline constexpr float kGreedyTemperature = kernels::kGreedyTemperature;
inline bool is_greedy(const SamplingParams& p) { return p.temperature < kGreedyTemperature; }
// Whether process_logits changes anything (then a greedy token is not the argmax of the raw logits).
bool has_logit_processing(const SamplingParams& p);
// The RNG seed of a request: its own seed when given, else the engine's per-request default.
inline uint64_t sampling_seed(const SamplingParams& p, uint64_t request_seed) { return p.seed.value_or(request_seed); }

// What the processors see at one position: the prompt and every token generated before the position
// (speculative drafts assumed accepted included).
struct TokenContext {
  std::span<const int32_t> prompt;
  std::span<const int32_t> generated;
};

// Stage 1, in place. logits: [V].
void process_logits(std::span<float> logits, const SamplingParams& p, const TokenContext& ctx);
// An error naming the first NaN logit, or saying that no token is allowed (every logit -inf).
Status check_logits(std::span<const float> logits);
// Argmax (ties: the lowest id) of a checked row.
int32_t argmax_of(std::span<const float> logits);

// The distribution a sampled request draws from (temperature, top-k, top-p, min-p applied), sparse.
using TokenDistribution = kernels::cpu::TokenDistribution;
// Stage 2's distribution of a processed, checked row (greedy: a point mass on the argmax).
TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingParams& p);

// Stage 2 on a processed row: the token at output index `step`. Errors as check_logits.
Result<int32_t> pick_token(std::span<const float> processed, const SamplingParams& p, uint64_t seed, uint64_t step);

// The raw log-softmax of `token` and, for n_top > 0, the n_top most likely tokens (ties: lower id first).
void raw_logprobs(std::span<const float> raw, int32_t token, int32_t n_top, float* logprob,
                  std::vector<TopLogprob>* top);

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.f;                   // raw log-softmax at the token (params.logprobs >= 0)
  std::vector<TopLogprob> top_logprobs;  // the params.logprobs most likely tokens under the raw logits
};

// Both stages plus logprobs. logits: [V] raw model logits (processed in place). step: output index.
Result<SampleResult> sample_token(std::span<float> logits, const SamplingParams& params, uint64_t request_seed,
                                  uint64_t step, const TokenContext& ctx);

// A uniform double in [0, 1) from (seed, counter): splitmix64 of the pair. Stateless by design.
inline double counter_uniform(uint64_t seed, uint64_t counter) { return kernels::cpu::counter_uniform(seed, counter); }

// ---- device-side sampling (Backend::sample_rows) ----
// Whether a request may be sampled by Backend::sample_rows: no logit mask (structured output keeps host
// logits). Speculative verification is decided by the engine (it keeps host logits too).
inline bool device_samplable(const SamplingParams& p) { return p.logit_mask == nullptr; }
// The op's row parameters of a request at output index `step` (bias / penalty ranges left empty).
kernels::SampleRowParams sample_row_params(const SamplingParams& p, uint64_t request_seed, uint64_t step,
                                           int32_t logit_row);
// Appends the request's logit_bias entries and the distinct tokens its penalties act on (none when it has
// no penalty: the upload is proportional to penalized rows' distinct tokens) and sets row's ranges.
void append_row_processing(const SamplingParams& p, const TokenContext& ctx, kernels::SampleRowParams* row,
                           kernels::SampleRowsInput* in);
// The same from a request's PenaltyTokens caught up with its tokens (the engine's per-step path).
void append_row_processing(const SamplingParams& p, const PenaltyTokens& seen, kernels::SampleRowParams* row,
                           kernels::SampleRowsInput* in);
// Whether the request's penalties need the distinct seen tokens (any penalty), and the prompt's (repetition).
inline bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
}

}  // namespace mxserve::runtime
