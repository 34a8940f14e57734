#include "model/layers/mla_attention.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/logging.h"
#include "model/layers/decision_sites.h"
#include "model/layers/fused_weights.h"
#include "model/layers/weight_decl.h"

namespace mxserve::model {
namespace {

constexpr float kLoraNormEps = 1e-6f;  // q_a_layernorm / kv_a_layernorm (transformers' default, not rms_norm_eps)
constexpr float kIndexerNormEps = 1e-6f;
constexpr parallel::ShardAxis kReplicated = parallel::ShardAxis::kNone;

kernels::InterleavedRopeParams rope_params(const ModelConfig& cfg, int64_t n_heads, int64_t stride, int64_t offset) {
  kernels::InterleavedRopeParams p;
  p.n_heads = static_cast<int32_t>(n_heads);
  p.head_stride = static_cast<int32_t>(stride);
  p.rot_offset = static_cast<int32_t>(offset);
  p.rotary_dim = static_cast<int32_t>(glm_moe_dsa_config(cfg).qk_rope_dim);
  p.theta = static_cast<float>(cfg.rope_theta);
  return p;
}

// Columns [begin, end) of y [T, N] as a [T, end - begin] tensor: a view of y's storage at one row with
// 16-byte aligned offsets (decode at batch 1: no copy), else a copy.
Tensor columns(backend::Backend& be, backend::MlaDsaOps& ops, const Tensor& y, int64_t begin, int64_t end) {
  Tensor v = row_columns_view(y, begin, end);
  if (v.defined() && v.numel() > 0) return v;
  Tensor out = be.alloc(y.dtype(), {y.dim(0), end - begin});
  ops.copy_columns(y, begin, end, out);
  return out;
}

// The indexer's selection from its roped queries q [T, NH * D] and head weights w [T, NH] over key_cache:
// topk [T, index_topk], then the decision hook's record of it (when one is active).
void select_topk(backend::Backend& be, backend::MlaDsaOps& ops, const GlmMoeDsaConfig& d, const Tensor& q,
                 const Tensor& w, const Tensor& key_cache, const backend::AttentionMeta& meta, int64_t layer,
                 Tensor& topk) {
  const int64_t NH = d.index_n_heads, D = d.index_head_dim;
  kernels::IndexerParams ip;
  ip.n_heads = static_cast<int32_t>(NH);
  ip.head_dim = static_cast<int32_t>(D);
  ip.top_k = static_cast<int32_t>(d.index_topk);
  ip.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  ip.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(NH)));
  ops.indexer_topk(q, w, key_cache, meta, ip, topk);
  if (DecisionHook* hook = active_decision_hook()) index_decision(be, q, w, key_cache, meta, ip, layer, *hook, topk);
}

}  // namespace

DsaIndexer DsaIndexer::load(WeightLoader& wl, const std::string& p, const ModelConfig& cfg) {
  const GlmMoeDsaConfig& d = glm_moe_dsa_config(cfg);
  const int64_t H = cfg.d_model, D = d.index_head_dim;
  DsaIndexer ix;
  ix.layer = layer_of_prefix(p);
  ix.wq_b = wl.get(decl::linear(p + "wq_b.weight", d.index_n_heads * D, d.q_lora_rank, kReplicated));
  ix.wk = wl.get(decl::linear(p + "wk.weight", D, H, kReplicated));
  ix.k_norm = wl.get(decl::replicated(p + "k_norm.weight", {D}));
  ix.k_bias = wl.get(decl::replicated(p + "k_norm.bias", {D}));
  ix.weights_proj = wl.get(decl::linear(p + "weights_proj.weight", d.index_n_heads, H, kReplicated));
  return ix;
}

void DsaIndexer::forward(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, const Tensor& x,
                         const Tensor& q_resid,
                         const Tensor& positions, const backend::AttentionMeta& meta, Tensor& key_cache,
                         Tensor& topk) const {
  const GlmMoeDsaConfig& d = glm_moe_dsa_config(cfg);
  const int64_t T = x.dim(0), NH = d.index_n_heads, D = d.index_head_dim;
  const DType act = be.activation_dtype();
  Tensor q = be.alloc(act, {T, NH * D});
  be.linear(q_resid, wq_b, nullptr, q);
  ops.rope_interleaved(q, positions, rope_params(cfg, NH, D, 0));
  write_keys(be, ops, cfg, x, positions, meta, key_cache);
  Tensor w = be.alloc(act, {T, NH});
  be.linear(x, weights_proj, nullptr, w);
  select_topk(be, ops, d, q, w, key_cache, meta, layer, topk);
}

