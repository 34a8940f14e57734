// Host-side launchers of the CUDA kernels. The CUDA backend calls these with raw device pointers, the
// shapes and a stream; kernels never see a Tensor, a Request or the KV manager. "bf16" pointers are
// __nv_bfloat16 on the device (declared void* here so plain C++ translation units can include this).
// Every launcher checks its launch (MX_CUDA_CHECK_LAUNCH) and returns without synchronizing.
// Preconditions (checked by the backend, once, at the op's entry): row widths that are loaded as
// 16-byte vectors are multiples of 8 elements; pointers come from the backend's 256-byte aligned pool.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/op_params.h"

namespace mxserve::kernels {
struct AttentionSplitTable;  // kernels/attention_split_table.h: tuned decode split counts
}  // namespace mxserve::kernels

namespace mxserve::kernels::cuda {

// ---- elementwise.cu ------------------------------------------------------------------------------
// out[r, :] = x[rows[r], :] for r < n_rows; rows of row_bytes bytes (embedding is this on the table).
void gather_rows(const void* x, const int32_t* rows, void* out, int64_t n_rows, int64_t row_bytes,
                 cudaStream_t stream);
// out[r, :] = bf16(x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w)   x, out: bf16 [rows, cols]; w bf16 [cols]
// (out may alias x). cols % 8 == 0.
void rmsnorm_bf16(const void* x, const void* w, void* out, int64_t rows, int64_t cols, float eps,
                  cudaStream_t stream);
// In place on x bf16 [n_tokens, n_heads, head_dim]: NeoX rotation of dims [0, rotary_dim).
void rope_neox_bf16(void* x, const int32_t* positions, int64_t n_tokens, const RopeParams& p, cudaStream_t stream);
// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]   gate_up bf16 [T, 2*inter], out bf16 [T, inter]
void silu_mul_bf16(const void* gate_up, void* out, int64_t n_tokens, int64_t inter, cudaStream_t stream);
// x[i] += y[i] (fp32 add, one rounding)
void add_bf16(void* x, const void* y, int64_t n, cudaStream_t stream);
void add_f32(float* x, const float* y, int64_t n, cudaStream_t stream);
// k/v bf16 [T, kv_width] -> caches bf16 [n_slots, kv_width] at slot_mapping[t] (< 0: not written). kv_width % 8 == 0.
void kv_write_bf16(const void* k, const void* v, const int32_t* slot_mapping, void* k_cache, void* v_cache,
                   int64_t n_tokens, int64_t kv_width, cudaStream_t stream);
// FP8 E4M3 cache (kernels/kv_fp8.h): k/v bf16 [T, n_kv_heads*head_dim] -> u8 codes at slot_mapping[t] of
// the caches [n_slots, n_kv_heads*head_dim] + f32 scales [n_slots, n_kv_heads]; byte-identical to the CPU's.
void kv_write_fp8(const void* k, const void* v, const int32_t* slot_mapping, void* k_cache, void* v_cache,
                  float* k_scales, float* v_scales, int64_t n_tokens, int n_kv_heads, int head_dim,
                  cudaStream_t stream);
// Rows src_slots[i] -> dst_slots[i] (device i32 [n_pairs]) of two tensors of row_bytes-byte rows (any
// dtype: K/V data or scales; b may be a), pairs applied in order.
void kv_copy_rows(const int32_t* src_slots, const int32_t* dst_slots, int64_t n_pairs, void* a, void* b,
                  int64_t row_bytes, cudaStream_t stream);
// Deterministic pseudo-random bf16 in [-scale, scale) from (seed, index): synthetic weights, benchmarks.
void fill_random_bf16(void* out, int64_t n, uint64_t seed, float scale, cudaStream_t stream);

// ---- attention/paged_attention.cu ----------------------------------------------------------------
// Paged causal GQA attention, flash-style online softmax in fp32, optionally split along the context
// (each split writes a partial (max, sum, acc) to workspace; a second kernel combines them). Tensor-core
// kernel where it applies, else the CUDA-core one (plan_paged_attention picks; see paged_attention.cu).
// q, out: bf16 [T, n_heads, head_dim]; caches bf16 [n_slots, n_kv_heads * head_dim].
// head_dim in {16, 32, 64, 128, 256}; n_heads / n_kv_heads <= 32.
// Tree masks (p.tree_mask, see AttentionParams) are applied by kSimt and kWarp; the planner never picks
// kShared for a tree batch, and the shared kernel refuses one.
enum class AttentionKernel {
  kSimt,    // CUDA-core kernel: any group <= 32, head_dim up to 256
  kWarp,    // tensor cores, one warp per (token, kv head, split): decode-like batches
  kShared,  // tensor cores, 8 tokens per block share K/V tiles: prefill-like batches
  kWgmmaWs, // Hopper wgmma, warp-specialized (producer warpgroup + 2 consumer warpgroups, mbarrier K/V ring,
            // S(j+1) issued before the softmax of tile j; paged_attention_wgmma_ws.cu), 128 query rows of one
            // head per block: long prefill chunks (sm_90, bf16 or FP8 cache, head_dim 128, no tree mask), the
            // planner's choice there (an FP8 cache dequantized once into a bf16 scratch first:
            // AttentionLaunch::fp8_dequant_once). Tree masks stay on the mma.sync kernels; a batch it does not serve
            // falls back to kShared and says so once. (Issue 31 retired the first wgmma kernel, "wgmma".)
};
const char* attention_kernel_name(AttentionKernel k);
// Where the decode kernel's split count came from (kWarp plans; the others are kHeuristic).
enum class AttentionSplitSource {
  kHeuristic,     // no tuned table for this device / cache dtype / head geometry
  kTable,         // the tuned table's nearest (rows, context) bucket
  kOutsideTable,  // a table exists but the shape lies beyond its largest bucket: the heuristic
  kForced,        // AttentionPlanOptions::warp_split_target_per_sm
};
const char* attention_split_source_name(AttentionSplitSource s);
struct AttentionLaunch {
  AttentionKernel kernel = AttentionKernel::kSimt;
  int n_splits = 1;        // context splits per (token, kv head)
  int split_len = 0;       // keys per split (multiple of the key tile)
  size_t workspace_bytes = 0;
  AttentionSplitSource split_source = AttentionSplitSource::kHeuristic;
  // kWgmmaWs over an FP8 cache: dequantize the context once into a bf16 scratch in the workspace, then the bf16
  // kernel (kv_fp8_dequant_once.cu); false: the kernel's producer dequantizes each tile per q-head block.
  bool fp8_dequant_once = false;
};
// Planner overrides, passed down from the backend's typed options (tests and benchmarks compare designs).
struct AttentionPlanOptions {
  enum class Force { kAuto, kSimt, kWarp, kShared, kWgmmaWs } force = Force::kAuto;  // a forced tensor-core kernel on
                                    // a shape it does not serve falls back to kSimt, by the planner's rule
  int64_t warp_split_target_per_sm = 0;  // > 0: warps per SM the decode kernel's context split aims for
  int32_t warp_splits = 0;               // > 0: exactly this many context splits (mxserve tune-attention)
  // Tuned split counts of the decode kernel for this device, cache dtype and head geometry
  // (kernels/attention_split_table.h; the backend picks it); null or a shape outside it: the heuristic
  // (said once, loudly). warp_splits or warp_split_target_per_sm > 0 override the table.
  const AttentionSplitTable* split_table = nullptr;
  // kWgmmaWs over an FP8 cache: kAuto dequantizes the context once where the scratch holds the step
  // (AttentionLaunch::fp8_dequant_once); kFused keeps the producer's per-tile dequantization (the comparison).
  enum class Fp8Prefill { kAuto, kFused } fp8_prefill = Fp8Prefill::kAuto;
};
AttentionLaunch plan_paged_attention(const AttentionParams& p, int n_sms, const AttentionPlanOptions& options = {});
void paged_attention_bf16(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                          const int32_t* kv_index, const int32_t* block_tables, void* out, const AttentionParams& p,
                          const AttentionLaunch& plan, void* workspace, cudaStream_t stream);

// ---- attention/attention_batch.cpp ----------------------------------------------------------------
// A whole batch's attention as one or two launches on one stream. A mixed batch (plain decode rows first,
// p.n_leading_decode_rows of them, then prefill / verify rows) that the planner would send entirely to the
// block-shared kernel -- or whose rows after the decode rows would take it on their own -- is split: the
// leading decode rows go to the per-warp kernel with its own split-KV plan (else 8 decode rows of 8 sequences
// share one block and walk their contexts one after the other), the rest to the planner's choice for them.
// Forcing a kernel (options.force != kAuto) keeps one launch (the old path).
struct AttentionBatchPart {
  int32_t row_begin = 0;      // first row of the batch this part serves
  AttentionParams params;     // the part's rows: n_tokens, n_seqs, n_leading_decode_rows
  AttentionLaunch launch;
};
struct AttentionBatchPlan {
  AttentionBatchPart parts[2];
  int n_parts = 0;
  size_t workspace_bytes = 0;  // the larger part's (the parts run one after the other)
};
AttentionBatchPlan plan_paged_attention_batch(const AttentionParams& p, int n_sms,
                                              const AttentionPlanOptions& options = {});
void paged_attention_batch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                           const int32_t* kv_index, const int32_t* block_tables, void* out,
                           const AttentionBatchPlan& plan, void* workspace, cudaStream_t stream);

