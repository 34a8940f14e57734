// ModelConfig: config.json parsed once into types. After this parser nothing branches on strings.
// Accepts both spellings seen in the wild: top-level rope_theta / partial_rotary_factor (published GLM
// configs) and transformers 5.x rope_parameters {rope_theta, partial_rotary_factor, rope_type};
// torch_dtype or dtype. Contradictions between spellings are errors, never a silent choice.
#pragma once

#include <any>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/status.h"
#include "model/registry.h"
#include "quant/quant_config.h"

namespace mxserve::model {

struct ModelConfig {
  const ArchitectureDef* arch = nullptr;  // the registry entry (model/registry.h) of config.json's architecture
  std::string source;  // path of the config.json, for error messages

  int64_t vocab_size = 0;
  int64_t d_model = 0;             // hidden_size
  int64_t n_layers = 0;            // num_hidden_layers (the MTP layer, if any, is extra, at index n_layers)
  int64_t n_heads = 0;             // num_attention_heads
  int64_t n_kv_heads = 0;          // num_key_value_heads
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;          // int(head_dim * partial_rotary_factor), NeoX half-split within it
  double partial_rotary_factor = 1.0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;     // q/k/v bias (never o_proj)
  bool use_qk_norm = false;        // per-head RMSNorm on q and k before RoPE
  int64_t max_position_embeddings = 0;

  int64_t dense_inter = 0;         // intermediate_size: dense MLP of layers < first_k_dense
  int64_t first_k_dense = 0;       // first_k_dense_replace
  int64_t moe_inter = 0;           // moe_intermediate_size: width of each routed expert
  int64_t n_experts = 0;           // n_routed_experts
  int64_t top_k = 0;               // num_experts_per_tok
  int64_t n_shared_experts = 0;    // shared expert width = moe_inter * n_shared_experts
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;

  bool tie_word_embeddings = false;
  int64_t n_mtp_layers = 0;        // num_nextn_predict_layers (0 or 1)
  std::vector<int64_t> eos_token_ids;
  DType dtype = DType::kBF16;      // torch_dtype / dtype
  std::optional<nlohmann::json> quantization_config;  // as written
  std::optional<quant::QuantizationConfig> quant;     // the same, typed (parse errors fail the config)
  // The architecture's own typed fields (ArchitectureDef::parse_config fills it; empty when it has none).
  std::any extension;

  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense; }  // the MTP layer is MoE too
  int64_t shared_inter() const { return moe_inter * n_shared_experts; }
};

Result<ModelConfig> parse_model_config(const nlohmann::json& json, const std::string& source);
// path: a config.json file or a model directory holding one.
Result<ModelConfig> load_model_config(const std::string& path);
// "GLM-4.5-Air (glm4_moe): 46 layers, d_model 4096, 128 experts top-8, ..."
std::string describe_config(const ModelConfig& cfg);

}  // namespace mxserve::model
