// Synthetic weights: every tensor of an architecture's weight table filled with deterministic random
// values (seeded by the tensor's name), at the real shapes, with no checkpoint. For benchmarks at true
// model shapes and for the embedded default model. Scales are chosen so activations stay O(1) and the
// router spreads tokens over experts (logit std ~1, small correction bias) instead of collapsing.
// NOTE: values are generated on the host; full-size models on a GPU need device-side generation.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/weight_table.h"

namespace mxserve::model {

// One bf16 host tensor per non-optional spec (f32 for e_score_correction_bias).
BoundWeights make_synthetic_weights(const std::vector<WeightSpec>& table, int64_t d_model, uint64_t seed);

// Bytes the synthetic weights of a table occupy on the host.
uint64_t synthetic_weight_bytes(const std::vector<WeightSpec>& table);

}  // namespace mxserve::model
