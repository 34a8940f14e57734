#include "quant/quant_config.h"

#include <fnmatch.h>

#include <regex>

namespace mxserve::quant {
namespace {

Status field_error(const std::string& source, const std::string& field, const std::string& expected,
                   const nlohmann::json& found) {
  return invalid_argument(source + ": quantization_config." + field + ": expected " + expected + ", found " +
                          found.dump());
}

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// The entries of an exclude / not-convert list for an error message: the first 8 quoted, then how many more.
std::string list_summary(const std::vector<std::string>& entries) {
  if (entries.empty()) return "empty";
  std::string s = "[";
  for (size_t i = 0; i < entries.size() && i < 8; ++i) s += (i ? ", '" : "'") + entries[i] + "'";
  if (entries.size() > 8) s += ", ... " + std::to_string(entries.size() - 8) + " more";
  return s + "]";
}

Result<std::vector<std::string>> string_list(const nlohmann::json& qc, const std::string& key, const std::string& source) {
  std::vector<std::string> out;
  if (!qc.contains(key) || qc[key].is_null()) return out;
  if (!qc[key].is_array()) return field_error(source, key, "a list of module names", qc[key]);
  for (const auto& e : qc[key]) {
    if (!e.is_string()) return field_error(source, key, "a list of module names", qc[key]);
    out.push_back(e.get<std::string>());
  }
  return out;
}

Status parse_quark(const nlohmann::json& qc, QuantizationConfig& c) {
  const std::string& src = c.source;
  if (!qc.contains("global_quant_config") || !qc["global_quant_config"].is_object())
    return field_error(src, "global_quant_config", "an object", qc.value("global_quant_config", nlohmann::json()));
  const auto& g = qc["global_quant_config"];
  if (!g.contains("weight") || !g["weight"].is_object())
    return field_error(src, "global_quant_config.weight", "an object (weight-only configs are not supported)",
                       g.value("weight", nlohmann::json()));
  const auto& w = g["weight"];
  auto want = [&](const char* key, const nlohmann::json& value) -> Status {
    if (!w.contains(key) || w[key] != value)
      return unsupported(src + ": quantization_config.global_quant_config.weight." + key + ": mxserve loads Quark " +
                         "MXFP4 only (dtype fp4, qscheme per_group, group_size 32, scale_format e8m0), found " +
                         (w.contains(key) ? w[key].dump() : std::string("nothing")));
    return Status::ok();
  };
  MX_RETURN_IF_ERROR(want("dtype", "fp4"));
  MX_RETURN_IF_ERROR(want("qscheme", "per_group"));
  MX_RETURN_IF_ERROR(want("group_size", 32));
  if (w.contains("scale_format")) MX_RETURN_IF_ERROR(want("scale_format", "e8m0"));
  if (w.contains("scale_calculation_mode") && w["scale_calculation_mode"].is_string())
    c.scale_calculation_mode = w["scale_calculation_mode"].get<std::string>();
  c.activations_quantized = g.contains("input_tensors") && !g["input_tensors"].is_null();
  for (const char* key : {"layer_quant_config", "layer_type_quant_config"})
    if (qc.contains(key) && !qc[key].is_null() && !qc[key].empty())
      return unsupported(src + ": quantization_config." + key + " is not empty: per-layer Quark overrides are not " +
                         "supported (found " + qc[key].dump() + ")");
  MX_ASSIGN_OR_RETURN(c.exclude, string_list(qc, "exclude", src));
  for (const auto& e : c.exclude) {
    if (e.rfind("re:", 0) != 0) continue;
    try {
      std::regex re(e.substr(3));
    } catch (const std::regex_error& err) {
      return invalid_argument(src + ": quantization_config.exclude entry '" + e + "' is not a valid regex: " + err.what());
    }
  }
  return Status::ok();
}

Status parse_fp8(const nlohmann::json& qc, QuantizationConfig& c) {
  const std::string& src = c.source;
  if (qc.contains("fmt") && qc["fmt"] != "e4m3")
    return unsupported(src + ": quantization_config.fmt: mxserve loads fp8 e4m3 weights only, found " + qc["fmt"].dump());
  if (qc.contains("modules_to_convert") && !qc["modules_to_convert"].is_null())
    return unsupported(src + ": quantization_config.modules_to_convert restricts FP8 to listed modules, which " +
                       "mxserve does not read (found " + qc["modules_to_convert"].dump() + "; null converts every Linear)");
  if (qc.contains("scale_fmt") && !qc["scale_fmt"].is_null() && qc["scale_fmt"] != "float")
    return unsupported(src + ": quantization_config.scale_fmt: mxserve reads f32 weight_scale_inv (\"float\") " +
                       "only, found " + qc["scale_fmt"].dump());
  if (qc.contains("weight_block_size") && !qc["weight_block_size"].is_null()) {
    const auto& b = qc["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0] <= 0 ||
        b[1] <= 0)
      return field_error(src, "weight_block_size", "[rows, cols] of positive integers", b);
    c.block_rows = b[0].get<int64_t>();
    c.block_cols = b[1].get<int64_t>();
  }
  MX_ASSIGN_OR_RETURN(auto a, string_list(qc, "modules_to_not_convert", src));
  MX_ASSIGN_OR_RETURN(auto b, string_list(qc, "ignored_layers", src));
  c.not_convert = a;
  c.not_convert.insert(c.not_convert.end(), b.begin(), b.end());
  return Status::ok();
}

Status parse_compressed_tensors(const nlohmann::json& qc, QuantizationConfig& c) {
  const std::string& src = c.source;
  if (!qc.contains("format") || qc["format"] != "float-quantized")
    return unsupported(src + ": quantization_config.format: mxserve loads compressed-tensors \"float-quantized\" " +
                       "(FP8) checkpoints only, found " + (qc.contains("format") ? qc["format"].dump() : "nothing"));
  if (qc.contains("kv_cache_scheme") && !qc["kv_cache_scheme"].is_null())
    return unsupported(src + ": quantization_config.kv_cache_scheme is not supported (found " +
                       qc["kv_cache_scheme"].dump() + ")");
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty())
    return field_error(src, "config_groups", "a non-empty object", qc.value("config_groups", nlohmann::json()));
  std::optional<Precision> prec;
  for (const auto& [gname, g] : qc["config_groups"].items()) {
    const std::string f = "config_groups." + gname;
    if (!g.contains("targets") || g["targets"] != nlohmann::json::array({"Linear"}))
      return unsupported(src + ": quantization_config." + f + ".targets: only [\"Linear\"] is supported, found " +
                         (g.contains("targets") ? g["targets"].dump() : "nothing"));
    const nlohmann::json w = g.value("weights", nlohmann::json());
    if (!w.is_object() || w.value("type", "") != "float" || w.value("num_bits", 0) != 8)
      return unsupported(src + ": quantization_config." + f + ".weights: only 8-bit float weights are supported, found " +
                         w.dump());
    const std::string strategy = w.value("strategy", "");
    Precision p;
    if (strategy == "channel") {
      p = Precision::kFp8Channel;
    } else if (strategy == "tensor") {
      p = Precision::kFp8Tensor;
    } else if (strategy == "block") {
      const auto& b = w.value("block_structure", nlohmann::json());
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0] <= 0 || b[1] <= 0)
        return field_error(src, f + ".weights.block_structure", "[rows, cols] of positive integers", b);
      c.block_rows = b[0].get<int64_t>();
      c.block_cols = b[1].get<int64_t>();
      p = Precision::kFp8Block;
    } else {
      return unsupported(src + ": quantization_config." + f + ".weights.strategy: expected channel, tensor or block, " +
                         "found " + w.value("strategy", nlohmann::json()).dump());
    }
    if (prec && *prec != p)
      return unsupported(src + ": quantization_config.config_groups: groups with different weight strategies");
    prec = p;
    if (g.contains("input_activations") && !g["input_activations"].is_null()) c.activations_quantized = true;
  }
  c.fp8_precision = *prec;
  MX_ASSIGN_OR_RETURN(c.not_convert, string_list(qc, "ignore", src));
  return Status::ok();
}

}  // namespace

