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
  // q | k | v as one GEMM: rows [q_proj | k_proj | v_proj] of this rank, which are then row views of it. bf16
  // weights only (f32 under MXSERVE_FUSED_PROJ=force), else undefined (three GEMMs). Used at every row count with
  // Backend::rope_kv_write (RoPE + K/V write straight from the GEMM output); with q/k norm only at one row.
  Tensor qkv;                      // [(n_heads + 2 n_kv_heads) * head_dim, H]
  std::optional<Tensor> qkv_bias;  // when attention_bias and qkv is defined

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

// Parallel ranks (docs/parallel.md): the router is replicated (every rank scores all E experts with the same
// bits and picks the same top-k). The rank holds the routed experts of its ep rank whole (ep > 1: a
// contiguous E / ep of them) or a tp slice of every expert's width (ep == 1), and its tp slice of the shared
// expert. forward()'s output is therefore a PARTIAL SUM: this rank's routed experts' contribution to every
// token of x, plus its shared-expert slice. Summing the outputs of the ranks of a tensor-parallel group
// (ep == tp: one all-reduce, the caller's) gives the block's output. A caller that sums over a group spanning
// several tp groups (DP attention: tokens all-gathered over the dp ranks, partial sums reduce-scattered
// back) runs forward_routed() there and forward_shared() apart (its slices sum over one tp group only).
struct MoeBlock {
  Tensor gate;                      // router weight [E, H] (all experts, replicated)
  Tensor correction_bias;           // f32 [E] (selection only)
  backend::ExpertWeights experts;   // this rank's: [E_local, 2I_local, H], [E_local, H, I_local]
  std::optional<SwigluMlp> shared;  // width I * n_shared_experts (/ tp)
  int64_t layer = -1;               // decoder layer (decision sites, model/decisions.h)

  static MoeBlock load(WeightLoader& wl, const std::string& prefix, const ModelConfig& cfg);
  // x [T,H] (the same rows on every rank of the group) -> out [T,H] = shared slice + local routed experts.
  void forward(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, Tensor& out) const;
  // out [T,H] += this rank's routed experts (router over all experts, local ones evaluated).
  void forward_routed(backend::Backend& be, const ModelConfig& cfg, const Tensor& x, Tensor& out) const;
  // out [T,H] = this rank's shared-expert slice, or zeros when the model has none.
  void forward_shared(backend::Backend& be, const Tensor& x, Tensor& out) const;
};

}  // namespace mxserve::model
