// Internal seam between the attention planner (paged_attention.cu) and the Hopper wgmma prefill kernel
// (paged_attention_wgmma_ws.cu). Not part of the backend-facing launcher API (cuda_kernels.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
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

// FP8 cache, dequantized once (kv_fp8_dequant_once.cu): the part's context into a bf16 scratch in the workspace,
// then paged_attention_wgmma_ws over it (bf16 tiles, no producer dequantization per q-head block). Context slots
// the scratch holds: the planner takes this path only where fp8_dequant_once_slots(p) <= kFp8DequantOnceSlots
// (at GLM-4.5-Air's 8 KV heads: 2 x 128 MiB of scratch).
constexpr int64_t kFp8DequantOnceSlots = 65536;
// Slots the scratch needs for p: every sequence sized as the longest context (n_seqs x blocks of max_kv_len).
int64_t fp8_dequant_once_slots(const AttentionParams& p);
// Workspace of paged_attention_wgmma_ws_fp8_dequant_once: the fixed-size scratch plus p's index arrays.
size_t fp8_dequant_once_workspace_bytes(const AttentionParams& p);
void paged_attention_wgmma_ws_fp8_dequant_once(const void* q, const void* k_cache, const void* v_cache,
                                               const int32_t* token_seq, const int32_t* kv_index,
                                               const int32_t* block_tables, void* out, const AttentionParams& p,
                                               void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
