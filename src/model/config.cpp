#include "model/config.h"

#include <cmath>
#include <sstream>

#include "io/checkpoint.h"
#include "io/json_fields.h"
#include "io/mapped_file.h"

namespace mxserve::model {
namespace {

Status contradiction(const std::string& source, const std::string& what, const std::string& a,
                     const std::string& b) {
  return invalid_argument(source + ": contradictory fields: " + what + " (" + a + " vs " + b + ")");
}

Result<DType> parse_dtype_name(const std::string& name, const std::string& source, const char* field) {
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  if (name == "float32") return DType::kF32;
  return invalid_argument(source + ": field '" + field + "': expected bfloat16, float16 or float32, found '" +
                          name + "'");
}

Status parse_rope(const io::JsonFields& f, ModelConfig& c) {
  std::optional<double> theta, partial;
  if (f.has("rope_theta")) {
    MX_ASSIGN_OR_RETURN(double v, f.get_double("rope_theta"));
    theta = v;
  }
  if (f.has("partial_rotary_factor")) {
    MX_ASSIGN_OR_RETURN(double v, f.get_double("partial_rotary_factor"));
    partial = v;
  }
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto rp = f.object(key);
    if (!rp) continue;
    MX_ASSIGN_OR_RETURN(std::string type, rp->get_string("rope_type", rp->has("type") ? "" : "default"));
    if (type.empty()) {
      MX_ASSIGN_OR_RETURN(type, rp->get_string("type"));
    }
    if (type != "default")
      return unsupported(f.source() + ": field '" + key + ".rope_type': '" + type +
                         "' is not supported (only 'default' RoPE)");
    if (rp->has("rope_theta")) {
      MX_ASSIGN_OR_RETURN(double v, rp->get_double("rope_theta"));
      if (theta && *theta != v)
        return contradiction(f.source(), "rope_theta vs " + std::string(key) + ".rope_theta", std::to_string(*theta),
                             std::to_string(v));
      theta = v;
    }
    if (rp->has("partial_rotary_factor")) {
      MX_ASSIGN_OR_RETURN(double v, rp->get_double("partial_rotary_factor"));
      if (partial && *partial != v)
        return contradiction(f.source(), "partial_rotary_factor vs " + std::string(key) + ".partial_rotary_factor",
                             std::to_string(*partial), std::to_string(v));
      partial = v;
    }
  }
  if (!theta) return invalid_argument(f.source() + ": no RoPE base: set 'rope_theta' or 'rope_parameters.rope_theta'");
  // The architecture's transformers default (Glm4MoeConfig: 0.5) when neither spelling gives one.
  c.rope_theta = *theta;
  c.partial_rotary_factor = partial.value_or(c.arch->default_partial_rotary_factor);
  if (!(c.rope_theta > 0)) return f.error("rope_theta", "a positive number");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    return f.error("partial_rotary_factor", "a number in (0, 1]");
  return Status::ok();
}

Status require_positive(const io::JsonFields& f, const char* key, int64_t v) {
  if (v <= 0) return f.error(key, "a positive integer");
  return Status::ok();
}

Status validate(const io::JsonFields& f, ModelConfig& c) {
  const struct {
    const char* key;
    int64_t v;
  } positives[] = {{"vocab_size", c.vocab_size},       {"hidden_size", c.d_model},
                   {"num_hidden_layers", c.n_layers},  {"num_attention_heads", c.n_heads},
                   {"num_key_value_heads", c.n_kv_heads}, {"head_dim", c.head_dim},
                   {"n_routed_experts", c.n_experts},  {"num_experts_per_tok", c.top_k},
                   {"moe_intermediate_size", c.moe_inter}, {"n_group", c.n_group},
                   {"topk_group", c.topk_group}};
  for (const auto& p : positives) MX_RETURN_IF_ERROR(require_positive(f, p.key, p.v));
  const std::string& s = f.source();
  if (c.n_heads % c.n_kv_heads != 0)
    return invalid_argument(s + ": num_attention_heads " + std::to_string(c.n_heads) +
                            " is not a multiple of num_key_value_heads " + std::to_string(c.n_kv_heads));
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0)
    return invalid_argument(s + ": head_dim " + std::to_string(c.head_dim) + " x partial_rotary_factor " +
                            std::to_string(c.partial_rotary_factor) + " gives rotary dim " +
                            std::to_string(c.rotary_dim) + "; it must be a positive even number");
  if (c.first_k_dense < 0 || c.first_k_dense > c.n_layers)
    return f.error("first_k_dense_replace", "an integer in [0, num_hidden_layers]");
  if (c.first_k_dense > 0 && c.dense_inter <= 0) return f.error("intermediate_size", "a positive integer");
  if (c.n_shared_experts < 0) return f.error("n_shared_experts", "a non-negative integer");
  if (c.n_experts % c.n_group != 0)
    return invalid_argument(s + ": n_routed_experts " + std::to_string(c.n_experts) + " is not divisible by n_group " +
                            std::to_string(c.n_group));
  if (c.topk_group > c.n_group)
    return invalid_argument(s + ": topk_group " + std::to_string(c.topk_group) + " exceeds n_group " +
                            std::to_string(c.n_group));
  if (c.n_experts / c.n_group < 2)
    return invalid_argument(s + ": n_group " + std::to_string(c.n_group) +
                            " leaves fewer than 2 experts per group (group score = sum of the top 2)");
  if (c.top_k > c.topk_group * (c.n_experts / c.n_group))
    return invalid_argument(s + ": num_experts_per_tok " + std::to_string(c.top_k) + " exceeds the " +
                            std::to_string(c.topk_group * (c.n_experts / c.n_group)) +
                            " experts in the topk_group selected groups");
  if (c.n_mtp_layers < 0 || c.n_mtp_layers > 1)
    return unsupported(s + ": field 'num_nextn_predict_layers': " + std::to_string(c.n_mtp_layers) +
                       " (supported: 0 or 1)");
  if (!(c.rms_norm_eps > 0)) return f.error("rms_norm_eps", "a positive number");
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      return invalid_argument(s + ": field 'eos_token_id': " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(c.vocab_size) + ")");
  return Status::ok();
}

}  // namespace

