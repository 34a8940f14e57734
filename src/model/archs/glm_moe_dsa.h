// glm_moe_dsa (GLM-5 / 5.1 / 5.2, GlmMoeDsaForCausalLM): the registered architecture (model/registry.h).
// MLA + DSA attention (model/layers/mla_attention.h), the glm4_moe MoE blocks, an MTP layer with its own
// full indexer. Runs on backends with the MLA / DSA ops (backend/mla_dsa_ops.h: the CPU reference and CUDA).
#pragma once

#include <vector>

#include "model/causal_lm.h"
#include "model/registry.h"
#include "model/weight_table.h"

namespace mxserve::model {

const ArchitectureDef& glm_moe_dsa_architecture();

// Every tensor of a glm_moe_dsa checkpoint (HF on-disk names), the MTP layer included when asked.
std::vector<WeightSpec> glm_moe_dsa_weight_table(const ModelConfig& cfg, bool include_mtp);

}  // namespace mxserve::model
