// MlaDsaOps: the backend ops of MLA + DeepSeek sparse attention (glm_moe_dsa / GLM-5.x), an optional
// capability a Backend implements alongside its op table (the CPU reference and CUDA, backend/cuda_mla_dsa_ops.h).
// mla_dsa_ops(be) is null on a backend without them, and the architecture then refuses to load with an
// error naming the backend -- never a fallback. Kept out of backend.h so adding these ops does not rebuild
// every file that includes the op table; the shapes and semantics are those of kernels/mla_params.h.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "kernels/mla_params.h"

namespace mxserve::backend {

class MlaDsaOps {
 public:
  virtual ~MlaDsaOps() = default;
  // LayerNorm with weight and bias over the last dim: x, out [R, C] (out may be x); w, b [C].
  virtual void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& out) = 0;
  // In place on x [T, n_heads * head_stride]: GPT-J interleaved RoPE of dims [rot_offset, +rotary_dim) per head.
  virtual void rope_interleaved(Tensor& x, const Tensor& positions, const kernels::InterleavedRopeParams& p) = 0;
  // out [R, end - begin] = columns [begin, end) of x [R, C].
  virtual void copy_columns(const Tensor& x, int64_t begin, int64_t end, Tensor& out) = 0;
  // Writes rows [T, W] into columns [col_offset, col_offset + W) of cache [n_slots, width] at meta.slot_mapping.
  virtual void cache_write(const Tensor& rows, const AttentionMeta& meta, Tensor& cache, int64_t col_offset) = 0;
  // DSA indexer: q [T, n_heads * head_dim] (roped), weights [T, n_heads], key_cache [n_slots, head_dim]
  // -> topk i32 [T, p.top_k]: the selected KV indices, ascending, -1 padded.
  // The DSA indexer key: k [T, C] = rope(layernorm(k) * w + b) in place (one head, head_stride C), written to
  // columns [0, C) of cache [n_slots, C] at meta.slot_mapping. Bit for bit the three ops above, which are the
  // default; a backend may fuse them into one pass.
  virtual void norm_rope_cache_write(Tensor& k, const Tensor& w, const Tensor& b, float eps, const Tensor& positions,
                                     const kernels::InterleavedRopeParams& p, const AttentionMeta& meta,
                                     Tensor& cache) {
    layernorm(k, w, b, eps, k);
    rope_interleaved(k, positions, p);
    cache_write(k, meta, cache, 0);
  }
  // The MLA cache row from kv_a's output in one pass, where the backend has it: kv [T, N] holds [latent | k_rope]
  // at columns [col0, col0 + L + R); cache row [0, L) = rmsnorm(latent) * norm_w (L = norm_w.numel()),
  // [L, L + R) = rope(k_rope) (p: one head, head_stride R). kv is not modified. Returns false, having done
  // nothing, where the backend does not fuse this case (the default): the caller runs rmsnorm, rope and
  // cache_write itself (the reference).
  virtual bool try_latent_cache_write(const Tensor& kv, int64_t col0, const Tensor& norm_w, float eps,
                                      const Tensor& positions, const kernels::InterleavedRopeParams& p,
                                      const AttentionMeta& meta, Tensor& cache) {
    (void)kv, (void)col0, (void)norm_w, (void)eps, (void)positions, (void)p, (void)meta, (void)cache;
    return false;
  }
  virtual void indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& key_cache,
                            const AttentionMeta& meta, const kernels::IndexerParams& p, Tensor& topk) = 0;
  // Absorbed MLA attention: q [T, n_heads * (nope + rope)] (roped), latent_cache [n_slots, kv_lora + rope],
  // kv_b [n_heads * (nope + v), kv_lora], topk i32 [T, K] or null (dense causal) -> out [T, n_heads * v].
  virtual void mla_attention(const Tensor& q, const Tensor& latent_cache, const Tensor& kv_b, const Tensor* topk,
                             const AttentionMeta& meta, const kernels::MlaParams& p, Tensor& out) = 0;
};

// The MLA / DSA ops of `be`, or null when that backend does not implement them.
inline MlaDsaOps* mla_dsa_ops(Backend& be) { return dynamic_cast<MlaDsaOps*>(&be); }

}  // namespace mxserve::backend
