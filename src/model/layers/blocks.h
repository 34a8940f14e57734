// Shared transformer blocks built on the backend op table: GQA attention (q/k/v bias, per-head q/k
// RMSNorm, partial NeoX RoPE, paged KV), SwiGLU MLP, and the sigmoid-routed MoE with shared experts.
// Architectures (model/archs/) assemble these; they hold weights, not activations. Each load() declares
// the weights it binds (name, shape, precisions, shard axis: model/layers/weight_decl.h).
#pragma once

#include <optional>
#include <string>

#include "backend/backend.h"
#include "model/config.h"
#include "model/layers/weight_loader.h"

namespace mxserve::model {

struct GqaAttention {
  Tensor q_proj, k_proj, v_proj;   // [n_heads*head_dim, H], [n_kv_heads*head_dim, H] x2
  Tensor o_proj;                   // [H, n_heads*head_dim]
  std::optional<Tensor> q_bias, k_bias, v_bias;  // when attention_bias
  std::optional<Tensor> q_norm, k_norm;          // [head_dim] when use_qk_norm

  static GqaAttention load(WeightLoader& wl, const std::string& prefix, const ModelConfig& cfg);
  // x_norm [T,H] -> out [T,H]; writes this layer's K/V for the batch into the paged cache first.
  // k_scales / v_scales: the layer's f32 [n_slots, n_kv_heads] scales of an FP8 cache, else null.
  void forward(backend::Backend& be, const ModelConfig& cfg, const Tensor& x_norm, const Tensor& positions,
               const backend::AttentionMeta& meta, Tensor& k_cache, Tensor& v_cache, Tensor* k_scales,
               Tensor* v_scales, Tensor& out) const;
};

struct SwigluMlp {
  Tensor gate_up;  // [2I, H]: gate rows then up rows
  Tensor down;     // [H, I]

  // moe_group: a MoE block's shared experts, sliced over the MoE group (parallel/shard.h), not the tp group.
  static SwigluMlp load(WeightLoader& wl, const std::string& prefix, int64_t d_model, int64_t inter,
                        bool moe_group = false);
  void forward(backend::Backend& be, const Tensor& x, Tensor& out) const;  // [T,H] -> [T,H]
};

struct MoeBlock {
  Tensor gate;                      // router weight [E, H]
  Tensor correction_bias;           // f32 [E] (selection only)
  backend::ExpertWeights experts;   // [E, 2I, H], [E, H, I]
  std::optional<SwigluMlp> shared;  // width I * n_shared_experts

  static MoeBlock load(WeightLoader& wl, const std::string& prefix, const ModelConfig& cfg);
  void forward(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, Tensor& out) const;  // [T,H]
};

}  // namespace mxserve::model
