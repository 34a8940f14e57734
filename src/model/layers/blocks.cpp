#include "model/layers/blocks.h"

#include <cmath>

namespace mxserve::model {

GqaAttention GqaAttention::load(WeightLoader& wl, const std::string& p, const ModelConfig& cfg) {
  GqaAttention a;
  a.q_proj = wl.get(p + "q_proj.weight");
  a.k_proj = wl.get(p + "k_proj.weight");
  a.v_proj = wl.get(p + "v_proj.weight");
  a.o_proj = wl.get(p + "o_proj.weight");
  if (cfg.attention_bias) {
    a.q_bias = wl.get(p + "q_proj.bias");
    a.k_bias = wl.get(p + "k_proj.bias");
    a.v_bias = wl.get(p + "v_proj.bias");
  }
  if (cfg.use_qk_norm) {
    a.q_norm = wl.get(p + "q_norm.weight");
    a.k_norm = wl.get(p + "k_norm.weight");
  }
  return a;
}

void GqaAttention::forward(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, const Tensor& positions,
                           const backend::AttentionMeta& meta, Tensor& k_cache, Tensor& v_cache,
                           Tensor& out) const {
  const int64_t T = x.dim(0);
  const DType act = be.activation_dtype();
  Tensor q = be.alloc(act, {T, cfg.n_heads * cfg.head_dim});
  Tensor k = be.alloc(act, {T, cfg.n_kv_heads * cfg.head_dim});
  Tensor v = be.alloc(act, {T, cfg.n_kv_heads * cfg.head_dim});
  be.linear(x, q_proj, q_bias ? &*q_bias : nullptr, q);
  be.linear(x, k_proj, k_bias ? &*k_bias : nullptr, k);
  be.linear(x, v_proj, v_bias ? &*v_bias : nullptr, v);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  if (q_norm) {  // per-head RMSNorm over head_dim, before RoPE
    be.rmsnorm(q, *q_norm, eps, q);
    be.rmsnorm(k, *k_norm, eps, k);
  }
  kernels::RopeParams rp;
  rp.head_dim = static_cast<int32_t>(cfg.head_dim);
  rp.rotary_dim = static_cast<int32_t>(cfg.rotary_dim);
  rp.theta = static_cast<float>(cfg.rope_theta);
  rp.n_heads = static_cast<int32_t>(cfg.n_heads);
  be.rope(q, positions, rp);
  rp.n_heads = static_cast<int32_t>(cfg.n_kv_heads);
  be.rope(k, positions, rp);
  be.kv_write(k, v, meta, k_cache, v_cache);
  Tensor attn = be.alloc(act, {T, cfg.n_heads * cfg.head_dim});
  be.attention(q, k_cache, v_cache, meta, attn);
  be.linear(attn, o_proj, nullptr, out);
}

SwigluMlp SwigluMlp::load(WeightLoader& wl, const std::string& p) {
  SwigluMlp m;
  m.gate_up = wl.concat_rows({p + "gate_proj.weight", p + "up_proj.weight"});
  m.down = wl.get(p + "down_proj.weight");
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
  MoeBlock m;
  m.gate = wl.get(p + "gate.weight");
  m.correction_bias = wl.get_f32(p + "gate.e_score_correction_bias");
  std::vector<std::vector<std::string>> gate_up;
  std::vector<std::string> down;
  for (int64_t e = 0; e < cfg.n_experts; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    gate_up.push_back({ep + "gate_proj.weight", ep + "up_proj.weight"});
    down.push_back(ep + "down_proj.weight");
  }
  m.experts = wl.experts(gate_up, down);
  wl.backend().prepare_moe(m.experts, cfg.top_k);  // tuned-kernel selection logged at start-up (issue 9)
  if (cfg.n_shared_experts > 0) m.shared = SwigluMlp::load(wl, p + "shared_experts.");
  return m;
}

void MoeBlock::forward(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, Tensor& out) const {
  const int64_t T = x.dim(0);
  kernels::RouterParams rp;
  rp.n_experts = static_cast<int32_t>(cfg.n_experts);
  rp.top_k = static_cast<int32_t>(cfg.top_k);
  rp.n_group = static_cast<int32_t>(cfg.n_group);
  rp.topk_group = static_cast<int32_t>(cfg.topk_group);
  rp.norm_topk_prob = cfg.norm_topk_prob;
  rp.routed_scaling_factor = static_cast<float>(cfg.routed_scaling_factor);
  Tensor ids = be.alloc(DType::kI32, {T, cfg.top_k});
  Tensor weights = be.alloc(DType::kF32, {T, cfg.top_k});
  be.router(x, gate, correction_bias, rp, ids, weights);
  if (shared) {
    shared->forward(be, x, out);  // out = shared(x); routed experts accumulate on top
  } else {
    out = be.upload(Tensor::zeros(be.activation_dtype(), out.shape()));  // routed experts accumulate into 0
  }
  be.moe_experts(x, ids, weights, experts, out);
}

}  // namespace mxserve::model
