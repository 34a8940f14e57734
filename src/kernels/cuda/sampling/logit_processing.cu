// Logit processing for device sampling: rows with logit_bias or penalty entries are copied to a scratch row,
// then bias entries are added in order (one thread: a token may repeat), then each distinct seen token's
// repetition / presence / frequency penalty is applied (one thread per token). Round-to-nearest intrinsics
// keep the arithmetic the CPU's (no fused multiply-add).
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/sampling/sample_rows.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void process_rows_kernel(DeviceSampleArgs a) {
  const SampleRowParams p = a.rows[blockIdx.x];
  if (!(p.bias_count > 0 || p.penalty_count > 0) || p.logit_row < 0 || p.logit_row >= a.n_logit_rows) return;
  const int64_t V = a.vocab;
  const float* raw = a.logits + static_cast<int64_t>(p.logit_row) * V;
  float* row = a.scratch + static_cast<int64_t>(blockIdx.x) * V;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) row[i] = raw[i];
  __syncthreads();
  if (threadIdx.x == 0)
    for (int32_t j = 0; j < p.bias_count; ++j) {
      const SampleBias b = a.biases[p.bias_begin + j];
      if (b.token >= 0 && b.token < V) row[b.token] = __fadd_rn(row[b.token], b.bias);
    }
  __syncthreads();
  for (int32_t j = threadIdx.x; j < p.penalty_count; j += kThreads) {
    const SamplePenaltyToken t = a.penalties[p.penalty_begin + j];
    if (t.token < 0 || t.token >= V) continue;
    float l = row[t.token];
    if (p.repetition_penalty != 1.f && (t.in_prompt || t.output_count > 0))
      l = l > 0 ? __fdiv_rn(l, p.repetition_penalty) : __fmul_rn(l, p.repetition_penalty);
    if (t.output_count > 0 && (p.presence_penalty != 0.f || p.frequency_penalty != 0.f))
      l = __fsub_rn(l, __fadd_rn(p.presence_penalty,
                                 __fmul_rn(p.frequency_penalty, static_cast<float>(t.output_count))));
    row[t.token] = l;
  }
}

}  // namespace

void process_sample_rows(const DeviceSampleArgs& a, cudaStream_t stream) {
  if (a.n_sample == 0) return;
  process_rows_kernel<<<static_cast<unsigned>(a.n_sample), kThreads, 0, stream>>>(a);
  MX_CUDA_CHECK_LAUNCH();
}

}  // namespace mxserve::kernels::cuda
