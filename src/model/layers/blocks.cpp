#include "model/layers/blocks.h"

#include <atomic>
#include <cmath>

#include "core/logging.h"
#include "model/layers/decision_sites.h"
#include "model/layers/fused_weights.h"
#include "model/layers/weight_decl.h"

namespace mxserve::model {

GqaAttention GqaAttention::load(WeightLoader& wl, const std::string& p, const ModelConfig& cfg) {
  using parallel::ShardAxis;
  const int64_t H = cfg.d_model, hd = cfg.head_dim, q = cfg.n_heads * hd;
  GqaAttention a;
  // Tensor parallel: q/k/v split by whole heads (KV heads replicated when tp > n_kv_heads), o_proj by columns.
  a.q_proj = wl.get(decl::head_linear(p + "q_proj.weight", cfg.n_heads, hd, H));
  a.k_proj = wl.get(decl::head_linear(p + "k_proj.weight", cfg.n_kv_heads, hd, H));
  a.v_proj = wl.get(decl::head_linear(p + "v_proj.weight", cfg.n_kv_heads, hd, H));
  a.o_proj = wl.get(decl::linear(p + "o_proj.weight", H, q, ShardAxis::kColumn));
  if (cfg.attention_bias) {
    a.q_bias = wl.get(decl::head_bias(p + "q_proj.bias", cfg.n_heads, hd));
    a.k_bias = wl.get(decl::head_bias(p + "k_proj.bias", cfg.n_kv_heads, hd));
    a.v_bias = wl.get(decl::head_bias(p + "v_proj.bias", cfg.n_kv_heads, hd));
  }
  if (cfg.use_qk_norm) {
    a.q_norm = wl.get(decl::replicated(p + "q_norm.weight", {cfg.head_dim}));
    a.k_norm = wl.get(decl::replicated(p + "k_norm.weight", {cfg.head_dim}));
  }
  // One QKV GEMM (this rank's heads: the parts are already tp slices). Said once per process.
  if (wl.is_recording()) return a;  // the weight table only: nothing allocated
  static std::atomic<bool> said{false};
  std::string why = "MXSERVE_FUSED_PROJ=0";
  if (fused_projections_enabled()) {
    a.qkv = fuse_rows(wl.backend(), {&a.q_proj, &a.k_proj, &a.v_proj}, &why);
    if (a.qkv.defined() && a.qkv.numel() > 0 && cfg.attention_bias) {
      Tensor b = fuse_rows(wl.backend(), {&*a.q_bias, &*a.k_bias, &*a.v_bias}, &why);
      if (b.defined() && b.numel() > 0) a.qkv_bias = b;
      else a.qkv = Tensor();  // the weights stay views of the (now unused) fused tensor: same values
    }
  }
  if (!said.exchange(true)) {
    if (a.qkv.defined() && a.qkv.numel() > 0 && cfg.use_qk_norm) {
      MX_LOG(kInfo) << "attention q | k | v: one fused GEMM " << a.qkv.describe()
                    << " per layer at one row; three GEMMs at more rows (per-head q/k RMSNorm: the fused RoPE + "
                       "K/V write takes no norm)";
    } else if (a.qkv.defined() && a.qkv.numel() > 0 && !wl.backend().one_qkv_gemm(2)) {
      MX_LOG(kInfo) << "attention q | k | v: one fused GEMM " << a.qkv.describe()
                    << " per layer at one row; three GEMMs at more rows (the backend's fused RoPE + K/V write is "
                       "not its default: see its log line)";
    } else if (a.qkv.defined() && a.qkv.numel() > 0) {
      MX_LOG(kInfo) << "attention q | k | v: one fused GEMM " << a.qkv.describe()
                    << " per layer at every row count, then RoPE + K/V cache write as one op (rope_kv_write)";
    } else {
      MX_LOG(kInfo) << "attention q | k | v: separate GEMMs (" << why << ")";
    }
  }
  return a;
}

void GqaAttention::forward(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, const Tensor& positions,
                           const backend::AttentionMeta& meta, Tensor& k_cache, Tensor& v_cache,
                           Tensor* k_scales, Tensor* v_scales, Tensor& out) const {
  const int64_t T = x.dim(0);
  const DType act = be.activation_dtype();
  const int64_t nq = cfg.n_heads * cfg.head_dim, nkv = cfg.n_kv_heads * cfg.head_dim;
  backend::AttentionMeta layer_meta;
  const backend::AttentionMeta* m = &meta;
  if (k_scales != nullptr) {  // FP8 cache: this layer's scale pointers ride in a copy of the batch's params
    layer_meta = meta;
    layer_meta.params.k_scales = k_scales->data<float>();
    layer_meta.params.v_scales = v_scales->data<float>();
    m = &layer_meta;
  }
  kernels::RopeParams rp;
  rp.head_dim = static_cast<int32_t>(cfg.head_dim);
  rp.rotary_dim = static_cast<int32_t>(cfg.rotary_dim);
  rp.theta = static_cast<float>(cfg.rope_theta);
  rp.n_heads = static_cast<int32_t>(cfg.n_heads);
  Tensor attn = be.alloc(act, {T, cfg.n_heads * cfg.head_dim});
  const bool fused = qkv.defined() && qkv.numel() > 0 && nq % 8 == 0 && nkv % 8 == 0;
  if (fused && !q_norm && be.one_qkv_gemm(T)) {  // one QKV GEMM at every row count, then RoPE + K/V write as one op
    Tensor y = be.alloc(act, {T, nq + 2 * nkv});
    be.linear(x, qkv, qkv_bias ? &*qkv_bias : nullptr, y);
    const Tensor q = be.rope_kv_write(y, positions, rp, *m, k_cache, v_cache);
    be.attention(q, k_cache, v_cache, *m, attn);
    be.linear(attn, o_proj, nullptr, out);
    return;
  }
  Tensor q, k, v;
  if (T == 1 && fused) {  // one GEMM at one row, q / k / v as views of its output (q/k norm layers; a backend
                          // whose fused rope_kv_write is not its default)
    Tensor y = be.alloc(act, {T, nq + 2 * nkv});
    be.linear(x, qkv, qkv_bias ? &*qkv_bias : nullptr, y);
    q = row_columns_view(y, 0, nq);
    k = row_columns_view(y, nq, nq + nkv);
    v = row_columns_view(y, nq + nkv, nq + 2 * nkv);
  } else {
    q = be.alloc(act, {T, nq});
    k = be.alloc(act, {T, nkv});
    v = be.alloc(act, {T, nkv});
    be.linear(x, q_proj, q_bias ? &*q_bias : nullptr, q);
    be.linear(x, k_proj, k_bias ? &*k_bias : nullptr, k);
    be.linear(x, v_proj, v_bias ? &*v_bias : nullptr, v);
  }
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  if (q_norm) {  // per-head RMSNorm over head_dim, before RoPE
    be.rmsnorm(q, *q_norm, eps, q);
    be.rmsnorm(k, *k_norm, eps, k);
  }
  be.rope(q, positions, rp);
  rp.n_heads = static_cast<int32_t>(cfg.n_kv_heads);
  be.rope(k, positions, rp);
  be.kv_write(k, v, *m, k_cache, v_cache);
  be.attention(q, k_cache, v_cache, *m, attn);
  be.linear(attn, o_proj, nullptr, out);
}

SwigluMlp SwigluMlp::load(WeightLoader& wl, const std::string& p, int64_t d_model, int64_t inter, bool moe_group) {
  using parallel::ShardAxis;
  auto spec = [moe_group](WeightSpec w) {
    w.moe_group = moe_group;
    return w;
  };
  SwigluMlp m;
  m.gate_up = wl.concat_rows({spec(decl::linear(p + "gate_proj.weight", inter, d_model, ShardAxis::kRow)),
                              spec(decl::linear(p + "up_proj.weight", inter, d_model, ShardAxis::kRow))});
  m.down = wl.get(spec(decl::linear(p + "down_proj.weight", d_model, inter, ShardAxis::kColumn)));
  return m;
}

void SwigluMlp::forward(backend::Backend& be, const Tensor& x, Tensor& out) const {
  const int64_t T = x.dim(0), inter = down.dim(1);
  Tensor gu = be.alloc(be.activation_dtype(), {T, 2 * inter});
  Tensor act = be.alloc(be.activation_dtype(), {T, inter});
  be.linear(x, gate_up, nullptr, gu);
  be.silu_mul(gu, act);
  be.linear(act, down, nullptr, out);
}

MoeBlock MoeBlock::load(WeightLoader& wl, const std::string& p, const ModelConfig& cfg) {
  const int64_t H = cfg.d_model, E = cfg.n_experts, I = cfg.moe_inter;
  MoeBlock m;
  m.layer = layer_of_prefix(p);
  m.gate = wl.get(decl::router(p + "gate.weight", E, H));
  m.correction_bias = wl.get_f32(decl::replicated(p + "gate.e_score_correction_bias", {E}));
  WeightLoader::ExpertDecls ex;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    using parallel::ShardAxis;
    ex.gate_up.push_back({decl::expert_linear(ep + "gate_proj.weight", I, H, e, E, ShardAxis::kRow),
                          decl::expert_linear(ep + "up_proj.weight", I, H, e, E, ShardAxis::kRow)});
    ex.down.push_back(decl::expert_linear(ep + "down_proj.weight", H, I, e, E, ShardAxis::kColumn));
  }
  m.experts = wl.experts(ex);
  wl.backend().prepare_moe(m.experts, cfg.top_k);  // tuned-kernel selection logged at start-up (issue 9)
  if (cfg.n_shared_experts > 0)
    m.shared = SwigluMlp::load(wl, p + "shared_experts.", H, cfg.shared_inter(), /*moe_group=*/true);
  return m;
}

