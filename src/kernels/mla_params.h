// Parameter structs of the MLA + DeepSeek sparse attention ops (glm_moe_dsa), shared by the CPU reference
// kernels (kernels/cpu/mla_dsa.cpp) and the CUDA kernels (kernels/cuda/attention/mla_dsa.h). Kept apart from op_params.h so the rest of the
// build does not depend on them.
#pragma once

#include <cstdint>

namespace mxserve::kernels {

// GPT-J interleaved RoPE (pairs 2i, 2i+1 rotated by pos * theta^(-2i/rotary_dim)) on dims
// [rot_offset, rot_offset + rotary_dim) of each of n_heads heads of head_stride elements per token.
struct InterleavedRopeParams {
  int32_t n_heads = 0;
  int32_t head_stride = 0;
  int32_t rot_offset = 0;
  int32_t rotary_dim = 0;
  float theta = 10000.f;
};

// DSA indexer: score[t, j] = sum_h weights[t, h] * weight_scale * ReLU(q[t, h] . key[j] * score_scale) over the
// token's visible causal keys j; keeps the top_k highest (ties to the lower KV index), or every visible key
// when there are at most top_k.
struct IndexerParams {
  int32_t n_heads = 0;       // index_n_heads
  int32_t head_dim = 0;      // index_head_dim (= width of a cached indexer key)
  int32_t top_k = 0;         // index_topk
  float score_scale = 1.f;   // index_head_dim^-0.5
  float weight_scale = 1.f;  // index_n_heads^-0.5
  // The key cache holds packed FP8 rows (kernels/mla_fp8.h: head_dim e4m3 codes + f32 scales), not values.
  // Set by the backend from the cache tensor's dtype (kU8), never by the model.
  bool fp8_keys = false;
};

// MLA over the paged latent cache: cache row = [latent (kv_lora_rank) | rope key (qk_rope_dim)];
// q per head = [nope (qk_nope_dim) | rope (qk_rope_dim)]; kv_b [n_heads * (qk_nope_dim + v_dim), kv_lora_rank].
struct MlaParams {
  int32_t n_heads = 0;
  int32_t qk_nope_dim = 0;
  int32_t qk_rope_dim = 0;
  int32_t v_dim = 0;
  int32_t kv_lora_rank = 0;
  float scale = 1.f;  // (qk_nope_dim + qk_rope_dim)^-0.5
  // The latent cache holds packed FP8 rows (kernels/mla_fp8.h: kv_lora_rank e4m3 codes + f32 scales + the
  // bf16 rope key), not values. Set by the backend from the cache tensor's dtype (kU8), never by the model.
  bool fp8_cache = false;
};

}  // namespace mxserve::kernels
