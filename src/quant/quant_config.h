// QuantizationConfig: config.json's `quantization_config`, parsed once into types, and the question the
// binder asks of it: "which precision does the config say module M is stored in?".
//   quark (AMD Quark MXFP4): global weight spec must be fp4 / per_group 32 / e8m0; `exclude` entries are
//     exact module names, "re:" regexes (Python re.match semantics: anchored at the start) or globs.
//     Linear layers (incl. the MoE router `mlp.gate`, which vLLM/sglang build as a Linear) not excluded
//     are MXFP4; everything else is float.
//   fp8 (DeepSeek / GLM FP8 block): `weight_block_size` [br, bc] (absent: per-tensor scales);
//     `modules_to_not_convert` / `ignored_layers` entries match a module exactly, as a dotted parent, or
//     as a glob. Linear layers not listed are FP8; the router (not a Linear in HF) is float.
//   compressed-tensors (format "float-quantized", e.g. official GLM-4.x FP8): every config group targets
//     "Linear" with 8-bit float weights, strategy channel | tensor | block; `ignore` entries are exact
//     names, "re:" regexes or globs. Linear layers not ignored are FP8 of that strategy; router float.
//   mxfp4 (gpt-oss): only MoE experts (stored fused, quant/gpt_oss.h) are MXFP4, unless listed in
//     `modules_to_not_convert` (matched like fp8's); everything else is float.
// Names are always the checkpoint's own (never runtime-fused names). Unknown methods, layer-specific
// overrides and unsupported specs are errors naming the field.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "quant/weight_format.h"

namespace mxserve::quant {

enum class QuantMethod { kQuark, kFp8, kCompressedTensors, kGptOssMxfp4 };
const char* quant_method_name(QuantMethod m);  // "quark", "fp8", "compressed-tensors", "mxfp4"

// What a weight-table entry is, as far as quantization configs are concerned.
enum class WeightRole {
  kNone,    // never quantized by these schemes: norms, biases, embeddings, router bias
  kLinear,  // a Linear layer's weight
  kRouter,  // the MoE router weight (`mlp.gate`): a Linear for Quark/vLLM, not for HF FP8
};

struct Expectation {
  bool quantized = false;
  Precision precision = Precision::kBF16;  // when quantized
  std::string reason;                       // "excluded by 'lm_head'", "not matched by any exclude entry"
};

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kQuark;
  std::string source;  // config.json path
  // quark
  std::vector<std::string> exclude;
  std::string scale_calculation_mode;  // informative ("even" etc.); dequantization does not depend on it
  bool activations_quantized = false;  // input activations quantized (W4A4 / W8A8): QDQ is not emulated
  // fp8, compressed-tensors
  std::vector<std::string> not_convert;    // modules_to_not_convert / ignored_layers / ignore
  int64_t block_rows = 0, block_cols = 0;  // 0: per-tensor (fp8) or see fp8_precision
  Precision fp8_precision = Precision::kFp8Block;  // what a converted Linear is stored as

  static Result<QuantizationConfig> parse(const nlohmann::json& qc, const std::string& source);

  // module: the checkpoint name without ".weight".
  Expectation expect(const std::string& module, WeightRole role) const;
  // The first exclude / not-convert entry matching module, if any.
  std::optional<std::string> excluded_by(const std::string& module) const;
};

// Quark exclude matching (exact, "re:" anchored at the start, or glob).
bool quark_entry_matches(const std::string& entry, const std::string& module);
// modules_to_not_convert matching (exact, dotted parent, or glob on the module or any dotted parent).
bool fp8_entry_matches(const std::string& entry, const std::string& module);

}  // namespace mxserve::quant
