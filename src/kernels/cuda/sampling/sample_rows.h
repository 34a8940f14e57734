// Device-side sampling (Backend::sample_rows on CUDA): one block per sampled row. Semantics are
// kernels/sampling_params.h's (the CPU sampler, kernels/cpu/sampling.h, is the oracle):
//   logit_processing.cu  copies rows with bias / penalties into a scratch row and applies them;
//   sample_rows.cu       checks the row (NaN / nothing allowed -> per-row error code), then greedy argmax or
//                        temperature -> top-k -> top-p -> min-p (exact pivots found by bisection on the
//                        order-preserving bits of the logits, ties by id) and the counter-based draw in id
//                        order; then the raw logprob of the token and the top-n raw logprobs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sampling_params.h"

namespace mxserve::kernels::cuda {

// What one sampled row returns (downloaded to the host as is).
struct DeviceSampleResult {
  int32_t token;
  float logprob;
  int32_t error;        // SampleErrorCode
  int32_t error_token;  // kSampleNanLogit: the first NaN id; kSampleBadRow: the row index
};

struct DeviceSampleArgs {
  const float* logits = nullptr;  // f32 [n_logit_rows, vocab]
  int64_t n_logit_rows = 0, vocab = 0;
  const SampleRowParams* rows = nullptr;  // [n_sample]
  int32_t n_sample = 0;
  const SampleBias* biases = nullptr;
  const SamplePenaltyToken* penalties = nullptr;
  float* scratch = nullptr;           // f32 [n_sample, vocab]: processed copies of rows with bias / penalties
  DeviceSampleResult* out = nullptr;  // [n_sample]
  int32_t max_top = 0;                // top columns of top_ids / top_logprobs
  int32_t* top_ids = nullptr;         // [n_sample, max_top]
  float* top_logprobs = nullptr;      // [n_sample, max_top]
};

#ifdef __CUDACC__
#define MX_SAMPLE_HD __host__ __device__
#else
#define MX_SAMPLE_HD
#endif
// Whether a row needs a processed copy (bias or penalty entries).
MX_SAMPLE_HD inline bool row_has_processing(const SampleRowParams& p) { return p.bias_count > 0 || p.penalty_count > 0; }

void process_sample_rows(const DeviceSampleArgs& a, cudaStream_t stream);  // logit_processing.cu
void sample_rows(const DeviceSampleArgs& a, cudaStream_t stream);          // sample_rows.cu (after the above)

}  // namespace mxserve::kernels::cuda