void DsaIndexer::forward_projected(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, Tensor& k,
                                   const Tensor& w, const Tensor& q_resid, const Tensor& positions,
                                   const backend::AttentionMeta& meta, Tensor& key_cache, Tensor& topk) const {
  const GlmMoeDsaConfig& d = glm_moe_dsa_config(cfg);
  const int64_t T = q_resid.dim(0), NH = d.index_n_heads, D = d.index_head_dim;
  Tensor q = be.alloc(be.activation_dtype(), {T, NH * D});
  be.linear(q_resid, wq_b, nullptr, q);
  ops.rope_interleaved(q, positions, rope_params(cfg, NH, D, 0));
  write_projected_keys(ops, cfg, k, positions, meta, key_cache);
  select_topk(be, ops, d, q, w, key_cache, meta, layer, topk);
}

void DsaIndexer::write_projected_keys(backend::MlaDsaOps& ops, const ModelConfig& cfg, Tensor& k,
                                      const Tensor& positions, const backend::AttentionMeta& meta,
                                      Tensor& key_cache) const {
  const int64_t D = glm_moe_dsa_config(cfg).index_head_dim;
  ops.norm_rope_cache_write(k, k_norm, k_bias, kIndexerNormEps, positions, rope_params(cfg, 1, D, 0), meta, key_cache);
}

void DsaIndexer::write_keys(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, const Tensor& x,
                            const Tensor& positions, const backend::AttentionMeta& meta, Tensor& key_cache) const {
  const int64_t T = x.dim(0), D = glm_moe_dsa_config(cfg).index_head_dim;
  Tensor k = be.alloc(be.activation_dtype(), {T, D});
  be.linear(x, wk, nullptr, k);
  ops.norm_rope_cache_write(k, k_norm, k_bias, kIndexerNormEps, positions, rope_params(cfg, 1, D, 0), meta, key_cache);
}

MlaAttention MlaAttention::load(WeightLoader& wl, const std::string& p, const ModelConfig& cfg, bool full_indexer) {
  const GlmMoeDsaConfig& d = glm_moe_dsa_config(cfg);
  const int64_t H = cfg.d_model, NH = cfg.n_heads;
  MlaAttention a;
  a.q_a = wl.get(decl::linear(p + "q_a_proj.weight", d.q_lora_rank, H, kReplicated));
  a.q_a_norm = wl.get(decl::replicated(p + "q_a_layernorm.weight", {d.q_lora_rank}));
  // Tensor parallel: q_b / kv_b split by whole heads ([nope | rope] and [k_nope | v] rows per head), o_proj by
  // the columns of those heads (a partial sum); q_a, kv_a (latent + rope key), their norms and the indexer
  // are replicated, so every rank writes the same latent cache and computes the same top-k.
  a.q_b = wl.get(decl::head_linear(p + "q_b_proj.weight", NH, d.qk_head_dim(), d.q_lora_rank));
  a.kv_a = wl.get(decl::linear(p + "kv_a_proj_with_mqa.weight", d.cache_width(), H, kReplicated));
  a.kv_a_norm = wl.get(decl::replicated(p + "kv_a_layernorm.weight", {d.kv_lora_rank}));
  a.kv_b = wl.get(decl::head_linear(p + "kv_b_proj.weight", NH, d.qk_nope_dim + d.v_dim, d.kv_lora_rank));
  a.o_proj = wl.get(decl::linear(p + "o_proj.weight", H, NH * d.v_dim, parallel::ShardAxis::kColumn));
  if (full_indexer) a.indexer = DsaIndexer::load(wl, p + "indexer.", cfg);
  // One GEMM for every projection of x_norm (decode: four skinny GEMMs -> one). All replicated, so no tp
  // slicing; bf16 weights only (an FP8 / f32 checkpoint keeps the four GEMMs). Said once per process.
  if (wl.is_recording()) return a;  // the weight table only: nothing allocated
  static std::atomic<bool> said{false};
  std::string why = "MXSERVE_FUSED_PROJ=0";
  if (fused_projections_enabled()) {
    std::vector<Tensor*> parts{&a.q_a, &a.kv_a};
    if (a.indexer) parts.insert(parts.end(), {&a.indexer->wk, &a.indexer->weights_proj});
    a.in_proj = fuse_rows(wl.backend(), parts, &why);
  }
  if (!said.exchange(true)) {
    if (a.in_proj.defined() && a.in_proj.numel() > 0) {
      MX_LOG(kInfo) << "MLA input projections: one fused GEMM " << a.in_proj.describe()
                    << " per layer (q_a | kv_a | indexer wk | weights_proj)";
    } else {
      MX_LOG(kInfo) << "MLA input projections: separate GEMMs (" << why << ")";
    }
  }
  return a;
}

