// CPU reference kernels: plain, correct, fp32 accumulation. The executable spec every CUDA kernel is
// tested against. All tensors are row-major and contiguous; shapes are given per argument.
#pragma once

#include <cstdint>

#include "kernels/mla_params.h"
#include "kernels/op_params.h"

namespace mxserve::kernels::cpu {

// out[M,N] = x[M,K] @ w[N,K]^T (+ bias[N]).  OpenBLAS sgemm.
void linear_f32(const float* x, const float* w, const float* bias, float* out, int64_t m, int64_t n, int64_t k);

// out[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * w   (rows x cols)
void rmsnorm_f32(const float* x, const float* w, float* out, int64_t rows, int64_t cols, float eps);
// residual[r,:] += x[r,:]; out[r,:] = rmsnorm(residual[r,:]) * w: bit for bit the add then rmsnorm_f32
// (the reference of the fused add + RMSNorm; out may alias x, not residual).
void add_rmsnorm_f32(const float* x, float* residual, const float* w, float* out, int64_t rows, int64_t cols,
                     float eps);

// out[t,:] = table[ids[t],:]; table is bf16 [V, H] or f32 (table_is_bf16 selects).
void embedding_f32(const void* table, bool table_is_bf16, const int32_t* ids, float* out, int64_t n_tokens,
                   int64_t d_model);

// In place on x[n_tokens, n_heads, head_dim]: NeoX half-split rotation of dims [0, rotary_dim).
void rope_neox_f32(float* x, const int32_t* positions, int64_t n_tokens, const RopeParams& p);

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]      gate_up: [T, 2*inter], out: [T, inter]
void silu_mul_f32(const float* gate_up, float* out, int64_t n_tokens, int64_t inter);

// Writes k/v rows [T, n_kv_heads*head_dim] into the paged caches at slot_mapping[t]
// (slot = block * block_size + offset; slot < 0: a padding row, not written, as in the MLA writers); caches are
// [n_blocks*block_size, n_kv_heads*head_dim].
void kv_write_f32(const float* k, const float* v, const int32_t* slot_mapping, float* k_cache, float* v_cache,
                  int64_t n_tokens, int64_t kv_width);

// FP8 E4M3 cache (kernels/kv_fp8.h): quantizes k/v rows [T, n_kv_heads*head_dim] into e4m3 codes at
// slot_mapping[t] of the u8 caches, with one f32 scale per (slot, kv head) into k_scales / v_scales
// [n_slots, n_kv_heads]. The oracle for the CUDA kv_write: the same bytes for the same inputs.
void kv_write_fp8(const float* k, const float* v, const int32_t* slot_mapping, uint8_t* k_cache, uint8_t* v_cache,
                  float* k_scales, float* v_scales, int64_t n_tokens, int64_t n_kv_heads, int64_t head_dim);

// Copies rows src_slots[i] -> dst_slots[i] of two caches of row_bytes-byte rows (any dtype: data or
// scales), in order (later pairs see earlier writes).
void kv_copy_rows(const int32_t* src_slots, const int32_t* dst_slots, int64_t n_pairs, uint8_t* a, uint8_t* b,
                  int64_t row_bytes);

// Copies cache rows src_slots[i] -> dst_slots[i] of both caches, in order (later pairs see earlier writes).
void kv_copy_f32(const int32_t* src_slots, const int32_t* dst_slots, int64_t n_pairs, float* k_cache, float* v_cache,
                 int64_t kv_width);

// q: [T, n_heads, head_dim]; out: [T, n_heads, head_dim].
// token_seq[T]: block_tables row of each token's sequence; kv_index[T]: its KV index; block_tables: [rows, max_blocks].
// With p.tree_mask (host pointers here) keys j >= tree_base[t] not in the token's mask are skipped.
// Caches: f32 [n_slots, n_kv_heads*head_dim], or with p.fp8_kv() u8 e4m3 codes dequantized on the fly with
// p.k_scales / p.v_scales (code value * scale in f32: the FP8 oracle).
void paged_attention_f32(const float* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                         const int32_t* kv_index, const int32_t* block_tables, float* out,
                         const AttentionParams& p);

