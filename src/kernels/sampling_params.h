// The contract of Backend::sample_rows (device-side sampling): what one logits row is sampled with, the
// sparse token data its logit processors need, and what comes back. The semantics are runtime/sampler.h's
// (kernels/cpu/sampling.h is the executable spec both backends follow):
//   processed = raw + logit_bias entries (in order) -> repetition penalty on prompt/output tokens ->
//               presence / frequency penalties on output tokens;
//   greedy (temperature < kGreedyTemperature): argmax of the processed row (ties: lowest id); else
//   temperature -> top-k -> top-p -> min-p, then the token where the id-ordered cumulative probability
//   first exceeds counter_uniform(seed, step);
//   logprob / top logprobs: the RAW row's log-softmax (before any processing).
// Upload size: one SampleRowParams per row plus the distinct tokens of penalized rows and the bias entries
// of biased rows (a row without penalties or bias uploads nothing else).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace mxserve::kernels {

// Temperatures below this are greedy (vLLM's rule): logits / T would overflow or underflow.
inline constexpr float kGreedyTemperature = 1e-5f;

// One sampled row. Plain data: uploaded to the device as is.
struct SampleRowParams {
  int32_t logit_row = 0;        // row of the logits tensor [R, V] this samples
  float temperature = 1.f;      // < kGreedyTemperature: greedy
  int32_t top_k = 0;            // 0 (or >= V): off
  float top_p = 1.f;            // in (0, 1]; 1: off
  float min_p = 0.f;            // 0: off
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  int32_t n_top = -1;           // logprobs wanted: -1 none; 0 the token's; n > 0 plus the n most likely
  uint64_t seed = 0;            // the draw is counter_uniform(seed, step)
  uint64_t step = 0;            // output index of the token being sampled
  int32_t bias_begin = 0, bias_count = 0;        // this row's entries in SampleRowsInput::biases
  int32_t penalty_begin = 0, penalty_count = 0;  // this row's entries in SampleRowsInput::penalties
};

// A distinct token a penalized row has seen: repetition applies when in_prompt or output_count > 0;
// presence / frequency apply when output_count > 0 (logit -= presence + frequency * output_count).
struct SamplePenaltyToken {
  int32_t token = 0;
  int32_t output_count = 0;
  int32_t in_prompt = 0;
};

struct SampleBias {
  int32_t token = 0;
  float bias = 0.f;
};

struct SampleRowsInput {
  std::vector<SampleRowParams> rows;
  std::vector<SamplePenaltyToken> penalties;  // per row: distinct tokens (no token twice within a row)
  std::vector<SampleBias> biases;             // per row: applied in order (a token may repeat)
  int32_t max_top() const {
    int32_t n = 0;
    for (const auto& r : rows) n = r.n_top > n ? r.n_top : n;
    return n;
  }
};

// Per-row outcome codes (the engine turns a non-zero code into that request's error).
enum SampleErrorCode : int32_t {
  kSampleOk = 0,
  kSampleNanLogit = 1,        // error_token: the first NaN processed logit
  kSampleNoAllowedToken = 2,  // every processed logit is -inf
  kSampleBadRow = 3,          // logit_row outside the logits tensor (a caller bug)
};

struct SampledRow {
  int32_t token = -1;
  float logprob = 0.f;  // raw log-softmax at token (n_top >= 0)
  int32_t error = kSampleOk;
  int32_t error_token = -1;
  std::vector<std::pair<int32_t, float>> top;  // n_top > 0: most likely raw tokens (ties: lower id first)
};

}  // namespace mxserve::kernels
