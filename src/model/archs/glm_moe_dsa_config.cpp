// Parsing and validation of glm_moe_dsa's own config fields (glm_moe_dsa_config.h).
#include "model/archs/glm_moe_dsa_config.h"

#include <any>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/json_fields.h"
#include "model/config.h"

namespace mxserve::model {
namespace {

Result<int64_t> positive(const io::JsonFields& f, const char* key) {
  if (!f.has(key)) return invalid_argument(f.source() + ": field '" + key + "' is missing (glm_moe_dsa needs it)");
  MX_ASSIGN_OR_RETURN(int64_t v, f.get_int(key));
  if (v <= 0) return f.error(key, "a positive integer");
  return v;
}

std::string join(const std::vector<bool>& full) {
  std::string s;
  for (bool b : full) s += b ? 'F' : 'S';
  return s;
}

// indexer_types as HF derives it when config.json has no explicit list: index_topk_pattern ("FSS..." or a
// list of "full"/"shared"), else index_topk_freq / index_skip_topk_offset (defaults 1 / 2: every layer full).
Result<std::optional<std::vector<bool>>> derived_indexer_types(const nlohmann::json& json, const io::JsonFields& f,
                                                               int64_t n_layers) {
  const std::string& s = f.source();
  if (f.has("index_topk_pattern")) {
    const nlohmann::json& p = json["index_topk_pattern"];
    std::vector<bool> full;
    if (p.is_string()) {
      for (char c : p.get<std::string>()) {
        if (c != 'F' && c != 'S')
          return invalid_argument(s + ": field 'index_topk_pattern': character '" + std::string(1, c) +
                                  "' is not 'F' (full) or 'S' (shared)");
        full.push_back(c == 'F');
      }
    } else {
      MX_ASSIGN_OR_RETURN(auto names, f.get_string_list("index_topk_pattern"));
      for (const auto& n : names) {
        if (n != "full" && n != "shared")
          return invalid_argument(s + ": field 'index_topk_pattern': entry '" + n + "' is not 'full' or 'shared'");
        full.push_back(n == "full");
      }
    }
    if (static_cast<int64_t>(full.size()) != n_layers)
      return invalid_argument(s + ": field 'index_topk_pattern' has " + std::to_string(full.size()) +
                              " entries for " + std::to_string(n_layers) + " layers");
    return std::optional<std::vector<bool>>(full);
  }
  if (!f.has("index_topk_freq") && !f.has("index_skip_topk_offset")) return std::optional<std::vector<bool>>();
  MX_ASSIGN_OR_RETURN(int64_t freq, f.get_int("index_topk_freq", 1));
  MX_ASSIGN_OR_RETURN(int64_t offset, f.get_int("index_skip_topk_offset", 2));
  freq = std::max<int64_t>(freq, 1);
  std::vector<bool> full;
  for (int64_t i = 0; i < n_layers; ++i) full.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0);
  return std::optional<std::vector<bool>>(full);
}

Status parse_indexer_types(const nlohmann::json& json, const io::JsonFields& f, int64_t n_layers,
                           GlmMoeDsaConfig& d) {
  const std::string& s = f.source();
  MX_ASSIGN_OR_RETURN(auto derived, derived_indexer_types(json, f, n_layers));
  if (f.has("indexer_types")) {
    MX_ASSIGN_OR_RETURN(auto names, f.get_string_list("indexer_types"));
    if (static_cast<int64_t>(names.size()) != n_layers)
      return invalid_argument(s + ": field 'indexer_types' has " + std::to_string(names.size()) + " entries for " +
                              std::to_string(n_layers) + " layers (num_hidden_layers)");
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] != "full" && names[i] != "shared")
        return invalid_argument(s + ": field 'indexer_types'[" + std::to_string(i) + "]: '" + names[i] +
                                "' is not 'full' or 'shared'");
      d.full_indexer.push_back(names[i] == "full");
    }
    if (derived && *derived != d.full_indexer)
      return invalid_argument(s + ": contradictory fields: indexer_types (" + join(d.full_indexer) +
                              ") vs index_topk_pattern / index_topk_freq / index_skip_topk_offset (" +
                              join(*derived) + ")");
  } else {
    d.full_indexer = derived ? *derived : std::vector<bool>(static_cast<size_t>(n_layers), true);
  }
  if (!d.full_indexer.empty() && !d.full_indexer[0])
    return invalid_argument(s + ": field 'indexer_types'[0] is 'shared': layer 0 has no earlier full indexer "
                            "layer to share top-k with");
  return Status::ok();
}

