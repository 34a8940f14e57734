// Synthetic weights: every tensor of an architecture's weight table filled with deterministic random
// values at the real shapes, with no checkpoint. For benchmarks at true model shapes and for the embedded
// default model. The values come from a counter-based generator (kernels/synthetic_fill.h): element i of
// tensor NAME is f(seed, stream(NAME), i), computed where the tensor lives -- by the backend's
// fill_synthetic op (a CUDA kernel on the GPU), so a full-size model never exists on the host. The CPU
// backend and the CUDA kernel produce the same bits (CPU stores the f32 widening of the same bf16).
//
// Distributions (z ~ unit-variance approximately normal, |z| <= 3.46; see synthetic_fill.h):
//   *norm.weight                 1 + 0.05 z   (RMSNorm gains around 1)
//   *mlp.gate.weight (router)    z / sqrt(d_model)   (router logits ~N(0,1): routing spreads over experts)
//   *e_score_correction_bias     0.02 z, kept in f32
//   everything else              0.02 z
// All float weights are bf16-rounded. Precision plan (--quantization EXPERTS[:REST]): MXFP4 weights are the
// bf16 values quantized per 32-block with Quark's "even" scale rule (== `mxserve quantize --scheme mxfp4`
// on the bf16 synthetic checkpoint); FP8-block weights are quantized on the host, one tensor at a time.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kernels/synthetic_fill.h"
#include "model/weight_table.h"

namespace mxserve::model {

// "EXPERTS[:REST]", each of mxfp4, fp8-block, bf16 ("" = bf16:bf16).
struct SyntheticPlan {
  std::string experts = "bf16";  // routed experts' *_proj.weight
  std::string rest = "bf16";     // other Linear projections (attention, dense MLP, shared experts)
};
Result<SyntheticPlan> parse_synthetic_plan(const std::string& plan);
// Storage scheme of one weight under a plan: router, norms, embeddings, lm_head and the MTP eh_proj stay
// bf16, as in the published FP8 / MXFP4 GLM checkpoints.
std::string synthetic_scheme(const SyntheticPlan& plan, const std::string& name);

// What a WeightLoader needs to generate a model's weights in place of a checkpoint.
struct SyntheticSource {
  uint64_t seed = 0;
  int64_t d_model = 0;
  SyntheticPlan plan;
  std::unordered_map<std::string, Shape> shapes;  // every non-optional tensor of the weight table
};
SyntheticSource make_synthetic_source(const std::vector<WeightSpec>& table, int64_t d_model, uint64_t seed,
                                      const SyntheticPlan& plan);

// Generator parameters of tensor `name` [rows, cols] (2-D view; 1-D tensors are [1, n]), kNormal, whole tensor.
kernels::SyntheticFill synthetic_fill_params(const SyntheticSource& src, const std::string& name);

// Host copies (tests, the host FP8 path): bf16 values of a tensor (f32 for e_score_correction_bias).
Tensor synthetic_host_tensor(const SyntheticSource& src, const std::string& name);

// One bf16 host tensor per non-optional spec (f32 for e_score_correction_bias): the same values the
// backends generate. Small models and tests only (this is a host image of the whole table).
BoundWeights make_synthetic_weights(const std::vector<WeightSpec>& table, int64_t d_model, uint64_t seed);

// Host BoundWeights quantized per a plan (tests, small models): the routed experts get EXPERTS, the other
// Linear projections REST, with the same code as `mxserve quantize` (mxfp4: scale rule even; fp8-block:
// e4m3, 128x128 block scales). Unknown schemes are an error naming the value.
Status quantize_synthetic_experts(BoundWeights& weights, const std::string& plan);

// Bytes the synthetic weights of a table occupy in bf16 (f32 bias) before any quantization.
uint64_t synthetic_weight_bytes(const std::vector<WeightSpec>& table);

}  // namespace mxserve::model
