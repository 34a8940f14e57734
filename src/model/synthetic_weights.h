// Synthetic weights: every tensor of an architecture's weight table filled with deterministic random
// values (seeded by the tensor's name), at the real shapes, with no checkpoint. For benchmarks at true
// model shapes and for the embedded default model. Scales are chosen so activations stay O(1) and the
// router spreads tokens over experts (logit std ~1, small correction bias) instead of collapsing.
// NOTE: values are generated on the host; full-size models on a GPU need device-side generation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/weight_table.h"

namespace mxserve::model {

// One bf16 host tensor per non-optional spec (f32 for e_score_correction_bias).
BoundWeights make_synthetic_weights(const std::vector<WeightSpec>& table, int64_t d_model, uint64_t seed);

// The precision plan for synthetic weights, "EXPERTS[:REST]" (e.g. "mxfp4" or "mxfp4:fp8-block"):
// routed-expert weights get EXPERTS, the other Linear projections (attention, dense MLP, shared experts)
// REST (default bf16), quantized in place with the same code as `mxserve quantize` ("mxfp4": Quark MXFP4,
// scale rule even; "fp8-block": e4m3, 128x128 block scales). Router, norms, embeddings, lm_head and the
// MTP eh_proj stay bf16, as in published checkpoints. Unknown schemes are an error naming the value.
Status quantize_synthetic_experts(BoundWeights& weights, const std::string& plan);

// Bytes the synthetic weights of a table occupy on the host.
uint64_t synthetic_weight_bytes(const std::vector<WeightSpec>& table);

}  // namespace mxserve::model