const char* quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::kQuark: return "quark";
    case QuantMethod::kFp8: return "fp8";
    case QuantMethod::kCompressedTensors: return "compressed-tensors";
    case QuantMethod::kGptOssMxfp4: return "mxfp4";
  }
  return "?";
}

bool quark_entry_matches(const std::string& entry, const std::string& module) {
  if (entry.rfind("re:", 0) == 0) {
    const std::regex re(entry.substr(3));
    return std::regex_search(module, re, std::regex_constants::match_continuous);
  }
  if (is_glob(entry)) return ::fnmatch(entry.c_str(), module.c_str(), 0) == 0;
  return entry == module;
}

bool fp8_entry_matches(const std::string& entry, const std::string& module) {
  // The module itself and every dotted parent ("model.layers.3.self_attn" for ...q_proj).
  std::string prefix = module;
  while (true) {
    if (entry == prefix || (is_glob(entry) && ::fnmatch(entry.c_str(), prefix.c_str(), 0) == 0)) return true;
    const size_t dot = prefix.rfind('.');
    if (dot == std::string::npos) return false;
    prefix.resize(dot);
  }
}

Result<QuantizationConfig> QuantizationConfig::parse(const nlohmann::json& qc, const std::string& source) {
  QuantizationConfig c;
  c.source = source;
  if (!qc.is_object()) return field_error(source, "", "an object", qc);
  if (!qc.contains("quant_method") || !qc["quant_method"].is_string())
    return field_error(source, "quant_method", "a string", qc.value("quant_method", nlohmann::json()));
  const std::string method = qc["quant_method"].get<std::string>();
  if (method == "quark") {
    c.method = QuantMethod::kQuark;
    MX_RETURN_IF_ERROR(parse_quark(qc, c));
  } else if (method == "fp8") {
    c.method = QuantMethod::kFp8;
    MX_RETURN_IF_ERROR(parse_fp8(qc, c));
  } else if (method == "compressed-tensors") {
    c.method = QuantMethod::kCompressedTensors;
    MX_RETURN_IF_ERROR(parse_compressed_tensors(qc, c));
  } else if (method == "mxfp4") {
    c.method = QuantMethod::kGptOssMxfp4;
    MX_ASSIGN_OR_RETURN(c.not_convert, string_list(qc, "modules_to_not_convert", source));
  } else {
    return unsupported(source + ": quantization_config.quant_method '" + method +
                       "' is not supported (supported: quark (MXFP4), fp8 (e4m3, block or per tensor), compressed-tensors " +
                       "(float-quantized FP8), mxfp4 (gpt-oss))");
  }
  return c;
}