// Router: logits[T, E] = x[T,H] @ gate_w[E,H]^T in fp32; sigmoid; + bias for selection only;
// group-limited top-k; weights = unbiased sigmoid scores of the chosen experts (normalized, scaled).
// topk_ids / topk_weights: [T, top_k].
void moe_router_f32(const float* logits, const float* correction_bias, int32_t* topk_ids, float* topk_weights,
                    int64_t n_tokens, const RouterParams& p);

// ---- MLA + DSA (mla_dsa.cpp) ----

// out[r,:] = (x[r,:] - mean) * rsqrt(var + eps) * w + b   (biased variance, rows x cols)
void layernorm_f32(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t cols, float eps);

// In place on x[n_tokens, n_heads, head_stride] (see InterleavedRopeParams).
void rope_interleaved_f32(float* x, const int32_t* positions, int64_t n_tokens, const InterleavedRopeParams& p);

// cache[slot_mapping[t], col_offset + c] = rows[t, c] for c < width; cache rows are cache_width wide.
void cache_write_f32(const float* rows, const int32_t* slot_mapping, float* cache, int64_t n_tokens, int64_t width,
                     int64_t cache_width, int64_t col_offset);

// Packed FP8 cache rows (kernels/mla_fp8.h) in u8 cache [n_slots, row_bytes]: col_offset 0 quantizes rows
// [T, width] into the codes + per-128 f32 scales; col_offset > 0 (= the quantized width) stores them as the
// bf16 tail. Negative slots (padding rows) are skipped.
void cache_write_fp8_packed(const float* rows, const int32_t* slot_mapping, uint8_t* cache, int64_t n_tokens,
                            int64_t width, int64_t row_bytes, int64_t col_offset);
// out [n + tail] = the dequantized values of one packed row (codes * scale, then the bf16 tail widened).
void dequant_fp8_packed_row(const uint8_t* row, int64_t n, int64_t tail, float* out);

// topk[t, :] = the selected KV indices of token t (ascending, -1 padded), [n_tokens, p.top_k].
// q [T, n_heads, head_dim], weights [T, n_heads], key_cache [n_slots, head_dim]; ap: paging + tree masks.
// p.fp8_keys: key_cache is packed FP8 rows u8 [n_slots, mla_fp8_row_bytes(head_dim, 0)] (kernels/mla_fp8.h),
// dequantized on read; else f32 [n_slots, head_dim].
void indexer_topk_f32(const float* q, const float* weights, const void* key_cache, const int32_t* token_seq,
                      const int32_t* kv_index, const int32_t* block_tables, int32_t* topk, const IndexerParams& p,
                      const AttentionParams& ap);

// Absorbed MLA attention over the latent cache: per head, q_abs = W_uk^T q_nope, score_j = (q_abs . latent_j +
// q_rope . krope_j) * scale, o = W_uv (sum_j softmax_j latent_j). Keys are the token's visible causal keys,
// restricted to topk[t, :] when topk is non-null ([T, topk_width], -1 padded KV indices).
// q [T, n_heads, nope + rope], cache [n_slots, kv_lora + rope], kv_b [n_heads*(nope+v), kv_lora], out [T, n_heads, v].
// p.fp8_cache: cache is packed FP8 rows u8 [n_slots, mla_fp8_row_bytes(kv_lora, rope)] (kernels/mla_fp8.h),
// dequantized on read (the same bytes the CUDA kernels read); else f32 as above.
void mla_attention_f32(const float* q, const void* cache, const float* kv_b, const int32_t* topk, int64_t topk_width,
                       const int32_t* token_seq, const int32_t* kv_index, const int32_t* block_tables, float* out,
                       const MlaParams& p, const AttentionParams& ap);

// out[r, c] = x[r, begin + c] for c < end - begin; x is [rows, cols].
void copy_columns_f32(const float* x, float* out, int64_t rows, int64_t cols, int64_t begin, int64_t end);

}  // namespace mxserve::kernels::cpu
