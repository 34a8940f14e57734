// glm4_moe (GLM-4.5 / 4.5-Air / 4.6 / 4.7): weight table and model.
#pragma once

#include <memory>
#include <vector>

#include "model/causal_lm.h"
#include "model/weight_table.h"

namespace mxserve::model {

class WeightLoader;

// Every tensor of a glm4_moe checkpoint (HF on-disk names), the MTP layer included when declared.
std::vector<WeightSpec> glm4_moe_weight_table(const ModelConfig& cfg, bool include_mtp);
BindOptions glm4_moe_bind_options(const ModelConfig& cfg, bool include_mtp);

Result<std::unique_ptr<CausalLM>> make_glm4_moe(const ModelConfig& cfg, const BoundWeights& weights,
                                                backend::Backend& be, bool include_mtp);
// Same, from any weight source (a checkpoint's BoundWeights or synthetic weights generated on the backend).
Result<std::unique_ptr<CausalLM>> make_glm4_moe(const ModelConfig& cfg, WeightLoader& weights, backend::Backend& be,
                                                bool include_mtp);

}  // namespace mxserve::model