Result<ModelConfig> parse_model_config(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) return invalid_argument(source + ": not a JSON object");
  io::JsonFields f(json, source);
  ModelConfig c;
  c.source = source;
  MX_ASSIGN_OR_RETURN(auto archs, f.get_string_list("architectures"));
  if (archs.size() != 1) return f.error("architectures", "a list of exactly one architecture name");
  MX_ASSIGN_OR_RETURN(c.arch, find_architecture(archs[0], source));

  MX_ASSIGN_OR_RETURN(c.vocab_size, f.get_int("vocab_size"));
  MX_ASSIGN_OR_RETURN(c.d_model, f.get_int("hidden_size"));
  MX_ASSIGN_OR_RETURN(c.n_layers, f.get_int("num_hidden_layers"));
  MX_ASSIGN_OR_RETURN(c.n_heads, f.get_int("num_attention_heads"));
  MX_ASSIGN_OR_RETURN(c.n_kv_heads, f.get_int("num_key_value_heads", c.n_heads));
  if (f.has("head_dim")) {
    MX_ASSIGN_OR_RETURN(c.head_dim, f.get_int("head_dim"));
  } else {
    if (c.n_heads <= 0 || c.d_model % c.n_heads != 0)
      return f.error("head_dim", "an integer (hidden_size is not a multiple of num_attention_heads)");
    c.head_dim = c.d_model / c.n_heads;
  }
  MX_ASSIGN_OR_RETURN(c.rms_norm_eps, f.get_double("rms_norm_eps", 1e-5));
  MX_ASSIGN_OR_RETURN(c.attention_bias, f.get_bool("attention_bias", false));
  MX_ASSIGN_OR_RETURN(c.use_qk_norm, f.get_bool("use_qk_norm", false));
  MX_ASSIGN_OR_RETURN(c.max_position_embeddings, f.get_int("max_position_embeddings", 131072));
  MX_RETURN_IF_ERROR(parse_rope(f, c));

  MX_ASSIGN_OR_RETURN(std::string act, f.get_string("hidden_act", "silu"));
  if (act != "silu") return unsupported(source + ": field 'hidden_act': '" + act + "' (only silu / SwiGLU)");
  MX_ASSIGN_OR_RETURN(c.dense_inter, f.get_int("intermediate_size", 0));
  MX_ASSIGN_OR_RETURN(c.first_k_dense, f.get_int("first_k_dense_replace", 1));
  MX_ASSIGN_OR_RETURN(c.moe_inter, f.get_int("moe_intermediate_size"));
  if (f.has("n_routed_experts") && f.has("num_local_experts")) {
    MX_ASSIGN_OR_RETURN(int64_t a, f.get_int("n_routed_experts"));
    MX_ASSIGN_OR_RETURN(int64_t b, f.get_int("num_local_experts"));
    if (a != b) return contradiction(source, "n_routed_experts vs num_local_experts", std::to_string(a), std::to_string(b));
  }
  MX_ASSIGN_OR_RETURN(c.n_experts, f.get_int(f.has("n_routed_experts") ? "n_routed_experts" : "num_local_experts"));
  MX_ASSIGN_OR_RETURN(c.top_k, f.get_int("num_experts_per_tok"));
  MX_ASSIGN_OR_RETURN(c.n_shared_experts, f.get_int("n_shared_experts", 1));
  MX_ASSIGN_OR_RETURN(c.n_group, f.get_int("n_group", 1));
  MX_ASSIGN_OR_RETURN(c.topk_group, f.get_int("topk_group", 1));
  MX_ASSIGN_OR_RETURN(c.norm_topk_prob, f.get_bool("norm_topk_prob", true));
  MX_ASSIGN_OR_RETURN(c.routed_scaling_factor, f.get_double("routed_scaling_factor", 1.0));
  MX_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.get_bool("tie_word_embeddings", false));
  if (f.has("num_nextn_predict_layers") && f.has("num_mtp_layers")) {
    MX_ASSIGN_OR_RETURN(int64_t a, f.get_int("num_nextn_predict_layers"));
    MX_ASSIGN_OR_RETURN(int64_t b, f.get_int("num_mtp_layers"));
    if (a != b)
      return contradiction(source, "num_nextn_predict_layers vs num_mtp_layers", std::to_string(a), std::to_string(b));
  }
  MX_ASSIGN_OR_RETURN(c.n_mtp_layers,
                      f.get_int(f.has("num_mtp_layers") ? "num_mtp_layers" : "num_nextn_predict_layers", 0));
  MX_ASSIGN_OR_RETURN(c.eos_token_ids, f.get_int_or_list("eos_token_id"));

  std::optional<DType> dt_a, dt_b;
  if (f.has("torch_dtype")) {
    MX_ASSIGN_OR_RETURN(std::string n, f.get_string("torch_dtype"));
    MX_ASSIGN_OR_RETURN(dt_a, parse_dtype_name(n, source, "torch_dtype"));
  }
  if (f.has("dtype")) {
    MX_ASSIGN_OR_RETURN(std::string n, f.get_string("dtype"));
    MX_ASSIGN_OR_RETURN(dt_b, parse_dtype_name(n, source, "dtype"));
  }
  if (dt_a && dt_b && *dt_a != *dt_b)
    return contradiction(source, "torch_dtype vs dtype", dtype_name(*dt_a), dtype_name(*dt_b));
  c.dtype = dt_a ? *dt_a : dt_b.value_or(DType::kBF16);
  if (json.contains("quantization_config") && !json["quantization_config"].is_null())
  {
    c.quantization_config = json["quantization_config"];
    MX_ASSIGN_OR_RETURN(c.quant, quant::QuantizationConfig::parse(*c.quantization_config, source));
  }

  MX_RETURN_IF_ERROR(validate(f, c));
  if (c.arch->parse_config != nullptr) MX_RETURN_IF_ERROR(c.arch->parse_config(json, c));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  const std::string file = io::is_directory(path) ? path + "/config.json" : path;
  MX_ASSIGN_OR_RETURN(std::string text, io::read_text_file(file));
  auto json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded()) return invalid_argument(file + ": not valid JSON");
  return parse_model_config(json, file);
}

std::string describe_config(const ModelConfig& c) {
  std::ostringstream os;
  os << (c.arch != nullptr ? c.arch->hf_name : "unknown architecture") << ": " << c.n_layers << " layers (+" << c.n_mtp_layers << " MTP), d_model "
     << c.d_model << ", heads " << c.n_heads << "/" << c.n_kv_heads << " x " << c.head_dim << " (rotary "
     << c.rotary_dim << "), " << c.n_experts << " experts top-" << c.top_k << " (groups " << c.n_group << "/"
     << c.topk_group << ", inter " << c.moe_inter << ", shared x" << c.n_shared_experts << "), first "
     << c.first_k_dense << " dense (inter " << c.dense_inter << "), vocab " << c.vocab_size;
  return os.str();
}

}  // namespace mxserve::model
