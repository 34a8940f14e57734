// glm4_moe (GLM-4.5 / 4.5-Air / 4.6 / 4.7): the registered architecture (model/registry.h). Its load code
// declares every weight (glm4_moe.cpp); the table and bind options below are that declaration, recorded.
#pragma once

#include <vector>

#include "model/causal_lm.h"
#include "model/registry.h"
#include "model/weight_table.h"

namespace mxserve::model {

const ArchitectureDef& glm4_moe_architecture();

// Every tensor of a glm4_moe checkpoint (HF on-disk names), the MTP layer included when asked: the load
// code run against a recording loader.
std::vector<WeightSpec> glm4_moe_weight_table(const ModelConfig& cfg, bool include_mtp);
BindOptions glm4_moe_bind_options(const ModelConfig& cfg, bool include_mtp);

}  // namespace mxserve::model