// mlp_layer_types must be dense layers then sparse ones (what the model's blocks implement); it decides
// first_k_dense, and must agree with first_k_dense_replace when both are given.
Status parse_mlp_layer_types(const io::JsonFields& f, ModelConfig& c) {
  const std::string& s = f.source();
  if (!f.has("mlp_layer_types")) {
    if (!f.has("first_k_dense_replace")) c.first_k_dense = std::min<int64_t>(3, c.n_layers);  // HF default
    return Status::ok();
  }
  MX_ASSIGN_OR_RETURN(auto types, f.get_string_list("mlp_layer_types"));
  if (static_cast<int64_t>(types.size()) != c.n_layers)
    return invalid_argument(s + ": field 'mlp_layer_types' has " + std::to_string(types.size()) + " entries for " +
                            std::to_string(c.n_layers) + " layers (num_hidden_layers)");
  int64_t n_dense = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "dense" && types[i] != "sparse")
      return invalid_argument(s + ": field 'mlp_layer_types'[" + std::to_string(i) + "]: '" + types[i] +
                              "' is not 'dense' or 'sparse'");
    if (types[i] == "dense") {
      if (n_dense != static_cast<int64_t>(i))
        return unsupported(s + ": field 'mlp_layer_types'[" + std::to_string(i) +
                           "]: a dense layer after a sparse one is not supported (dense layers must come first)");
      ++n_dense;
    }
  }
  if (f.has("first_k_dense_replace") && n_dense != c.first_k_dense)
    return invalid_argument(s + ": contradictory fields: mlp_layer_types (" + std::to_string(n_dense) +
                            " dense layers) vs first_k_dense_replace (" + std::to_string(c.first_k_dense) + ")");
  c.first_k_dense = n_dense;
  if (n_dense > 0 && c.dense_inter <= 0) return f.error("intermediate_size", "a positive integer");
  return Status::ok();
}

}  // namespace

Status parse_glm_moe_dsa_config(const nlohmann::json& json, ModelConfig& c) {
  io::JsonFields f(json, c.source);
  const std::string& s = c.source;
  GlmMoeDsaConfig d;
  if (json.contains("q_lora_rank") && json["q_lora_rank"].is_null())
    return unsupported(s + ": field 'q_lora_rank' is null: glm_moe_dsa without a q LoRA is not supported (the "
                       "DSA indexer reads q_a_proj's output)");
  MX_ASSIGN_OR_RETURN(d.q_lora_rank, positive(f, "q_lora_rank"));
  MX_ASSIGN_OR_RETURN(d.kv_lora_rank, positive(f, "kv_lora_rank"));
  MX_ASSIGN_OR_RETURN(d.qk_nope_dim, positive(f, "qk_nope_head_dim"));
  MX_ASSIGN_OR_RETURN(d.qk_rope_dim, positive(f, "qk_rope_head_dim"));
  MX_ASSIGN_OR_RETURN(d.v_dim, positive(f, "v_head_dim"));
  MX_ASSIGN_OR_RETURN(d.index_topk, positive(f, "index_topk"));
  MX_ASSIGN_OR_RETURN(d.index_head_dim, positive(f, "index_head_dim"));
  MX_ASSIGN_OR_RETURN(d.index_n_heads, positive(f, "index_n_heads"));
  MX_ASSIGN_OR_RETURN(d.index_share_for_mtp_iteration, f.get_bool("index_share_for_mtp_iteration", false));
  if (c.n_kv_heads != c.n_heads)
    return invalid_argument(s + ": num_key_value_heads " + std::to_string(c.n_kv_heads) + " differs from " +
                            "num_attention_heads " + std::to_string(c.n_heads) +
                            " (MLA expands one latent into every head; transformers requires them equal)");
  if (d.qk_rope_dim % 2 != 0) return f.error("qk_rope_head_dim", "an even number (RoPE rotates pairs)");
  if (d.index_head_dim < d.qk_rope_dim)
    return invalid_argument(s + ": index_head_dim " + std::to_string(d.index_head_dim) +
                            " is smaller than qk_rope_head_dim " + std::to_string(d.qk_rope_dim) +
                            " (the indexer ropes its first qk_rope_head_dim dims)");
  if (f.has("qk_head_dim")) {
    MX_ASSIGN_OR_RETURN(int64_t qk, f.get_int("qk_head_dim"));
    if (qk != d.qk_head_dim())
      return invalid_argument(s + ": contradictory fields: qk_head_dim " + std::to_string(qk) +
                              " vs qk_nope_head_dim + qk_rope_head_dim " + std::to_string(d.qk_head_dim()));
  }
  // transformers 5.17 hard-codes interleaved RoPE for attention and indexer and ignores these flags.
  for (const char* key : {"rope_interleave", "indexer_rope_interleave"}) {
    MX_ASSIGN_OR_RETURN(bool interleave, f.get_bool(key, true));
    if (!interleave)
      return unsupported(s + ": field '" + std::string(key) +
                         "': false is not supported (glm_moe_dsa uses interleaved RoPE, as transformers does)");
  }
  MX_RETURN_IF_ERROR(parse_indexer_types(json, f, c.n_layers, d));
  MX_RETURN_IF_ERROR(parse_mlp_layer_types(f, c));
  // The common fields as MLA means them (describe_config, accounting): q/k head = nope + rope, RoPE on rope.
  c.head_dim = d.qk_head_dim();
  c.rotary_dim = d.qk_rope_dim;
  c.extension = d;
  return Status::ok();
}

const GlmMoeDsaConfig& glm_moe_dsa_config(const ModelConfig& c) {
  const auto* d = std::any_cast<GlmMoeDsaConfig>(&c.extension);
  MX_CHECK_MSG(d != nullptr, c.source << ": not a glm_moe_dsa config (no GlmMoeDsaConfig extension)");
  return *d;
}

}  // namespace mxserve::model