void MlaAttention::forward(backend::Backend& be, backend::MlaDsaOps& ops, const ModelConfig& cfg, const Tensor& x,
                           const Tensor& positions,
                           const backend::AttentionMeta& meta, Tensor& latent_cache, Tensor* index_key_cache,
                           Tensor& topk, Tensor& out, bool reuse_topk) const {
  const GlmMoeDsaConfig& d = glm_moe_dsa_config(cfg);
  const int64_t T = x.dim(0), NH = cfg.n_heads;  // this rank's heads
  MX_CHECK_MSG(q_b.dim(0) == NH * d.qk_head_dim() && kv_b.dim(0) == NH * (d.qk_nope_dim + d.v_dim),
               "MLA: cfg.n_heads " << NH << " is not the head count of q_b " << q_b.describe() << " / kv_b "
                                   << kv_b.describe());
  const DType act = be.activation_dtype();
  const int64_t QR = d.q_lora_rank, CW = d.cache_width();
  const bool fused = in_proj.defined() && in_proj.numel() > 0;
  Tensor y;  // fused: x_norm x in_proj^T [T, QR + CW (+ D + NHi)]
  if (fused) {
    y = be.alloc(act, {T, in_proj.dim(0)});
    be.linear(x, in_proj, nullptr, y);
  }
  Tensor q_resid;
  if (fused) {
    q_resid = columns(be, ops, y, 0, QR);
  } else {
    q_resid = be.alloc(act, {T, QR});
    be.linear(x, q_a, nullptr, q_resid);
  }
  be.rmsnorm(q_resid, q_a_norm, kLoraNormEps, q_resid);
  Tensor q = be.alloc(act, {T, NH * d.qk_head_dim()});
  be.linear(q_resid, q_b, nullptr, q);
  ops.rope_interleaved(q, positions, rope_params(cfg, NH, d.qk_head_dim(), d.qk_nope_dim));

  Tensor kv = y;
  int64_t kv0 = QR;  // kv_a's first column in kv
  if (!fused) {
    kv = be.alloc(act, {T, CW});
    be.linear(x, kv_a, nullptr, kv);
    kv0 = 0;
  }
  // The cache row [rmsnorm(latent) | rope(k_rope)] in one kernel where the backend fuses it (CUDA, bf16 cache).
  if (!ops.try_latent_cache_write(kv, kv0, kv_a_norm, kLoraNormEps, positions, rope_params(cfg, 1, d.qk_rope_dim, 0),
                                  meta, latent_cache)) {
    Tensor latent = columns(be, ops, kv, kv0, kv0 + d.kv_lora_rank);
    be.rmsnorm(latent, kv_a_norm, kLoraNormEps, latent);
    Tensor k_rope = columns(be, ops, kv, kv0 + d.kv_lora_rank, kv0 + CW);
    ops.rope_interleaved(k_rope, positions, rope_params(cfg, 1, d.qk_rope_dim, 0));
    // One row [latent | k_rope] written at once where both are views of one kv row (one token: views, not
    // copies) and the cache holds them as they are (bf16 / f32; a packed FP8 row quantizes the latent alone).
    const Tensor kv_row = latent_cache.dtype() != DType::kU8 ? row_columns_view(kv, kv0, kv0 + CW) : Tensor();
    const bool one_write =
        kv_row.defined() && kv_row.numel() > 0 && latent.raw() == kv_row.raw() &&
        k_rope.raw() == static_cast<const char*>(kv_row.raw()) + d.kv_lora_rank * (kv_row.nbytes() / kv_row.numel());
    if (one_write) {
      ops.cache_write(kv_row, meta, latent_cache, 0);
    } else {
      ops.cache_write(latent, meta, latent_cache, 0);
      ops.cache_write(k_rope, meta, latent_cache, d.kv_lora_rank);
    }
  }

  if (indexer) {
    MX_CHECK_MSG(index_key_cache != nullptr, "MLA: a full indexer layer needs its indexer-key cache");
    if (fused) {
      const int64_t D = d.index_head_dim, k0 = QR + CW;
      Tensor k = columns(be, ops, y, k0, k0 + D);
      if (reuse_topk) {
        indexer->write_projected_keys(ops, cfg, k, positions, meta, *index_key_cache);
      } else {
        const Tensor w = columns(be, ops, y, k0 + D, k0 + D + d.index_n_heads);
        indexer->forward_projected(be, ops, cfg, k, w, q_resid, positions, meta, *index_key_cache, topk);
      }
    } else if (reuse_topk) {
      indexer->write_keys(be, ops, cfg, x, positions, meta, *index_key_cache);
    } else {
      indexer->forward(be, ops, cfg, x, q_resid, positions, meta, *index_key_cache, topk);
    }
  }
  kernels::MlaParams mp;
  mp.n_heads = static_cast<int32_t>(NH);
  mp.qk_nope_dim = static_cast<int32_t>(d.qk_nope_dim);
  mp.qk_rope_dim = static_cast<int32_t>(d.qk_rope_dim);
  mp.v_dim = static_cast<int32_t>(d.v_dim);
  mp.kv_lora_rank = static_cast<int32_t>(d.kv_lora_rank);
  mp.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.qk_head_dim())));
  Tensor attn = be.alloc(act, {T, NH * d.v_dim});
  ops.mla_attention(q, latent_cache, kv_b, &topk, meta, mp, attn);
  be.linear(attn, o_proj, nullptr, out);
}

}  // namespace mxserve::model
