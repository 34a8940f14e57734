// Host launchers of the MLA + DeepSeek sparse attention kernels (glm_moe_dsa / GLM-5.x) on CUDA: the
// row ops (LayerNorm with bias, GPT-J interleaved RoPE, column copy, column-offset cache write), the DSA
// indexer (scores over causal keys, then an exact top-k per query) and absorbed MLA attention over the
// paged latent cache. Semantics are those of the CPU reference (kernels/cpu/mla_dsa.cpp, params in
// kernels/mla_params.h); bf16 storage, fp32 math. Launchers take raw device pointers, enqueue on `stream`
// and never synchronize; shapes are checked by the backend (backend/cuda_mla_dsa_ops.cpp) at the op entry.
// Invariant: a token t sees KV index j only when j <= kv_index[t] and its tree mask (if any) allows j; the
// indexer and the attention apply that same rule (device helper in mla_visibility.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/mla_params.h"
#include "kernels/op_params.h"

namespace mxserve::kernels {
struct AttentionSplitTable;  // kernels/attention_split_table.h: tuned split counts (here: the wgmma MLA attend)
}  // namespace mxserve::kernels

namespace mxserve::kernels::cuda {

// ---- attention/mla_rows.cu -----------------------------------------------------------------------
// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b   x, out bf16 [rows, cols] (out may alias x); w, b bf16.
void layernorm_bf16(const void* x, const void* w, const void* b, void* out, int64_t rows, int64_t cols, float eps,
                    cudaStream_t stream);
// In place on x bf16 [n_tokens, n_heads * head_stride]: GPT-J pairs (2i, 2i+1) of [rot_offset, +rotary_dim).
void rope_interleaved_bf16(void* x, const int32_t* positions, int64_t n_tokens, const InterleavedRopeParams& p,
                           cudaStream_t stream);
// out bf16 [rows, end - begin] = columns [begin, end) of x bf16 [rows, cols].
void copy_columns_bf16(const void* x, void* out, int64_t rows, int64_t cols, int64_t begin, int64_t end,
                       cudaStream_t stream);
// rows bf16 [n_tokens, width] -> columns [col_offset, +width) of cache bf16 [n_slots, cache_width] at
// slot_mapping[t]; a negative slot (a padding row) is skipped.
void cache_write_columns_bf16(const void* rows, const int32_t* slot_mapping, void* cache, int64_t n_tokens,
                              int64_t width, int64_t cache_width, int64_t col_offset, cudaStream_t stream);

// ---- attention/mla_fp8_cache.cu (--kv-cache-dtype fp8_e4m3; layout in kernels/mla_fp8.h) -------------
// rows bf16 [n_tokens, width] -> packed FP8 rows of cache u8 [n_slots, row_bytes] at slot_mapping[t]:
// col_offset 0 quantizes them into the codes + per-128 f32 scales, col_offset > 0 (= the quantized width)
// stores them as the bf16 tail. Negative slots are skipped. The same bytes as the CPU reference.
void cache_write_fp8_packed_bf16(const void* rows, const int32_t* slot_mapping, void* cache, int64_t n_tokens,
                                 int64_t width, int64_t row_bytes, int64_t col_offset, cudaStream_t stream);

// ---- attention/dsa_indexer.cu --------------------------------------------------------------------
// Shared memory (bytes) the score kernel needs for this shape; the backend refuses shapes above 48 KiB.
size_t dsa_indexer_smem_bytes(const IndexerParams& p);
// Workspace (bytes) dsa_indexer_topk needs for a batch whose keys per token are at most max_ctx.
size_t dsa_indexer_workspace_bytes(int64_t n_tokens, int64_t max_ctx);
// q bf16 [T, n_heads * head_dim], weights bf16 [T, n_heads], key_cache bf16 [n_slots, head_dim]
// (p.fp8_keys: packed FP8 rows u8 [n_slots, mla_fp8_row_bytes(head_dim, 0)], kernels/mla_fp8.h)
// -> topk i32 [T, top_k]: the selected KV indices ascending, -1 padded (all visible keys when at most
// top_k); ties go to the lower KV index. ap: paging + tree rows (n_tokens, block_size, max_blocks_per_seq,
// max_kv_len, tree_mask / tree_base); workspace of dsa_indexer_workspace_bytes(T, max_ctx).
// Which path dsa_indexer_topk runs: kAuto = kFused up to kIndexerFusedMaxRows rows where it supports the shape,
// else tensor cores where dsa_indexer_mma_supported, else the SIMT kernel with a one-time warning;
// kSimple = the SIMT kernel (the oracle); kMma = tensor cores (an unsupported shape is an error); both
// with the one-block-per-token radix select over a scores workspace. kFused = score + first-digit
// histogram on tensor cores split over the SMs, one select block per token, rows with context <= top_k
// skipped on the device (dsa_indexer_fused.cu; an unsupported shape is an error). kFusedSplit = kFused with
// the select of each token split over a thread-block cluster of 1..8 CTAs (dsa_select_split.cu, sm_90; 8 at
// batch 1). kFused / kFusedSplit read bf16 keys or packed FP8 rows. All pick the same set for the same scores:
// ties to the lower KV index.
enum class IndexerScoreKernel { kAuto, kSimple, kMma, kFused, kFusedSplit };
// kAuto (the model's path) runs kFused up to this many rows (tokens) a launch, the mma path above: on an H100
// (2026-12-06, bench_dsa_indexer, 32 heads x 128, top-2048) kFused took 32.6 / 100.6 / 322 us at batch 1 / 16 / 64
// over 20k keys against the mma path's 61.9 / 111.8 / 254 us (at 64k keys 59 / 279 / 1005 vs 204 / 359 / 775).
constexpr int64_t kIndexerFusedMaxRows = 32;
// kAuto's fused path uses the cluster-split select (kFusedSplit) when true, the one-block select when false.
// Off until an H100 run of bench_dsa_indexer shows the split row ahead (session 8: built, not yet measured).
constexpr bool kIndexerAutoSplitSelect = false;
// kAuto sends FP8 keys (p.fp8_keys) to the fused path when true (else kMma / kSimple as before). Off until
// measured. (The backend's FP8 indexer op names kMma itself: backend/cuda_mla_dsa_ops.cpp fp8_score_kernel.)
constexpr bool kIndexerAutoFusedFp8 = false;
bool dsa_indexer_mma_supported(const IndexerParams& p);
void dsa_indexer_topk(const void* q, const void* weights, const void* key_cache, const int32_t* token_seq,
                      const int32_t* kv_index, const int32_t* block_tables, int32_t* topk, const IndexerParams& p,
                      const AttentionParams& ap, int64_t max_ctx, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream, IndexerScoreKernel kernel = IndexerScoreKernel::kAuto);

// ---- attention/mla_attention.cu ------------------------------------------------------------------
// Largest kv_lora_rank the attention kernel holds per lane (kv_lora_rank <= 32 * 16).
constexpr int kMlaMaxLatent = 512;
// Which attend kernel mla_attention_bf16 runs: kAuto = the tensor-core kernel (mla_decode_mma.cu) where
// mla_attend_mma_supported, else the SIMT kernel with a one-time warning; kSimple = the SIMT kernel (the
// oracle); kMma = the tensor-core kernel (an unsupported shape is an error); kWgmma = the Hopper path
// (mla_decode_wgmma.cu attend + mla_absorb_mma.cu absorb / un-absorb GEMMs; an unsupported shape or device is
// an error), each warpgroup scoring the whole latent tile; kWgmmaSplitS = the same with the two warpgroups
// splitting the tile's keys for the scores (half the score MMAs, row maxima / P exchanged through shared memory).
// kAuto runs kMlaAutoHopperKernel where the Hopper path is supported, else kMma. kWgmmaSplitS since the H100 run
// of 2026-12-06 (bench_mla_decode --heads 64, every case PASS against the mma op): the whole op 54 / 130 / 61 us
// against the mma path's 180 / 370 / 204 us at batch 1 (2k dense / 20k dense / 20k top-2048), attend 0.72 / 0.82
// of copy bandwidth at batch 16 / 64 and 20k (mma: 0.28 / 0.31); split-S is ahead on every sparse (top-k) case,
// the kWgmma variant on some dense ones (B64 20k: 573 vs 609 us).
// kWgmmaPrefill = the Hopper path with the sparse-prefill attend (mla_sparse_prefill_wgmma.cu: one CTA per token, no
// split-KV) for top-k rows; it needs a top-k list (dense rows are an error) and a bf16 cache. kWgmmaPrefillEg = the
// same attend in its early-gather schedule (kMlaSparsePrefillEarlyGather below; bitwise the same output).
enum class MlaAttendKernel { kAuto, kSimple, kMma, kWgmma, kWgmmaSplitS, kWgmmaPrefill, kWgmmaPrefillEg };
inline constexpr MlaAttendKernel kMlaAutoHopperKernel = MlaAttendKernel::kWgmmaSplitS;
inline constexpr bool kMlaAutoWgmma = kMlaAutoHopperKernel == MlaAttendKernel::kWgmma ||
                                      kMlaAutoHopperKernel == MlaAttendKernel::kWgmmaSplitS;
// kAuto on the Hopper path runs the sparse-prefill attend for a launch of top-k rows with at least this many tokens
// (prefill chunks); fewer rows keep the split-KV decode attend, which fills the SMs by splitting each token's keys
// while the tokens are fewer than the SMs (the prefill kernel has one CTA per token and no splits). 256 (about two
// waves of CTAs on 132 SMs) leaves a margin above one wave. On since the H100 run of 2026-12-06 (session 8,
// bench_mla_sparse_prefill, 8192 rows over 20k keys, top-2048, every case PASS against the mma op): attend 7.30 ms
// (320 TFLOP/s) against the split-KV decode attend's 10.35 ms (226) at 64 heads, 6.93 vs 10.05 ms at 16 heads.
inline constexpr int64_t kMlaSparsePrefillMinTokens = 256;
inline constexpr bool kMlaAutoSparsePrefill = true;
// The schedule mla_attention_bf16 runs the sparse-prefill attend with (mla_sparse_prefill_wgmma's overlap_pv): the
// overlap-PV schedule (P.V in flight under the next tile's scores) was 4% faster on the same run, bitwise equal.
inline constexpr bool kMlaSparsePrefillOverlapPv = true;
// When true, kAuto's sparse prefill (mla_attention_bf16) runs the early-gather schedule (mla_sparse_prefill_wgmma's
// early_gather: the overlap-PV order with each warpgroup gathering its own half of tile j + 1 as soon as its
// P V(j - 1) retires, lookups prefetched a tile ahead; bitwise the same output) instead of
// kMlaSparsePrefillOverlapPv's. Off until a GPU run of bench_mla_sparse_prefill shows its "attend prefill-eg" rows
// ahead (session 8: built, not yet measured).
inline constexpr bool kMlaSparsePrefillEarlyGather = false;
// Workspace (bytes) mla_attention_bf16 needs for T tokens (q absorbed and the latent output, fp32, plus
// the split partials of the tensor-core kernels); wgmma_splits as passed to mla_attention_bf16.
size_t mla_attention_workspace_bytes(int64_t n_tokens, const MlaParams& p, int wgmma_splits = 0);
// Absorbed MLA: q bf16 [T, n_heads * (nope + rope)] (roped), latent_cache bf16 [n_slots, kv_lora + rope],
// kv_b bf16 [n_heads * (nope + v), kv_lora], topk i32 [T, topk_width] or null (every causal key)
// -> out bf16 [T, n_heads * v]. q_abs = q_nope W_uk (fp32), softmax over the token's keys of
// (q_abs . latent + q_rope . k_rope) * scale, latent-weighted sum, then W_uv. p.fp8_cache: latent_cache is
// packed FP8 rows u8 [n_slots, mla_fp8_row_bytes(kv_lora, rope)] (kernels/mla_fp8.h), read by both attend kernels.
void mla_attention_bf16(const void* q, const void* latent_cache, const void* kv_b, const int32_t* topk,
                        int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                        const int32_t* block_tables, void* out, const MlaParams& p, const AttentionParams& ap,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        MlaAttendKernel kernel = MlaAttendKernel::kAuto, int wgmma_splits = 0,
                        const AttentionSplitTable* wgmma_table = nullptr);

// ---- attention/mla_decode_mma.cu -----------------------------------------------------------------
// The tensor-core attend step handles kv_lora_rank 512, qk_rope_dim 64, 1..64 heads (GLM-5.x).
bool mla_attend_mma_supported(const MlaParams& p);
// KV splits per token of a group (chosen so group_tokens x n_splits fills the SMs once) and the keys
// (or top-k entries) each split walks, a multiple of the 32-key tile.
struct MlaSplitPlan {
  int n_splits = 1;
  int64_t keys_per_split = 0;
};
MlaSplitPlan mla_attend_split_plan(int64_t group_tokens, int64_t max_items);
// Split partials (bytes) for a group of group_tokens tokens.
size_t mla_attend_mma_workspace_bytes(int64_t group_tokens, const MlaParams& p);
// o_lat f32 [group, n_heads, 512] for tokens [t0, t0 + group) from q_abs f32 [group, n_heads, 512] and the
// roped q bf16 (rope part); max_items bounds every token's causal context (dense) or is topk_width (sparse).
void mla_attend_mma(const void* q, const float* q_abs, const void* latent_cache, const int32_t* topk,
                    int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index, const int32_t* block_tables,
                    float* o_lat, int64_t t0, int64_t group_tokens, int64_t max_items, const MlaParams& p,
                    const AttentionParams& ap, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- attention/mla_decode_wgmma.cu (Hopper) -------------------------------------------------------
// kv_lora_rank 512, qk_rope_dim 64, 1..64 heads, qk_nope_dim % 32 == 0, v_dim % 64 == 0, an sm_90 device;
// why (optional) names the first unmet condition.
bool mla_attend_wgmma_supported(const MlaParams& p, const char** why = nullptr);
// Splits per token CTA (dense rows pack 64 / n_heads tokens per CTA, sparse rows one): forced_splits > 0 (tests,
// benchmarks, the tuner) exactly; else the tuned table's bucket for (group_tokens, max_items) (`mxserve
// tune-attention --mla`; at most one wave of CTAs), else enough to fill the SMs once with >= 256 keys each.
MlaSplitPlan mla_attend_wgmma_split_plan(int64_t group_tokens, int64_t max_items, const MlaParams& p, bool sparse,
                                         int forced_splits = 0, const AttentionSplitTable* table = nullptr);
// Split partials (bytes) for a group of group_tokens tokens, any max_items, dense or sparse.
size_t mla_attend_wgmma_workspace_bytes(int64_t group_tokens, const MlaParams& p, int forced_splits = 0);
// o_lat bf16 [group, n_heads, 512] for tokens [t0, t0 + group) from q_abs bf16 [group, n_heads, 512] and the
// roped q bf16 (rope part); as mla_attend_mma otherwise. split_s: the kWgmmaSplitS variant.
void mla_attend_wgmma(const void* q, const void* q_abs, const void* latent_cache, const int32_t* topk,
                      int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                      const int32_t* block_tables, void* o_lat, int64_t t0, int64_t group_tokens, int64_t max_items,
                      const MlaParams& p, const AttentionParams& ap, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream, int forced_splits = 0, const AttentionSplitTable* table = nullptr,
                      bool split_s = false);

// ---- attention/mla_sparse_prefill_wgmma.cu (Hopper) -------------------------------------------------
// The sparse-prefill attend: o_lat bf16 [group, n_heads, 512] for tokens [t0, t0 + group) from q_abs bf16
// [group, n_heads, 512], the roped q bf16 (rope part) and topk i32 [T, topk_width] (-1 padded; entries the token
// cannot see are skipped), one CTA per token, no split-KV and no workspace. Same shape and device conditions as
// mla_attend_wgmma (mla_attend_wgmma_supported), bf16 cache only (p.fp8_cache is an error). overlap_pv: the
// schedule that leaves each tile's P V in flight under the next tile's scores (bitwise the same output; which one is
// faster is for the GPU run to say: bench_mla_sparse_prefill times both; mla_attention_bf16 runs
// kMlaSparsePrefillOverlapPv). early_gather (overrides overlap_pv): the overlap-PV order with each warpgroup
// gathering its own half of the next tile right after its previous P V retires (bitwise the same output again;
// mla_attention_bf16 runs it when kMlaSparsePrefillEarlyGather).
void mla_sparse_prefill_wgmma(const void* q, const void* q_abs, const void* latent_cache, const int32_t* topk,
                              int64_t topk_width, const int32_t* token_seq, const int32_t* kv_index,
                              const int32_t* block_tables, void* o_lat, int64_t t0, int64_t group_tokens,
                              const MlaParams& p, const AttentionParams& ap, cudaStream_t stream,
                              bool overlap_pv = false, bool early_gather = false);

// ---- attention/mla_absorb_mma.cu -----------------------------------------------------------------
bool mla_absorb_gemm_supported(const MlaParams& p);
// q_abs bf16 [n, n_heads, kv_lora] = q_nope W_uk per head, for tokens [t0, t0 + n) of q (tensor cores).
void mla_absorb_gemm_bf16(const void* q, const void* kv_b, void* q_abs, int64_t t0, int64_t n_tokens,
                          const MlaParams& p, cudaStream_t stream);
// out bf16 rows [t0, t0 + n) of [T, n_heads * v] = o_lat (bf16 [n, n_heads, kv_lora]) W_uv^T per head.
void mla_unabsorb_gemm_bf16(const void* o_lat, const void* kv_b, void* out, int64_t t0, int64_t n_tokens,
                            const MlaParams& p, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
