// Parameter accounting derived from the declared weights (model/weight_table.h): what the server's
// start-up memory plan and bench-model count, so no formula elsewhere restates an architecture's shapes.
// Invariant: a count is a sum over WeightSpec shapes -- optional specs (a tied lm_head) are not counted.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weight_table.h"

namespace mxserve::model {

struct WeightStats {
  int64_t tensors = 0;            // declared, non-optional weights
  int64_t parameters = 0;         // their logical elements
  int64_t expert_parameters = 0;  // of which in routed experts (ShardAxis::kExpert)
  int64_t n_experts = 0;          // routed experts per MoE layer (0 without)
};

WeightStats weight_stats(const std::vector<WeightSpec>& table);

// The weights whose names start with `prefix` (e.g. "model.layers.3.self_attn.").
std::vector<WeightSpec> weights_under(const std::vector<WeightSpec>& table, const std::string& prefix);

// The weights of one block (a name prefix), split the way a per-token cost model needs them: what every
// token reads (dense), what multiplies activations (matmul: Linear and router weights -- 2 FLOPs per
// parameter per token), and the routed experts (each token runs top_k of them).
struct BlockWeights {
  int64_t dense_params = 0;       // every non-expert parameter (norms, biases, projections, router)
  int64_t matmul_params = 0;      // of them Linear / router weights
  int64_t per_expert_params = 0;  // one routed expert's parameters (0 without experts)
  int64_t n_experts = 0;
};
BlockWeights block_weights(const std::vector<WeightSpec>& table, const std::string& prefix);

}  // namespace mxserve::model
