// Internal seam between the attention planner (paged_attention.cu) and the Hopper wgmma prefill kernel
// (paged_attention_wgmma_ws.cu). Not part of the backend-facing launcher API (cuda_kernels.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

// Query rows per block of the wgmma kernel (one q head, consecutive tokens).
constexpr int kWgmmaRowsPerBlock = 128;

// Whether the wgmma prefill kernel serves p on the current device: an sm_90 device, head_dim 128, no tree mask
// (a bf16 cache, or an FP8 E4M3 one with its scales: the producer dequantizes). Else false and *why (a static
// string) names the first reason.
bool paged_attention_wgmma_supports(const AttentionParams& p, const char** why);

// Causal paged GQA attention, warp-specialized, one launch, no context split (every row's whole context in one
// block; paged_attention_wgmma_ws.cu): a producer warpgroup feeding a 3-stage K/V ring through mbarriers, two
// consumer warpgroups overlapping S(j+1) = Q K^T with the softmax of tile j (k_cache / v_cache: bf16, or FP8
// codes where p.k_scales is set). Serves exactly what
// paged_attention_wgmma_supports accepts. ping_pong: the two consumer warpgroups take turns at issuing MMAs (the
// planner's choice); false is for the benchmark's comparison (dev/kernels/bench_prefill_attention).
void paged_attention_wgmma_ws(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                                   const int32_t* kv_index, const int32_t* block_tables, void* out,
                                   const AttentionParams& p, cudaStream_t stream, bool ping_pong = true);

}  // namespace mxserve::kernels::cuda