// ---- moe/router.cu -------------------------------------------------------------------------------
// logits f32 [T, E] (x @ gate_w^T, computed by the caller in fp32) -> top-k ids i32 / weights f32
// [T, top_k]: sigmoid, + bias for selection, group-limited top-k; bit-for-bit the CPU reference's rule
// (ties go to the lower expert index). E <= 1024, n_group <= 64.
void moe_router(const float* logits, const float* bias, int32_t* topk_ids, float* topk_weights, int64_t n_tokens,
                const RouterParams& p, cudaStream_t stream);

// ---- moe/moe_experts.cu --------------------------------------------------------------------------
// out [T, H] += sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, k]; bf16 weights
// gate_up [E, 2I, H] (gate rows first), down [E, H, I]. Tokens are permuted by expert on the device
// (no host sync), two grouped GEMMs run on tensor cores (SwiGLU fused into the first), then a
// weighted un-permute adds into out. H % 8 == 0, I % 8 == 0.
struct MoeShape {
  int64_t n_tokens = 0, d_model = 0, inter = 0;
  int32_t n_experts = 0, top_k = 0;
  bool force_grouped = false;  // bf16 path: the grouped GEMM even where the GEMV wins (KernelOptions::moe_kernel)
  // MXFP4 only: W4A8 (per-token FP8 e4m3 activations) on the wgmma prefill GEMMs; opt-in
  bool fp8_activations = false;
};
size_t moe_workspace_bytes(const MoeShape& s);
void moe_experts_bf16(const void* x, const int32_t* topk_ids, const float* topk_weights, const void* gate_up,
                      const void* down, void* out, const MoeShape& s, void* workspace, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
