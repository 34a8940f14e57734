// glm_moe_dsa's own config fields (GLM-5 / 5.1 / 5.2): MLA geometry, the DSA indexer and the per-layer
// indexer / MLP patterns, parsed and validated once (held in ModelConfig::extension). Semantics follow
// transformers 5.17's GlmMoeDsaConfig (research/glm5-dsa.md); a missing, contradictory or unknown value
// is an error naming the field, never a silent default for what changes the maths.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace mxserve::model {

struct ModelConfig;

struct GlmMoeDsaConfig {
  int64_t q_lora_rank = 0;      // q_a_proj width (the indexer's query input too)
  int64_t kv_lora_rank = 0;     // latent width (cached per token)
  int64_t qk_nope_dim = 0;      // qk_nope_head_dim
  int64_t qk_rope_dim = 0;      // qk_rope_head_dim: the shared rope key head (cached per token), and RoPE dim
  int64_t v_dim = 0;            // v_head_dim
  int64_t index_topk = 0;       // keys kept per query by the indexer
  int64_t index_head_dim = 0;   // indexer key width (cached per token on full layers)
  int64_t index_n_heads = 0;
  std::vector<bool> full_indexer;  // per target layer: true = "full" (own indexer), false = "shared"
  bool index_share_for_mtp_iteration = false;  // draft steps >= 2 reuse the first step's top-k

  int64_t qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  int64_t cache_width() const { return kv_lora_rank + qk_rope_dim; }  // latent + rope key per token
};

// ArchitectureDef::parse_config of glm_moe_dsa: fills cfg.extension with a GlmMoeDsaConfig and may adjust
// cfg.first_k_dense from mlp_layer_types.
Status parse_glm_moe_dsa_config(const nlohmann::json& json, ModelConfig& cfg);
// The parsed extension (CHECKs that cfg is a glm_moe_dsa config).
const GlmMoeDsaConfig& glm_moe_dsa_config(const ModelConfig& cfg);

}  // namespace mxserve::model