void MoeBlock::forward(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, Tensor& out) const {
  forward_shared(be, x, out);         // out = shared(x); routed experts accumulate on top
  forward_routed(be, cfg, x, out);
}

void MoeBlock::forward_shared(backend::Backend& be, const Tensor& x, Tensor& out) const {
  if (shared) {
    shared->forward(be, x, out);
  } else {
    out = be.upload(Tensor::zeros(be.activation_dtype(), out.shape()));
  }
}

void MoeBlock::forward_routed(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, Tensor& out) const {
  const int64_t T = x.dim(0);
  kernels::RouterParams rp;
  rp.n_experts = static_cast<int32_t>(cfg.n_experts);  // all experts: the same choice on every rank
  rp.top_k = static_cast<int32_t>(cfg.top_k);
  rp.n_group = static_cast<int32_t>(cfg.n_group);
  rp.topk_group = static_cast<int32_t>(cfg.topk_group);
  rp.norm_topk_prob = cfg.norm_topk_prob;
  rp.routed_scaling_factor = static_cast<float>(cfg.routed_scaling_factor);
  Tensor ids = be.alloc(DType::kI32, {T, cfg.top_k});
  Tensor weights = be.alloc(DType::kF32, {T, cfg.top_k});
  be.router(x, gate, correction_bias, rp, ids, weights);
  if (DecisionHook* hook = active_decision_hook())
    routing_decision(be, x, gate, correction_bias, rp, layer, *hook, ids, weights);
  be.moe_experts(x, ids, weights, experts, out);  // expert parallel: only this rank's experts add
}

}  // namespace mxserve::model
