// Multi-head latent attention (MLA) with the DeepSeek sparse-attention (DSA) indexer, as glm_moe_dsa
// (GLM-5.x) computes it in transformers 5.17 (research/glm5-dsa.md):
//   q_resid = RMSNorm_1e-6(q_a(x)); q = q_b(q_resid) per head [nope | rope];
//   kv_a(x) = [latent | k_rope]; latent = RMSNorm_1e-6(latent); per head [k_nope | v] = kv_b(latent);
//   RoPE is GPT-J interleaved on q's rope part and on the one shared k_rope head.
// Cache per token: [latent | roped k_rope] (kLatent) and, on "full" indexer layers, the indexer key
// (kIndexerKey). Attention runs in the absorbed form against the cached latent (Backend::mla_attention),
// restricted to the indexer's top-k keys (backend/mla_dsa_ops.h). Holds weights, not activations.
// Tensor parallel (docs/parallel.md): a rank holds its heads of q_b / kv_b / o_proj; everything before the
// per-head split (q_a, kv_a, norms, the indexer) is replicated, so the latent cache, the indexer keys and
// the top-k are the same on every rank.
#pragma once

#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/mla_dsa_ops.h"
#include "model/archs/glm_moe_dsa_config.h"
#include "model/config.h"
#include "model/layers/weight_loader.h"

namespace mxserve::model {

// The DSA indexer of a "full" layer: scores every visible causal key, keeps index_topk of them.
struct DsaIndexer {
  Tensor wq_b;            // [index_n_heads * index_head_dim, q_lora_rank]
  Tensor wk;              // [index_head_dim, H]
  Tensor k_norm, k_bias;  // LayerNorm weight / bias [index_head_dim]
  Tensor weights_proj;    // [index_n_heads, H]
  int64_t layer = -1;     // decoder layer (decision sites, model/decisions.h)

  static DsaIndexer load(WeightLoader& wl, const std::string& prefix, const ModelConfig& cfg);
  // Writes the batch's indexer keys into key_cache [n_slots, index_head_dim], then topk i32 [T, index_topk].
  void forward(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, const Tensor& x_norm,
               const Tensor& q_resid,
               const Tensor& positions, const backend::AttentionMeta& meta, Tensor& key_cache, Tensor& topk) const;
  // Only the first half of forward: the batch's indexer keys into key_cache (the top-k is reused, not scored).
  void write_keys(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, const Tensor& x_norm,
                  const Tensor& positions, const backend::AttentionMeta& meta, Tensor& key_cache) const;
  // The same with the x-side projections already computed (MlaAttention's fused input GEMM): k = wk x [T, D]
  // (normed, roped in place), w = weights_proj x [T, index_n_heads].
  void forward_projected(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, Tensor& k,
                         const Tensor& w, const Tensor& q_resid, const Tensor& positions,
                         const backend::AttentionMeta& meta, Tensor& key_cache, Tensor& topk) const;
  void write_projected_keys(backend::MlaDsaOps& ops, const ModelConfig& cfg, Tensor& k, const Tensor& positions,
                            const backend::AttentionMeta& meta, Tensor& key_cache) const;
};

struct MlaAttention {
  Tensor q_a;        // [q_lora_rank, H]
  Tensor q_a_norm;   // [q_lora_rank]
  Tensor q_b;        // [n_heads * (nope + rope), q_lora_rank]   (n_heads: this rank's heads)
  Tensor kv_a;       // [kv_lora_rank + rope, H]
  Tensor kv_a_norm;  // [kv_lora_rank]
  Tensor kv_b;       // [n_heads * (nope + v), kv_lora_rank]       (this rank's heads)
  Tensor o_proj;     // [H, n_heads * v]  (this rank's heads' columns: a partial sum at tp > 1)
  std::optional<DsaIndexer> indexer;  // "full" layers only
  // The projections of x_norm as one GEMM (bf16 weights only; else undefined: four GEMMs): rows
  // [q_a | kv_a | indexer wk | indexer weights_proj] (the indexer's on full layers); q_a, kv_a, wk and
  // weights_proj are then row views of it (no second copy). Built once by load; MXSERVE_FUSED_PROJ=0: off.
  Tensor in_proj;  // [q_lora_rank + kv_lora_rank + rope (+ index_head_dim + index_n_heads), H]

  // full_indexer: the layer has its own indexer (its tensors must be in the checkpoint). cfg: the model's
  // (all heads); the loader slices q_b / kv_b / o_proj to this rank's heads.
  static MlaAttention load(WeightLoader& wl, const std::string& prefix, const ModelConfig& cfg, bool full_indexer);
  // x_norm [T,H] -> out [T,H]. Writes the batch's latent rows (and indexer keys) first. A full layer fills
  // topk [T, index_topk]; a shared layer reads the topk its most recent full layer wrote in this batch.
  // cfg.n_heads: this rank's heads (tensor parallel; the model's count at tp 1). out: this rank's partial
  // sum over its heads at tp > 1 (the caller all-reduces it). reuse_topk (MTP draft steps >= 2 under
  // index_share_for_mtp_iteration): topk already holds the rows to attend over; a full layer still writes its
  // indexer keys but does not score them.
  void forward(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, const Tensor& x_norm,
               const Tensor& positions, const backend::AttentionMeta& meta, Tensor& latent_cache,
               Tensor* index_key_cache, Tensor& topk, Tensor& out, bool reuse_topk = false) const;
};

}  // namespace mxserve::model