std::optional<std::string> QuantizationConfig::excluded_by(const std::string& module) const {
  if (method == QuantMethod::kCompressedTensors) {
    for (const auto& e : not_convert)
      if (quark_entry_matches(e, module)) return e;  // exact, "re:" (re.match) or glob, like Quark
  } else if (method == QuantMethod::kQuark) {
    for (const auto& e : exclude)
      if (quark_entry_matches(e, module)) return e;
  } else {
    for (const auto& e : not_convert)
      if (fp8_entry_matches(e, module)) return e;
  }
  return std::nullopt;
}

Expectation QuantizationConfig::expect(const std::string& module, WeightRole role) const {
  Expectation x;
  if (role == WeightRole::kNone) {
    x.reason = "not a Linear layer";
    return x;
  }
  if ((method == QuantMethod::kFp8 || method == QuantMethod::kCompressedTensors) && role == WeightRole::kRouter) {
    x.reason = std::string("the router is not a Linear layer for quant_method ") + quant_method_name(method);
    return x;
  }
  // transformers' FineGrainedFP8 always adds the output head to modules_to_not_convert (DeepSeek-V3 / GLM FP8
  // releases keep it in bf16 without listing it either).
  if (method == QuantMethod::kFp8 && (module == "lm_head" || (module.size() >= 17 &&
                                      module.compare(module.size() - 17, 17, ".shared_head.head") == 0))) {
    x.reason = "the output head, which quant_method fp8 never converts (transformers keeps it unquantized)";
    return x;
  }
  if (method == QuantMethod::kGptOssMxfp4 && module.find(".experts.") == std::string::npos) {
    x.reason = "only MoE experts are quantized by quant_method mxfp4 (gpt-oss)";
    return x;
  }
  const char* list = method == QuantMethod::kQuark               ? "exclude"
                     : method == QuantMethod::kCompressedTensors ? "ignore"
                                                                 : "modules_to_not_convert";
  if (auto e = excluded_by(module)) {
    x.reason = std::string("listed in ") + list + " by '" + *e + "'";
    return x;
  }
  x.quantized = true;
  x.reason = std::string("a Linear layer not matched by any ") + list + " entry (" + list + ": " +
             list_summary(method == QuantMethod::kQuark ? exclude : not_convert) + ")";
  switch (method) {
    case QuantMethod::kQuark: x.precision = Precision::kMxfp4; break;
    case QuantMethod::kFp8: x.precision = block_rows > 0 ? Precision::kFp8Block : Precision::kFp8Tensor; break;
    case QuantMethod::kCompressedTensors: x.precision = fp8_precision; break;
    case QuantMethod::kGptOssMxfp4: x.precision = Precision::kMxfp4GptOss; break;
  }
  return x;
}

}  // namespace mxserve::quant
